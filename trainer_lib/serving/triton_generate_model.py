"""Triton Python-backend model: raw text in, the model's completion out, over the exported ONNX decoder.

Copied as ``model.py`` into ``<repo>/<model>/<version>/``, next to ``model.onnx``, ``tokenizer/``,
``generate.json`` (eos ids, defaults) and ``ort_generate.py`` (the export's KV-cache loop,
:mod:`trainer_lib.export.ort_generate`, copied as is). It runs inside Triton's stub environment,
so it imports only numpy, onnxruntime, tokenizers, that loop and the backend's
``triton_python_backend_utils``: no torch, no transformers, no trainer_lib package (the serving
image, images/Dockerfile.triton, installs exactly these; tests/images checks the imports).

Where it runs: an instance Triton places on a CPU gets onnxruntime's CPU provider. One placed on
a GPU (``instance_group { kind: KIND_GPU }``) gets, in this order and each only if the installed
onnxruntime has it: TensorRT with FP16 engines (when generate.json has a ``tensorrt`` section,
which deploy writes for fp16 and fp32 on GPU instances), CUDA on the instance's GPU, then the CPU
for whatever the others do not run (:func:`execution_providers`). The server log names the
providers the session got.

Inputs follow Triton's generate extension, so ``POST /v2/models/<name>/generate`` with
``{"text_input": ..., "max_tokens": ..., "temperature": ...}`` works as well as ``infer``:

* ``text_input`` (string): the prompt as is (no chat template);
* ``max_tokens`` (int32, optional): new tokens at most (default from generate.json);
* ``temperature`` (fp32, optional): 0 (default) is greedy, > 0 samples from softmax(logits / t).

``text_output`` is the completion without the prompt; generation stops at an eos token or
``max_tokens``. Requests the dynamic batcher groups together are decoded as left-padded batches.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import numpy as np

try:
    import triton_python_backend_utils as pb_utils  # only inside Triton's stub
except ImportError:  # imported for a test or a local check
    pb_utils = None


TENSORRT = "TensorrtExecutionProvider"
CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"


def execution_providers(available: list[str], instance_kind: str, device_id: int = 0, tensorrt: dict | None = None):
    """onnxruntime's providers for one Triton instance, best first, as ``(name, options)`` pairs.

    Args:
        available: ``onnxruntime.get_available_providers()``, what this onnxruntime was built with.
        instance_kind: Triton's ``model_instance_kind``: ``"GPU"``, ``"CPU"`` or ``"MODEL"``.
        device_id: the instance's GPU (``model_instance_device_id``).
        tensorrt: TensorRT's options (:func:`tensorrt_options`); None: no TensorRT.

    A GPU instance gets TensorRT (if asked for), then CUDA, each only where ``available`` has it;
    the CPU comes last, for the nodes the others do not take, and is all a CPU instance gets.
    """
    providers = []
    if instance_kind == "GPU":
        if tensorrt is not None and TENSORRT in available:
            providers.append((TENSORRT, {**tensorrt, "device_id": device_id}))
        if CUDA in available:
            providers.append((CUDA, {"device_id": device_id}))
    return [*providers, (CPU, {})]


def tensorrt_options(cache_dir: str, profile: dict | None = None) -> dict:
    """TensorRT provider options: FP16 engines, cached (with the timing cache) under ``cache_dir``.

    ``profile`` (``{"min", "opt", "max"}`` shape strings, as deploy writes them into generate.json)
    fixes the input shapes one engine covers. Without it TensorRT rebuilds its engine whenever a
    shape leaves the range seen so far, which the growing KV cache does at every new length."""
    options = {
        "trt_fp16_enable": True,
        "trt_engine_cache_enable": True,
        "trt_engine_cache_path": cache_dir,
        "trt_timing_cache_enable": True,
        "trt_timing_cache_path": cache_dir,
    }
    if profile:
        options.update({f"trt_profile_{key}_shapes": profile[key] for key in ("min", "opt", "max")})
    return options


def engine_cache_dir(version_dir: str, configured: str = "", model: str = "", version: str = "") -> str:
    """Where TensorRT keeps its engines (created): ``configured/<model>/<version>`` when the deploy
    named a directory (a volume that outlives the server), else ``<version_dir>/tensorrt_cache``, or,
    where the version directory takes no new entries (KServe mounts the repository read-only), a
    directory under the temp dir."""
    if configured:
        path = os.path.join(configured, model, version)
        os.makedirs(path, exist_ok=True)
        return path
    try:
        path = os.path.join(version_dir, "tensorrt_cache")
        os.makedirs(path, exist_ok=True)
    except OSError:
        path = os.path.join(tempfile.gettempdir(), "posttrain-tensorrt", model, version)
        os.makedirs(path, exist_ok=True)
    return path


def read_settings(version_dir: str) -> dict:
    with open(os.path.join(version_dir, "generate.json"), encoding="utf-8") as f:
        return json.load(f)


def instance_providers(args: dict, version_dir: str, settings: dict) -> list:
    """:func:`execution_providers` for the instance Triton's ``args`` describe."""
    import onnxruntime as ort

    available = ort.get_available_providers()
    kind = args.get("model_instance_kind", "CPU")
    tensorrt = settings.get("tensorrt")
    options = None
    if kind == "GPU" and tensorrt and TENSORRT in available:
        cache = engine_cache_dir(
            version_dir, tensorrt.get("cache_dir") or "", args.get("model_name", ""), args.get("model_version", "")
        )
        options = tensorrt_options(cache, tensorrt.get("profile"))
    return execution_providers(available, kind, int(args.get("model_instance_device_id") or 0), options)


def _log(message: str) -> None:
    logger = getattr(pb_utils, "Logger", None)
    if logger is not None:
        logger.log_info(message)
    else:
        print(message, file=sys.stderr, flush=True)


class Generator:
    """Prompts in, completions out: the tokenizer around the shared ``OrtDecoder`` loop.

    The dynamic batcher may group requests with different ``max_tokens`` or ``temperature``;
    rows that share both are decoded as one left-padded batch. ``max_context`` (0: none) bounds
    prompt + ``max_tokens``: TensorRT's engines cover no longer sequences."""

    def __init__(self, version_dir: str, providers: list | None = None):
        from ort_generate import OrtDecoder  # copied next to this file (trainer_lib/export/ort_generate.py)
        from tokenizers import Tokenizer

        self.settings = read_settings(version_dir)
        self.tokenizer = Tokenizer.from_file(os.path.join(version_dir, "tokenizer", "tokenizer.json"))
        self.decoder = OrtDecoder(os.path.join(version_dir, "model.onnx"), providers=providers)
        self.eos = list(self.settings.get("eos_token_ids") or [])
        self.pad_id = int(self.settings.get("pad_token_id") or 0)
        self.max_context = 0

    def check_length(self, prompts: list[str], max_tokens: list[int]) -> None:
        """A ValueError for a prompt whose tokens plus its ``max_tokens`` exceed ``max_context``."""
        if not self.max_context:
            return
        for prompt, limit in zip(prompts, max_tokens):
            length = len(self.tokenizer.encode(prompt).ids)
            if length + limit > self.max_context:
                raise ValueError(
                    f"text_input: {length} prompt tokens + max_tokens {limit} exceed the {self.max_context} "
                    f"tokens this server's TensorRT engines were built for (deploy's tensorrt.max_context)"
                )

    def generate(self, prompts: list[str], max_tokens: list[int], temperatures: list[float]) -> list[str]:
        ids = [self.tokenizer.encode(p).ids for p in prompts]
        if any(not row for row in ids):
            raise ValueError("text_input: the prompt has no tokens")
        texts: list[str] = [""] * len(prompts)
        groups: dict[tuple[int, float], list[int]] = {}
        for row, key in enumerate(zip(max_tokens, temperatures)):
            groups.setdefault(key, []).append(row)
        for (limit, temperature), rows in groups.items():
            new = self.decoder.generate(
                [ids[r] for r in rows],
                limit,
                eos_token_id=self.eos or None,
                temperature=temperature,
                pad_token_id=self.pad_id,
            )
            for r, tokens in zip(rows, new):
                if tokens and tokens[-1] in self.eos:
                    tokens = tokens[:-1]
                texts[r] = self.tokenizer.decode(tokens, skip_special_tokens=True)
        return texts


def _scalar_per_row(request, name: str, rows: int, default, kind):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return [default] * rows
    values = tensor.as_numpy().reshape(-1).tolist()
    if len(values) == 1:
        values = values * rows
    if len(values) != rows:
        raise ValueError(f"{name}: expected 1 or {rows} values, got {len(values)}")
    return [kind(v) for v in values]


class TritonPythonModel:
    def initialize(self, args):
        version_dir = os.path.join(args["model_repository"], args["model_version"])
        providers = instance_providers(args, version_dir, read_settings(version_dir))
        self.generator = Generator(version_dir, providers)
        settings = self.generator.settings
        used = self.generator.decoder.session.get_providers()
        if TENSORRT in used:
            self.generator.max_context = int(settings["tensorrt"].get("max_context") or 0)
        _log(
            f"{args.get('model_name', 'model')} version {args['model_version']} on "
            f"{args.get('model_instance_kind', 'CPU')} {args.get('model_instance_device_id', 0)}: "
            f"asked onnxruntime for {[name for name, _ in providers]}, the session runs on {used}"
        )
        self.default_max_tokens = int(settings.get("default_max_tokens", 64))
        self.max_tokens_limit = int(settings.get("max_tokens_limit", 4096))
        # a version whose graph or tokenizer cannot decode must fail its load, not its first request
        self.generator.generate(["Hello"], [2], [0.0])

    def _parse(self, request):
        texts = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)
        prompts = [t.decode("utf-8") if isinstance(t, bytes) else str(t) for t in texts]
        if not all(prompts):
            raise ValueError("text_input: empty prompt")
        max_tokens = _scalar_per_row(request, "max_tokens", len(prompts), self.default_max_tokens, int)
        temps = _scalar_per_row(request, "temperature", len(prompts), 0.0, float)
        for m in max_tokens:
            if not 0 < m <= self.max_tokens_limit:
                raise ValueError(f"max_tokens: expected 1..{self.max_tokens_limit}, got {m}")
        for t in temps:
            if not (t >= 0 and np.isfinite(t)):
                raise ValueError(f"temperature: expected >= 0, got {t}")
        self.generator.check_length(prompts, max_tokens)
        return prompts, max_tokens, temps

    def execute(self, requests):
        responses: list = [None] * len(requests)
        batch = []  # (request index, prompts, max_tokens, temperatures)
        for i, request in enumerate(requests):
            try:
                batch.append((i, *self._parse(request)))
            except (ValueError, UnicodeDecodeError) as exc:
                responses[i] = pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(str(exc)))
        if batch:
            try:
                texts = self.generator.generate(
                    [p for _, ps, _, _ in batch for p in ps],
                    [m for _, _, ms, _ in batch for m in ms],
                    [t for _, _, _, ts in batch for t in ts],
                )
            except Exception as exc:
                error = pb_utils.TritonError(f"generation failed: {exc}")
                for i, *_ in batch:
                    responses[i] = pb_utils.InferenceResponse(output_tensors=[], error=error)
                return responses
            start = 0
            for i, prompts, _, _ in batch:
                out = np.array([[t.encode("utf-8")] for t in texts[start : start + len(prompts)]], dtype=np.object_)
                start += len(prompts)
                responses[i] = pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("text_output", out)])
        return responses

    def finalize(self):
        self.generator = None
