"""The stages: one module each, exposing ``CONFIG`` (its typed config) and ``run(cfg) -> dict``.

The registry lives here, with the stages it names. Modules are imported only when a stage is
looked up, so reading the registry (``posttrain --help``, compiling a pipeline) needs no torch.
"""

from __future__ import annotations

import importlib

#: name -> (module, one-line description)
STAGES = {
    "prepare": ("trainer_lib.stages.lifecycle.prepare", "Validate, normalize, filter and split a dataset."),
    "sft": ("trainer_lib.stages.training.sft", "Supervised fine-tuning with prompt-masked loss and packing."),
    "reward": ("trainer_lib.stages.training.reward", "Train a pairwise (Bradley-Terry) reward model."),
    "dpo": ("trainer_lib.stages.training.dpo", "Direct preference optimization (DPO, IPO, SimPO, KTO, ...)."),
    "ppo": ("trainer_lib.stages.training.ppo", "PPO with a critic, GAE and KL control."),
    "grpo": ("trainer_lib.stages.training.grpo", "Critic-free RL: GRPO, Dr. GRPO, RLOO."),
    "evaluate": ("trainer_lib.stages.lifecycle.evaluate", "Evaluate models, write report and gate decision."),
    "release": ("trainer_lib.stages.lifecycle.release", "Publish a model that passed the evaluation gate."),
    "export": ("trainer_lib.stages.lifecycle.export", "ONNX export and INT8 quantization with parity check."),
    "deploy": ("trainer_lib.stages.lifecycle.deploy", "Publish a Triton model repository and load it."),
    "tiny-model": ("trainer_lib.demo.tiny_model", "Train a tokenizer and build a tiny model (demo, tests)."),
    "demo-data": ("trainer_lib.demo.demo_data", "Write the bundled deterministic demo datasets."),
}


def stage_module(name: str):
    """The module of stage ``name`` (``CONFIG`` and ``run``); KeyError for an unknown name."""
    return importlib.import_module(STAGES[name][0])
