"""posttrain's library: every stage of LLM post-training, one folder per layer or concern.

Layers, each importing only those below it (``tests/test_layers.py`` checks it)::

    losses/                  pure math: preference and policy-gradient losses, advantages
    config/ storage/ data/ models/ engine/ loop/ rl/ rewards/ sandbox/ eval/ export/ serving/ cluster/ demo/
                             the core, one concern per folder
    stages/training/         the training recipes (sft, reward, dpo, ppo, grpo), each a readable run(config)
    stages/lifecycle/        prepare, evaluate, release, export, deploy
    stage_api.py, cli.py     build a stage's config and run it; the ``posttrain`` command

Modules that moved when the folders became the layers (2026-12) still import from their old
paths, with a DeprecationWarning naming the new one; nothing heavy is imported here.
"""

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

#: old module path -> new module path (removed in 0.3)
MOVED = {
    "trainer_lib.config_aliases": "trainer_lib.config.aliases",
    "trainer_lib.keys": "trainer_lib.config.values",
    "trainer_lib.rl.config": "trainer_lib.config.rl",
    "trainer_lib.strategy": "trainer_lib.engine.strategy",
    "trainer_lib.deepspeed_config": "trainer_lib.engine.deepspeed_file",
    "trainer_lib.batch_size": "trainer_lib.engine.batch_size",
    "trainer_lib.checkpoint": "trainer_lib.engine.checkpoint",
    "trainer_lib.launch": "trainer_lib.engine.launch",
    "trainer_lib.cadence": "trainer_lib.loop.cadence",
    "trainer_lib.schedule": "trainer_lib.loop.micro_batches",
    "trainer_lib.tracking": "trainer_lib.loop.tracking",
    "trainer_lib.rollout": "trainer_lib.rl.rollout",
    "trainer_lib.rl.schedule": "trainer_lib.rl.prompts",
    "trainer_lib.data.preference": "trainer_lib.data.preference_batches",
    "trainer_lib.losses.rl": "trainer_lib.losses.policy_gradient",
    "trainer_lib.data.demo": "trainer_lib.demo.generator",
    "trainer_lib.models.tiny": "trainer_lib.demo.tiny_model",
    "trainer_lib.stages.tiny_model": "trainer_lib.demo.tiny_model",
    "trainer_lib.stages.demo_data": "trainer_lib.demo.demo_data",
    "trainer_lib.eval.cli": "trainer_lib.eval.humaneval_cli",
    "trainer_lib.serving.cli": "trainer_lib.serving.serve_cli",
    **{
        f"trainer_lib.stages.{name}": f"trainer_lib.stages.training.{name}"
        for name in ("sft", "reward", "dpo", "ppo", "grpo")
    },
    **{
        f"trainer_lib.stages.{name}": f"trainer_lib.stages.lifecycle.{name}"
        for name in ("prepare", "evaluate", "release", "export", "deploy")
    },
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old module path as the module at its new path (the same module object)."""

    specs: dict = {}

    def find_spec(self, fullname, path=None, target=None):
        if fullname in MOVED:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        new = MOVED[spec.name]
        warnings.warn(f"{spec.name} moved to {new}; import it from there", DeprecationWarning, stacklevel=2)
        module = importlib.import_module(new)
        self.specs[new] = module.__spec__
        return module

    def exec_module(self, module):
        module.__spec__ = self.specs[module.__name__]  # its own spec, which the import system replaced


sys.meta_path.append(_MovedModules())
