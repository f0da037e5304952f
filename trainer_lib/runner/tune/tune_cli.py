"""``posttrain tune --config tune.yaml [key=value ...]``: a local hyperparameter search (docs/tuning.md)."""

from __future__ import annotations

import argparse
import sys
import textwrap

from trainer_lib.config import describe
from trainer_lib.errors import UserError
from trainer_lib.runner.tune.search_config import TuneConfig, load_search

USAGE = """usage: posttrain tune --config tune.yaml [--target local|katib] [--out FILE] [key=value ...]

Search a training stage's keys with Optuna: each trial runs `posttrain <stage>` as a process of its own,
the study lives in <output_dir>/study.db, and a rerun of a killed search finishes it. Writes
<output_dir>/best.yaml (posttrain <stage> --config best.yaml), results.json and report.html.
--target katib writes the same search as a Katib Experiment instead (to --out, default stdout), for
`kubectl apply -f` on a cluster with Katib; nothing runs here.
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


def main(argv: list[str], cluster=None) -> int:
    """``cluster``: the images and pod resources of Katib trials (a ClusterDefaults), handed in by the
    ``posttrain`` command from components/common.py."""
    parser = argparse.ArgumentParser(prog="posttrain tune", add_help=False)
    parser.add_argument("-h", "--help", action="store_true")
    parser.add_argument("--config", default="")
    parser.add_argument("--target", default="local")
    parser.add_argument("--out", default="")
    args, overrides = parser.parse_known_args(argv)
    if args.help or not args.config:
        print(usage())
        return 0 if args.help else 2
    bad = [item for item in overrides if item.startswith("-") or "=" not in item]
    if bad:
        raise UserError(f"{bad[0]}: expected key=value (see posttrain tune --help)")
    if args.target not in ("local", "katib"):
        raise UserError(f"--target: expected local or katib, got {args.target!r}")
    if args.target == "katib":
        return write_experiment(load_search(args.config, overrides), args.out, cluster)
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


def write_experiment(search, out: str, cluster) -> int:
    import yaml

    class KubeDumper(yaml.SafeDumper):
        """Text that a YAML 1.2 reader (kubectl) would take for a number, such as Katib's bounds
        (``1e-06``), is quoted; text of several lines (the base config) is written as a block."""

    def text(dumper, value: str):
        style = "|" if "\n" in value else "'" if looks_numeric(value) else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    KubeDumper.add_representer(str, text)

    from trainer_lib.runner.tune.katib_experiment import build_experiment

    experiment = build_experiment(search, cluster)
    text = yaml.dump(experiment, Dumper=KubeDumper, sort_keys=False, width=1000)
    if not out:
        print(text, end="")
        return 0
    with open(out, "w", encoding="utf-8") as fh:
        fh.write(text)
    spec = experiment["spec"]
    print(
        f"tune: wrote Katib Experiment {experiment['metadata']['name']} to {out}: {spec['maxTrialCount']} trials, "
        f"{spec['parallelTrialCount']} at once; kubectl apply -f {out}",
        file=sys.stderr,
    )
    return 0


def looks_numeric(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return value.lower() in ("true", "false", "null", "yes", "no", "on", "off", "~")
    return True
