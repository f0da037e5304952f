"""``posttrain``: one command line for every stage and for the pipeline.

    posttrain <stage> [--config FILE] [--nproc N] [key=value ...]
    posttrain pipeline {compile,run,submit,schedule} ...

Stages are looked up lazily so ``posttrain --help`` needs no torch. A stage module exposes
``CONFIG`` (its dataclass) and ``run(cfg) -> dict``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import textwrap

from trainer_lib.config import ConfigError, describe, load_config

# name -> (module, one-line description)
STAGES = {
    "prepare": ("trainer_lib.stages.prepare", "Validate, normalize, filter and split a dataset."),
    "sft": ("trainer_lib.stages.sft", "Supervised fine-tuning with prompt-masked loss and packing."),
    "reward": ("trainer_lib.stages.reward", "Train a pairwise (Bradley-Terry) reward model."),
    "dpo": ("trainer_lib.stages.dpo", "Direct preference optimization (DPO, IPO, SimPO, KTO, ...)."),
    "ppo": ("trainer_lib.stages.ppo", "PPO with a critic, GAE and KL control."),
    "grpo": ("trainer_lib.stages.grpo", "Critic-free RL: GRPO, Dr. GRPO, RLOO."),
    "evaluate": ("trainer_lib.stages.evaluate", "Evaluate models, write report and gate decision."),
    "release": ("trainer_lib.stages.release", "Publish a model that passed the evaluation gate."),
    "export": ("trainer_lib.stages.export", "ONNX export and INT8 quantization with parity check."),
    "deploy": ("trainer_lib.stages.deploy", "Publish a Triton model repository and load it."),
    "tiny-model": ("trainer_lib.stages.tiny_model", "Train a tokenizer and build a tiny model (demo, tests)."),
    "demo-data": ("trainer_lib.stages.demo_data", "Write the bundled deterministic demo datasets."),
}


def _available() -> dict:
    out = {}
    for name, (module, text) in STAGES.items():
        path = os.path.join(os.path.dirname(__file__), *module.split(".")[1:]) + ".py"
        if os.path.exists(path):
            out[name] = (module, text)
    return out


def _stage_help(name: str, module) -> str:
    rows = describe(module.CONFIG)
    width = max(len(k) for k, _, _ in rows) + 2
    lines = [f"usage: posttrain {name} [--config FILE] [--nproc N] [key=value ...]", "",
             STAGES[name][1], "", "options (YAML keys, or key=value on the command line):"]
    for key, default, text in rows:
        wrapped = textwrap.wrap(f"{text} [default: {default}]", 100 - width) or [""]
        lines.append(f"  {key.ljust(width)}{wrapped[0]}")
        lines.extend(" " * (width + 2) + w for w in wrapped[1:])
    lines += ["", "  --config FILE   YAML file with any of the keys above; key=value overrides it.",
              "  --nproc N       Launch N local worker processes (torchrun-style) for this stage.",
              "  --print-config  Print the resolved config as YAML and exit."]
    return "\n".join(lines)


def run_stage(name: str, argv: list[str]) -> int:
    module = importlib.import_module(_available()[name][0])
    parser = argparse.ArgumentParser(prog=f"posttrain {name}", add_help=False)
    parser.add_argument("-h", "--help", action="store_true")
    parser.add_argument("--config")
    parser.add_argument("--nproc", type=int, default=1)
    parser.add_argument("--print-config", action="store_true")
    args, overrides = parser.parse_known_args(argv)
    if args.help:
        print(_stage_help(name, module))
        return 0
    bad = [o for o in overrides if o.startswith("-")]
    if bad:
        print(f"error: unknown option {bad[0]} (see posttrain {name} --help)", file=sys.stderr)
        return 2
    try:
        cfg = load_config(module.CONFIG, args.config, overrides)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.print_config:
        import yaml

        from trainer_lib.config import to_dict
        print(yaml.safe_dump(to_dict(cfg), sort_keys=False))
        return 0
    if args.nproc > 1 and "TORCHELASTIC_RUN_ID" not in os.environ:  # not yet inside torchrun
        from trainer_lib.launch import launch_workers

        return launch_workers(args.nproc, ["-m", "trainer_lib.cli", name, *argv_without_nproc(argv)])
    from trainer_lib.errors import UserError

    try:
        summary = module.run(cfg)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if summary and int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps(summary, indent=2, default=str))
    return 0


def argv_without_nproc(argv: list[str]) -> list[str]:
    out, skip = [], False
    for item in argv:
        if skip:
            skip = False
            continue
        if item == "--nproc":
            skip = True
            continue
        if item.startswith("--nproc="):
            continue
        out.append(item)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    stages = _available()
    if not argv or argv[0] in ("-h", "--help", "help"):
        print("usage: posttrain <command> [--config FILE] [--nproc N] [key=value ...]\n")
        print("LLM post-training stages (each also runs as a Kubeflow component):\n")
        for name, (_, text) in stages.items():
            print(f"  {name:<12}{text}")
        here = os.path.dirname(__file__)
        if os.path.exists(os.path.join(here, "eval", "cli.py")):
            print(f"  {'humaneval':<12}Score a HumanEval completions file (pass@k) without a model.")
        print(f"  {'pipeline':<12}Compile, run locally, submit or schedule the Kubeflow pipelines.")
        print("\nRun 'posttrain <command> --help' for every option of a command.")
        return 0
    command, rest = argv[0], argv[1:]
    if command == "pipeline":
        from pipelines.cli import main as pipeline_main

        return pipeline_main(rest)
    if command == "humaneval" and os.path.exists(os.path.join(os.path.dirname(__file__), "eval", "cli.py")):
        from trainer_lib.eval.cli import main as humaneval_main

        return humaneval_main(rest)
    if command not in stages:
        print(f"error: unknown command '{command}' (see posttrain --help)", file=sys.stderr)
        return 2
    return run_stage(command, rest)


if __name__ == "__main__":
    sys.exit(main())
