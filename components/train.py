"""train: one component for every training stage (sft, reward, dpo, ppo, grpo).

The stages differ in their config and their loop, both of which live in ``trainer_lib``; what a
component does is the same for all of them: turn artifacts and parameters into the stage's config,
run it, describe the model it wrote and log its summary. The DAG names each task after its stage
(``SFT``, ``DPO``, ...), so the KFP UI reads the same as with one component per stage.

``params`` carries the stage's own scalar keys (``loss``, ``beta``, ``rollout.n``...): a dict whose
values may arrive as text when the DAG fills them from pipeline parameters; the typed config parses
them like ``key=value`` on the command line. Lists (the RL reward sources) are parameters of their
own, since a list inside a dict does not survive that substitution; empty ones are left out, so
``config_yaml`` can set them instead.

Where it runs (:func:`trainer_lib.runner.dispatch.dispatch`): ``gpus`` > 1 runs the stage in that many
processes in this pod (torchrun; rank 0 writes the model; CPU processes under ``kfp.local``).
``nodes`` > 1 runs it as a Kubeflow Trainer ``TrainJob`` of that many nodes with ``gpus`` processes (and
accelerators of the ``accelerator`` resource type) each (RBAC in manifests/rbac.yaml); inputs are then
read from the object store, and the pipeline root must be one.

``checkpoint_root`` (the pipeline root): resumable checkpoints go under it, outside the output
artifact, at a location a retried pod of this task finds again (unless the config sets
``checkpoint_dir``); the Model artifact then holds only the final model. A SIGTERM ends the task with
status 75 after a checkpoint, and its retry resumes from it.
``tensorboard``: the run's TensorBoard event files, moved out of the model (a Kubeflow Tensorboard
can be pointed at this artifact's URI); empty with ``report_to`` without tensorboard.
``reward_model`` is the RL stages' reward source (and PPO's critic start); under ``dpo``, precomputed
reference log-probs are cached next to a dataset that lives in the object store, so a retry, a
resumed run or another DPO run on the same data and reference finds them there.
``tuned`` is the best config of a search run before this task (components/tune.py): this task's own
config (the same inputs) with the best trial's values and seed, so it replaces config_yaml, the typed
parameters, ``params`` and overrides; the artifacts' paths still go over it.
Returns ``parameters``: the saved model's parameter count (0 when it cannot be read here, as for a
multi-node step's model), from which the export step is sized (components.resources).
"""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import Artifact, Dataset, Input, Metrics, Model, Output

from components.common import image_for


@dsl.component(base_image=image_for("train"), install_kfp_package=False)
def train(
    stage: str,
    model: Input[Model],
    data: Input[Dataset],
    output_model: Output[Model],
    metrics: Output[Metrics],
    tensorboard: Output[Artifact],
    reward_model: Input[Model] = None,
    tuned: Input[Artifact] = None,
    reward_functions: list = [],
    reward_weights: list = [],
    max_steps: int = 100,
    lr: float = 1e-4,
    batch_size: int = 8,
    max_length: int = 512,
    seed: int = 0,
    params: dict = {},
    config_yaml: str = "",
    overrides: list = [],
    checkpoint_root: str = "",
    gpus: int = 1,
    nodes: int = 1,
    accelerator: str = "",
) -> NamedTuple("Outputs", parameters=int):
    """Run training stage ``stage``. Precedence, lowest first: config_yaml, the typed parameters and
    ``params``, overrides, the artifacts; with ``tuned``, that file and the artifacts. ``gpus`` processes on
    each of ``nodes`` nodes (see the module)."""
    from collections import namedtuple

    from components.common import image_for, log_summary, remote_location, source_of, stage_params, training_node
    from trainer_lib.runner.dispatch import Where, dispatch, exit_when_preempted
    from trainer_lib.runner.outcome import trained_model
    from trainer_lib.runner.stage_api import stage_config, training_layers
    from trainer_lib.stages import TRAINING_STAGES

    if stage not in TRAINING_STAGES:
        raise ValueError(f"stage: expected a training stage ({', '.join(TRAINING_STAGES)}), got {stage!r}")
    params = stage_params(stage, data, params)
    locate = remote_location if nodes > 1 else source_of
    paths = {"model.path": locate(model), "data.path": locate(data), "output_dir": output_model.path}
    if reward_model is not None:
        paths["reward.model_path"] = locate(reward_model)
    typed = dict(max_steps=max_steps, lr=lr, batch_size=batch_size, max_length=max_length, seed=seed, params=params)
    given = dict(reward_functions=reward_functions, reward_weights=reward_weights, overrides=overrides)
    layers = training_layers({**typed, **given}, paths)
    if tuned is not None:  # a search's best config, built from these same inputs: only the paths go over it
        with open(tuned.path, encoding="utf-8") as fh:
            layers, config_yaml = [paths], fh.read()
    cfg = stage_config(stage, layers, config_yaml)
    where = Where(gpus, nodes, checkpoint_root, image=image_for("train"), node=training_node(gpus, accelerator))
    with exit_when_preempted():  # SIGTERM: checkpoint written; status 75, and the task's retry resumes from it
        summary = dispatch(stage, cfg, where)
    trained = trained_model(summary, output_model.path, tensorboard.path)
    tensorboard.metadata.update({"format": "tensorboard", "stage": stage})
    output_model.metadata.update({"base": source_of(model), **trained.metadata})
    log_summary(metrics, trained.metrics)
    return namedtuple("Outputs", ["parameters"])(trained.parameters)
