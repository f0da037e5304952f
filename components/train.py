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
    """Precedence, lowest first: config_yaml, the typed parameters and ``params``, overrides, the artifacts.

    ``gpus`` > 1 runs the stage in that many processes in this pod (``posttrain <stage> --nproc N``,
    torchrun); rank 0 writes the model. Under ``kfp.local`` they are CPU processes.
    ``nodes`` > 1 runs it as a Kubeflow Trainer ``TrainJob`` of that many nodes with ``gpus``
    processes (and accelerators of the ``accelerator`` resource type) each (trainer_lib.cluster; RBAC in
    manifests/rbac.yaml); inputs are then read from the object store, and the pipeline root must be one.
    ``checkpoint_root`` (the pipeline root): resumable checkpoints go under it, outside the output
    artifact, at a location a retried pod of this task finds again (unless the config sets
    ``checkpoint_dir``); the Model artifact then holds only the final model.
    ``tensorboard``: the run's TensorBoard event files, moved out of the model (a Kubeflow Tensorboard
    can be pointed at this artifact's URI); empty with ``report_to`` without tensorboard.
    ``reward_model`` is the RL stages' reward source (and PPO's critic start); under ``dpo``, precomputed
    reference log-probs are cached next to a dataset that lives in the object store, so a retry, a
    resumed run or another DPO run on the same data and reference finds them there.
    Returns ``parameters``: the saved model's parameter count (0 when it cannot be read here, as for a
    multi-node step's model), from which the export step is sized (components.resources).
    """
    from components.common import (
        last_logged,
        log_summary,
        remote_location,
        run_in_processes,
        run_on_nodes,
        source_of,
        store_prefix,
        training_layers,
    )
    from trainer_lib.engine.checkpoint import stable_checkpoint_dir
    from trainer_lib.stage_api import run_config, stage_config
    from trainer_lib.stages import TRAINING_STAGES

    if stage not in TRAINING_STAGES:
        raise ValueError(f"stage: expected a training stage ({', '.join(TRAINING_STAGES)}), got {stage!r}")
    store = store_prefix(data) if stage == "dpo" else None
    if store:  # below the user's overrides: they may put the cache elsewhere
        params = {"reference_logps_path": store + "/reference_logps", **params}
    locate = remote_location if nodes > 1 else source_of
    paths = {"model.path": locate(model), "data.path": locate(data), "output_dir": output_model.path}
    if reward_model is not None:
        paths["reward.model_path"] = locate(reward_model)
    layers = training_layers(
        dict(
            max_steps=max_steps,
            lr=lr,
            batch_size=batch_size,
            max_length=max_length,
            seed=seed,
            params=params,
            reward_functions=reward_functions,
            reward_weights=reward_weights,
            overrides=overrides,
        ),
        paths,
    )
    cfg = stage_config(stage, layers, config_yaml)
    if checkpoint_root and not cfg.checkpoint_dir:
        cfg.checkpoint_dir = stable_checkpoint_dir(cfg, checkpoint_root, stage)
    from trainer_lib.engine.preemption import PREEMPTED_EXIT, Preempted

    try:
        if nodes > 1:
            summary = run_on_nodes(stage, cfg, nodes, gpus, checkpoint_root, accelerator)
        elif gpus > 1:
            summary = run_in_processes(stage, cfg, gpus)
        else:
            summary = run_config(stage, cfg)
    except Preempted as exc:  # SIGTERM: checkpoint written; status 75, and the task's retry resumes from it
        print(f"preempted: {exc}", flush=True)
        raise SystemExit(PREEMPTED_EXIT) from None

    import os
    import shutil

    events = os.path.join(output_model.path, "tensorboard")
    os.makedirs(tensorboard.path, exist_ok=True)
    if os.path.isdir(events):
        for name in os.listdir(events):
            shutil.move(os.path.join(events, name), os.path.join(tensorboard.path, name))
        os.rmdir(events)
    tensorboard.metadata.update({"format": "tensorboard", "stage": stage})

    from collections import namedtuple

    from trainer_lib.models.save import saved_parameters

    parameters = saved_parameters(output_model.path)
    described = {**summary, **summary.get("reward_stats", {})}  # reward models: their mean and std too
    output_model.metadata.update(
        {
            "base": source_of(model),
            "parameters": parameters,
            **{
                k: v
                for k, v in described.items()
                if k in ("stage", "steps", "loss", "advantage", "kl_coef", "reference", "reward_mean", "reward_std")
            },
        }
    )
    log_summary(metrics, {**summary, "train": last_logged(output_model.path, "train")})
    return namedtuple("Outputs", ["parameters"])(parameters)
