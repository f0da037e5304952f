"""The PPO and GRPO components: thin wrappers whose bodies run the stages when called directly."""

import json

from kfp import dsl

from components.grpo import grpo
from components.ppo import ppo
from tests.stages.rl_helpers import LENGTH_REWARD, one_thread, write_prompts


def test_rl_component_interfaces():
    for component in (ppo, grpo):
        inputs = component.component_spec.inputs
        assert inputs["model"].type == "system.Model@0.0.1" and inputs["data"].type == "system.Dataset@0.0.1"
        assert inputs["reward_model"].optional and inputs["reward_functions"].default == []
        assert {k: v.type for k, v in component.component_spec.outputs.items()} == {
            "output_model": "system.Model@0.0.1", "metrics": "system.Metrics@0.0.1"}


def test_grpo_component_trains_and_reports(tiny_model_dir, tmp_path):
    model = dsl.Model(uri=tiny_model_dir)
    data = dsl.Dataset(uri=write_prompts(tmp_path / "prompts.jsonl", 8))
    out, metrics = dsl.Model(uri=str(tmp_path / "out")), dsl.Metrics(uri=str(tmp_path / "metrics"))
    with one_thread():
        grpo.python_func(model=model, data=data, output_model=out, metrics=metrics,
                         reward_functions=[LENGTH_REWARD],
                         advantage="dr_grpo", rollout_n=2, max_new_tokens=8, prompts_per_step=2, max_steps=2,
                         lr=1e-3, batch_size=4, config_yaml="reward:\n  functions: [ignored:fn]\nlogging_steps: 1\n",
                         overrides=["data.eval_fraction=0.25", "save_steps=0"])
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["advantage"] == "dr_grpo"
    assert out.metadata["stage"] == "grpo" and metrics.metadata["steps"] == 2
    assert "eval_reward" in metrics.metadata and "train.reward" in metrics.metadata
