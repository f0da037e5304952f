"""``posttrain deploy``: publish an export as the next version of a Triton model and switch to it safely.

    posttrain deploy export.path=s3://b/run/export repository=s3://b/triton triton.url=http://triton:8000 \\
        model_name=posttrain variant=int8

1. Copy ``onnx/<variant>/`` and ``tokenizer/`` of the export, with the generate ``model.py``, into
   ``<repository>/<model_name>/<N>/``, N one past every version the model ever had.
2. Point ``config.pbtxt`` at N alone (``version_policy { specific { versions: [N] } }``).
3. With ``triton.url``: ask the server (explicit model control) to load the model, then send a
   smoke request to version N. Triton keeps the loaded version serving when a reload fails, so
   a version that does not load never serves; one that loads but fails the smoke request is
   rolled back by restoring the old config and reloading. Either way the failed version's files
   are removed, the failure is recorded in ``deploy.json`` and the stage exits with an error.
4. Record N in ``<repository>/<model_name>/deploy.json`` and keep the last ``keep_versions``.

Without ``triton.url`` the stage only publishes (steps 1, 2 and 4): a server started later on the
repository, or KServe with ``storageUri`` at its root, serves version N.
"""

from __future__ import annotations

import json
import re
import sys
import time
from dataclasses import dataclass

from trainer_lib import storage
from trainer_lib.config import StorageConfig, opt
from trainer_lib.errors import ConfigError, UserError
from trainer_lib.serving import repository as repo

HISTORY = "deploy.json"


@dataclass
class ExportSource:
    path: str | None = opt(None, "The export stage's output_dir to publish, local or URL (docs/export-and-serving.md).")


@dataclass
class TritonTarget:
    url: str = opt("", "Triton server (http://host:port, explicit model control) to load on; empty: only publish.")


@dataclass
class DeployConfig:
    export: ExportSource = opt(ExportSource, "What to deploy.")
    repository: str | None = opt(None, "Root of the Triton model repository to publish into (local dir or URL).")
    triton: TritonTarget = opt(TritonTarget, "The server to load the new version on.")
    model_name: str = opt("posttrain", "The model's name in the repository and in /v2/models/<name>.")
    variant: str = opt("int8", "Which ONNX export to serve.", ("int8", "fp32"))
    max_batch_size: int = opt(8, "Requests the dynamic batcher may decode together.")
    instance_kind: str = opt("cpu", "Where the ONNX Runtime session runs (gpu needs onnxruntime-gpu).", ("cpu", "gpu"))
    execution_env: str = opt("", "Python-backend environment path (EXECUTION_ENV_PATH); empty: the server's python3.")
    default_max_tokens: int = opt(64, "New tokens per request when the request gives no max_tokens.")
    publish_onnx: bool = opt(False, "Also publish the raw ONNX decoder as '<model_name>_onnx' (not loaded here).")
    tensorrt_fp16: bool = opt(False, "TensorRT FP16 for the raw ONNX model (needs publish_onnx, instance_kind=gpu).")
    smoke_prompt: str = opt("Hello", "Prompt of the smoke request sent to the new version.")
    smoke_max_tokens: int = opt(4, "max_tokens of the smoke request.")
    timeout_s: float = opt(300.0, "Seconds to wait for the server to load the new version (and per request).")
    keep_versions: int = opt(2, "Deployed versions kept in the repository, the serving one included (0: all).")
    storage: StorageConfig = opt(StorageConfig, "Object store settings.")

    def validate(self) -> None:
        for key, value in (("export.path", self.export.path), ("repository", self.repository)):
            if not value:
                raise ConfigError(f"{key}: required, expected a local path or URL (s3://, gs://...)")
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", self.model_name or ""):
            raise ConfigError(f"model_name: expected letters, digits, '_', '.' or '-', got {self.model_name!r}")
        if self.triton.url and not re.fullmatch(r"https?://[^/\s]+/?", self.triton.url):
            raise ConfigError(f"triton.url: expected http://host:port, got {self.triton.url!r}")
        for key in ("max_batch_size", "default_max_tokens", "smoke_max_tokens", "timeout_s"):
            if not getattr(self, key) > 0:
                raise ConfigError(f"{key}: expected a positive number, got {getattr(self, key)}")
        if self.keep_versions < 0:
            raise ConfigError(f"keep_versions: expected >= 0, got {self.keep_versions}")
        if self.tensorrt_fp16 and not (self.publish_onnx and self.instance_kind == "gpu"):
            raise ConfigError("tensorrt_fp16: needs publish_onnx=true and instance_kind=gpu")


CONFIG = DeployConfig


def _say(message: str) -> None:
    print(f"deploy: {message}", file=sys.stderr, flush=True)  # stdout carries the JSON summary


def run(cfg: DeployConfig) -> dict:
    from trainer_lib.serving.client import connected

    if not cfg.triton.url:
        return _deploy(cfg, None)
    with connected(cfg.triton.url, cfg.timeout_s) as client:
        try:
            live, why = client.is_server_live(), "it is not live"
        except Exception as exc:
            live, why = False, _reason(exc)
        if not live:
            raise UserError(f"triton.url: no Triton server answers at {cfg.triton.url} ({why}); nothing was published")
        return _deploy(cfg, client)


def _deploy(cfg: DeployConfig, client) -> dict:
    model_dir = storage.join(cfg.repository, cfg.model_name)
    history = _read_history(model_dir)
    old_config = repo.read_config(model_dir)
    previous = (repo.served_versions(old_config) or [None])[-1] if old_config else None
    version = max([0, *repo.versions(model_dir), *(e["version"] for e in history["versions"])]) + 1
    version_dir = storage.join(model_dir, str(version))
    _say(f"publishing {cfg.export.path} ({cfg.variant}) as {cfg.model_name} version {version} in {cfg.repository}")
    try:
        repo.write_generate_version(cfg.export.path, version_dir, cfg.variant, cfg.default_max_tokens)
    except BaseException:
        storage.delete(version_dir)
        raise
    repo.write_config(
        model_dir,
        repo.generate_config(
            cfg.model_name, [version], cfg.max_batch_size, cfg.instance_kind, execution_env=cfg.execution_env or None
        ),
    )
    entry = {
        "version": version,
        "export": cfg.export.path,
        "variant": cfg.variant,
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    smoke = None
    if client is not None:
        try:
            failure, smoke = _load_and_check(client, cfg, version)
        except BaseException:  # interrupted mid-switch (Ctrl-C, pod killed): put the old version back first
            _roll_back(client, cfg, model_dir, old_config, version_dir, loaded=True)
            raise
        if failure:
            notes = _roll_back(client, cfg, model_dir, old_config, version_dir, loaded=failure[0] != "load")
            history["versions"].append({**entry, "status": "failed", "reason": f"{failure[0]}: {failure[1]}"})
            _write_history(model_dir, history)
            still = f"version {previous} still serves" if previous else "no version was serving before"
            raise UserError(
                f"{cfg.model_name} version {version} failed its {failure[0]} "
                f"({failure[1]}); it was removed and {still}{notes}"
            )
    history["serving"] = version
    history["versions"].append({**entry, "status": "served" if client is not None else "published"})
    if cfg.publish_onnx:
        onnx_dir = storage.join(cfg.repository, f"{cfg.model_name}_onnx")
        signature = repo.write_onnx_version(cfg.export.path, storage.join(onnx_dir, str(version)), cfg.variant)
        repo.write_config(
            onnx_dir,
            repo.onnx_config(
                f"{cfg.model_name}_onnx", [version], signature, cfg.instance_kind, tensorrt_fp16=cfg.tensorrt_fp16
            ),
        )
    _write_history(model_dir, history)
    removed = _prune(cfg, history)
    _say(
        f"{cfg.model_name} version {version} is {'serving' if client is not None else 'published'}"
        + (f" (removed old versions {removed})" if removed else "")
    )
    url = cfg.triton.url.rstrip("/") or None
    return {
        "stage": "deploy",
        "model_name": cfg.model_name,
        "version": version,
        "previous_version": previous,
        "variant": cfg.variant,
        "repository": cfg.repository,
        "loaded": client is not None,
        "endpoint": url,
        "generate_url": f"{url}/v2/models/{cfg.model_name}/generate" if url else None,
        "smoke": smoke,
    }


def _load_and_check(client, cfg: DeployConfig, version: int) -> tuple[tuple[str, str] | None, dict | None]:
    """((``"load"`` | ``"smoke test"``, reason) or None, the smoke answer)."""
    from trainer_lib.serving.client import generate

    _say(f"loading {cfg.model_name} on {cfg.triton.url}")
    try:
        client.load_model(cfg.model_name)
    except Exception as exc:
        return ("load", _reason(exc)), None
    try:
        answer = generate(client, cfg.model_name, cfg.smoke_prompt, cfg.smoke_max_tokens, version=str(version))
    except Exception as exc:
        return ("smoke test", _reason(exc)), None
    if answer["model_version"] != str(version):
        return ("smoke test", f"version {answer['model_version']} answered instead of {version}"), None
    _say(f"smoke test passed: {cfg.smoke_prompt!r} -> {answer['text_output']!r}")
    return None, {"prompt": cfg.smoke_prompt, **answer}


def _reason(exc: Exception) -> str:
    text = exc.message() if callable(getattr(exc, "message", None)) else str(exc)
    return (text or type(exc).__name__).strip().splitlines()[0][:500]


def _roll_back(
    client, cfg: DeployConfig, model_dir: str, old_config: str | None, version_dir: str, loaded: bool
) -> str:
    """Put the repository back as it was; if the new version got loaded, reload the old one (or unload).
    Returns a note for the error message when the server could not be put back."""
    config_path = storage.join(model_dir, repo.CONFIG)
    if old_config is None:
        storage.delete(config_path)
    else:
        storage.write_text(config_path, old_config)
    note = ""
    if loaded:
        try:
            if old_config is None:
                client.unload_model(cfg.model_name)
            else:
                client.load_model(cfg.model_name)
        except Exception as exc:
            note = f"; restoring the server failed too: {_reason(exc)}"
    storage.delete(version_dir)
    return note


def _read_history(model_dir: str) -> dict:
    path = storage.join(model_dir, HISTORY)
    if not storage.exists(path):
        return {"serving": None, "versions": []}
    try:
        return json.loads(storage.read_text(path))
    except ValueError as exc:
        raise UserError(f"{path}: not a deploy history ({exc}); fix or delete it") from None


def _write_history(model_dir: str, history: dict) -> None:
    storage.write_text(storage.join(model_dir, HISTORY), json.dumps(history, indent=2))


def _prune(cfg: DeployConfig, history: dict) -> list[int]:
    """Delete version directories other than the last ``keep_versions`` deployed ones (this one
    included), also leftovers of deploys that died half-way."""
    if not cfg.keep_versions:
        return []
    deployed = [e["version"] for e in history["versions"] if e["status"] in ("served", "published")]
    keep = set(deployed[-cfg.keep_versions :])
    removed = []
    for model in (cfg.model_name, f"{cfg.model_name}_onnx"):
        model_dir = storage.join(cfg.repository, model)
        for version in repo.versions(model_dir):
            if version not in keep:
                storage.delete(storage.join(model_dir, str(version)))
                removed.append(version)
    return sorted(set(removed))
