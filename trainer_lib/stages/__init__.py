"""The stages: one module each, exposing ``CONFIG`` (its typed config) and ``run(cfg) -> dict``.

* ``stages/training/``: the training recipes (sft, reward, dpo, ppo, grpo, online-dpo, distill), each a readable
  loop.
* ``stages/lifecycle/``: what surrounds training (prepare, evaluate, release, export, deploy).
* The demo's two stages live with the demo kit (``trainer_lib/demo/``).

This registry is the one list of stages: the CLI, :func:`trainer_lib.runner.stage_api.run_stage` and the
KFP components read it. Modules are imported only when a stage is looked up, so reading the
registry (``posttrain --help``, compiling a pipeline) needs no torch.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Stage:
    module: str
    help: str
    kind: str  # training (the `train` component runs it), lifecycle, or demo


def _training(name: str, text: str) -> Stage:
    return Stage(f"trainer_lib.stages.training.{name}", text, "training")


def _lifecycle(name: str, text: str) -> Stage:
    return Stage(f"trainer_lib.stages.lifecycle.{name}", text, "lifecycle")


STAGES: dict[str, Stage] = {
    "prepare": _lifecycle("prepare", "Validate, normalize, filter and split a dataset."),
    "sft": _training("sft", "Supervised fine-tuning with prompt-masked loss and packing."),
    "reward": _training("reward", "Train a pairwise (Bradley-Terry) reward model."),
    "dpo": _training("dpo", "Direct preference optimization (DPO, IPO, SimPO, KTO, ...)."),
    "ppo": _training("ppo", "PPO with a critic, GAE and KL control."),
    "grpo": _training("grpo", "Critic-free RL: GRPO, Dr. GRPO, RLOO."),
    "online-dpo": _training("online_dpo", "Online DPO: the policy's own samples, paired by a judge each step."),
    "distill": _training("distill", "On-policy distillation from a teacher (GKD: reverse KL, JSD)."),
    "rloo": _training("rloo", "RLOO as TRL runs it: posttrain grpo with advantage=rloo."),
    "kto": _training("kto", "KTO as TRL runs it: posttrain dpo with loss=kto."),
    "evaluate": _lifecycle("evaluate", "Evaluate models, write report and gate decision."),
    "release": _lifecycle("release", "Publish a model that passed the evaluation gate."),
    "export": _lifecycle("export", "ONNX export and INT8 quantization with parity check."),
    "deploy": _lifecycle("deploy", "Publish a Triton model repository and load it."),
    "tiny-model": Stage(
        "trainer_lib.demo.tiny_model", "Train a tokenizer and build a tiny model (demo, tests).", "demo"
    ),
    "demo-data": Stage("trainer_lib.demo.demo_data", "Write the bundled deterministic demo datasets.", "demo"),
}

#: The stages the ``train`` component runs, in pipeline order.
TRAINING_STAGES = tuple(name for name, stage in STAGES.items() if stage.kind == "training")


def stage_module(name: str):
    """The module of stage ``name`` (``CONFIG`` and ``run``); KeyError for an unknown name."""
    return importlib.import_module(STAGES[name].module)
