"""How closely an exported decoder follows the PyTorch model it came from, and how fast it is.

Every figure compares a candidate (an :class:`~trainer_lib.export.ort_generate.OrtDecoder`)
with the reference (:class:`TorchDecoder`, the HF model behind the same ``forward``):

* logits at prefill (all prompts in one left-padded batch, real tokens only) and at one cached
  decode step (both sides fed the reference's greedy token, each on its own cache):
  max and mean ``|logits_onnx - logits_torch|``;
* top-1 agreement: the share of those positions (every real prompt position, plus the decode
  step) where both pick the same next token, i.e. teacher-forced greedy agreement;
* greedy exact match: ``OrtDecoder.generate`` vs ``model.generate(do_sample=False)``, one
  prompt at a time, the whole continuation equal token for token;
* decode latency, batch 1: the mean time of one cached single-token step after a warm-up;
* sizes: all files of a variant, and its weights alone (every initializer).

The PyTorch side of each figure (:func:`reference_logits`, :func:`torch_greedy`, its latency) is
computed first and kept as arrays, so the export stage can free the model before it opens the
first onnxruntime session: one copy of the weights in memory at a time.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass

import numpy as np

from trainer_lib.export.onnx_decoder import EXTERNAL_DATA
from trainer_lib.export.ort_generate import pad_left


class TorchDecoder:
    """The PyTorch model behind ``OrtDecoder.forward``'s interface (numpy in, numpy logits out);
    its ``past`` is the ``DynamicCache`` itself, updated in place."""

    def __init__(self, model):
        self.model = model

    def empty_past(self, batch: int):
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)

    def forward(self, input_ids, attention_mask, position_ids, past):
        import torch

        with torch.inference_mode():
            out = self.model(
                input_ids=torch.from_numpy(input_ids),
                attention_mask=torch.from_numpy(attention_mask),
                position_ids=torch.from_numpy(position_ids),
                past_key_values=past,
                use_cache=True,
            )
        return out.logits.float().numpy(), past


@contextlib.contextmanager
def torch_threads(threads: int):
    """Run with ``threads`` intra-op threads (0: leave as is), restoring the old count after."""
    import torch

    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _next_step(mask: np.ndarray, next_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    mask = np.concatenate([mask, np.ones((mask.shape[0], 1), dtype=np.int64)], axis=1)
    return next_ids[:, None].astype(np.int64), mask, mask.sum(axis=1, keepdims=True) - 1


#: padded tokens per forward of :func:`reference_logits` and :func:`logit_parity`: a chunk's logits are
#: tokens x vocabulary floats, 400 MB at 2,048 tokens of a 49,152-token vocabulary
CHUNK_TOKENS = 2048


def prompt_chunks(prompts: list[list[int]], budget: int | None = None) -> list[tuple[int, int]]:
    """``[(start, end), ...]``: consecutive prompts grouped so that each padded group holds at most
    ``budget`` tokens (default :data:`CHUNK_TOKENS`; a longer prompt alone)."""
    budget = budget or CHUNK_TOKENS
    chunks, start, longest = [], 0, 0
    for i, ids in enumerate(prompts):
        longest_with = max(longest, len(ids))
        if i > start and longest_with * (i - start + 1) > budget:
            chunks.append((start, i))
            start, longest_with = i, len(ids)
        longest = longest_with
    return chunks + [(start, len(prompts))] if prompts else chunks


@dataclass
class ReferenceLogits:
    """The reference's side of :func:`logit_parity`, computed once: prompts, prefill logits at the
    real positions (a file-backed array: a real vocabulary over thousands of positions is gigabytes),
    the greedy next token of every prompt, and the logits of that cached step."""

    prompts: list[list[int]]
    prefill: np.ndarray  # [real positions, vocab], memory-mapped
    next_ids: np.ndarray  # [batch]
    decode: np.ndarray  # [batch, 1, vocab]


def reference_logits(reference, prompts: list[list[int]]) -> ReferenceLogits:
    """Run ``reference`` (a :class:`TorchDecoder`) once, a chunk of prompts at a time, so that the model
    can be freed before the ONNX variants are compared with it. The prefill logits go to an anonymous
    temporary file (deleted with the array), so memory holds one chunk's logits at a time."""
    import tempfile

    positions, vocab = sum(map(len, prompts)), None
    prefill, next_ids, decode, at = None, [], [], 0
    for start, end in prompt_chunks(prompts):
        tokens, mask, position_ids = pad_left(prompts[start:end])
        logits, past = reference.forward(tokens, mask, position_ids, reference.empty_past(end - start))
        if prefill is None:
            vocab = logits.shape[-1]
            prefill = np.memmap(tempfile.TemporaryFile(), dtype=np.float32, mode="w+", shape=(positions, vocab))
        real = logits[mask.astype(bool)]
        prefill[at : at + len(real)] = real
        at += len(real)
        chunk_next = logits[:, -1].argmax(-1)
        step, _ = reference.forward(*_next_step(mask, chunk_next), past)
        next_ids.append(chunk_next)
        decode.append(step)
    return ReferenceLogits(prompts, prefill, np.concatenate(next_ids), np.concatenate(decode))


class _Differences:
    """max and mean |reference - candidate| over chunks, and the top-1 agreement of each position."""

    def __init__(self):
        self.worst, self.total, self.count, self.agree = 0.0, 0.0, 0, []

    def add(self, reference: np.ndarray, candidate: np.ndarray) -> None:
        delta = np.abs(reference.astype(np.float32) - candidate.astype(np.float32))
        self.worst = max(self.worst, float(delta.max()))
        self.total += float(delta.sum(dtype=np.float64))
        self.count += delta.size
        self.agree.append(reference.argmax(-1).reshape(-1) == candidate.argmax(-1).reshape(-1))

    def figures(self) -> dict:
        return {"max_abs_diff": self.worst, "mean_abs_diff": self.total / self.count}


def logit_parity(reference: ReferenceLogits, candidate) -> dict:
    """Logit differences at prefill and at one cached decode step (fed the reference's greedy
    token), and top-1 agreement, a chunk of prompts at a time as :func:`reference_logits` took them."""
    prefill, decode, at = _Differences(), _Differences(), 0
    for start, end in prompt_chunks(reference.prompts):
        tokens, mask, positions = pad_left(reference.prompts[start:end])
        logits, past = candidate.forward(tokens, mask, positions, candidate.empty_past(end - start))
        real = logits[mask.astype(bool)]  # padded positions have no meaningful logits
        prefill.add(np.asarray(reference.prefill[at : at + len(real)]), real)
        at += len(real)
        logits, _ = candidate.forward(*_next_step(mask, reference.next_ids[start:end]), past)
        decode.add(reference.decode[start:end, -1], logits[:, -1])
    agree = np.concatenate(prefill.agree + decode.agree)
    return {
        "prefill": prefill.figures(),
        "decode": decode.figures(),
        "top1_agreement": float(agree.mean()),
        "top1_positions": int(agree.size),
    }


def torch_greedy(
    model, prompts: list[list[int]], max_new_tokens: int, eos_token_id, pad_token_id: int
) -> list[list[int]]:
    """``model.generate`` greedy continuations (new ids only), one prompt at a time."""
    import torch
    from transformers import GenerationConfig

    config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=False,
        num_beams=1,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
    )
    outputs = []
    with torch.inference_mode():
        for ids in prompts:
            generated = model.generate(
                torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long), generation_config=config
            )
            outputs.append(generated[0, len(ids) :].tolist())
    return outputs


def greedy_parity(
    reference_outputs: list[list[int]], decoder, prompts: list[list[int]], max_new_tokens: int, eos_token_id
) -> dict:
    """Share of prompts whose ONNX greedy continuation equals PyTorch's exactly."""
    matches = sum(
        decoder.generate([ids], max_new_tokens, eos_token_id)[0] == expected
        for ids, expected in zip(prompts, reference_outputs)
    )
    return {
        "greedy_exact_match": matches / len(prompts),
        "greedy_matches": int(matches),
        "greedy_prompts": len(prompts),
    }


def decode_latency(decoder, prompt: list[int], steps: int, warmup: int = 3) -> dict:
    """Batch-1 cached decode: mean milliseconds per generated token, and tokens per second."""
    tokens, mask, positions = pad_left([prompt])
    logits, past = decoder.forward(tokens, mask, positions, decoder.empty_past(1))
    for i in range(warmup + steps):
        if i == warmup:
            start = time.perf_counter()
        step = _next_step(mask, logits[:, -1].argmax(-1))
        mask = step[1]
        logits, past = decoder.forward(*step, past)
    ms = (time.perf_counter() - start) / steps * 1000
    return {"decode_ms_per_token": round(ms, 4), "tokens_per_s": round(1000 / ms, 2)}


def directory_bytes(path: str) -> int:
    """Total size of the files in a model directory (``model.onnx`` plus its external data)."""
    return sum(
        os.path.getsize(os.path.join(path, name))
        for name in os.listdir(path)
        if os.path.isfile(os.path.join(path, name))
    )


def weight_bytes(path: str) -> int:
    """Bytes of all initializers of ``path/model.onnx``: its external data plus the small inline ones."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(os.path.join(path, "model.onnx"), load_external_data=False)
    inline = sum(
        numpy_helper.to_array(t).nbytes for t in model.graph.initializer if t.data_location != onnx.TensorProto.EXTERNAL
    )
    return inline + os.path.getsize(os.path.join(path, EXTERNAL_DATA))
