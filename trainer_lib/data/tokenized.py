"""Token lengths (prepare's too-long filter) and tokenized splits (the training stages), through
``datasets.Dataset.map(batched=True, num_proc=data.num_workers)`` writing memory-mapped Arrow.

A training stage's tokenized split is cached (:mod:`trainer_lib.data.cache`) under a key of the
split's content fingerprint, the tokenizer, ``data.max_length``, the tokenization kind and the
source of the module that tokenizes, so only the first run of a job tokenizes (on local rank 0)
and a rerun or a resumed run memory-maps the result.

Kinds (the function, and the columns it makes):

* ``sft``: :func:`trainer_lib.data.tokenize.tokenize_sft_batch`: ``input_ids``, ``labels``,
  ``length`` (rows with nothing to learn are dropped);
* ``pairs``: :func:`trainer_lib.data.preference_batches.tokenize_pairs_batch`: ``prompt_ids``,
  ``chosen_ids``, ``rejected_ids`` (and ``margin`` when the data has one);
* ``unpaired``: :func:`trainer_lib.data.preference_batches.tokenize_unpaired_batch`: ``prompt_ids``,
  ``completion_ids``, ``label``;
* ``sft_images``: :func:`trainer_lib.data.vision_tokenize.tokenize_image_sft_batch`: ``sft``'s columns and
  ``images`` (the row's image references as JSON; pixels are made when a micro-batch is collated);
* ``pairs_images``: :func:`trainer_lib.data.vision_tokenize.tokenize_image_pairs_batch`: ``pairs``' columns
  and ``images``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time

from trainer_lib.data import cache
from trainer_lib.errors import DataError, UserError

log = logging.getLogger(__name__)

#: kind -> (module, function name) of the batched tokenization.
KINDS = {
    "sft": ("trainer_lib.data.tokenize", "tokenize_sft_batch"),
    "pairs": ("trainer_lib.data.preference_batches", "tokenize_pairs_batch"),
    "unpaired": ("trainer_lib.data.preference_batches", "tokenize_unpaired_batch"),
    "sft_images": ("trainer_lib.data.vision_tokenize", "tokenize_image_sft_batch"),
    "pairs_images": ("trainer_lib.data.vision_tokenize", "tokenize_image_pairs_batch"),
}
#: kinds for a vision-language model: their ``tokenizer`` is the model's processor (models/vision.py), whose
#: image settings (how many tokens an image becomes) are part of the cache key; image hashes are in the data's.
IMAGE_KINDS = ("sft_images", "pairs_images")


@contextlib.contextmanager
def _quiet_map(num_proc: int | None):
    """No datasets progress bars (we log one line); tokenizers' own threads off in the forked workers
    (else each warns that it was forked after using them, and turns them off anyway)."""
    before = os.environ.get("TOKENIZERS_PARALLELISM")
    if num_proc and before is None:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        with cache.quiet():
            yield
    finally:
        if num_proc and before is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)


def _num_proc(num_workers: int, rows: int) -> int | None:
    """Worker processes for ``rows`` rows: ``data.num_workers``, but no more than the rows or the CPU cores
    this process may use (a file written for a 16-core machine starts no 16 processes on 2 cores)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    n = min(max(int(num_workers or 1), 1), rows, cores)
    return n if n > 1 else None


def run_map(ds, function, fn_kwargs: dict, num_workers: int, cache_file: str, remove_columns=None):
    """``ds.map(function, batched=True)`` into ``cache_file`` (and its ``_0000N_of_0000M`` shards)."""
    num_proc = _num_proc(num_workers, len(ds))
    with _quiet_map(num_proc):
        return ds.map(
            function,
            batched=True,
            num_proc=num_proc,
            fn_kwargs=fn_kwargs,
            remove_columns=ds.column_names if remove_columns is None else remove_columns,
            cache_file_name=cache_file,
            load_from_cache_file=False,
            writer_batch_size=1000,
            new_fingerprint=cache.digest([cache_file])[:40],
        )


# --------------------------------------------------------------------------- token lengths (prepare)


def _chat(tokenizer, messages: list[dict], location: str, generation_prompt: bool = False, tools=None):
    """(text, add_special_tokens) for a conversation rendered with the chat template."""
    from trainer_lib.data.tokenize import chat_text

    if getattr(tokenizer, "chat_template", None):
        try:
            text = chat_text(tokenizer, messages, generation_prompt, tools)
        except UserError:
            raise
        except Exception as exc:
            raise DataError(location, None, f"a conversation the tokenizer's chat template accepts ({exc})") from None
        return text, False
    # No chat template: count a simple role-tagged rendering.
    text = "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages)
    return text, True


def _sequences(row: dict, fmt: str, conv: bool, tokenizer, location: str) -> list[tuple[str, bool]]:
    """The texts a model sees for a row (preference: one per response)."""
    if fmt == "text":
        return [(row["text"], True)]
    if fmt == "messages":
        return [_chat(tokenizer, row["messages"], location, tools=row.get("tools"))]
    tools = row.get("tools")
    if fmt == "prompt_only":
        if conv:
            return [_chat(tokenizer, row["prompt"], location, generation_prompt=True, tools=tools)]
        return [(row["prompt"], True)]
    answers = ("chosen", "rejected") if fmt == "preference" else ("completion",)
    if conv:
        return [_chat(tokenizer, row["prompt"] + row[a], location, tools=tools) for a in answers]
    return [(row["prompt"] + row[a], True) for a in answers]


def token_lengths(items: list[tuple[str, dict]], fmt: str, conversational: bool, tokenizer) -> list[int]:
    """Token count per ``(location, row)`` (the longest sequence of the row), chat template applied."""
    texts: list[tuple[int, str, bool]] = []
    for i, (loc, row) in enumerate(items):
        texts.extend((i, t, special) for t, special in _sequences(row, fmt, conversational, tokenizer, loc))
    lengths = [0] * len(items)
    for special in (True, False):
        group = [(i, t) for i, t, s in texts if s == special]
        if group:
            ids = tokenizer([t for _, t in group], add_special_tokens=special)["input_ids"]
            for (i, _), seq in zip(group, ids):
                lengths[i] = max(lengths[i], len(seq))
    return lengths


def token_lengths_batch(batch: dict, fmt: str, conversational: bool, tokenizer, location: str) -> dict:
    """``datasets.map(batched=True)`` form of :func:`token_lengths`; ``location`` names the column of row
    locations (kept for error messages)."""
    names = [n for n in batch if n != location]
    items = [(values[-1], dict(zip(names, values[:-1]))) for values in zip(*(batch[n] for n in names), batch[location])]
    return {"length": token_lengths(items, fmt, conversational, tokenizer)}


def length_column(ds, fmt: str, conversational: bool, tokenizer, num_workers: int, work_dir: str, location: str):
    """numpy array of the token length of every row of ``ds`` (which has a ``location`` column)."""
    from trainer_lib.data.formats import FORMATS

    start = time.monotonic()
    keep = [c for c in ds.column_names if c in FORMATS[fmt] or c == location]
    ds = ds.select_columns(keep)
    out = run_map(
        ds,
        token_lengths_batch,
        {"fmt": fmt, "conversational": conversational, "tokenizer": tokenizer, "location": location},
        num_workers,
        os.path.join(work_dir, f"lengths-{cache.digest([ds.cache_files, len(ds)])[:12]}.arrow"),
    )
    lengths = out.with_format("numpy")["length"] if len(out) else []
    log.info("data: measured %d rows in %.1fs (%s worker(s))", len(ds), time.monotonic() - start, num_workers)
    return lengths


# --------------------------------------------------------------------------- tokenized splits (training)


def tokenize_split(
    ds,
    fingerprint: str | None,
    kind: str,
    fmt: str,
    tokenizer,
    max_length: int,
    num_workers: int = 1,
    what: str = "data",
):
    """``ds`` tokenized by ``kind`` as a memory-mapped Dataset, from the cache when ``fingerprint`` (the
    content fingerprint of ``ds``) was seen before with the same tokenizer, max_length and code."""
    import importlib

    module, name = KINDS[kind]
    function = getattr(importlib.import_module(module), name)
    kwargs = {"tokenizer": tokenizer, "max_length": max_length}
    if kind in ("sft", "sft_images"):
        kwargs["fmt"] = fmt
    parts = None
    if fingerprint is not None:
        parts = {
            "data": fingerprint,
            "kind": kind,
            "format": fmt,
            "max_length": max_length,
            "tokenizer": cache.tokenizer_fingerprint(tokenizer.tokenizer if kind in IMAGE_KINDS else tokenizer),
            "code": cache.code_version(module, __name__, "trainer_lib.data.tokenize"),
        }
        if kind in IMAGE_KINDS:
            from trainer_lib.data.vision_tokenize import processor_fingerprint

            parts["processor"] = processor_fingerprint(tokenizer)

    def build(tmp: str) -> dict:
        start = time.monotonic()
        if len(ds):
            out = run_map(ds, function, kwargs, num_workers, os.path.join(tmp, "tokenized.arrow"))
            files = [os.path.relpath(f["filename"], tmp) for f in out.cache_files]
            features = out.features.to_dict()
        else:
            files, features = [], function({c: [] for c in ds.column_names}, **kwargs)
            features = _empty_features(features, kind)
        log.info(
            "data: tokenized %s (%d rows, %s) in %.1fs with %d worker(s)",
            what,
            len(ds),
            kind,
            time.monotonic() - start,
            _num_proc(num_workers, len(ds)) or 1,
        )
        return {"tokenized": {"files": files, "features": features}}

    entry, manifest = cache.build_once("tokenized", parts, build, what=f"tokenized {what}")
    return cache.load_arrow(entry, manifest, "tokenized")


def tokenize_train_eval(data, kind: str, tokenizer, data_cfg) -> tuple:
    """``(train, eval)``: both splits of ``data`` (a :class:`trainer_lib.data.dataset.TrainingData`) through
    :func:`tokenize_split`, with ``data_cfg``'s max_length and num_workers."""
    return tuple(
        tokenize_split(
            data.splits[name],
            data.fingerprints[name],
            kind,
            data.format,
            tokenizer,
            data_cfg.max_length,
            data_cfg.num_workers,
            what=f"{data_cfg.path} [{name}]",
        )
        for name in ("train", "eval")
    )


def _empty_features(columns: dict, kind: str) -> dict:
    """Features of a tokenized split with no rows (token id lists, and the scalars of the kind)."""
    import datasets

    scalar = {"length": "int64", "margin": "float64", "label": "bool", "images": "string"}
    return datasets.Features(
        {c: datasets.Value(scalar[c]) if c in scalar else datasets.List(datasets.Value("int64")) for c in columns}
    ).to_dict()
