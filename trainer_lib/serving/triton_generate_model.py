"""Triton Python-backend model: raw text in, the model's completion out, over the exported ONNX decoder.

Copied as ``model.py`` into ``<repo>/<model>/<version>/``, next to ``model.onnx``, ``tokenizer/``,
``generate.json`` (eos ids, defaults) and ``ort_generate.py`` (the export's KV-cache loop,
:mod:`trainer_lib.export.ort_generate`, copied as is). It runs inside Triton's stub environment,
so it imports only numpy, onnxruntime, tokenizers, that loop and the backend's
``triton_python_backend_utils``: no torch, no transformers, no trainer_lib package.

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

import numpy as np

try:
    import triton_python_backend_utils as pb_utils  # only inside Triton's stub
except ImportError:  # imported for a test or a local check
    pb_utils = None


class Generator:
    """Prompts in, completions out: the tokenizer around the shared ``OrtDecoder`` loop.

    The dynamic batcher may group requests with different ``max_tokens`` or ``temperature``;
    rows that share both are decoded as one left-padded batch."""

    def __init__(self, version_dir: str, providers: list | None = None):
        from ort_generate import OrtDecoder  # copied next to this file (trainer_lib/export/ort_generate.py)
        from tokenizers import Tokenizer

        with open(os.path.join(version_dir, "generate.json"), encoding="utf-8") as f:
            self.settings = json.load(f)
        self.tokenizer = Tokenizer.from_file(os.path.join(version_dir, "tokenizer", "tokenizer.json"))
        self.decoder = OrtDecoder(os.path.join(version_dir, "model.onnx"), providers=providers)
        self.eos = list(self.settings.get("eos_token_ids") or [])
        self.pad_id = int(self.settings.get("pad_token_id") or 0)

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
        providers = None
        if args.get("model_instance_kind") == "GPU":
            import onnxruntime as ort

            if "CUDAExecutionProvider" in ort.get_available_providers():
                providers = [
                    ("CUDAExecutionProvider", {"device_id": int(args["model_instance_device_id"])}),
                    "CPUExecutionProvider",
                ]
        self.generator = Generator(version_dir, providers)
        settings = self.generator.settings
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
