"""The demo dataset writer: :func:`generate_demo_data` turns a :class:`~trainer_lib.demo.demo_spec.DemoSpec`
into these files, in TRL's conversational formats (no downloads):

    sft.jsonl                      {"messages": [user, assistant]}
    preferences.jsonl / _eval      {"prompt", "chosen", "rejected", "source", "kind"}
    code_tasks.jsonl / _eval       {"prompt", "task_id", "family", "entry_point", "solution", "tests"}
                                   (code_tasks.jsonl: the RL code tasks; their own tasks with n_code_rl)
    rl_prompts.jsonl               the RL prompts: code_tasks.jsonl, then n_safety_rl safety prompts
                                   {"prompt", "kind"} from the preference pairs' (never held-out) prompts
    safety_eval.jsonl              {"prompt", "kind", "reference"}
    corpus.txt                     the tokenizer's training texts
    manifest.json                  seed, counts, sha256 per file

The code tasks come from :mod:`~trainer_lib.demo.code_tasks`, the safety prompts from
:mod:`~trainer_lib.demo.safety_prompts`; no held-out item appears in a training file.
``python -m trainer_lib.demo.generator OUT_DIR --n-code-train 500 ...`` writes them from the command line.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import random
import tempfile
from collections import Counter

from trainer_lib.demo.code_tasks import CodeTasks, build_code_tasks
from trainer_lib.demo.demo_spec import DemoSpec
from trainer_lib.demo.safety_prompts import SafetyRows, draw_rl_prompts, safety_rows

__all__ = ["generate_demo_data", "main"]


def generate_demo_data(out_dir: str, spec: DemoSpec | None = None) -> dict:
    """Write the dataset ``spec`` describes (default: :class:`DemoSpec`'s defaults) into ``out_dir``; return
    the manifest (also written)."""
    spec = spec or DemoSpec()
    os.makedirs(out_dir, exist_ok=True)
    code = build_code_tasks(spec.seed, spec.n_code_train, spec.n_code_eval, spec.n_code_rl, spec.teacher_mistakes)
    safety = safety_rows(
        spec.seed, spec.n_safety_train, spec.n_safety_eval, spec.n_safety_sft, spec.sft_refusals, spec.sft_topics
    )
    files = _dataset_files(spec, code, safety)
    corpus = _corpus(files, code)
    manifest = _manifest(spec, code, safety, files, corpus)
    texts = {name: _jsonl(rows) for name, rows in files.items()} | {"corpus.txt": "\n".join(corpus) + "\n"}
    manifest["sha256"] = {name: _atomic_write(os.path.join(out_dir, name), text) for name, text in texts.items()}
    _atomic_write(os.path.join(out_dir, "manifest.json"), json.dumps(manifest, indent=2) + "\n")
    return manifest


def _dataset_files(spec: DemoSpec, code: CodeTasks, safety: SafetyRows) -> dict[str, list[dict]]:
    """The rows of every JSONL file, by file name."""
    rng = random.Random(f"{spec.seed}:shuffle")  # shuffles SFT's rows, then the pairs, then the held-out pairs
    sft = _sft_rows(code.train, safety.sft, rng)
    preferences = _preference_rows(_paired_tasks(spec, code.train), safety.pairs, rng)
    preferences_eval = _preference_rows(code.held_out, safety.held_out, rng)
    code_rows = [_task_row(t) for t in code.rl]
    return {
        "sft.jsonl": sft,
        "preferences.jsonl": preferences,
        "preferences_eval.jsonl": preferences_eval,
        "code_tasks.jsonl": code_rows,
        "rl_prompts.jsonl": _rl_prompts(spec, code_rows, safety.pairs),
        "code_tasks_eval.jsonl": [_task_row(t) for t in code.held_out],
        "safety_eval.jsonl": [
            {"prompt": _message("user", r["prompt"]), "kind": r["kind"], "reference": r["chosen"]}
            for r in safety.held_out
        ],
    }


def _message(role: str, text: str) -> list[dict]:
    return [{"role": role, "content": text}]


def _sft_rows(tasks: list[dict], safety: list[dict], rng: random.Random) -> list[dict]:
    """The teacher's code demonstrations and the SFT safety rows' chosen answers, shuffled together."""
    rows = [(t["prompt"], t["demo"]) for t in tasks] + [(r["prompt"], r["chosen"]) for r in safety]
    rows = [{"messages": _message("user", prompt) + _message("assistant", answer)} for prompt, answer in rows]
    rng.shuffle(rows)
    return rows


def _paired_tasks(spec: DemoSpec, tasks: list[dict]) -> list[dict]:
    """The training tasks that get a preference pair: ``n_code_pairs`` of them drawn by seed, or all."""
    if 0 < spec.n_code_pairs < len(tasks):
        return random.Random(f"{spec.seed}:pairs").sample(tasks, spec.n_code_pairs)
    return tasks


def _preference_rows(tasks: list[dict], safety: list[dict], rng: random.Random) -> list[dict]:
    """Code pairs (the teacher's answer, or the reference on a held-out task, over a failing one) and safety
    pairs, shuffled together."""
    pairs = [(t["prompt"], t.get("demo", t["solution"]), t["rejected"], "code", "code") for t in tasks]
    pairs += [(r["prompt"], r["chosen"], r["rejected"], "safety", r["kind"]) for r in safety]
    rows = [
        {
            "prompt": _message("user", prompt),
            "chosen": _message("assistant", chosen),
            "rejected": _message("assistant", rejected),
            "source": source,
            "kind": kind,
        }
        for prompt, chosen, rejected, source, kind in pairs
    ]
    rng.shuffle(rows)
    return rows


def _task_row(task: dict) -> dict:
    fields = ("task_id", "family", "entry_point", "solution", "tests")
    return {"prompt": _message("user", task["prompt"]), **{key: task[key] for key in fields}}


def _rl_prompts(spec: DemoSpec, code_rows: list[dict], safety_pairs: list[dict]) -> list[dict]:
    """The code task rows and ``n_safety_rl`` labelled safety prompts from the preference pairs, shuffled."""
    rng = random.Random(f"{spec.seed}:rl-safety")
    safety = draw_rl_prompts(rng, safety_pairs, spec.n_safety_rl)
    if not safety:
        return code_rows  # without safety prompts the file is code_tasks.jsonl, byte for byte
    rows = code_rows + [{"prompt": _message("user", r["prompt"]), "kind": r["kind"]} for r in safety]
    rng.shuffle(rows)
    return rows


def _corpus(files: dict[str, list[dict]], code: CodeTasks) -> list[str]:
    """The tokenizer's training texts, each once, in order: SFT's messages, the pairs' rejected answers, the RL
    code prompts and the training tasks' tests."""
    texts = [m["content"] for r in files["sft.jsonl"] for m in r["messages"]]
    texts += [r["rejected"][0]["content"] for r in files["preferences.jsonl"]]
    texts += [t["prompt"] for t in code.rl]
    texts += [test for t in code.train for test in t["tests"]]
    return list(dict.fromkeys(texts))


def _manifest(spec: DemoSpec, code: CodeTasks, safety: SafetyRows, files: dict, corpus: list[str]) -> dict:
    """Seed and counts; :func:`generate_demo_data` adds each file's sha256."""
    return {
        "name": "posttrain-demo",
        "version": 1,
        "seed": spec.seed,
        "counts": {
            "code_train": len(code.train),
            "code_eval": len(code.held_out),
            "code_rl": len(code.own_rl),
            "safety_train": len(safety.pairs),
            "safety_eval": len(safety.held_out),
            "safety_rl": sum("kind" in r for r in files["rl_prompts.jsonl"]),  # code task rows have no kind
            "teacher_mistakes": sum(t["demo"] != t["solution"] for t in code.train),
            **{name: len(rows) for name, rows in files.items()},
            "corpus.txt": len(corpus),
        },
        "code_families_train": dict(sorted(Counter(t["family"] for t in code.train).items())),
        "code_families_eval": dict(sorted(Counter(t["family"] for t in code.held_out).items())),
    }


def _jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def _atomic_write(path: str, text: str) -> str:
    """Write ``text`` to ``path`` by way of a temporary file renamed into place; its sha256."""
    data = text.encode("utf-8")
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-", suffix=".part")
    try:
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; make outputs readable like normal files
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return hashlib.sha256(data).hexdigest()


def main(argv: list[str] | None = None) -> int:
    """``python -m trainer_lib.demo.generator OUT_DIR [--seed 0 --n-code-train 3000 ...]``: one option per
    :class:`DemoSpec` field; prints the manifest's counts."""
    ap = argparse.ArgumentParser(prog="python -m trainer_lib.demo.generator", description="Write the demo datasets.")
    ap.add_argument("out_dir")
    for f in dataclasses.fields(DemoSpec):
        flag = "--" + f.name.replace("_", "-")
        ap.add_argument(flag, type=type(f.default), default=f.default, help=f.metadata["help"])
    args = vars(ap.parse_args(argv))
    manifest = generate_demo_data(args.pop("out_dir"), DemoSpec(**args))
    print(json.dumps(manifest["counts"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
