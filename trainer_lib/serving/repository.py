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

import contextlib
import fcntl
import json
import os
import socket
import time

from trainer_lib import storage
from trainer_lib.errors import UserError
from trainer_lib.storage import StorageError, redact
from trainer_lib.storage.file_lock import poll_until, try_lock

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


def with_versions(text: str, versions: list[int]) -> str:
    """``config.pbtxt`` text with its version policy set to ``versions`` alone, every other setting kept."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    config = text_format.Parse(text, model_config_pb2.ModelConfig())
    config.version_policy.Clear()
    config.version_policy.specific.versions.extend(sorted(versions))
    return text_format.MessageToString(config)


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


def load(client, model_dir: str, model_name: str) -> None:
    """Have the server (re)load ``model_name`` with the config the repository holds now, sent with the
    request. Triton tells from the files' modification times whether a model changed, and an S3 store
    keeps those to the second: a config rewritten within a second of the last load went unseen (a
    deploy right after the server started reloaded the old version, and its smoke request found no new one)."""
    from google.protobuf import json_format, text_format
    from tritonclient.grpc import model_config_pb2

    text = read_config(model_dir)
    config = json_format.MessageToJson(text_format.Parse(text, model_config_pb2.ModelConfig())) if text else None
    client.load_model(model_name, config=config)


# --------------------------------------------------------------------------- the deploy lock

#: the lock file (object) of a model directory while a deploy or rollback changes it
LOCK = ".deploy.lock"
#: an object-store lock older than this is left over from a deploy that died (a local lock dies with its holder)
STALE_LOCK_S = 3600.0


@contextlib.contextmanager
def deploy_lock(model_dir: str, what: str, wait_s: float, say, stale_s: float = STALE_LOCK_S):
    """Hold ``<model_dir>/.deploy.lock`` while a deploy or rollback reads and changes the model's versions,
    so two of them never pick the same version or interleave their writes. A second one waits: after
    SAY_AFTER_S it says (through ``say``) who holds the lock, after ``wait_s`` it fails with a UserError.

    A local directory uses ``flock`` (released by the kernel when the holder dies). On S3 the lock is an
    object created with a conditional put (``If-None-Match: *``), deleted on release only if it is still
    ours (``If-Match`` on its ETag); one older than ``stale_s`` is removed as a leftover. Other object
    stores have no lock here: a warning says so."""
    lock = storage.join(model_dir, LOCK)
    holder = json.dumps(
        {"holder": f"pid {os.getpid()} on {socket.gethostname()}", "what": what, "since": time.time()}, sort_keys=True
    )
    if not storage.is_remote(lock):
        os.makedirs(model_dir, exist_ok=True)
        with open(lock, "a+", encoding="utf-8") as fh:
            _wait(lambda: try_lock(fh), lambda: _describe(_read_local(lock)), lock, wait_s, say)
            fh.seek(0)
            fh.truncate()
            fh.write(holder)
            fh.flush()
            try:
                yield
            finally:
                fh.truncate(0)
                fcntl.flock(fh, fcntl.LOCK_UN)
    elif storage.scheme(lock) == "s3":
        bucket, key = storage.split_s3(lock)
        etag = _wait(lambda: _try_put(bucket, key, holder, stale_s), lambda: _s3_holder(bucket, key), lock, wait_s, say)
        try:
            yield
        finally:
            _s3_release(bucket, key, etag)
    else:
        say(f"no deploy lock on {storage.scheme(lock)}:// (only local directories and s3://): run one deploy at a time")
        yield


def _wait(attempt, describe, lock: str, wait_s: float, say):
    """``attempt()`` until it returns something true; one line after SAY_AFTER_S, a UserError after ``wait_s``."""

    def gave_up(waited: float) -> UserError:
        return UserError(
            f"gave up after {waited:.0f} s waiting for another deploy of this model to finish ({describe()} "
            f"holds {lock}); run it again when that one is done, or raise lock_wait_s"
        )

    def waiting() -> None:
        say(f"waiting for another deploy of this model: {describe()} holds {lock} (up to {wait_s:g} s)")

    return poll_until(attempt, wait_s, waiting, gave_up)


def _read_local(lock: str) -> str:
    try:
        with open(lock, encoding="utf-8") as fh:
            return fh.read()
    except OSError:
        return ""


def _describe(text: str) -> str:
    try:
        entry = json.loads(text)
        since = time.strftime("%H:%M:%S UTC", time.gmtime(entry["since"]))
        return f"{entry['holder']} ({entry['what']}, since {since})"
    except (ValueError, KeyError, TypeError):
        return "another process"


def _s3():
    import boto3
    from botocore.config import Config

    from trainer_lib.storage.base import option

    endpoint = option("endpoint_url")
    config = Config(s3={"addressing_style": "path"} if endpoint else None)  # MinIO wants path style
    return boto3.client("s3", endpoint_url=endpoint, region_name=option("region"), config=config)


def _code(exc) -> str:
    return getattr(exc, "response", {}).get("Error", {}).get("Code", "")


def _try_put(bucket: str, key: str, body: str, stale_s: float) -> str | None:
    """Create the lock object if there is none (its ETag), else None; a stale one is removed first."""
    from botocore.exceptions import ClientError

    client = _s3()
    try:
        return client.put_object(Bucket=bucket, Key=key, Body=body.encode(), IfNoneMatch="*")["ETag"]
    except ClientError as exc:
        if _code(exc) not in ("PreconditionFailed", "ConditionalRequestConflict", "412", "409"):
            raise StorageError(redact(f"s3://{bucket}/{key}: could not create the deploy lock: {exc}")) from None
    try:
        held = client.head_object(Bucket=bucket, Key=key)
    except ClientError:
        return None  # released meanwhile: the next attempt takes it
    age = time.time() - held["LastModified"].timestamp()
    if age > stale_s:  # left by a deploy that died; If-Match: never a lock taken since
        with contextlib.suppress(ClientError):
            client.delete_object(Bucket=bucket, Key=key, IfMatch=held["ETag"])
    return None


def _s3_holder(bucket: str, key: str) -> str:
    try:
        return _describe(_s3().get_object(Bucket=bucket, Key=key)["Body"].read().decode())
    except Exception:
        return "another process"


def _s3_release(bucket: str, key: str, etag: str) -> None:
    from botocore.exceptions import ClientError

    with contextlib.suppress(ClientError):  # gone or taken over as stale: not ours to delete any more
        _s3().delete_object(Bucket=bucket, Key=key, IfMatch=etag)
