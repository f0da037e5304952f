"""Our side of a benchmark run: ``python -m benchmarks.side_ours SPEC OUT`` (the posttrain venv).

Runs ``posttrain <algo>`` in this process with the spec's settings; step ends are taken from
``Cadence.after_step`` and the final loss from ``metrics.jsonl``. DPO runs with its default
reference (precomputed once for a whole-epoch run): the time that takes is charged to the timed
steps pro rata (``one_off_seconds``).
"""

from __future__ import annotations

import json
import os
import sys
import time

from benchmarks.probe import Probe, write_result


def overrides(spec: dict, output_dir: str) -> list[str]:
    common = {
        "model.path": spec["model_dir"],
        "data.path": spec["data_path"],
        "output_dir": output_dir,
        "max_steps": spec["steps"],
        "batch_size": spec["batch_size"],
        "lr": spec["lr"],
        "lr_scheduler": "constant",
        "warmup_steps": 0,
        "adam_beta1": spec["adam_beta1"],
        "adam_beta2": spec["adam_beta2"],
        "adam_epsilon": spec["adam_epsilon"],
        "weight_decay": spec["weight_decay"],
        "engine.max_grad_norm": spec["max_grad_norm"],
        "engine.precision": spec["precision"],
        "engine.gradient_checkpointing": "false",
        "engine.gradient_accumulation_steps": spec["accumulation"],
        "data.max_length": spec["max_length"],
        "data.eval_fraction": 0,
        "save_steps": 0,
        "eval_steps": 0,
        "logging_steps": 1,
        "report_to": "none",
        "resume": "false",
        "seed": spec["seed"],
    }
    if spec["algo"] == "sft":
        # SFT packing would put more rows in a step than TRL's; DPO and the reward model keep their default,
        # each micro-batch's pairs as one padding-free row (the same pairs per step as TRL's padded batch)
        common["data.packing"] = "false"
    if spec["algo"] == "dpo":
        common.update({"loss": "sigmoid", "beta": spec["dpo_beta"]})  # our default reference: precomputed
    if spec["algo"] == "grpo":
        completions = spec["prompts_per_step"] * spec["group_size"]
        common.update(
            {
                "prompts_per_step": spec["prompts_per_step"],
                "rollout.n": spec["group_size"],
                "rollout.max_new_tokens": spec["max_new_tokens"],
                "rollout.temperature": spec["temperature"],
                "rollout.batch_size": completions,
                "batch_size": completions,
                "mini_batch_size": 0,
                "ppo_epochs": 1,
                "engine.gradient_accumulation_steps": 1,
                "beta": 0.0,
                "advantage": "grpo",
                "reward.functions": f'["{spec["reward_function"]}"]',
            }
        )
    return [f"{key}={value}" for key, value in common.items()] + spec.get("ours_overrides", [])


def main(spec_path: str, out_path: str) -> int:
    with open(spec_path, encoding="utf-8") as f:
        spec = json.load(f)
    probe = Probe.from_spec(spec)
    probe.install()

    from trainer_lib import cli
    from trainer_lib.loop.cadence import Cadence

    after_step = Cadence.after_step

    def timed_after_step(self, step, epoch=None):
        probe.step_end()  # before logging, as TRL's on_step_end
        return after_step(self, step, epoch=epoch)

    Cadence.after_step = timed_after_step

    from trainer_lib.models import reference

    compute_tables = reference.compute_reference_tables

    def timed_tables(*args, **kwargs):
        start = time.perf_counter()
        tables = compute_tables(*args, **kwargs)
        probe.one_off_seconds += time.perf_counter() - start
        return tables

    reference.compute_reference_tables = timed_tables
    output_dir = os.path.join(os.path.dirname(out_path), os.path.basename(out_path) + ".run")
    code = cli.main([spec["algo"], *overrides(spec, output_dir)])
    if code != 0:
        return code
    with open(os.path.join(output_dir, "metrics.jsonl"), encoding="utf-8") as f:
        records = [json.loads(line) for line in f if line.strip()]
    probe.losses = [r["loss"] for r in records if r.get("split") == "train" and "loss" in r]
    write_result(out_path, probe.result(spec["prompts_per_step"]))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
