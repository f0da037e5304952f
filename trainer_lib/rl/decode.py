"""Our own decode loop for text rollouts: one prefill, then one forward per new token on a KV cache, with
finished rows dropped from the batch as they end.

Why not ``model.generate``: it keeps stepping every row until the longest one ends (GRPO completions vary a
lot in length), its multinomial sampler draws one random number per vocabulary entry (49,152 on SmolLM2,
14% of a CPU decode step), and every step runs its processor and criterion machinery. Here:

* the ``n`` samples of a prompt share its prefill (:func:`shared_prompt_cache`);
* :func:`sample_tokens` is a pure function that draws with one uniform number per row (inverse CDF:
  ``cumsum`` of the softmax weights, then ``searchsorted``), and returns each drawn token's log-prob under
  ``log_softmax(logits / temperature)``, the definition :func:`trainer_lib.rl.rollout.token_logprobs` scores
  (top-k / top-p truncation not counted);
* each step draws one uniform number for every row of the chunk, live or not, so a row's samples do not
  depend on which other rows are still running (compaction changes no sample, up to float rounding);
* decode steps pass a 4-D boolean attention mask: without one, transformers drops an all-ones mask and SDPA
  takes a kernel that is 1.6x slower per step on CPU for a one-token query.

The caller (:func:`trainer_lib.rl.rollout.generate`) cuts each row at its eos / stop string and builds the
Rollout; vision-language policies stay on ``model.generate``. Under ZeRO-3 (``synced``) every rank steps until
no rank has a row left, as transformers' ``synced_gpus`` does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def sample_tokens(
    logits: torch.Tensor, uniform: torch.Tensor | None, temperature: float, top_k: int = 0, top_p: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tokens (B,), log-probs (B,))`` drawn from next-token ``logits (B, V)``.

    Sampling (``temperature > 0``): ``p = softmax(logits / temperature)``, cut to the ``top_k`` most likely
    tokens and then to the smallest most-likely set whose mass reaches ``top_p`` (as transformers' warpers
    do), and token ``i`` is the first whose cumulative weight reaches ``u * total`` for the row's ``u`` in
    ``(0, 1]`` (``uniform`` holds ``1 - u``, as ``torch.rand`` gives ``[0, 1)``). Greedy at temperature 0
    (``uniform`` unused). The log-prob is ``log_softmax(logits / temperature)`` at the token (temperature 1
    when greedy), over the whole vocabulary: the truncation is not counted.
    """
    logits = logits.float()
    scaled = logits / temperature if temperature > 0 else logits
    top = scaled.max(-1, keepdim=True).values
    weights = torch.exp(scaled - top)  # softmax up to its normalizer
    normalizer = top.squeeze(-1) + weights.sum(-1).log()
    if temperature <= 0:
        tokens = logits.argmax(-1)
    else:
        kept, index = _truncated(weights, top_k, top_p)
        cdf = kept.cumsum(-1)
        target = (1.0 - uniform).unsqueeze(-1) * cdf[:, -1:]  # in (0, total]: never a zero-weight token
        pick = torch.searchsorted(cdf, target).clamp(max=cdf.shape[-1] - 1)
        tokens = (pick if index is None else index.gather(-1, pick)).squeeze(-1)
    return tokens, scaled.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - normalizer


def _truncated(weights: torch.Tensor, top_k: int, top_p: float) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The weights top-k / top-p keep, most likely first with their vocabulary ``index``; the weights as they
    are (``index`` None) without truncation. Top-p keeps a token while the mass before it is under ``top_p``."""
    if 0 < top_k < weights.shape[-1]:
        kept, index = weights.topk(top_k, dim=-1)
    elif top_p < 1.0:
        kept, index = weights.sort(dim=-1, descending=True)
    else:
        return weights, None
    if top_p < 1.0:
        mass = kept.cumsum(-1)
        kept = kept.masked_fill(mass - kept >= top_p * mass[:, -1:], 0.0)
    return kept, index


def shared_prompt_cache(model, ids: torch.Tensor, mask: torch.Tensor, n: int):
    """The KV cache of left-padded prompts ``ids`` (one row per prompt) up to their last token, computed once
    and repeated for the ``n`` samples of each prompt: ``generate`` given it and the prompts repeated ``n``
    times runs only their last token. Positions as ``generate`` numbers left-padded rows."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    model(
        input_ids=ids[:, :-1],
        attention_mask=mask[:, :-1],
        position_ids=positions[:, :-1],
        cache=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    cache.batch_repeat_interleave(n)
    return cache


class LiveRows:
    """The rows still decoding: their KV cache, attention mask over all it holds, next positions, and which
    row of the chunk each is (``rows``)."""

    def __init__(self, model, ids: torch.Tensor, mask: torch.Tensor, n: int):
        """Prefill left-padded prompts; ``n > 1``: rows come in groups of ``n`` equal prompts that share it."""
        from transformers import DynamicCache

        self.model, self.attention = model, mask
        self.rows = torch.arange(ids.shape[0], device=ids.device)
        self.positions = mask.sum(1) - 1  # of each row's last prompt token
        # our 4-D mask under SDPA; a sliding-window model keeps transformers' own (it masks per layer)
        sdpa = getattr(model.config, "_attn_implementation", None) == "sdpa"
        self.boolean_mask = sdpa and getattr(model.config, "sliding_window", None) is None
        if n > 1 and ids.shape[1] > 1:  # every prompt but its last token once, then the last token per row
            self.cache = shared_prompt_cache(model, ids[::n], mask[::n], n)
            self.logits = self._step(ids[:, -1])
        else:
            self.cache = DynamicCache(config=model.config)
            positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
            out = model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=positions,
                cache=self.cache,
                use_cache=True,
                logits_to_keep=1,
            )
            self.logits = out.logits[:, -1].float()

    def _step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Float next-token logits ``(L, V)`` after one token per live row at its position; the mask already
        covers the token."""
        mask = self.attention.bool()[:, None, None, :] if self.boolean_mask else self.attention
        out = self.model(
            input_ids=tokens.unsqueeze(1),
            attention_mask=mask,
            position_ids=self.positions.unsqueeze(1),
            cache=self.cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return out.logits[:, -1].float()

    def advance(self, tokens: torch.Tensor) -> None:
        """Feed each live row its next token; ``self.logits`` become those after it."""
        self.attention = torch.cat([self.attention, self.attention.new_ones((len(tokens), 1))], dim=1)
        self.positions = self.positions + 1
        self.logits = self._step(tokens)

    def keep(self, index: torch.Tensor) -> None:
        """Keep only these batch rows (the live ones), in this order."""
        self.cache.batch_select_indices(index)
        self.attention, self.positions = self.attention[index], self.positions[index]
        self.rows, self.logits = self.rows[index], self.logits[index]


class StopStrings:
    """Which rows' *generated* text contains a stop string, looking at their last few tokens only (every token
    decodes to at least one character); ``rollout``'s stopping criterion for ``generate`` calls it too."""

    def __init__(self, tokenizer, stop: list[str]):
        self.tokenizer, self.stop = tokenizer, list(stop)
        self.window = max(len(s) for s in self.stop) + 3

    def hits(self, rows: list[list[int]]) -> list[bool]:
        tails = self.tokenizer.batch_decode([row[-self.window :] for row in rows])
        return [any(s in text for s in self.stop) for text in tails]


@dataclass
class Decoded:
    tokens: list[list[int]]  # each row's new tokens, up to and including its eos / stop token
    logprobs: list[list[float]] | None  # each token's log-prob under the distribution it was drawn from


@torch.no_grad()
def decode(
    model,
    ids: torch.Tensor,
    mask: torch.Tensor,
    *,
    max_new_tokens: int,
    eos_ids: list[int],
    pad_id: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    n: int = 1,
    stop: StopStrings | None = None,
    generator: torch.Generator | None = None,
    logits_processor=None,
    compact_every: int = 1,
    synced: bool = False,
) -> Decoded:
    """Decode left-padded prompts ``ids`` / ``mask`` (on the model's device) until every row has ended.

    Args:
        n: rows come in groups of ``n`` equal prompts, which share one prefill.
        stop: ends a row once its generated text holds a stop string.
        generator: the sampler's random numbers (``temperature > 0``; None: one seeded with 0); the global RNG
            is not touched.
        logits_processor: ``(prompt ids, prompt mask) -> LogitsProcessor``, applied to the raw float logits of
            every step, before temperature (NLPO's action mask). It sees every row of the chunk with the ids so
            far (``pad_id`` after a row's end, as under ``generate``), so rows are not dropped then.
        compact_every: drop finished rows from the batch every this many steps (0: never).
        synced: a collective decode (a model partitioned with ZeRO-3 across ranks, whose every forward gathers
            parameters from all ranks): every step, the ranks agree whether any row anywhere still decodes, and a
            rank whose rows have all ended keeps running forwards (outputs discarded) until then.
    """
    generator = generator if generator is not None else torch.Generator(device=ids.device).manual_seed(0)
    processor = None if logits_processor is None else logits_processor(ids, mask)
    if processor is not None:
        compact_every = 0
        history = torch.full((ids.shape[0], max_new_tokens), pad_id, dtype=ids.dtype, device=ids.device)
    live = LiveRows(model, ids, mask, n)
    eos = set(eos_ids)
    tokens: list[list[int]] = [[] for _ in range(ids.shape[0])]
    logprobs: list[list[float]] = [[] for _ in range(ids.shape[0])]
    going = [max_new_tokens > 0] * ids.shape[0]
    for step in range(max_new_tokens):
        scores = live.logits
        if processor is not None:
            scores = processor(torch.cat([ids, history[:, :step]], dim=1), scores)
        uniform = None
        if temperature > 0:  # one number per row of the chunk, live or not
            uniform = torch.rand(ids.shape[0], generator=generator, device=ids.device)[live.rows]
        drawn, drawn_logprobs = sample_tokens(scores, uniform, temperature, top_k, top_p)
        rows = live.rows.tolist()
        feed = [pad_id] * len(rows)
        for j, (row, token, logprob) in enumerate(zip(rows, drawn.tolist(), drawn_logprobs.tolist())):
            if going[row]:
                tokens[row].append(token)
                logprobs[row].append(logprob)
                feed[j] = token
                going[row] = token not in eos and len(tokens[row]) < max_new_tokens
        if stop is not None:
            checked = [row for row in rows if going[row]]
            for row, hit in zip(checked, stop.hits([tokens[row] for row in checked]) if checked else []):
                going[row] = not hit
        if not (_going_anywhere(any(going), ids.device) if synced else any(going)):
            break
        feed = torch.tensor(feed, dtype=ids.dtype, device=ids.device)
        if processor is not None:
            history[:, step] = feed
        ended = not all(going[row] for row in rows)
        if compact_every and (step + 1) % compact_every == 0 and ended and any(going):
            index = torch.tensor([j for j, row in enumerate(rows) if going[row]], device=ids.device)
            live.keep(index)
            feed = feed[index]
        live.advance(feed)
    return Decoded(tokens, logprobs)


def _going_anywhere(going_here: bool, device) -> bool:
    """Whether a row of any rank still decodes (one all-reduce, every rank each step)."""
    import torch.distributed as dist

    flag = torch.tensor([1.0 if going_here else 0.0], device=device)
    dist.all_reduce(flag)
    return bool(flag.item())
