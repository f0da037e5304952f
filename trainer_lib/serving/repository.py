"""A versioned Triton model repository (local dir or URL), as NVIDIA's images and KServe read it.

    <repo>/<model>/config.pbtxt            which versions serve: version_policy { specific { versions: [N] } }
    <repo>/<model>/<N>/model.py            the text-generation model (Python backend), from triton_generate_model.py
    <repo>/<model>/<N>/ort_generate.py     its KV-cache loop, from trainer_lib/export/ort_generate.py
    <repo>/<model>/<N>/model.onnx          the export's decoder (fp32, fp16 or int8), model.onnx.data beside it
    <repo>/<model>/<N>/tokenizer/          the export's tokenizer files
    <repo>/<model>/<N>/generate.json       eos ids, defaults and, for TensorRT, its shape profile, for model.py
    <repo>/<model>_onnx/<N>/model.onnx     optional: the raw decoder, platform onnxruntime_onnx

KServe takes the repository root as ``storageUri``; ``tritonserver --model-repository=<repo>`` serves
it directly. Configs are built as dicts in protobuf's JSON form, then checked against Triton's own
``ModelConfig`` message (shipped with tritonclient) and written in its text format by :func:`config_text`.
"""

from __future__ import annotations

import json
import os

from trainer_lib import storage
from trainer_lib.errors import UserError

CONFIG = "config.pbtxt"
_HERE = os.path.dirname(os.path.abspath(__file__))
# copied into every version: model.py and the generation loop it imports (Triton's stub cannot import trainer_lib)
VERSION_CODE = {
    "model.py": os.path.join(_HERE, "triton_generate_model.py"),
    "ort_generate.py": os.path.join(os.path.dirname(_HERE), "export", "ort_generate.py"),
}

# ONNX TensorProto element types -> Triton data types (the ones a decoder uses)
_TRITON_TYPES = {
    1: "TYPE_FP32",
    10: "TYPE_FP16",
    16: "TYPE_BF16",
    11: "TYPE_FP64",
    7: "TYPE_INT64",
    6: "TYPE_INT32",
    3: "TYPE_INT8",
    2: "TYPE_UINT8",
    9: "TYPE_BOOL",
}


# --------------------------------------------------------------------------- configs


def config_text(config: dict) -> str:
    """A config (a dict in protobuf's JSON form) checked against Triton's ``ModelConfig`` message and
    written in protobuf text format, the form ``config.pbtxt`` takes; a ValueError names a bad field."""
    from google.protobuf import json_format, text_format
    from tritonclient.grpc import model_config_pb2

    try:
        message = json_format.ParseDict(config, model_config_pb2.ModelConfig())
    except json_format.ParseError as exc:
        raise ValueError(f"not a valid Triton model config: {exc}") from None
    return text_format.MessageToString(message)


def version_policy(versions: list[int]) -> dict:
    return {"specific": {"versions": sorted(versions)}}


def generate_config(
    name: str,
    versions: list[int],
    max_batch_size: int = 8,
    instance_kind: str = "cpu",
    instance_count: int = 1,
    execution_env: str | None = None,
) -> dict:
    """The text-generation model (Python backend): ``text_input`` [+ ``max_tokens``, ``temperature``]
    -> ``text_output``, the names of Triton's generate extension. ``execution_env``: the stub's
    environment (a conda-pack tarball or venv path on the server), else the server's own python3."""
    config = {
        "name": name,
        "backend": "python",
        "max_batch_size": max_batch_size,
        "input": [
            {"name": "text_input", "data_type": "TYPE_STRING", "dims": [1]},
            {"name": "max_tokens", "data_type": "TYPE_INT32", "dims": [1], "optional": True},
            {"name": "temperature", "data_type": "TYPE_FP32", "dims": [1], "optional": True},
        ],
        "output": [{"name": "text_output", "data_type": "TYPE_STRING", "dims": [1]}],
        "dynamic_batching": {},
        "instance_group": [{"count": instance_count, "kind": f"KIND_{instance_kind.upper()}"}],
        "version_policy": version_policy(versions),
    }
    if execution_env:
        config["parameters"] = {"EXECUTION_ENV_PATH": {"string_value": execution_env}}
    return config


def onnx_config(
    name: str, versions: list[int], signature: dict, instance_kind: str = "gpu", instance_count: int = 1
) -> dict:
    """The raw decoder for ONNX Runtime (``platform: onnxruntime_onnx``), one request = one step.

    ``max_batch_size: 0``: the batch axis is part of ``dims``, since requests with different
    past lengths could not be batched anyway. Nothing here generates with it; the generate model
    runs the same graph in-process (and on a GPU with TensorRT, docs/export-and-serving.md)."""
    return {
        "name": name,
        "platform": "onnxruntime_onnx",
        "max_batch_size": 0,
        "input": [{"name": n, "data_type": t, "dims": d} for n, t, d in signature["inputs"]],
        "output": [{"name": n, "data_type": t, "dims": d} for n, t, d in signature["outputs"]],
        "instance_group": [{"count": instance_count, "kind": f"KIND_{instance_kind.upper()}"}],
        "version_policy": version_policy(versions),
    }


def onnx_signature(onnx_path: str) -> dict:
    """``{"inputs"/"outputs": [(name, Triton type, dims)]}`` of a local ONNX file; symbolic dims are -1."""
    import onnx

    graph = onnx.load(onnx_path, load_external_data=False).graph
    initializers = {t.name for t in graph.initializer}

    def rows(values):
        out = []
        for v in values:
            if v.name in initializers:
                continue
            tensor = v.type.tensor_type
            if tensor.elem_type not in _TRITON_TYPES:
                raise UserError(
                    f"{onnx_path}: {v.name} has ONNX element type {tensor.elem_type}, "
                    f"which has no Triton data type here"
                )
            dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim]
            out.append((v.name, _TRITON_TYPES[tensor.elem_type], dims))
        return out

    return {"inputs": rows(graph.input), "outputs": rows(graph.output)}


def tensorrt_profile(signature: dict, max_batch_size: int, max_context: int) -> dict:
    """TensorRT's shape profile for the export's decoder (trainer_lib/export/onnx_decoder.py), as
    onnxruntime's ``trt_profile_{min,opt,max}_shapes`` strings: ``{"min": "input_ids:1x1,...", ...}``.

    One profile covers prefill and decode: batch 1..``max_batch_size``, new tokens 1..``max_context``,
    cached tokens 0..``max_context - 1`` (an empty cache at prefill). TensorRT checks the graph at
    each end of the profile, so each end is a shape the graph can take: the attention mask spans
    cached + new tokens. It is tuned ("opt") for what generation mostly runs, one-token decode steps
    of one row over a cache of half the context, at most 1024 tokens (as onnxruntime-genai tunes its
    TensorRT profiles)."""
    sizes = {  # (batch, new tokens, cached tokens) at each end of the profile
        "min": (1, 1, 0),
        "opt": (1, 1, max(1, min(max_context // 2, 1024))),
        "max": (max_batch_size, max_context, max_context - 1),
    }
    dims_of = {}
    for name, _, dims in signature["inputs"]:
        if name in ("input_ids", "position_ids"):
            dims_of[name] = lambda b, s, p: (b, s)
        elif name == "attention_mask":
            dims_of[name] = lambda b, s, p: (b, p + s)
        elif name.startswith("past_key_values.") and len(dims) == 4 and dims[1] > 0 and dims[3] > 0:
            dims_of[name] = lambda b, s, p, heads=dims[1], width=dims[3]: (b, heads, p, width)
        else:
            raise UserError(f"model.onnx: input {name} {dims} is not one of the export's decoder inputs")
    return {
        end: ",".join(f"{name}:" + "x".join(str(d) for d in shape(*size)) for name, shape in dims_of.items())
        for end, size in sizes.items()
    }


def served_versions(text: str) -> list[int]:
    """The versions a config's ``version_policy { specific { versions: [...] } }`` names."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    config = text_format.Parse(text, model_config_pb2.ModelConfig())
    return sorted(config.version_policy.specific.versions)


# --------------------------------------------------------------------------- repository contents


def versions(model_dir: str) -> list[int]:
    """The numbered version directories under ``model_dir`` (none if it does not exist)."""
    try:
        names = storage.listdir(model_dir)
    except FileNotFoundError:
        return []
    return sorted(int(n) for n in names if n.isdigit())


def _export_summary(export_dir: str) -> dict:
    path = storage.join(export_dir, "export.json")
    return json.loads(storage.read_text(path)) if storage.exists(path) else {}


def variant_dir(export_dir: str, variant: str) -> str:
    """The directory of ``variant``'s ``model.onnx``: where export.json's ``models`` puts it, else
    ``onnx/<variant>``. A UserError when export.json lists its models and this one is not among them."""
    models = _export_summary(export_dir).get("models")
    if models and variant not in models:
        raise UserError(
            f"variant: the export at {export_dir} has no {variant} model (it has {', '.join(sorted(models))}); "
            f"deploy one of those, or export again with {variant} turned on"
        )
    relative = os.path.dirname(models[variant]) if models else f"onnx/{variant}"
    return storage.join(export_dir, *relative.split("/"))


def _eos_and_pad(export_dir: str, summary: dict) -> dict:
    """eos/pad ids: those the export stage recorded in ``export.json`` (the model's generation
    config, as Hugging Face ``generate`` stops), else the tokenizer's own eos and pad tokens."""
    eos, pad = summary.get("eos_token_id"), summary.get("pad_token_id")
    if eos is None:
        from tokenizers import Tokenizer

        tokenizer_dir = storage.join(export_dir, "tokenizer")
        tokenizer = Tokenizer.from_str(storage.read_text(storage.join(tokenizer_dir, "tokenizer.json")))
        config_path = storage.join(tokenizer_dir, "tokenizer_config.json")
        config = json.loads(storage.read_text(config_path)) if storage.exists(config_path) else {}

        def token_id(entry):
            text = entry.get("content") if isinstance(entry, dict) else entry
            return tokenizer.token_to_id(text) if text else None

        eos = token_id(config.get("eos_token"))
        pad = token_id(config.get("pad_token")) if pad is None else pad
    eos_ids = sorted({int(i) for i in (eos if isinstance(eos, list) else [eos]) if i is not None})
    return {"eos_token_ids": eos_ids, "pad_token_id": int(pad) if pad is not None else 0}


def write_generate_version(
    export_dir: str,
    version_dir: str,
    variant: str,
    default_max_tokens: int = 64,
    max_tokens_limit: int = 4096,
    tensorrt: dict | None = None,
) -> dict:
    """Fill ``version_dir`` with the text-generation model for ``export_dir``'s ``variant``.

    Works for any mix of local and s3:// paths (s3 to s3 copies stay on the server). ``tensorrt``
    (``max_context``, ``cache_dir``, ``profile`` from :func:`tensorrt_profile`) goes into
    generate.json as is: a GPU instance then tries TensorRT first. Returns the generate.json it wrote."""
    onnx_dir = variant_dir(export_dir, variant)
    tokenizer_dir = storage.join(export_dir, "tokenizer")
    for needed in (storage.join(onnx_dir, "model.onnx"), storage.join(tokenizer_dir, "tokenizer.json")):
        if not storage.exists(needed):
            raise UserError(
                f"export.path: {needed} is missing (expected the export stage's output: "
                f"onnx/<variant>/model.onnx and tokenizer/)"
            )
    settings = {
        **_eos_and_pad(export_dir, _export_summary(export_dir)),
        "default_max_tokens": default_max_tokens,
        "max_tokens_limit": max_tokens_limit,
        "variant": variant,
        "export": export_dir,
    }
    if tensorrt is not None:
        settings["tensorrt"] = tensorrt
    storage.copy(onnx_dir, version_dir)  # model.onnx and any external-data files next to it
    storage.copy(tokenizer_dir, storage.join(version_dir, "tokenizer"))
    for name, source in VERSION_CODE.items():
        with open(source, "rb") as f:
            storage.write_bytes(storage.join(version_dir, name), f.read())
    storage.write_text(storage.join(version_dir, "generate.json"), json.dumps(settings, indent=2))
    return settings


def variant_signature(export_dir: str, variant: str) -> dict:
    """:func:`onnx_signature` of the export's ``variant`` (fetched first when it is a URL)."""
    return onnx_signature(storage.localize(storage.join(variant_dir(export_dir, variant), "model.onnx"), kind="file"))


def write_onnx_version(export_dir: str, version_dir: str, variant: str) -> dict:
    """Copy the raw decoder into ``version_dir``; returns its signature for :func:`onnx_config`."""
    onnx_dir = variant_dir(export_dir, variant)
    signature = variant_signature(export_dir, variant)
    storage.copy(onnx_dir, version_dir)
    return signature


def write_config(model_dir: str, config: dict) -> str:
    text = config_text(config)
    storage.write_text(storage.join(model_dir, CONFIG), text)
    return text


def read_config(model_dir: str) -> str | None:
    path = storage.join(model_dir, CONFIG)
    return storage.read_text(path) if storage.exists(path) else None
