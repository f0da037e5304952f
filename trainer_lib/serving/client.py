"""Talk to a Triton server over HTTP: the text-generation model and explicit model control."""

from __future__ import annotations

import contextlib


def http_client(url: str, timeout_s: float = 120.0):
    """A tritonclient HTTP client for ``http(s)://host:port``; close it when done."""
    import tritonclient.http as httpclient

    scheme, _, hostport = url.rstrip("/").rpartition("://")
    if scheme not in ("http", "https", "") or not hostport:
        raise ValueError(f"{url!r}: expected http://host:port")
    return httpclient.InferenceServerClient(
        url=hostport, ssl=scheme == "https", connection_timeout=timeout_s, network_timeout=timeout_s
    )


def generate(
    client, model: str, prompt: str, max_tokens: int | None = None, temperature: float | None = None, version: str = ""
) -> dict:
    """One request to the text-generation model: ``{"text_output": str, "model_version": str}``."""
    import numpy as np
    import tritonclient.http as httpclient

    inputs = [httpclient.InferInput("text_input", [1, 1], "BYTES")]
    inputs[0].set_data_from_numpy(np.array([[prompt.encode("utf-8")]], dtype=np.object_))
    for name, value, kind, dtype in (
        ("max_tokens", max_tokens, "INT32", np.int32),
        ("temperature", temperature, "FP32", np.float32),
    ):
        if value is not None:
            inputs.append(httpclient.InferInput(name, [1, 1], kind))
            inputs[-1].set_data_from_numpy(np.array([[value]], dtype=dtype))
    result = client.infer(
        model, inputs, model_version=version, outputs=[httpclient.InferRequestedOutput("text_output")]
    )
    text = result.as_numpy("text_output").reshape(-1)[0]
    return {
        "text_output": text.decode("utf-8") if isinstance(text, bytes) else str(text),
        "model_version": result.get_response().get("model_version", ""),
    }


@contextlib.contextmanager
def connected(url: str, timeout_s: float = 120.0):
    client = http_client(url, timeout_s)
    try:
        yield client
    finally:
        client.close()
