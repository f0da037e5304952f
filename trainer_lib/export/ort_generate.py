"""Generation with an exported KV-cache decoder on onnxruntime: numpy and onnxruntime only.

No torch or transformers here, and nothing from trainer_lib: the Triton model repository carries
a copy of this file next to its ``model.py`` (keep it standalone). Use::

    from trainer_lib.export.ort_generate import OrtDecoder

    decoder = OrtDecoder("out/onnx/int8")            # a directory with model.onnx, or the file
    new_tokens = decoder.generate([[5, 6, 7], [8, 9]], max_new_tokens=32, eos_token_id=3)
    # -> list[list[int]]: the generated ids only (not the prompt), one list per prompt, each
    #    ending with the eos id if one was generated; at most max_new_tokens ids.

``OrtDecoder(model_path, providers=None, threads=0)``
    ``providers`` is passed to ``onnxruntime.InferenceSession`` (default CPU), e.g.
    ``["CUDAExecutionProvider", "CPUExecutionProvider"]`` with onnxruntime-gpu; ``providers``
    afterwards lists those the session really uses (onnxruntime drops one it cannot load).
    ``threads`` sets intra-op threads (0: onnxruntime's default). Every variant takes int64 ids
    and returns float32 logits; the cache arrays have the graph's type (float16 in the FP16 model).
``generate(input_ids, max_new_tokens, eos_token_id=None, temperature=0.0, seed=None, pad_token_id=0)``
    ``input_ids``: token ids per prompt, of any lengths (batched with left padding; the pad id
    never reaches attention). ``eos_token_id``: an id, a list of ids, or None (always generate
    ``max_new_tokens``). ``temperature`` 0 is greedy (argmax); above 0 it samples from
    ``softmax(logits / temperature)`` with ``numpy.random.default_rng(seed)``.
``forward(input_ids, attention_mask, position_ids, past)`` -> ``(logits, present)``
    One graph call on int64 numpy arrays; ``past``/``present`` are lists of
    ``[key_0, value_0, key_1, ...]`` arrays. ``empty_past(batch)`` gives the prefill's past.
``pad_left(input_ids, pad_token_id=0)`` -> ``(tokens, attention_mask, position_ids)``
    The left-padded prefill inputs that ``generate`` builds, for callers that drive ``forward``.

The graph interface is the one :mod:`trainer_lib.export.onnx_decoder` writes. Position ids
follow the attention mask (the first real token of a left-padded row is position 0), as
Hugging Face ``generate`` computes them, so outputs match PyTorch token for token.
"""

from __future__ import annotations

import os
import time

import numpy as np

_NUMPY_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64}


def pad_left(input_ids: list[list[int]], pad_token_id: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Prompts -> ``(tokens, attention_mask, position_ids)`` int64 arrays, left padded so every
    row's last token is in the last column; positions count real tokens only."""
    batch, width = len(input_ids), max(len(ids) for ids in input_ids)
    tokens = np.full((batch, width), pad_token_id, dtype=np.int64)
    mask = np.zeros((batch, width), dtype=np.int64)
    for row, ids in enumerate(input_ids):
        tokens[row, width - len(ids) :] = ids
        mask[row, width - len(ids) :] = 1
    return tokens, mask, np.maximum(np.cumsum(mask, axis=1) - 1, 0)


class OrtDecoder:
    """An onnxruntime session on an exported decoder, and its generation loop (see above)."""

    def __init__(self, model_path: str, providers: list | None = None, threads: int = 0):
        import onnxruntime as ort

        path = os.path.join(model_path, "model.onnx") if os.path.isdir(model_path) else model_path
        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(path, options, providers=providers or ["CPUExecutionProvider"])
        self.providers = self.session.get_providers()
        inputs = {i.name: i for i in self.session.get_inputs()}
        self.past_names = [name for name in inputs if name.startswith("past_key_values.")]
        self.output_names = [o.name for o in self.session.get_outputs()]
        first = inputs[self.past_names[0]]
        self.num_layers = len(self.past_names) // 2
        self.num_kv_heads, self.head_dim = int(first.shape[1]), int(first.shape[3])
        self.cache_dtype = _NUMPY_TYPES[first.type]
        self.last_timing: dict = {}

    def empty_past(self, batch: int) -> list[np.ndarray]:
        shape = (batch, self.num_kv_heads, 0, self.head_dim)
        return [np.zeros(shape, dtype=self.cache_dtype) for _ in self.past_names]

    def forward(
        self, input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray, past: list[np.ndarray]
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        feed = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": position_ids,
            **dict(zip(self.past_names, past)),
        }
        logits, *present = self.session.run(self.output_names, feed)
        return logits, present

    def generate(
        self,
        input_ids: list[list[int]],
        max_new_tokens: int,
        eos_token_id: int | list[int] | None = None,
        temperature: float = 0.0,
        seed: int | None = None,
        pad_token_id: int = 0,
    ) -> list[list[int]]:
        """New token ids per prompt (see the module docstring). ``last_timing`` afterwards holds
        ``prefill_s``, ``decode_s`` and ``decode_steps`` of this call."""
        if not input_ids or any(len(ids) == 0 for ids in input_ids):
            raise ValueError("input_ids: expected at least one prompt, each with at least one token")
        if max_new_tokens <= 0:
            return [[] for _ in input_ids]
        eos = set() if eos_token_id is None else {eos_token_id} if isinstance(eos_token_id, int) else set(eos_token_id)
        rng = np.random.default_rng(seed)
        batch = len(input_ids)
        tokens, mask, positions = pad_left(input_ids, pad_token_id)
        start = time.perf_counter()
        logits, past = self.forward(tokens, mask, positions, self.empty_past(batch))
        prefill_s, decode_start = time.perf_counter() - start, time.perf_counter()
        out: list[list[int]] = [[] for _ in range(batch)]
        done = np.zeros(batch, dtype=bool)
        steps = 0
        while True:
            next_ids = self._pick(logits[:, -1, :], temperature, rng)
            for row in np.flatnonzero(~done):
                out[row].append(int(next_ids[row]))
                done[row] = int(next_ids[row]) in eos or len(out[row]) >= max_new_tokens
            if done.all():
                break
            next_ids = np.where(done, pad_token_id, next_ids)  # finished rows run along, ignored
            mask = np.concatenate([mask, np.ones((batch, 1), dtype=np.int64)], axis=1)
            positions = mask.sum(axis=1, keepdims=True) - 1
            logits, past = self.forward(next_ids[:, None].astype(np.int64), mask, positions, past)
            steps += 1
        self.last_timing = {
            "prefill_s": prefill_s,
            "decode_s": time.perf_counter() - decode_start,
            "decode_steps": steps,
        }
        return out

    @staticmethod
    def _pick(logits: np.ndarray, temperature: float, rng: np.random.Generator) -> np.ndarray:
        if temperature <= 0:
            return logits.argmax(axis=-1)
        scaled = logits.astype(np.float64) / temperature
        probs = np.exp(scaled - scaled.max(axis=-1, keepdims=True))
        cdf = np.cumsum(probs / probs.sum(axis=-1, keepdims=True), axis=-1)
        return (cdf < rng.random((logits.shape[0], 1))).sum(axis=-1).clip(max=logits.shape[-1] - 1)
