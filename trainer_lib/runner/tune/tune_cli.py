"""``posttrain tune --config tune.yaml [key=value ...]``: a local hyperparameter search (docs/tuning.md)."""

from __future__ import annotations

import argparse
import textwrap

from trainer_lib.config import describe
from trainer_lib.errors import UserError
from trainer_lib.runner.tune.search_config import TuneConfig, load_search

USAGE = """usage: posttrain tune --config tune.yaml [key=value ...]

Search a training stage's keys with Optuna: each trial runs `posttrain <stage>` as a process of its own,
the study lives in <output_dir>/study.db, and a rerun of a killed search finishes it. Writes
<output_dir>/best.yaml (posttrain <stage> --config best.yaml), results.json and report.html.
key=value sets keys of the search file (n_trials=16, objective.metric=eval_loss).

keys of the search file (docs/tuning.md):"""


def usage() -> str:
    rows = describe(TuneConfig)
    width = max(len(key) for key, _, _ in rows) + 2
    lines = [USAGE]
    for key, default, text in rows:
        wrapped = textwrap.wrap(f"{text} [default: {default or '-'}]", 100 - width) or [""]
        lines.append(f"  {key.ljust(width)}{wrapped[0]}")
        lines.extend(" " * (width + 2) + line for line in wrapped[1:])
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="posttrain tune", add_help=False)
    parser.add_argument("-h", "--help", action="store_true")
    parser.add_argument("--config", default="")
    args, overrides = parser.parse_known_args(argv)
    if args.help or not args.config:
        print(usage())
        return 0 if args.help else 2
    bad = [item for item in overrides if item.startswith("-") or "=" not in item]
    if bad:
        raise UserError(f"{bad[0]}: expected key=value (see posttrain tune --help)")
    try:
        import optuna  # noqa: F401
    except ImportError:
        raise UserError("posttrain tune needs Optuna: pip install 'posttrain[tune]'") from None
    from trainer_lib.runner.tune.optuna_study import run_search
    from trainer_lib.runner.tune.tune_results import write_results

    search = load_search(args.config, overrides)
    study = run_search(search)
    results = write_results(study, search)
    best = results["best"]
    if best is None:
        print("tune: no trial finished; see the reasons above")
        return 1
    print(f"tune: best trial {best['trial']}: {results['metric']} = {best['value']:.6g}; config: {best['config']}")
    return 0
