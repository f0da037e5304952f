"""Rollouts: sample ``n`` completions per prompt from the current policy, then score them per token.

This module is the seam for a faster engine (vLLM, SGLang): the RL stages only call
:func:`generate` (prompt token ids in, a :class:`Rollout` out) and :func:`token_logprobs`.

Text policies decode with our own loop (:mod:`trainer_lib.rl.decode`): one prefill, one forward per new
token on a KV cache, finished rows dropped from the batch, a sampler that needs one random number per row.
Every sampling setting is passed explicitly (a checkpoint's ``generation_config.json`` cannot switch on a
top-k or repetition penalty behind our back), and a fixed seed per call, so a resumed run samples exactly what
the interrupted one would have. The ``n`` samples of a prompt share its KV cache: every prompt but its last
token goes through the model once, and the cache is repeated for its ``n`` rows (``n - 1`` of every ``n``
prompt forwards saved; the samples are those of ``n`` separate prefills up to float rounding).

A vision-language policy (images) uses the model's own ``generate`` on left-padded batches. Under ZeRO-3 pass
``synced_gpus=True``: DeepSpeed's hooks then fetch each layer's weights for each forward (no rank holds the
whole model), which is a collective, so a rank whose rows are all done keeps stepping until every rank's are
(our decode loop's ``synced``, as transformers' ``synced_gpus`` does).

Layout of a :class:`Rollout` of ``N`` sequences (``n`` consecutive ones per prompt)::

    prompt_ids     (N, P)  left-padded         prompt_mask    (N, P)  1 on prompt tokens
    response_ids   (N, R)  right-padded        response_mask  (N, R)  1 up to and including
                                                                      the eos / stop token
                                               action_mask    (N, R)  multi-turn only: 1 on the
                                                                      model's tokens, 0 on the
                                                                      environment's (loss_mask)
A vision-language policy's rollout also holds ``pixel_values``: the images of all its rows, in row order
(``image_counts`` per row), passed to ``generate`` and to every forward over the rollout.

A response ends at the first eos (the tokenizer's, or any the checkpoint's generation config
lists), at the token that completes a stop string (the text is cut before the stop string, the
token stays so the policy learns to stop), or at ``max_new_tokens`` (``finished`` is False then).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

import torch

from trainer_lib.rl.decode import shared_prompt_cache


@dataclass
class Rollout:
    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    completions: list[str]
    finished: list[bool]
    stats: dict = field(default_factory=dict)
    pixel_values: torch.Tensor | None = None  # a vision-language policy's images, all rows' in row order
    image_counts: list[int] | None = None  # images per row
    logprobs: torch.Tensor | None = None  # (N, R) the sampler's log-probs of the response tokens, if recorded
    # a multi-turn rollout (trainer_lib.rl.multi_turn): 1 on the tokens the model sampled, 0 on the environment's
    action_mask: torch.Tensor | None = None  # (N, R)
    episodes: list | None = None  # one multi_turn.Trajectory per row: per-step rewards, done reason, turn spans
    # set when the step's rollout is scored (not carried by select): what samples.jsonl shows
    prompts: list | None = None  # each row's prompt as the reward functions saw it
    reward_table: torch.Tensor | None = None  # (N, S) each reward source's raw score, NaN where it had none

    def __len__(self) -> int:
        return self.response_ids.shape[0]

    def select(self, rows) -> Rollout:
        """The given rows, with columns that are padding in all of them trimmed off."""
        rows = torch.as_tensor(rows, dtype=torch.long)
        prompt_mask, response_mask = self.prompt_mask[rows], self.response_mask[rows]
        first = int(prompt_mask.any(0).float().argmax()) if prompt_mask.any() else prompt_mask.shape[1]
        width = int(response_mask.sum(1).max()) if len(rows) else 0
        return Rollout(
            self.prompt_ids[rows, first:],
            prompt_mask[:, first:],
            self.response_ids[rows, :width],
            response_mask[:, :width],
            [self.completions[i] for i in rows.tolist()],
            [self.finished[i] for i in rows.tolist()],
            **self.images_of(rows.tolist()),
            logprobs=None if self.logprobs is None else self.logprobs[rows, :width],
            action_mask=None if self.action_mask is None else self.action_mask[rows, :width],
            episodes=None if self.episodes is None else [self.episodes[i] for i in rows.tolist()],
        )

    def images_of(self, rows: list[int]) -> dict:
        """``{"pixel_values", "image_counts"}`` of the given rows; empty without images."""
        if self.pixel_values is None:
            return {}
        starts = [0, *itertools.accumulate(self.image_counts)]
        index = [j for i in rows for j in range(starts[i], starts[i + 1])]
        if not index:
            return {}
        return {
            "pixel_values": self.pixel_values[torch.tensor(index, dtype=torch.long)],
            "image_counts": [self.image_counts[i] for i in rows],
        }

    def model_inputs(self, device) -> dict:
        """``input_ids`` / ``attention_mask`` / ``position_ids`` of prompt + response (and ``pixel_values``)."""
        input_ids = torch.cat([self.prompt_ids, self.response_ids], dim=1).to(device)
        attention_mask = torch.cat([self.prompt_mask, self.response_mask], dim=1).to(device)
        position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}
        if self.pixel_values is not None:
            inputs["pixel_values"] = self.pixel_values.to(device)
        return inputs

    def response_lengths(self) -> torch.Tensor:
        return self.response_mask.sum(1)

    @property
    def loss_mask(self) -> torch.Tensor:
        """``(N, R)`` the tokens that carry loss, KL and advantage: the model's own (``action_mask``) in a
        multi-turn rollout, every response token otherwise. ``response_mask`` stays what attention sees."""
        return self.response_mask if self.action_mask is None else self.action_mask


def eos_token_ids(model, tokenizer) -> list[int]:
    """The tokenizer's eos plus any end-of-turn ids the checkpoint's generation config lists."""
    ids = [tokenizer.eos_token_id]
    extra = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids += extra if isinstance(extra, list) else [extra]
    return list(dict.fromkeys(i for i in ids if i is not None))


def _generation_config(
    eos_ids: list[int], pad_id: int, *, max_new_tokens: int, temperature: float, top_p: float, top_k: int
):
    from transformers import GenerationConfig

    sampling = (
        {"do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": top_k, "min_p": 0.0, "typical_p": 1.0}
        if temperature > 0
        else {"do_sample": False}
    )
    return GenerationConfig(
        max_new_tokens=max_new_tokens,
        num_beams=1,
        repetition_penalty=1.0,
        no_repeat_ngram_size=0,
        min_new_tokens=0,
        use_cache=True,
        eos_token_id=eos_ids,
        pad_token_id=pad_id,
        return_dict_in_generate=False,
        **sampling,
    )


def _stopping_criteria(tokenizer, stop: list[str], prompt_width: int):
    """Stop a row once its *generated* text contains a stop string (transformers' own
    ``stop_strings`` also match text that starts in the prompt): our decode loop's :class:`StopStrings`."""
    from transformers import StoppingCriteria, StoppingCriteriaList

    from trainer_lib.rl.decode import StopStrings

    if not stop:
        return None
    strings = StopStrings(tokenizer, stop)

    class StopStringCriterion(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.tensor(strings.hits(input_ids[:, prompt_width:].tolist()), device=input_ids.device)

    return StoppingCriteriaList([StopStringCriterion()])


class SampledLogprobs:
    """A logits processor that records, for each row, the log-prob of the token sampled at each step under
    the distribution it was drawn from: ``log_softmax(logits / temperature)`` after every processor before it
    (NLPO's mask included), as :func:`token_logprobs` defines it (top-k / top-p truncation not counted).

    ``generate`` calls it once per new token with the ids so far; the last column of those ids is the token
    drawn from the previous call's distribution, so one ``(B, vocab)`` table is held at a time."""

    def __init__(self, temperature: float):
        self.temperature = temperature if temperature > 0 else 1.0
        self.pending: torch.Tensor | None = None
        self.taken: list[torch.Tensor] = []

    def _take(self, tokens: torch.Tensor) -> None:
        if self.pending is not None:
            self.taken.append(self.pending.gather(-1, tokens.unsqueeze(-1)).squeeze(-1))
            self.pending = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self._take(input_ids[:, -1])
        self.pending = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def columns(self, new_tokens: torch.Tensor) -> torch.Tensor:
        """``(B, T)`` log-probs of the ``(B, T)`` tokens generated."""
        if new_tokens.shape[1]:
            self._take(new_tokens[:, -1])
        return torch.stack(self.taken, dim=1).cpu() if self.taken else torch.zeros((new_tokens.shape[0], 0))


def _images(pixels: list | None, device=None) -> dict:
    """``{"pixel_values": ...}``: the images of rows that have them, in row order; empty without any."""
    if pixels is None or all(p is None for p in pixels):
        return {}
    return {"pixel_values": torch.cat([p for p in pixels if p is not None]).to(device or "cpu")}


def _processor_list(logits_processor, ids: torch.Tensor, mask: torch.Tensor, recorder: SampledLogprobs | None):
    """The caller's processor for this chunk (``logits_processor(ids, mask)``), then the recorder, last, so it
    sees what the processors before it made of the logits; None without either."""
    from transformers import LogitsProcessorList

    processors = LogitsProcessorList()
    if logits_processor is not None:
        processors.append(logits_processor(ids, mask))
    if recorder is not None:
        processors.append(recorder)
    return processors or None


def _cut(tokenizer, ids: list[int], stop: list[str], eos_ids: list[int] | None = None) -> tuple[list[int], str, bool]:
    """(response tokens, completion text, finished) for one row of generated tokens."""
    eos_ids = set(eos_ids or [tokenizer.eos_token_id])
    end, finished = len(ids), False
    first_eos = next((i for i, token in enumerate(ids) if token in eos_ids), None)
    if first_eos is not None:
        end, finished = first_eos + 1, True
    if stop:
        text = tokenizer.decode(ids[:end])
        if any(s in text for s in stop):
            lo, hi = 1, end  # the shortest prefix whose text contains a stop string
            while lo < hi:
                mid = (lo + hi) // 2
                if any(s in tokenizer.decode(ids[:mid]) for s in stop):
                    hi = mid
                else:
                    lo = mid + 1
            end, finished = lo, True
    ids = ids[:end]
    text = tokenizer.decode(ids, skip_special_tokens=True)
    for s in stop:
        cut = text.find(s)
        if cut >= 0:
            text = text[:cut]
    return ids, text, finished


def cut_completion(
    tokenizer, ids: list[int], stop: list[str] | tuple = (), eos_ids: list[int] | None = None
) -> tuple[list[int], str, bool]:
    """The cut :func:`generate` makes of each row, for engines that generate the tokens elsewhere (an
    exported ONNX decoder, vLLM): (response tokens, completion text, finished)."""
    return _cut(tokenizer, list(ids), list(stop), eos_ids)


def pad_rows(rows: list[list[int]], value: int, left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, mask)`` of token rows padded with ``value`` to the longest, on the left or the right."""
    width = max((len(r) for r in rows), default=0)
    ids = torch.full((len(rows), width), value, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        if not row:
            continue
        cols = slice(width - len(row), width) if left else slice(0, len(row))
        ids[i, cols] = torch.tensor(row, dtype=torch.long)
        mask[i, cols] = 1
    return ids, mask


@torch.no_grad()
def generate(
    model,
    tokenizer,
    prompt_ids: list[list[int]],
    *,
    n: int = 1,
    max_new_tokens: int = 64,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    stop: list[str] | tuple = (),
    batch_size: int = 64,
    seed: int = 0,
    synced_gpus: bool = False,
    logits_processor=None,
    pixel_values: list | None = None,
    record_logprobs: bool = False,
    use_generate: bool = False,
) -> Rollout:
    """``n`` samples for each prompt (token ids), ``batch_size`` sequences per decode call.

    Text policies decode with :func:`trainer_lib.rl.decode.decode` (finished rows leave the batch); a
    vision-language policy uses the model's ``generate``; ``synced_gpus`` runs the same loop in step across ranks.
    ``temperature=0`` is greedy decoding. Sampling draws from a generator seeded with ``seed``
    (the global RNG is left as it was). ``stats`` holds ``generate_time`` and ``tokens_per_s``.
    ``synced_gpus``: every rank calls this with the same number of chunks (see the module's docs).
    ``logits_processor``: ``(prompt ids, prompt attention mask) -> transformers.LogitsProcessor``,
    called for each chunk of left-padded prompts and applied to the raw next-token logits before
    temperature, top-k and top-p (NLPO's action mask).
    ``pixel_values``: a vision-language policy's images, one ``(images, 3, H, W)`` tensor (or None) per prompt.
    ``record_logprobs``: the Rollout's ``logprobs`` hold each response token's log-prob under the distribution
    it was sampled from (:func:`trainer_lib.rl.decode.sample_tokens`, :class:`SampledLogprobs` under
    ``generate``; :func:`trainer_lib.losses.truncated_importance_weights`).
    ``use_generate``: the model's ``generate`` for a text policy too (benchmarks and parity checks).
    """
    device = next(model.parameters()).device
    eos_ids = eos_token_ids(model, tokenizer)
    expanded = [list(p) for p in prompt_ids for _ in range(n)]
    pixels = None if pixel_values is None else [p for p in pixel_values for _ in range(n)]
    pad = tokenizer.pad_token_id
    text_policy = getattr(model.config, "image_token_id", None) is None
    own_loop = not use_generate and pixels is None and text_policy
    settings = {"max_new_tokens": max_new_tokens, "temperature": temperature, "top_p": top_p, "top_k": top_k}
    responses, texts, finished, sampled = [], [], [], []
    was_training = model.training
    model.eval()
    start = time.perf_counter()
    devices = [device.index or 0] if device.type == "cuda" else []
    # the n samples of a prompt share its prefill (not under synced_gpus, whose ranks must run the same forwards,
    # nor with images), when a chunk holds whole groups
    share = n > 1 and batch_size >= n and not synced_gpus and pixels is None
    step = batch_size - batch_size % n if share else batch_size
    generator = torch.Generator(device=device).manual_seed(seed)
    common = {
        "settings": settings,
        "eos_ids": eos_ids,
        "stop": list(stop),
        "n": n if share else 1,  # rows come in groups of n equal prompts that share a prefill
        "logits_processor": logits_processor,
    }
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        for chunk_start in range(0, len(expanded), step):
            ids, mask = (t.to(device) for t in pad_rows(expanded[chunk_start : chunk_start + step], pad, left=True))
            if own_loop:
                rows, chunk_logprobs = _decode_chunk(
                    model, tokenizer, ids, mask, generator=generator, synced=synced_gpus, **common
                )
            else:
                chunk_pixels = None if pixels is None else pixels[chunk_start : chunk_start + step]
                rows, chunk_logprobs = _generate_chunk(
                    model, tokenizer, ids, mask, synced_gpus, chunk_pixels, record_logprobs, **common
                )
            for i, row in enumerate(rows):
                response, text, done = _cut(tokenizer, row, list(stop), eos_ids)
                if record_logprobs:
                    sampled.append(torch.as_tensor(chunk_logprobs[i][: len(response)], dtype=torch.float32))
                responses.append(response)
                texts.append(text)
                finished.append(done)
    elapsed = time.perf_counter() - start
    model.train(was_training)
    logprobs = torch.nn.utils.rnn.pad_sequence(sampled, batch_first=True) if record_logprobs else None
    return _assemble(expanded, responses, texts, finished, pad, elapsed, pixels, logprobs)


def _assemble(prompts, responses, texts, finished, pad: int, elapsed: float, pixels, logprobs) -> Rollout:
    """The Rollout of the prompts (one per row) and their cut responses, with its timing stats."""
    prompt_tensor, prompt_mask = pad_rows(prompts, pad, left=True)
    response_tensor, response_mask = pad_rows(responses, pad, left=False)
    tokens = int(response_mask.sum())
    stats = {"generate_time": elapsed, "generated_tokens": tokens, "tokens_per_s": tokens / max(elapsed, 1e-9)}
    images = _images(pixels)
    if images:
        images["image_counts"] = [0 if p is None else p.shape[0] for p in pixels]
    return Rollout(
        prompt_tensor, prompt_mask, response_tensor, response_mask, texts, finished, stats, **images, logprobs=logprobs
    )


def _decode_chunk(model, tokenizer, ids, mask, *, settings, eos_ids, stop, n, generator, synced, logits_processor):
    """One chunk through our own decode loop: (each row's new tokens, their sampled log-probs)."""
    from trainer_lib.rl.decode import StopStrings, decode

    decoded = decode(
        model,
        ids,
        mask,
        **settings,
        eos_ids=eos_ids,
        pad_id=tokenizer.pad_token_id,
        n=n,
        stop=StopStrings(tokenizer, stop) if stop else None,
        generator=generator,
        logits_processor=logits_processor,
        synced=synced,
    )
    return decoded.tokens, decoded.logprobs


def _generate_chunk(
    model, tokenizer, ids, mask, synced_gpus, pixels, record_logprobs, *, settings, eos_ids, stop, n, logits_processor
):
    """One chunk through the model's ``generate`` (the global RNG seeded by the caller): (each row's new
    tokens, their sampled log-probs or None)."""
    config = _generation_config(eos_ids, tokenizer.pad_token_id, **settings)
    image_token = getattr(model.config, "image_token_id", None)
    if image_token is not None:  # a vision-language policy never writes an image token (it has no pixels for it)
        config.suppress_tokens = [image_token]
    shared = {}
    if n > 1 and ids.shape[1] > 1:
        shared["cache"] = shared_prompt_cache(model, ids[::n], mask[::n], n)
    recorder = SampledLogprobs(settings["temperature"]) if record_logprobs else None
    out = model.generate(
        **_images(pixels, ids.device),
        **shared,
        input_ids=ids,
        attention_mask=mask,
        generation_config=config,
        stopping_criteria=_stopping_criteria(tokenizer, stop, ids.shape[1]),
        logits_processor=_processor_list(logits_processor, ids, mask, recorder),
        synced_gpus=synced_gpus,
    )
    new = out[:, ids.shape[1] :]
    return new.tolist(), recorder.columns(new) if recorder is not None else None


class SplitRows:
    """A rollout's padded rows as one padding-free row cut into a sequence group's chunks
    (:class:`~trainer_lib.engine.sequence.SequenceShards`): this rank's chunk of the model's inputs, which of
    its positions predict a response token (``scored``) and that token (``targets``), and the way back from
    per-position values of the chunk to the rollout's ``(N, R)`` layout."""

    def __init__(self, rollout: Rollout, shards, device):
        from trainer_lib.data.tokenize import boundary_kwargs

        inputs = rollout.model_inputs(device)
        self.keep, self.shards, self.rollout, self.device = inputs["attention_mask"].bool(), shards, rollout, device
        is_response = torch.cat([torch.zeros_like(rollout.prompt_mask), rollout.response_mask], dim=1).to(device)
        bounds = torch.cat([torch.zeros(1, dtype=torch.long), self.keep.sum(1).cpu().cumsum(0)])
        row = {
            "input_ids": inputs["input_ids"][self.keep][None],
            "position_ids": inputs["position_ids"][self.keep][None],
            "is_response": is_response.bool()[self.keep][None],  # scored: the token after is a response's
            **boundary_kwargs(bounds, device),
        }
        self.length = row["input_ids"].shape[1]
        self.inputs, shifted = shards.split(row, {"input_ids": 0, "is_response": False})
        self.targets, self.scored = shifted["input_ids"], shifted["is_response"]

    def back_in_place(self, chunk: torch.Tensor) -> torch.Tensor:
        """``(1, chunk)`` values of this rank's positions -> the group's joined (each rank's gradient its own
        chunk's) -> ``(N, R)`` at the positions that predict each response token, 0 past a response's end."""
        whole = self.shards.gather_with_grad(chunk)[0, : self.length]
        spread = torch.zeros(self.keep.shape, dtype=whole.dtype, device=whole.device).masked_scatter(self.keep, whole)
        start, width = self.rollout.prompt_ids.shape[1] - 1, self.rollout.response_ids.shape[1]
        return spread[:, start : start + width] * self.rollout.response_mask.to(whole.device)


def split_token_logprobs(
    model, rollout: Rollout, shards, temperature: float = 1.0, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`token_logprobs` of a rollout every rank of a sequence group holds, its rows split over the group
    (:class:`SplitRows`): each rank scores its chunk's positions, the chunks joined again."""
    from trainer_lib.models.lm_head import position_logprobs

    rows = SplitRows(rollout, shards, next(model.parameters()).device)
    logprobs, entropy = position_logprobs(model, rows.inputs, rows.targets, rows.scored, temperature, with_entropy)
    return rows.back_in_place(logprobs), None if entropy is None else rows.back_in_place(entropy.detach()).detach()


def token_logprobs(
    model,
    rollout: Rollout,
    temperature: float = 1.0,
    with_entropy: bool = False,
    *,
    entropy_grad: bool = False,
    allowed: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log pi(y_t | x, y_<t) `` of every response token, ``(N, R)``, and optionally the
    entropy of each next-token distribution (without gradient, unless ``entropy_grad``).

    Logits are divided by the sampling temperature, so the log-probs are those of the
    distribution the tokens were drawn from (minus top-k / top-p truncation). ``allowed``, a
    boolean ``(N, R, vocab)`` tensor, restricts each position's distribution to its True tokens
    (renormalized over them; NLPO's masked policy); every response token must be allowed.
    """
    device = next(model.parameters()).device
    inputs = rollout.model_inputs(device)
    width = rollout.response_ids.shape[1]
    mask = rollout.response_mask.to(device)
    if allowed is None and not entropy_grad:  # the LM head a tile at a time (models/lm_head.py)
        from trainer_lib.models.lm_head import scored_logprobs

        scored = scored_logprobs(model, inputs, rollout.response_ids.to(device), mask, temperature, with_entropy)
        if scored is not None:
            return scored
    logits = model(**inputs, use_cache=False, logits_to_keep=width + 1).logits[:, :-1].float()
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    if allowed is not None:  # the lowest float, not -inf: 0 * it stays 0 in the entropy below
        logits = logits.masked_fill(~allowed.to(device), torch.finfo(logits.dtype).min)
    targets = rollout.response_ids.to(device)
    normalizer = torch.logsumexp(logits, dim=-1)
    logprobs = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - normalizer
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy = (normalizer - (torch.softmax(logits, dim=-1) * logits).sum(-1)) * mask
    return logprobs * mask, entropy
