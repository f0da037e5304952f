"""Sub-pipelines: one named, reusable step of the post-training DAG each (GCPC style).

A sub-pipeline takes artifacts and the parameters of its own stage only; infrastructure
(image, resources, secrets) comes from :mod:`pipelines.settings`. The top-level DAGs in
:mod:`pipelines.dag` chain them.
"""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import Dataset, Input, Metrics, Model

from components.dpo import dpo
from components.prepare import prepare
from components.reward import reward
from components.sft import sft
from pipelines.settings import configure

StageOutputs = NamedTuple("StageOutputs", model=Model, metrics=Metrics)


@dsl.pipeline(name="sft-stage", description="Prepare an SFT dataset, then fine-tune the model on it.")
def sft_stage(
    model: Input[Model],
    data: Input[Dataset],
    max_steps: int = 200,
    lr: float = 1e-4,
    batch_size: int = 8,
    max_length: int = 512,
    eval_fraction: float = 0.05,
    seed: int = 0,
    config_yaml: str = "",
    overrides: list = [],
    prepare_overrides: list = [],
) -> StageOutputs:
    prepared = configure(prepare(data=data, model=model, max_length=max_length, eval_fraction=eval_fraction,
                                 seed=seed, overrides=prepare_overrides), "prepare SFT data")
    trained = configure(sft(model=model, data=prepared.outputs["prepared"], max_steps=max_steps, lr=lr,
                            batch_size=batch_size, max_length=max_length, seed=seed,
                            config_yaml=config_yaml, overrides=overrides), "SFT")
    return StageOutputs(model=trained.outputs["output_model"], metrics=trained.outputs["metrics"])


@dsl.pipeline(name="dpo-stage", description="Prepare preference pairs, then optimize the SFT model on them.")
def dpo_stage(
    model: Input[Model],
    data: Input[Dataset],
    loss: str = "sigmoid",
    beta: float = 0.1,
    max_steps: int = 200,
    lr: float = 5e-5,
    batch_size: int = 8,
    max_length: int = 512,
    seed: int = 0,
    config_yaml: str = "",
    overrides: list = [],
    prepare_overrides: list = [],
) -> StageOutputs:
    prepared = configure(prepare(data=data, model=model, max_length=max_length, seed=seed,
                                 overrides=prepare_overrides), "prepare preference data")
    trained = configure(dpo(model=model, data=prepared.outputs["prepared"], loss=loss, beta=beta,
                            max_steps=max_steps, lr=lr, batch_size=batch_size, max_length=max_length, seed=seed,
                            config_yaml=config_yaml, overrides=overrides), "DPO")
    return StageOutputs(model=trained.outputs["output_model"], metrics=trained.outputs["metrics"])


@dsl.pipeline(name="reward-stage", description="Prepare preference pairs, then train a pairwise reward model.")
def reward_stage(
    model: Input[Model],
    data: Input[Dataset],
    max_steps: int = 200,
    lr: float = 1e-4,
    batch_size: int = 8,
    max_length: int = 512,
    seed: int = 0,
    config_yaml: str = "",
    overrides: list = [],
    prepare_overrides: list = [],
) -> StageOutputs:
    prepared = configure(prepare(data=data, model=model, max_length=max_length, seed=seed,
                                 overrides=prepare_overrides), "prepare reward data")
    trained = configure(reward(model=model, data=prepared.outputs["prepared"], max_steps=max_steps, lr=lr,
                               batch_size=batch_size, max_length=max_length, seed=seed,
                               config_yaml=config_yaml, overrides=overrides), "reward model")
    return StageOutputs(model=trained.outputs["output_model"], metrics=trained.outputs["metrics"])
