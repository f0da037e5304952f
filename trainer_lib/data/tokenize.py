"""Tokenize normalized rows for causal-LM training, pack them, and collate micro-batches.

Loss masking: labels are -100 everywhere except completion / assistant tokens. For chat data
we render the template once and mark tokens whose characters fall inside assistant turns,
which works for any chat template without ``{% generation %}`` tags.

Packing is padding-free: a micro-batch is one flat row of several sequences with
``position_ids`` restarting at 0 for each. transformers builds a block-diagonal causal mask
from such position ids (sdpa and eager attention, ``use_cache=False``), so sequences never
attend to each other; the first token of each sequence is never a label target, so no
sequence learns to predict across a boundary.
"""

from __future__ import annotations

from trainer_lib.errors import UserError

IGNORE = -100


def _is_chat(value) -> bool:
    return isinstance(value, list)


def template_messages(messages: list[dict]) -> tuple[list[dict], bool]:
    """Messages as chat templates expect them, and whether one calls a tool: keys without a value
    dropped (a column read back from Arrow gives every message every key), tool-call arguments
    from their stored JSON string back to a mapping (transformers' documented layout)."""
    out, calls = [], False
    for message in messages:
        message = {k: v for k, v in message.items() if v is not None}
        if message.get("tool_calls"):
            calls = True
            message["tool_calls"] = [
                {**call, "function": {**call["function"], "arguments": _arguments(call["function"].get("arguments"))}}
                for call in message["tool_calls"]
            ]
        out.append(message)
    return out, calls


def _arguments(value):
    import json

    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def chat_text(tokenizer, messages: list[dict], add_generation_prompt: bool = False, tools=None) -> str:
    """A conversation rendered by the tokenizer's chat template; ``tools`` (a list of tool definitions,
    or its JSON string as the data keeps it) go through the template's own tool support."""
    import json

    if not getattr(tokenizer, "chat_template", None):
        raise UserError(
            "model.path: the tokenizer has no chat template, so conversational data "
            "cannot be rendered; set model.chat_template (chatml, llama3, zephyr or a Jinja file), "
            "or use plain text / prompt-completion data"
        )
    messages, calls = template_messages(messages)
    tools = json.loads(tools) if isinstance(tools, str) and tools else tools or None
    if (tools or calls) and "tool" not in str(tokenizer.chat_template):
        raise UserError(
            "model.chat_template: the data offers tools or calls them, but the chat template has no tool "
            "support, so they would be dropped; use a model whose template renders tools, or set "
            "model.chat_template to a Jinja file that does"
        )
    extra = {"tools": tools} if tools else {}
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt, **extra)


def _chat_spans(
    tokenizer, messages: list[dict], trainable_from: int = 0, tools=None
) -> tuple[str, list[tuple[int, int]]]:
    """Rendered text and character spans of assistant turns at index >= ``trainable_from``."""
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant" or i < trainable_from:
            continue
        start = len(chat_text(tokenizer, messages[:i], add_generation_prompt=True, tools=tools))
        end = len(chat_text(tokenizer, messages[: i + 1], tools=tools))
        spans.append((start, end))
    return chat_text(tokenizer, messages, tools=tools), spans


def _labels(ids: list[int], offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> list[int]:
    """Each token id where the token starts inside a span (and is not empty), else IGNORE.

    One sweep over the tokens with a cursor into the sorted spans (offsets grow along the text; a
    token that starts before its predecessor resets the cursor), not a scan of every span per token.
    """
    spans = sorted(spans)
    labels, k, previous = [], 0, 0
    for token_id, (start, end) in zip(ids, offsets):
        if start < previous:
            k = 0
        previous = start
        while k < len(spans) and start >= spans[k][1]:
            k += 1
        inside = k < len(spans) and spans[k][0] <= start < end
        labels.append(token_id if inside else IGNORE)
    return labels


def _text_and_spans(row: dict, fmt: str, tokenizer) -> tuple[str, list[tuple[int, int]]]:
    """The text a model sees for a row and the character spans it learns to predict."""
    eos = tokenizer.eos_token or ""
    if fmt == "text":
        text = row["text"] + eos
        return text, [(0, len(text))]
    if fmt == "messages":
        return _chat_spans(tokenizer, row["messages"], tools=row.get("tools"))
    if fmt == "prompt_completion":
        prompt, completion = row["prompt"], row["completion"]
        if _is_chat(prompt):
            return _chat_spans(tokenizer, [*prompt, *completion], trainable_from=len(prompt), tools=row.get("tools"))
        text = prompt + completion + eos
        return text, [(len(prompt), len(text))]
    raise UserError(f"data.format: SFT cannot train on '{fmt}' data")


def text_and_spans(row: dict, fmt: str, tokenizer) -> tuple[str, list[tuple[int, int]]]:
    """The text a model sees for a row and the character spans it learns to predict (for the image rows
    of :mod:`trainer_lib.data.vision_tokenize`)."""
    return _text_and_spans(row, fmt, tokenizer)


def span_labels(ids: list[int], offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> list[int]:
    """Each token id where the token starts inside one of ``spans``, else IGNORE."""
    return _labels(ids, offsets, spans)


def tokenize_sft_rows(rows: list[dict], fmt: str, tokenizer, max_length: int) -> list[dict]:
    """``{"input_ids", "labels"}`` for each normalized row of format ``fmt`` (one tokenizer call)."""
    rendered = [_text_and_spans(row, fmt, tokenizer) for row in rows]
    if not rendered:
        return []
    enc = tokenizer(
        [text for text, _ in rendered],
        add_special_tokens=False,
        return_offsets_mapping=True,
        truncation=True,
        max_length=max_length,
    )
    return [
        {"input_ids": list(ids), "labels": _labels(ids, offsets, spans)}
        for ids, offsets, (_, spans) in zip(enc["input_ids"], enc["offset_mapping"], rendered)
    ]


def tokenize_sft(row: dict, fmt: str, tokenizer, max_length: int) -> dict:
    """``{"input_ids", "labels"}`` for one normalized row of format ``fmt``."""
    return tokenize_sft_rows([row], fmt, tokenizer, max_length)[0]


def is_trainable(example: dict) -> bool:
    """Whether an example has a label to learn past its first token (the first is never a target)."""
    return any(label != IGNORE for label in example["labels"][1:])


def tokenize_sft_batch(batch: dict, fmt: str, tokenizer, max_length: int) -> dict:
    """``datasets.map(batched=True)`` form of :func:`tokenize_sft`: columns ``input_ids``, ``labels``,
    ``length``, keeping only rows with something to learn (:func:`is_trainable`)."""
    names = list(batch)
    rows = [dict(zip(names, values)) for values in zip(*batch.values())]
    examples = [ex for ex in tokenize_sft_rows(rows, fmt, tokenizer, max_length) if is_trainable(ex)]
    return {
        "input_ids": [ex["input_ids"] for ex in examples],
        "labels": [ex["labels"] for ex in examples],
        "length": [len(ex["input_ids"]) for ex in examples],
    }


def render_prompt(tokenizer, prompt, tools=None) -> str:
    """The text a model continues from: chat prompts get the generation prompt appended (and the
    ``tools`` offered, rendered by the template)."""
    if _is_chat(prompt):
        return chat_text(tokenizer, list(prompt), add_generation_prompt=True, tools=tools)
    return prompt


# --------------------------------------------------------------------------- packing


def pack(lengths: list[int], capacity: int) -> list[list[int]]:
    """First-fit-decreasing bins of example indices, each bin at most ``capacity`` tokens.

    Deterministic: ties are broken by index, bins come out in order of creation.
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    room: list[int] = []
    for i in order:
        n = min(lengths[i], capacity)
        for b, free in enumerate(room):
            if n <= free:
                bins[b].append(i)
                room[b] -= n
                break
        else:
            bins.append([i])
            room.append(capacity - n)
    return bins


def collate_packed(examples: list[dict]) -> dict:
    """One flat row: concatenated ids, restarting position ids, boundary-safe labels."""
    import torch

    ids, labels, positions = [], [], []
    for ex in examples:
        n = len(ex["input_ids"])
        ids.extend(ex["input_ids"])
        labels.extend([IGNORE] + list(ex["labels"][1:]))
        positions.extend(range(n))
    return {
        "input_ids": torch.tensor([ids], dtype=torch.long),
        "labels": torch.tensor([labels], dtype=torch.long),
        "position_ids": torch.tensor([positions], dtype=torch.long),
    }


def collate_padded(examples: list[dict], pad_token_id: int) -> dict:
    """Right-padded batch with an attention mask (the non-packing path)."""
    import torch

    width = max(len(ex["input_ids"]) for ex in examples)
    ids = torch.full((len(examples), width), pad_token_id, dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    for row, ex in enumerate(examples):
        n = len(ex["input_ids"])
        ids[row, :n] = torch.tensor(ex["input_ids"])
        labels[row, :n] = torch.tensor(ex["labels"])
        mask[row, :n] = 1
    return {"input_ids": ids, "labels": labels, "attention_mask": mask}


def micro_batches(examples, batch_size: int, max_length: int, packing: bool) -> list[list[int]]:
    """Group example indices into micro-batches: ``batch_size`` packed rows of ``max_length``
    tokens each (flattened together), or ``batch_size`` examples when not packing. ``examples``: a
    list of tokenized dicts, or a ``datasets.Dataset`` with a ``length`` column."""
    if not packing:
        return [list(range(i, min(i + batch_size, len(examples)))) for i in range(0, len(examples), batch_size)]
    if hasattr(examples, "column_names"):
        lengths = list(examples["length"])
    else:
        lengths = [len(ex["input_ids"]) for ex in examples]
    bins = pack(lengths, max_length)
    return [sum(bins[i : i + batch_size], []) for i in range(0, len(bins), batch_size)]


def count_tokens(batch: dict) -> int:
    """Tokens a collated batch trains on, padding excluded (packed rows have none)."""
    mask = batch.get("attention_mask")
    return int(mask.sum()) if mask is not None else int(batch["input_ids"].numel())


def boundary_kwargs(bounds, device) -> dict:
    """transformers' flash-attention kwargs of a packed row from its cumulative sequence lengths ``bounds``
    (a host tensor ``[0, n_1, ..., N]``): the boundaries on ``device`` and the longest sequence, read on
    the host, so no attention layer has to find them."""
    import torch

    on_device, longest = bounds.to(device=device, dtype=torch.int32), int((bounds[1:] - bounds[:-1]).max())
    return {"cu_seq_lens_q": on_device, "cu_seq_lens_k": on_device, "max_length_q": longest, "max_length_k": longest}
