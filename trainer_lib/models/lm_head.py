"""Token log-probs and losses of a causal LM through its LM head a tile at a time (``losses/chunked_head.py``).

The model runs with ``logits_to_keep=1`` (transformers projects one position onto the vocabulary)
and returns its final, normalised hidden states; only the positions that are scored (completion
tokens, SFT labels, RL responses) go through the head. Used when the head is a plain ``Linear``
without bias (Llama, Qwen2/3, Mistral, Gemma 1, Phi-3 ...), and not when:

* ``model.chunked_lm_head=false`` (the model is then marked at load, :func:`use_full_logits`);
* the model rescales or caps its logits (``final_logit_softcapping`` of Gemma 2/3, ``logit_scale``);
* the head is wrapped (LoRA on ``lm_head``, ``modules_to_save``) or partitioned by ZeRO-3;
* the model's forward takes no ``logits_to_keep`` (older remote modelling code);

then the full logits are taken, as transformers computes them. Which path a stage uses is logged
once per model (``lm head: ...``).
"""

from __future__ import annotations

import inspect
import logging

import torch

log = logging.getLogger(__name__)

_FULL = "_posttrain_full_logits"


def use_full_logits(model) -> None:
    """Mark ``model`` (``model.chunked_lm_head=false``) to take full logits everywhere."""
    setattr(model, _FULL, True)


def _unwrapped(model):
    model = getattr(model, "module", model)  # a DeepSpeed engine
    return model.get_base_model() if hasattr(model, "get_base_model") else model  # a PeftModel


def _why_full(base) -> str | None:
    if getattr(base, _FULL, False):
        return "model.chunked_lm_head=false"
    head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    if type(head) is not torch.nn.Linear or head.bias is not None:
        return f"the output layer is a {type(head).__name__}, not a Linear without bias"
    config = getattr(base, "config", None)
    for key in ("final_logit_softcapping", "logit_scale", "output_multiplier_scale"):
        if getattr(config, key, None) not in (None, 1, 1.0):
            return f"the model's config sets {key}"
    if hasattr(head.weight, "ds_id"):
        return "ZeRO-3 partitions the head"
    if "logits_to_keep" not in inspect.signature(base.forward).parameters:  # e.g. older remote modelling code
        return "the model's forward takes no logits_to_keep"
    return None


_SAID: set[int] = set()


def head_weight(model) -> torch.Tensor | None:
    """The LM head's weight if the tiled path applies to ``model``, else None (logged once)."""
    base = _unwrapped(model)
    reason = _why_full(base)
    if id(base) not in _SAID:
        _SAID.add(id(base))
        log.info("lm head: %s", f"full logits ({reason})" if reason else "tiled log-probs, no full logits")
    return None if reason else base.get_output_embeddings().weight


def final_hidden(model, inputs: dict, share_prefixes: bool = False) -> torch.Tensor:
    """``(B, T, H)`` final hidden states (after the last norm), with the head applied to one position only.

    A padded batch runs padding-free: its rows' real tokens as one row, each sequence attending to itself
    only (as ``data.packing``'s rows, ``models/attention.py``), at their own positions; the states are put
    back in place, zeros at padding. The same states as the padded forward (to float rounding, tested),
    without the work on padding: a rollout's left-padded prompts are as wide as its longest.
    ``share_prefixes``: rows that begin alike (the completions of one prompt) run their common beginning
    once (:func:`shared_prefix_inputs`), where that saves tokens."""
    shared = shared_prefix_inputs(model, inputs) if share_prefixes else None
    flat = shared or padding_free_inputs(model, inputs)
    if flat is None:
        return model(**inputs, use_cache=False, output_hidden_states=-1, logits_to_keep=1).hidden_states[-1]
    keep, packed, order = flat if shared else (*flat, None)
    hidden = model(**packed, use_cache=False, output_hidden_states=-1, logits_to_keep=1).hidden_states[-1][0]
    if order is not None:  # the packed row's states in the rows' token order (a prefix's state once per row)
        hidden = hidden[order]
    return hidden.new_zeros(*keep.shape, hidden.shape[-1]).masked_scatter(keep.unsqueeze(-1), hidden)


#: The least common beginning two rows must share to run it once, in tokens; and the least share of a batch's
#: tokens that sharing must save to be used (else the batch runs padding-free, each row whole).
MIN_SHARED_PREFIX, MIN_SAVED = 16, 0.1


def prefix_groups(rows: list[list[tuple[int, int]]]) -> list[tuple[int, list[int]]]:
    """``(prefix length, member rows)`` over consecutive ``rows`` (each its real tokens as ``(id, position)``):
    a row joins the group before it when it shares at least :data:`MIN_SHARED_PREFIX` tokens with the group's
    first row and the group saves no fewer tokens with it than without it; a row alone has its whole length.
    Every member keeps at least one token of its own after the prefix."""
    groups: list[tuple[int, list[int]]] = []
    for index, row in enumerate(rows):
        if groups:
            length, members = groups[-1]
            first = rows[members[0]]
            common = next((t for t, (x, y) in enumerate(zip(first, row)) if x != y), min(len(first), len(row)))
            shared = min(common, len(row) - 1, len(first) - 1, length)
            count = len(members)
            if shared >= MIN_SHARED_PREFIX and count * shared >= (count - 1) * length:
                groups[-1] = (shared, [*members, index])
                continue
        groups.append((len(row), [index]))
    return groups


def windowed(model) -> bool:
    """Whether an attention layer of ``model`` may have a sliding window (shared prefixes do not keep one): the
    config names a window for layers not all ``full_attention`` (Mistral's), or a layer holds one."""
    config = getattr(model, "config", None)
    layer_types = getattr(config, "layer_types", None) or ()
    if getattr(config, "sliding_window", None) and not (layer_types and set(layer_types) == {"full_attention"}):
        return True
    return any(getattr(module, "sliding_window", None) for module in model.modules())


def shared_prefix_inputs(model, inputs: dict) -> tuple[torch.Tensor, dict, torch.Tensor] | None:
    """``(real-token mask (B, T), one-row inputs, order)`` where the batch's rows, in any order, share
    beginnings (:func:`prefix_groups` over the rows sorted): the row holds each group's common prefix once,
    then each member's remainder, attended by :func:`trainer_lib.models.attention.shared_prefix_sdpa`;
    ``order`` picks, for every real token of the batch in row order, its state's place in the packed row.
    None where it does not apply (the model's attention is not ``posttrain_sdpa``, it has sliding windows,
    or :func:`padding_free_inputs` would not apply) or saves under :data:`MIN_SAVED` of the tokens."""
    from trainer_lib.models.attention import NAME, PREFIX_GROUPS

    base = _unwrapped(model)
    if getattr(getattr(base, "config", None), "_attn_implementation", None) != NAME or windowed(base):
        return None
    if padding_free_inputs(model, inputs) is None:
        return None
    keep = inputs["attention_mask"].bool()
    positions = inputs.get("position_ids")
    if positions is None:
        positions = torch.arange(keep.shape[1], device=keep.device).expand_as(keep)
    ids_rows, position_rows = inputs["input_ids"].tolist(), positions.tolist()
    rows = [
        [(i, p) for i, p, k in zip(ids, pos, kept) if k]
        for ids, pos, kept in zip(ids_rows, position_rows, keep.tolist())
    ]
    # rows that begin alike side by side (an update's micro-batch holds a shuffle of the rollouts)
    ranked = sorted(range(len(rows)), key=rows.__getitem__)
    groups = [(length, [ranked[m] for m in members]) for length, members in prefix_groups([rows[i] for i in ranked])]
    total = sum(len(row) for row in rows)
    # each group: its prefix once, then every member's remainder (a row alone: the prefix is all of it)
    packed_length = sum(length + sum(len(rows[m]) - length for m in members) for length, members in groups)
    if packed_length > (1 - MIN_SAVED) * total:
        return None
    tokens, spans, order = [], [], [0] * total
    starts = [0]
    for row in rows[:-1]:
        starts.append(starts[-1] + len(row))
    for length, members in groups:
        a = len(tokens)
        tokens += rows[members[0]][:length]
        branches = []
        for member in members:  # a row alone has no remainder: its branch would be empty, and is left out
            base, rest = starts[member], rows[member][length:]
            order[base : base + length] = range(a, a + length)
            if rest:
                order[base + length : base + len(rows[member])] = range(len(tokens), len(tokens) + len(rest))
                branches.append((len(tokens), len(tokens) + len(rest)))
                tokens += rest
        spans.append((a, a + length, branches))
    device = keep.device
    packed = {
        "input_ids": torch.tensor([[t for t, _ in tokens]], device=device),
        "position_ids": torch.tensor([[p for _, p in tokens]], device=device),
        PREFIX_GROUPS: spans,
    }
    return keep, packed, torch.tensor(order, device=device)


def padding_free_inputs(model, inputs: dict) -> tuple[torch.Tensor, dict] | None:
    """``(real-token mask (B, T), one-row inputs)`` for a padded batch of ids, attention mask and optional
    positions (default: the column, as transformers numbers them); None where it does not apply: no padding,
    any other input (images), an empty row, or modelling code outside transformers (remote code)."""
    from trainer_lib.data.tokenize import boundary_kwargs

    mask = inputs.get("attention_mask")
    if mask is None or mask.dim() != 2 or set(inputs) - {"input_ids", "attention_mask", "position_ids"}:
        return None
    if not type(_unwrapped(model)).__module__.startswith("transformers."):
        return None
    keep = mask.bool()
    lengths = keep.sum(1).cpu()
    if bool(keep.all()) or not bool(lengths.all()):
        return None
    positions = inputs.get("position_ids")
    if positions is None:
        positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    bounds = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    packed = {"input_ids": inputs["input_ids"][keep][None], "position_ids": positions[keep][None]}
    return keep, {**packed, **boundary_kwargs(bounds, mask.device)}


def causal_lm_loss(model, batch: dict) -> torch.Tensor:
    """Mean next-token cross-entropy over the labels that are not -100: ``model(**batch).loss``."""
    from trainer_lib.losses.chunked_head import chunked_nll

    weight = head_weight(model)
    if weight is None:
        return model(**batch, use_cache=False).loss
    inputs = {key: value for key, value in batch.items() if key != "labels"}
    targets = batch["labels"][:, 1:]
    keep = targets != -100
    hidden = final_hidden(model, inputs)[:, :-1][keep]
    count = hidden.shape[0]
    scale = torch.full((count,), 1.0 / max(count, 1), device=hidden.device)
    return chunked_nll(hidden, weight, targets[keep], scale)


def shifted_lm_loss(model, inputs: dict, shifted: torch.Tensor, scale: float) -> torch.Tensor:
    """``scale`` x the summed next-token cross-entropy of ``inputs``' positions against labels already
    shifted (``shifted[:, i]`` is the token position ``i`` predicts; -100 unscored): a sequence-parallel
    rank's share of its row's loss (:mod:`trainer_lib.engine.sequence`)."""
    import torch.nn.functional as F

    from trainer_lib.losses.chunked_head import chunked_nll

    keep = shifted != -100
    weight = head_weight(model)
    if weight is None:
        logits = model(**inputs, use_cache=False).logits[keep]
        return F.cross_entropy(logits.float(), shifted[keep], reduction="sum") * scale
    hidden = final_hidden(model, inputs)[keep]
    return chunked_nll(hidden, weight, shifted[keep], torch.full((hidden.shape[0],), scale, device=hidden.device))


def position_logprobs(
    model, inputs: dict, targets: torch.Tensor, keep: torch.Tensor, temperature: float = 1.0, with_entropy=False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log p(targets[:, i])`` predicted at position ``i`` of ``inputs`` where ``keep``, 0 elsewhere, ``(B, T)``
    float32, and (``with_entropy``) each kept position's entropy without gradient: targets already shifted (a
    sequence-parallel rank's chunk, :mod:`trainer_lib.engine.sequence`)."""
    from trainer_lib.losses.chunked_head import chunked_logprobs

    weight = head_weight(model)
    if weight is None:
        logits = model(**inputs, use_cache=False).logits[keep].float()
        if temperature > 0 and temperature != 1.0:
            logits = logits / temperature
        normalizer = torch.logsumexp(logits, dim=-1)
        picked = logits.gather(-1, targets[keep].unsqueeze(-1)).squeeze(-1) - normalizer
        entropy = None
        if with_entropy:
            with torch.no_grad():
                entropy = normalizer - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    else:
        hidden = final_hidden(model, inputs)[keep]
        picked, entropy = chunked_logprobs(hidden, weight, targets[keep], temperature, with_entropy)
    full = torch.zeros(targets.shape, dtype=torch.float32, device=picked.device)
    spread = full.masked_scatter(keep, picked.float())
    return spread, None if entropy is None else full.masked_scatter(keep, entropy.float())


def scored_logprobs(
    model, inputs: dict, targets: torch.Tensor, mask: torch.Tensor, temperature: float = 1.0, with_entropy=False
) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """``log p(targets)`` where ``mask``, 0 elsewhere, ``(B, W)`` float32, for the last ``W`` positions'
    targets (``targets[:, j]`` is predicted from position ``T - W - 1 + j``), and each masked position's
    entropy (no gradient) with ``with_entropy``; None when the model takes full logits."""
    from trainer_lib.losses.chunked_head import chunked_logprobs

    weight = head_weight(model)
    if weight is None:
        return None
    width = targets.shape[1]
    keep = mask.bool()
    hidden = final_hidden(model, inputs, share_prefixes=True)[:, -width - 1 : -1][keep]
    logprobs, entropy = chunked_logprobs(hidden, weight, targets[keep], temperature, with_entropy)
    full = torch.zeros(targets.shape, dtype=torch.float32, device=hidden.device)
    spread = full.masked_scatter(keep, logprobs)
    return spread, None if entropy is None else full.masked_scatter(keep, entropy)


def response_states(model, inputs: dict, width: int, keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(states, head weight)`` at the positions that predict the last ``width`` tokens where ``keep``
    ``(B, width)`` is True: final hidden states ``(N, H)`` and the LM head's weight, or, where the model takes
    full logits (:func:`head_weight` None), its logits ``(N, V)`` and None. For a loss that needs the whole
    next-token distribution at each position (distillation), to be projected a chunk of positions at a time
    (:func:`trainer_lib.losses.chunked_generalized_jsd`)."""
    weight = head_weight(model)
    if weight is None:
        return model(**inputs, use_cache=False, logits_to_keep=width + 1).logits[:, :-1][keep], None
    return final_hidden(model, inputs, share_prefixes=True)[:, -width - 1 : -1][keep], weight
