"""Preference data for the reward and DPO stages: tokenize, collate, sequence log-probs.

A row becomes a prompt and one or two completions, tokenized separately and concatenated
(``prompt_ids + completion_ids``), so a completion is scored exactly as the policy would
generate it after the prompt. Completions end with the eos token: plain text gets it appended;
chat completions are the rendered turn, cut after its eos (the template's trailing newline is
not something a model generates).

The collators put every sequence of a micro-batch into ONE right-padded batch of ``2B`` rows,
so chosen and rejected (or KTO's completion and its mismatched KL completion) share a single
forward pass:

    rows [0, B)    prompt_i + chosen_i       (unpaired: prompt_i + completion_i)
    rows [B, 2B)   prompt_i + rejected_i     (unpaired: prompt_i + kl_completion_i)

``completion_mask`` marks completion tokens; :func:`sequence_logps` sums (or averages) the
policy's token log-probs over them. torch is imported inside the functions.
"""

from __future__ import annotations

import hashlib
import random

from trainer_lib.data.tokenize import chat_text, render_prompt
from trainer_lib.errors import UserError

PAIRED_FORMATS = ("preference",)
#: the image tensors a vision-language model's batch carries (data/vision_tokenize.py) into its forward.
IMAGE_INPUTS = ("pixel_values", "image_sizes", "image_grid_thw")
UNPAIRED_FORMATS = ("unpaired_preference",)


# --------------------------------------------------------------------------- tokenize


def completion_text(tokenizer, prompt, completion, tools=None) -> str:
    """The text that follows ``render_prompt(prompt)``: a chat turn cut after its eos, or
    plain text with the eos appended."""
    eos = tokenizer.eos_token or ""
    if not isinstance(prompt, list):
        return completion + eos
    prompt_text = render_prompt(tokenizer, prompt, tools)
    full = chat_text(tokenizer, list(prompt) + list(completion), tools=tools)
    if not full.startswith(prompt_text):
        raise UserError(
            "model.path: the chat template renders a conversation differently from its "
            "prompt with add_generation_prompt=True; cannot split prompt and completion"
        )
    text = full[len(prompt_text) :]
    if eos and text.rstrip().endswith(eos):
        text = text.rstrip()
    return text


def encode_prompt(tokenizer, prompt, tools=None) -> list[int]:
    """Prompt token ids; special tokens (e.g. BOS) only for plain text (templates add their own)."""
    text = render_prompt(tokenizer, prompt, tools)
    return tokenizer(text, add_special_tokens=not isinstance(prompt, list))["input_ids"]


def encode_completion(tokenizer, prompt, completion, tools=None) -> list[int]:
    return tokenizer(completion_text(tokenizer, prompt, completion, tools), add_special_tokens=False)["input_ids"]


def _fit(prompt_ids: list[int], completions: list[list[int]], max_length: int):
    """Keep at most ``max_length`` tokens per sequence: the end of the prompt (but at most half
    the budget when the completions need the rest), then the start of each completion."""
    longest = max(len(c) for c in completions)
    if len(prompt_ids) + longest > max_length:
        keep = max(max_length - longest, max_length // 2)
        prompt_ids = prompt_ids[-keep:] if keep > 0 else []
    room = max_length - len(prompt_ids)
    return prompt_ids, [c[:room] for c in completions]


def tokenize_pair(row: dict, tokenizer, max_length: int) -> dict:
    """``{"prompt_ids", "chosen_ids", "rejected_ids"[, "margin"]}`` for a normalized preference row.

    An optional numeric ``margin`` column is carried along (reward model loss margin).
    """
    prompt, tools = row["prompt"], row.get("tools")
    prompt_ids, (chosen, rejected) = _fit(
        encode_prompt(tokenizer, prompt, tools),
        [
            encode_completion(tokenizer, prompt, row["chosen"], tools),
            encode_completion(tokenizer, prompt, row["rejected"], tools),
        ],
        max_length,
    )
    out = {"prompt_ids": prompt_ids, "chosen_ids": chosen, "rejected_ids": rejected}
    if row.get("margin") is not None:
        out["margin"] = float(row["margin"])
    return out


def tokenize_unpaired(row: dict, tokenizer, max_length: int) -> dict:
    """``{"prompt_ids", "completion_ids", "label"}`` for a normalized unpaired-preference row."""
    prompt, tools = row["prompt"], row.get("tools")
    prompt_ids, (completion,) = _fit(
        encode_prompt(tokenizer, prompt, tools),
        [encode_completion(tokenizer, prompt, row["completion"], tools)],
        max_length,
    )
    return {"prompt_ids": prompt_ids, "completion_ids": completion, "label": bool(row["label"])}


def _rows(batch: dict) -> list[dict]:
    names = list(batch)
    return [dict(zip(names, values)) for values in zip(*batch.values())]


def tokenize_pairs_batch(batch: dict, tokenizer, max_length: int) -> dict:
    """``datasets.map(batched=True)`` form of :func:`tokenize_pair` (``margin`` is null where a row has none)."""
    examples = [tokenize_pair(row, tokenizer, max_length) for row in _rows(batch)]
    out = {key: [ex[key] for ex in examples] for key in ("prompt_ids", "chosen_ids", "rejected_ids")}
    if "margin" in batch:
        out["margin"] = [ex.get("margin") for ex in examples]
    return out


def tokenize_unpaired_batch(batch: dict, tokenizer, max_length: int) -> dict:
    """``datasets.map(batched=True)`` form of :func:`tokenize_unpaired`."""
    examples = [tokenize_unpaired(row, tokenizer, max_length) for row in _rows(batch)]
    return {key: [ex[key] for ex in examples] for key in ("prompt_ids", "completion_ids", "label")}


def unpair(pairs: list[dict]) -> list[dict]:
    """Tokenized pairs -> unpaired examples: chosen desirable, rejected undesirable (for KTO)."""
    out = []
    for pair in pairs:
        out.append({"prompt_ids": pair["prompt_ids"], "completion_ids": pair["chosen_ids"], "label": True})
        out.append({"prompt_ids": pair["prompt_ids"], "completion_ids": pair["rejected_ids"], "label": False})
    return out


def assign_kl_completions(examples: list[dict], seed: int, max_length: int) -> list[dict]:
    """Give each unpaired example a completion of another example (KTO's mismatched pairs for
    the KL estimate). Fixed once from ``seed`` so a resumed run and a precomputed reference see
    the same pairs: a derangement by rotating a seeded permutation by one."""
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    for pos, i in enumerate(order):
        j = order[(pos + 1) % len(order)]
        room = max_length - len(examples[i]["prompt_ids"])
        examples[i]["kl_completion_ids"] = examples[j]["completion_ids"][:room]
    return examples


def token_fingerprint(examples: list[dict], *extra: str) -> str:
    """sha256 over every token id of ``examples`` (and ``extra`` strings), in order."""
    h = hashlib.sha256("\0".join(extra).encode())
    for ex in examples:
        for key in sorted(k for k in ex if k.endswith("_ids")):
            h.update(key.encode())
            h.update(",".join(map(str, ex[key])).encode())
        if ex.get("images"):  # image rows: the same token ids over other pictures are other examples
            h.update(ex["images"].encode())
        h.update(b"\n")
    return h.hexdigest()


# --------------------------------------------------------------------------- collate


def _pad(prompts: list[list[int]], completions: list[list[int]], pad_token_id: int) -> dict:
    import torch

    width = max(len(p) + len(c) for p, c in zip(prompts, completions))
    n = len(prompts)
    ids = torch.full((n, width), pad_token_id, dtype=torch.long)
    attention = torch.zeros((n, width), dtype=torch.long)
    completion_mask = torch.zeros((n, width), dtype=torch.bool)
    for row, (p, c) in enumerate(zip(prompts, completions)):
        ids[row, : len(p) + len(c)] = torch.tensor(p + c, dtype=torch.long)
        attention[row, : len(p) + len(c)] = 1
        completion_mask[row, len(p) : len(p) + len(c)] = True
    return {"input_ids": ids, "attention_mask": attention, "completion_mask": completion_mask}


def _pack(prompts: list[list[int]], completions: list[list[int]]) -> dict:
    """The ``N`` sequences as ONE padding-free row: ``position_ids`` restart at each sequence (so each
    attends only to itself, see ``models/attention.py``), ``segment_ids`` says which sequence a
    token belongs to and ``cu_seq_lens`` (int32 ``[N + 1]``) where each starts, then the row's length.
    Every sequence starts with a prompt token, so no completion token is ever predicted across a
    boundary."""
    import torch

    ids, positions, completion, segments, bounds = [], [], [], [], [0]
    for row, (p, c) in enumerate(zip(prompts, completions)):
        ids += p + c
        positions += range(len(p) + len(c))
        completion += [False] * len(p) + [True] * len(c)
        segments += [row] * (len(p) + len(c))
        bounds.append(len(ids))
    return {
        "input_ids": torch.tensor([ids], dtype=torch.long),
        "position_ids": torch.tensor([positions], dtype=torch.long),
        "completion_mask": torch.tensor([completion], dtype=torch.bool),
        "segment_ids": torch.tensor([segments], dtype=torch.long),
        "cu_seq_lens": torch.tensor(bounds, dtype=torch.int32),
    }


def collate_pairs(examples: list[dict], pad_token_id: int, packed: bool = False) -> dict:
    """``2B`` sequences: chosen, then rejected (plus ``margin`` (B,) when every row has one); padded
    rows, or one packed row (``packed``)."""
    import torch

    prompts = [ex["prompt_ids"] for ex in examples]
    completions = [ex["chosen_ids"] for ex in examples] + [ex["rejected_ids"] for ex in examples]
    batch = _pack(prompts + prompts, completions) if packed else _pad(prompts + prompts, completions, pad_token_id)
    if all(ex.get("margin") is not None for ex in examples):
        batch["margin"] = torch.tensor([ex["margin"] for ex in examples], dtype=torch.float32)
    return batch


def collate_unpaired(examples: list[dict], pad_token_id: int, packed: bool = False) -> dict:
    """``2B`` sequences: completions, then their mismatched KL completions; ``label`` (B,) bool."""
    import torch

    prompts = [ex["prompt_ids"] for ex in examples]
    completions = [ex["completion_ids"] for ex in examples] + [ex["kl_completion_ids"] for ex in examples]
    batch = _pack(prompts + prompts, completions) if packed else _pad(prompts + prompts, completions, pad_token_id)
    batch["label"] = torch.tensor([ex["label"] for ex in examples], dtype=torch.bool)
    return batch


def model_inputs(batch: dict, device) -> dict:
    """The tensors a model's forward takes, moved to ``device``. A packed row: ids, positions and the
    sequence boundaries as transformers' flash-attention kwargs, so that no attention layer has to find
    them (``models/attention.py``); the longest sequence is read from the collated (host) tensor."""
    pixels = {key: batch[key].to(device) for key in IMAGE_INPUTS if key in batch}  # a vision-language model's
    if "segment_ids" not in batch:
        ids, mask = batch["input_ids"].to(device), batch["attention_mask"].to(device)
        return {"input_ids": ids, "attention_mask": mask, **pixels}
    from trainer_lib.data.tokenize import boundary_kwargs

    inputs = {"input_ids": batch["input_ids"].to(device), "position_ids": batch["position_ids"].to(device)}
    if pixels:  # a VLM hands the flash-attention kwargs to its vision tower too; positions mark the boundaries
        return {**inputs, **pixels}
    return {**inputs, **boundary_kwargs(batch["cu_seq_lens"], device)}


# --------------------------------------------------------------------------- log-probs


def token_logps(logits, input_ids, chunk: int = 1024):
    """log p(token_t | tokens_<t) for t >= 1, shape ``(N, T-1)``; ``chunk`` positions at a time to cap
    the ``(chunk, vocab)`` float32 log-softmax (a packed row holds a whole batch)."""
    import torch

    targets = input_ids[:, 1:]
    out = []
    for row_logits, row_targets in zip(logits[:, :-1], targets):
        pieces = []
        for start in range(0, row_targets.shape[0], chunk):
            part = row_logits[start : start + chunk].float()
            picked = part.gather(-1, row_targets[start : start + chunk].unsqueeze(-1)).squeeze(-1)
            pieces.append(picked - torch.logsumexp(part, dim=-1))
        out.append(torch.cat(pieces) if pieces else row_logits.new_zeros(0))
    return torch.stack(out)


def sequence_logps(logits, input_ids, completion_mask, segment_ids=None):
    """``(summed log-probs, completion token counts)``, each ``(N,)``, over completion tokens.

    Token ``t`` is predicted from position ``t - 1``; the mask is aligned to the predicted token. A
    packed row (``segment_ids`` numbering its sequences 0..N-1 in order) is summed per sequence.
    """

    mask = completion_mask[:, 1:].to(logits.device)
    return summed_logps(token_logps(logits, input_ids.to(logits.device)) * mask, mask, segment_ids)


def summed_logps(per_token, mask, segment_ids=None, rows: int | None = None):
    """``(summed log-probs, token counts)`` of :func:`sequence_logps` from per-token log-probs ``(N, T-1)``
    (0 outside ``mask``, the completion mask aligned to the predicted token). A packed row's ``segment_ids``
    number the sequences of the tokens the positions predict, ``(1, T)`` (the first unread), or, given the
    number of sequences ``rows``, ``(1, T-1)`` aligned with ``per_token`` (a sequence-parallel chunk)."""
    import torch

    if segment_ids is None:
        return per_token.sum(-1), mask.sum(-1)
    if rows is None:
        rows, segment_ids = int(segment_ids[0, -1]) + 1, segment_ids[:, 1:]
    segments = segment_ids[0].to(per_token.device)
    summed = per_token.new_zeros(rows).index_add(0, segments, per_token[0])
    counts = torch.zeros(rows, dtype=torch.long, device=per_token.device).index_add(0, segments, mask[0].long())
    return summed, counts


def average_logps(summed, counts):
    """Length-normalized log-probs ``log pi(y|x) / |y|`` (SimPO)."""
    return summed / counts.clamp(min=1)


def split_halves(values):
    """``(first B, last B)`` of a ``(2B,)`` tensor laid out as the collators lay out rows."""
    half = values.shape[0] // 2
    return values[:half], values[half:]
