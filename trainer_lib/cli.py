"""``posttrain``: one command line for every stage.

    posttrain <stage> [FILE.yaml | --config FILE ...] [--nproc N] [key=value ...]
    posttrain train FILE.yaml [key=value ...]     (the stage from the file's LLaMA-Factory `stage:`)
    posttrain humaneval --samples FILE --out DIR
    posttrain safety-set [--harmbench P] [--donotanswer P] [--benign FILE ...] --out FILE
    posttrain serve --repo DIR|s3://... [--http-port P] [--grpc-port Q]
    posttrain convert-gguf FILE.gguf [OUT_DIR]
    posttrain tune --config tune.yaml [--target local|katib] [--out FILE] [key=value ...]
    posttrain tune-trial --metric NAME --output-dir DIR -- posttrain <stage> ...
    posttrain deploy rollback repository=... model_name=... [to_version=N] [triton.url=...]

Stages come from the registry in :mod:`trainer_lib.stages` and are imported lazily, so
``posttrain --help`` needs no torch. Commands that belong to the layers above the library
(``posttrain pipeline``) are handed in by the console entry point (:func:`pipelines.commands.posttrain`)
as ``extra_commands``; this module never imports them.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import sys
import textwrap
from collections.abc import Callable

from trainer_lib.config import describe
from trainer_lib.stages import STAGES, stage_module

Command = tuple[str, Callable[[list[str]], int]]  # (one-line help, main(argv) -> exit code)


def _lazy(module: str) -> Callable[[list[str]], int]:
    return lambda argv: importlib.import_module(module).main(argv)


def one_line(exc: BaseException) -> str:
    """An error's message on one line (library messages, e.g. transformers', span several)."""
    return " ".join(line.strip() for line in str(exc).splitlines() if line.strip())


def exit_code(exc: BaseException) -> int | None:
    """What a command exits with when ``exc`` stops it: 2 for a user's mistake (a bad file, path, setting
    or row), 1 for an object store that failed after its retries (a retried pod may succeed), 75 for a
    stage stopped by SIGTERM after its checkpoint (retryable: the retry resumes); None for anything else,
    which is a bug and keeps its traceback."""
    from trainer_lib.engine.preemption import PREEMPTED_EXIT, Preempted
    from trainer_lib.errors import UserError
    from trainer_lib.storage import StorageError

    if isinstance(exc, Preempted):
        return PREEMPTED_EXIT
    if isinstance(exc, (UserError, FileNotFoundError)):
        return 2
    if isinstance(exc, StorageError):  # (its message names the location, with credentials redacted)
        return 1
    return None


def run_command(command: Callable[[list[str]], int], argv: list[str]) -> int:
    """Run a command's ``main``; an error with an :func:`exit_code` is printed as one line."""
    try:
        return command(argv)
    except Exception as exc:
        code = exit_code(exc)
        if code is None:
            raise
        from trainer_lib.engine.preemption import PREEMPTED_EXIT

        print(f"{'preempted' if code == PREEMPTED_EXIT else 'error'}: {one_line(exc)}", file=sys.stderr)
        return code


#: Library commands that are not stages: name -> (help, main).
COMMANDS: dict[str, Command] = {
    "train": ("Run a LLaMA-Factory config: the stage comes from its `stage:` key.", lambda argv: train_main(argv)),
    "humaneval": (
        "Score a HumanEval completions file (pass@k) without a model.",
        _lazy("trainer_lib.eval.humaneval_cli"),
    ),
    "safety-set": (
        "Write a safety set of real prompts (HarmBench, Do-Not-Answer, benign questions) for evaluate.",
        _lazy("trainer_lib.eval.safety_sets"),
    ),
    "serve": ("Serve a Triton model repository with a local tritonserver.", _lazy("trainer_lib.serving.serve_cli")),
    "convert-gguf": (
        "Convert a GGUF file into a Hugging Face model folder.",
        _lazy("trainer_lib.models.gguf_convert"),
    ),
    "dashboard": (
        "Watch and compare runs in a browser: curves, samples, evaluations (docs/dashboard.md).",
        _lazy("trainer_lib.dashboard.dashboard_cli"),
    ),
    "tune": (
        "Search a training stage's keys with Optuna, each trial a stage process (docs/tuning.md).",
        _lazy("trainer_lib.runner.tune.tune_cli"),
    ),
    "tune-trial": (
        "Run one Katib trial's stage, printing its eval metrics for Katib's collector (posttrain tune --target katib).",
        _lazy("trainer_lib.runner.tune.katib_trial"),
    ),
}


def _stage_help(name: str, module) -> str:
    rows = describe(module.CONFIG)
    width = max(len(k) for k, _, _ in rows) + 2
    lines = [
        f"usage: posttrain {name} [--config FILE ...] [--nproc N] [key=value ...]",
        "",
        STAGES[name].help,
        "",
        "options (YAML keys, or key=value on the command line):",
    ]
    for key, default, text in rows:
        wrapped = textwrap.wrap(f"{text} [default: {default}]", 100 - width, break_on_hyphens=False) or [""]
        lines.append(f"  {key.ljust(width)}{wrapped[0]}")
        lines.extend(" " * (width + 2) + w for w in wrapped[1:])
    lines += [
        "",
        "  --config FILE   YAML file with any of the keys above (or TRL's / LLaMA-Factory's names for",
        "                  them); repeat it to merge several files in order; key=value overrides them.",
        "                  A bare FILE.yaml (.yml, .json) is read the same way, as llamafactory-cli does.",
        "  --config-yaml TEXT",
        "                  YAML text with any of the keys above, read after the --config files and before",
        "                  key=value (how a TrainJob's nodes get their config).",
        "  --nproc N       Launch N local worker processes (torchrun-style) for this stage.",
        "  --print-config  Print the resolved config as YAML and exit.",
    ]
    return "\n".join(lines)


def stage_main(name: str, argv: list[str]) -> int:
    """``posttrain <stage> ...``: parse, validate, then run in this process or in N workers; the config is
    built as for a component (:func:`trainer_lib.runner.stage_api.stage_config`), and N workers read it
    back from one file (:func:`trainer_lib.runner.dispatch.launch_processes`)."""
    from trainer_lib.runner.stage_api import config_text, run_config, stage_config

    parser = argparse.ArgumentParser(prog=f"posttrain {name}", add_help=False)
    parser.add_argument("-h", "--help", action="store_true")
    parser.add_argument("--config", action="append", default=[])
    parser.add_argument("--config-yaml", default="")
    parser.add_argument("--nproc", type=int, default=1)
    parser.add_argument("--print-config", action="store_true")
    args, overrides = parser.parse_known_args(config_files_as_options(argv))
    if args.help:
        print(_stage_help(name, stage_module(name)))
        return 0
    bad = [o for o in overrides if o.startswith("-")]
    if bad:
        print(f"error: unknown option {bad[0]} (see posttrain {name} --help)", file=sys.stderr)
        return 2
    cfg = stage_config(name, overrides, args.config_yaml, config_files=args.config)
    if args.print_config:  # the text other processes and nodes read back (a --config file of its own)
        print(config_text(cfg))
        return 0
    if args.nproc > 1 and "TORCHELASTIC_RUN_ID" not in os.environ:  # not yet inside torchrun
        from trainer_lib.runner.dispatch import launch_processes

        return launch_processes(name, cfg, args.nproc)
    try:
        summary = run_config(name, cfg)
    except RuntimeError as exc:  # a worker whose peer died: one line, the launcher names the rank and ends the job
        from trainer_lib.engine.collectives import LOST_PEER_EXIT, lost_peer_line, say

        line = lost_peer_line(exc) if "TORCHELASTIC_RUN_ID" in os.environ else None
        if line is None:
            raise
        say(f"error: {line}")
        return LOST_PEER_EXIT
    finally:
        if "TORCHELASTIC_RUN_ID" in os.environ:  # a worker of --nproc / torchrun
            from trainer_lib.engine.process_group import leave_process_group

            leave_process_group()
    if summary and int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps(summary, indent=2, default=str))
    if "TORCHELASTIC_RUN_ID" in os.environ:
        from trainer_lib.engine.process_group import exit_worker

        exit_worker(0)
    return 0


#: a bare argument with one of these endings is a config file (``posttrain sft my.yaml``), as in llamafactory-cli.
CONFIG_SUFFIXES = (".yaml", ".yml", ".json")
#: options whose value is the next argument.
VALUE_OPTIONS = ("--config", "--config-yaml", "--nproc")


def config_files_as_options(argv: list[str]) -> list[str]:
    """``argv`` with each bare config file (no ``=``, a YAML/JSON ending) turned into ``--config FILE``, in place,
    so files keep their order among the ``--config`` options."""
    out: list[str] = []
    after_option = False
    for item in argv:
        bare = not after_option and not item.startswith("-") and "=" not in item
        if bare and item.lower().endswith(CONFIG_SUFFIXES):
            out.append("--config")
        out.append(item)
        after_option = item in VALUE_OPTIONS
    return out


def train_main(argv: list[str]) -> int:
    """``posttrain train FILE.yaml [...]``: the stage LLaMA-Factory's ``stage:`` in the file(s) names, then
    as ``posttrain <that stage> FILE.yaml [...]``."""
    from trainer_lib.config import read_yaml
    from trainer_lib.config.aliases import llamafactory_stage
    from trainer_lib.errors import ConfigError

    parser = argparse.ArgumentParser(prog="posttrain train", add_help=False)
    parser.add_argument("--config", action="append", default=[])
    args, _ = parser.parse_known_args(config_files_as_options(argv))
    if not args.config or argv[:1] in (["-h"], ["--help"]):
        print(
            "usage: posttrain train FILE.yaml [--config FILE ...] [--nproc N] [key=value ...]\n\n"
            "Runs the stage a LLaMA-Factory file names in `stage:` (sft, rm: reward, dpo, kto: dpo loss=kto, "
            "ppo);\nthe rest is read as by `posttrain <stage> --help`."
        )
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    stages = {path: read_yaml(path).get("stage") for path in args.config}
    named = {path: value for path, value in stages.items() if value is not None}
    if not named:
        raise ConfigError(
            f"stage: {', '.join(args.config)} names no LLaMA-Factory stage (stage: sft, rm, dpo, kto or ppo); "
            f"run `posttrain <stage> FILE` instead"
        )
    return stage_main(llamafactory_stage(list(named.values())[-1]), argv)


def main(argv: list[str] | None = None, extra_commands: dict[str, Command] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {**COMMANDS, **(extra_commands or {})}
    if not argv or argv[0] in ("-h", "--help", "help"):
        print("usage: posttrain <command> [--config FILE] [--nproc N] [key=value ...]\n")
        print("LLM post-training stages (each also runs as a Kubeflow component):\n")
        width = max(map(len, [*STAGES, *commands])) + 2
        for name, stage in STAGES.items():
            print(f"  {name:<{width}}{stage.help}")
        for name, (text, _) in commands.items():
            print(f"  {name:<{width}}{text}")
        print("\nRun 'posttrain <command> --help' for every option of a command.")
        return 0
    command, rest = argv[0], argv[1:]
    if command in commands:
        return run_command(commands[command][1], rest)
    if command == "deploy" and rest[:1] == ["rollback"]:  # a subcommand of the deploy stage
        return run_command(_lazy("trainer_lib.stages.lifecycle.rollback"), rest[1:])
    if command not in STAGES:
        print(f"error: unknown command '{command}' (see posttrain --help)", file=sys.stderr)
        return 2
    return run_command(functools.partial(stage_main, command), rest)


if __name__ == "__main__":
    sys.exit(main())
