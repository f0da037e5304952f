"""ppo: SFT model + prompt dataset (+ reward model) -> policy trained with PPO (critic, GAE, KL control)."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Metrics, Model, Output

from components.common import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def ppo(
    model: Input[Model],
    data: Input[Dataset],
    output_model: Output[Model],
    metrics: Output[Metrics],
    reward_model: Input[Model] = None,
    reward_functions: list = [],
    reward_weights: list = [],
    kl_coef: float = 0.05,
    rollout_n: int = 4,
    max_new_tokens: int = 64,
    temperature: float = 1.0,
    prompts_per_step: int = 8,
    max_steps: int = 100,
    lr: float = 1e-4,
    batch_size: int = 8,
    max_length: int = 512,
    seed: int = 0,
    config_yaml: str = "",
    overrides: list = [],
):
    """Precedence, lowest first: config_yaml, the typed parameters, overrides, the artifacts.

    The critic starts from ``reward_model`` when given (else from ``model`` with a new head);
    ``reward_functions`` and ``reward_weights`` are passed only when non-empty.
    """
    from components.common import last_logged, log_summary, source_of
    from trainer_lib.stage_api import run_stage

    params = {"kl.coef": kl_coef, "rollout.n": rollout_n, "rollout.max_new_tokens": max_new_tokens,
              "rollout.temperature": temperature, "prompts_per_step": prompts_per_step, "max_steps": max_steps,
              "lr": lr, "batch_size": batch_size, "data.max_length": max_length, "seed": seed}
    lists = {"reward.functions": reward_functions, "reward.weights": reward_weights}
    params.update({key: value for key, value in lists.items() if value})
    wiring = {"model.path": source_of(model), "data.path": source_of(data), "output_dir": output_model.path}
    if reward_model is not None:
        wiring["reward.model_path"] = source_of(reward_model)
    summary = run_stage("ppo", [params, *overrides, wiring], config_yaml)
    output_model.metadata.update({"stage": "ppo", "steps": summary.get("steps"), "kl_coef": summary.get("kl_coef"),
                                  "base": source_of(model)})
    log_summary(metrics, {**summary, "train": last_logged(output_model.path, "train")})
