"""``posttrain deploy``: publish an export as the next version of a Triton model and switch to it safely.

    posttrain deploy export.path=s3://b/run/export repository=s3://b/triton triton.url=http://triton:8000 \\
        model_name=posttrain variant=int8
    posttrain deploy ... variant=fp16            # on the server's GPU, TensorRT FP16 first (instance_kind=auto)

1. Copy the variant's ONNX directory (``onnx/<variant>/``, as export.json lists it) and ``tokenizer/``
   of the export, with the generate ``model.py``, into
   ``<repository>/<model_name>/<N>/``, N one past every version the model ever had.
2. Point ``config.pbtxt`` at N alone (``version_policy { specific { versions: [N] } }``).
3. With ``triton.url``: ask the server (explicit model control) to load the model, then send a
   smoke request to version N. Triton keeps the loaded version serving when a reload fails, so
   a version that does not load never serves; one that loads but fails the smoke request is
   rolled back by restoring the old config and reloading. Either way the failed version's files
   are removed, the failure is recorded in ``deploy.json`` and the stage exits with an error.
4. Record N in ``<repository>/<model_name>/deploy.json`` and keep the last ``keep_versions``.

Steps 1-4 run under the model's deploy lock (``<model_name>/.deploy.lock``, :func:`repository.deploy_lock`):
a second deploy or rollback of the same model waits for it (saying so after a few seconds) and then takes
the next version, or gives up with one error line after ``lock_wait_s``.

Without ``triton.url`` the stage only publishes (steps 1, 2 and 4): a server started later on the
repository, or KServe with ``storageUri`` at its root, serves version N.

``instance_kind=auto`` (the default) places fp16 on a GPU and the other variants on the CPU. On a
GPU, fp16 and fp32 get a ``tensorrt`` section in generate.json (its shape profile, the engine cache),
so the generate model tries onnxruntime's TensorRT provider before CUDA (docs/export-and-serving.md,
"Serving on GPUs").
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import sys
import time
from dataclasses import dataclass

from trainer_lib import storage
from trainer_lib.config import StorageConfig, opt
from trainer_lib.errors import ConfigError, UserError
from trainer_lib.export.variants import CHOICES, resolve
from trainer_lib.serving import repository as repo

HISTORY = "deploy.json"


@dataclass
class ExportSource:
    path: str | None = opt(None, "The export stage's output_dir to publish, local or URL (docs/export-and-serving.md).")


@dataclass
class TritonTarget:
    url: str = opt("", "Triton server (http://host:port, explicit model control) to load on; empty: only publish.")


@dataclass
class TensorRTSettings:
    enabled: bool = opt(
        True, "On GPU instances, fp16 and fp32 try onnxruntime's TensorRT provider (FP16 engines) first."
    )
    max_context: int = opt(2048, "Prompt + new tokens the TensorRT engines cover; longer requests are refused there.")
    cache_dir: str = opt(
        "", "Engine cache on the server (a volume that outlives it); empty: in the version's directory."
    )


#: The variants TensorRT builds engines for: int8's and int4's MatMulNBits (and int8's GatherBlockQuantized)
#: are not TensorRT operations, so CUDA runs those.
TENSORRT_VARIANTS = ("fp16", "fp32")


@dataclass
class DeployConfig:
    export: ExportSource = opt(ExportSource, "What to deploy.")
    repository: str | None = opt(None, "Root of the Triton model repository to publish into (local dir or URL).")
    triton: TritonTarget = opt(TritonTarget, "The server to load the new version on.")
    model_name: str = opt("posttrain", "The model's name in the repository and in /v2/models/<name>.")
    variant: str = opt(
        "int8",
        "Which ONNX export to serve (fp16 is for GPUs; int4 needs int4=true at export); auto: the smallest the "
        "export wrote that a CPU serves (it leaves out the variants that failed their parity, and fp16).",
        CHOICES,
    )
    max_batch_size: int = opt(8, "Requests the dynamic batcher may decode together.")
    instance_kind: str = opt(
        "auto",
        "Where Triton places the model and its onnxruntime session: auto is gpu for fp16, cpu for the others "
        "(gpu needs onnxruntime-gpu on the server: images/Dockerfile.triton).",
        ("auto", "cpu", "gpu"),
    )
    tensorrt: TensorRTSettings = opt(TensorRTSettings, "TensorRT on GPU instances (fp16 and fp32 only).")
    execution_env: str = opt("", "Python-backend environment path (EXECUTION_ENV_PATH); empty: the server's python3.")
    default_max_tokens: int = opt(64, "New tokens per request when the request gives no max_tokens.")
    publish_onnx: bool = opt(False, "Also publish the raw ONNX decoder as '<model_name>_onnx' (not loaded here).")
    smoke_prompt: str = opt("Hello", "Prompt of the smoke request sent to the new version.")
    smoke_max_tokens: int = opt(4, "max_tokens of the smoke request.")
    timeout_s: float = opt(300.0, "Seconds to wait for the server to load the new version (and per request).")
    keep_versions: int = opt(2, "Deployed versions kept in the repository, the serving one included (0: all).")
    lock_wait_s: float = opt(
        600.0, "Seconds to wait while another deploy or rollback of this model holds its lock, then fail."
    )
    storage: StorageConfig = opt(StorageConfig, "Object store settings.")

    def validate(self) -> None:
        for key, value in (("export.path", self.export.path), ("repository", self.repository)):
            if not value:
                raise ConfigError(f"{key}: required, expected a local path or URL (s3://, gs://...)")
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", self.model_name or ""):
            raise ConfigError(f"model_name: expected letters, digits, '_', '.' or '-', got {self.model_name!r}")
        if self.triton.url and not re.fullmatch(r"https?://[^/\s]+/?", self.triton.url):
            raise ConfigError(f"triton.url: expected http://host:port, got {self.triton.url!r}")
        for key in ("max_batch_size", "default_max_tokens", "smoke_max_tokens", "timeout_s", "lock_wait_s"):
            if not getattr(self, key) > 0:
                raise ConfigError(f"{key}: expected a positive number, got {getattr(self, key)}")
        if self.keep_versions < 0:
            raise ConfigError(f"keep_versions: expected >= 0, got {self.keep_versions}")
        if self.tensorrt.max_context <= 0:
            raise ConfigError(f"tensorrt.max_context: expected a positive number, got {self.tensorrt.max_context}")

    @property
    def kind(self) -> str:
        """The instance kind, ``auto`` resolved: gpu for fp16, cpu for the others."""
        if self.instance_kind != "auto":
            return self.instance_kind
        return "gpu" if self.variant == "fp16" else "cpu"

    def tensorrt_settings(self) -> dict | None:
        """generate.json's ``tensorrt`` section (without its profile), or None where TensorRT is not tried."""
        if not (self.tensorrt.enabled and self.kind == "gpu" and self.variant in TENSORRT_VARIANTS):
            return None
        return {"max_context": self.tensorrt.max_context, "cache_dir": self.tensorrt.cache_dir}


CONFIG = DeployConfig


def say(message: str) -> None:
    """One line of progress on stderr."""
    print(f"deploy: {message}", file=sys.stderr, flush=True)  # stdout carries the JSON summary


def run(cfg: DeployConfig) -> dict:
    cfg = dataclasses.replace(cfg, variant=resolve(cfg.export.path, cfg.variant, "variant", "export.path"))
    if not cfg.triton.url:
        return _deploy(cfg, None)
    with live_server(cfg.triton.url, cfg.timeout_s, "nothing was published") as client:
        return _deploy(cfg, client)


@contextlib.contextmanager
def live_server(url: str, timeout_s: float, untouched: str):
    """A client of the Triton server at ``url``; a UserError ending in ``untouched`` when it does not answer."""
    from trainer_lib.serving.client import connected

    with connected(url, timeout_s) as client:
        try:
            live, why = client.is_server_live(), "it is not live"
        except Exception as exc:
            live, why = False, reason(exc)
        if not live:
            raise UserError(f"triton.url: no Triton server answers at {url} ({why}); {untouched}")
        yield client


def _deploy(cfg: DeployConfig, client) -> dict:
    """Publish (and load) under the model's deploy lock: a concurrent deploy waits, then takes the next version."""
    model_dir = storage.join(cfg.repository, cfg.model_name)
    with repo.deploy_lock(model_dir, f"deploying {cfg.export.path}", cfg.lock_wait_s, say):
        return _publish(cfg, client, model_dir)


def _publish(cfg: DeployConfig, client, model_dir: str) -> dict:
    history = read_history(model_dir)
    old_config = repo.read_config(model_dir)
    previous = (repo.served_versions(old_config) or [None])[-1] if old_config else None
    version = max([0, *repo.versions(model_dir), *(e["version"] for e in history["versions"])]) + 1
    version_dir = storage.join(model_dir, str(version))
    say(
        f"publishing {cfg.export.path} ({cfg.variant}, {cfg.kind} instances) as {cfg.model_name} version {version} "
        f"in {cfg.repository}"
    )
    if cfg.variant == "fp16" and cfg.kind == "cpu":
        say("fp16 on CPU instances runs, but slower than fp32: onnxruntime's CPU kernels compute in fp32")
    try:
        repo.write_generate_version(
            cfg.export.path, version_dir, cfg.variant, cfg.default_max_tokens, tensorrt=_tensorrt(cfg)
        )
    except BaseException:
        storage.delete(version_dir)
        raise
    repo.write_config(
        model_dir,
        repo.generate_config(
            cfg.model_name, [version], cfg.max_batch_size, cfg.kind, execution_env=cfg.execution_env or None
        ),
    )
    entry = {
        "version": version,
        "export": cfg.export.path,
        "variant": cfg.variant,
        "instance_kind": cfg.kind,
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    smoke = None
    if client is not None:
        try:
            failure, smoke = load_and_check(client, cfg, version)
        except BaseException:  # interrupted mid-switch (Ctrl-C, pod killed): put the old version back first
            _roll_back(client, cfg, model_dir, old_config, version_dir, loaded=True)
            raise
        if failure:
            notes = _roll_back(client, cfg, model_dir, old_config, version_dir, loaded=failure[0] != "load")
            history["versions"].append({**entry, "status": "failed", "reason": f"{failure[0]}: {failure[1]}"})
            write_history(model_dir, history)
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
        repo.write_config(onnx_dir, repo.onnx_config(f"{cfg.model_name}_onnx", [version], signature, cfg.kind))
    write_history(model_dir, history)
    removed = _prune(cfg, history)
    say(
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
        "instance_kind": cfg.kind,
        "tensorrt": cfg.tensorrt_settings() is not None,
        "repository": cfg.repository,
        "loaded": client is not None,
        "endpoint": url,
        "generate_url": f"{url}/v2/models/{cfg.model_name}/generate" if url else None,
        "smoke": smoke,
    }


def _tensorrt(cfg: DeployConfig) -> dict | None:
    """generate.json's ``tensorrt`` section, its shape profile read from the variant's graph."""
    settings = cfg.tensorrt_settings()
    if settings is None:
        return None
    signature = repo.variant_signature(cfg.export.path, cfg.variant)
    return {**settings, "profile": repo.tensorrt_profile(signature, cfg.max_batch_size, settings["max_context"])}


def load_and_check(client, cfg: DeployConfig, version: int) -> tuple[tuple[str, str] | None, dict | None]:
    """((``"load"`` | ``"smoke test"``, reason) or None, the smoke answer)."""
    from trainer_lib.serving.client import generate

    say(f"loading {cfg.model_name} on {cfg.triton.url}")
    try:
        repo.load(client, storage.join(cfg.repository, cfg.model_name), cfg.model_name)
    except Exception as exc:
        return ("load", reason(exc)), None
    try:
        answer = generate(client, cfg.model_name, cfg.smoke_prompt, cfg.smoke_max_tokens, version=str(version))
    except Exception as exc:
        return ("smoke test", reason(exc)), None
    if answer["model_version"] != str(version):
        return ("smoke test", f"version {answer['model_version']} answered instead of {version}"), None
    say(f"smoke test passed: {cfg.smoke_prompt!r} -> {answer['text_output']!r}")
    return None, {"prompt": cfg.smoke_prompt, **answer}


def reason(exc: Exception) -> str:
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
                repo.load(client, model_dir, cfg.model_name)
        except Exception as exc:
            note = f"; restoring the server failed too: {reason(exc)}"
    storage.delete(version_dir)
    return note


def read_history(model_dir: str) -> dict:
    path = storage.join(model_dir, HISTORY)
    if not storage.exists(path):
        return {"serving": None, "versions": []}
    try:
        return json.loads(storage.read_text(path))
    except ValueError as exc:
        raise UserError(f"{path}: not a deploy history ({exc}); fix or delete it") from None


def write_history(model_dir: str, history: dict) -> None:
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
