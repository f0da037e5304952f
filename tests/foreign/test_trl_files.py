"""TRL's own documented configs run unchanged (tests/data/foreign/trl/README.md says where they come from): only the
model, the dataset (a local file in the hub dataset's format), the output directory, push_to_hub=false and
the step count are given on the command line. Also: TRL's GRPO/RLOO keys map to ours."""

import contextlib
import io
import json
import os
import re

import pytest

from tests.conftest import REPO
from tests.stages.training.rl_helpers import one_thread
from trainer_lib.cli import main
from trainer_lib.config import load_config
from trainer_lib.errors import ConfigError
from trainer_lib.stages.training.dpo import DPOConfig
from trainer_lib.stages.training.grpo import GRPOConfig
from trainer_lib.stages.training.ppo import PPOConfig
from trainer_lib.stages.training.sft import SFTConfig

pytestmark = pytest.mark.usefixtures("single_thread")

TRL = os.path.join(REPO, "tests", "data", "foreign", "trl")
#: their file -> (the posttrain command, the local file in the format of the hub dataset it names, max_steps)
RUNS = {
    "sft.yaml": ("sft", "capybara.jsonl", 1),
    "dpo.yaml": ("dpo", "ultrafeedback_binarized.jsonl", 1),
    "kto.yaml": ("kto", "kto_mix.jsonl", 1),
    "reward.yaml": ("reward", "ultrafeedback_binarized.jsonl", 1),
    # two steps: 64 sampled completions, of which a random model gets about one in ten answers right
    "grpo.yaml": ("grpo", "deepmath.jsonl", 2),
    "rloo.yaml": ("rloo", "deepmath.jsonl", 2),
}
REQUIRED = {"model": {"path": "m"}, "data": {"path": "d.jsonl"}, "output_dir": "out"}


def _mapping(err: str) -> dict[str, str]:
    """``their key -> what it became`` from the ``config:`` lines on stderr."""
    lines = [line[len("config: ") :] for line in err.splitlines() if line.startswith("config: ")]
    return dict(line.split(" -> ", 1) for line in lines if " -> " in line)


@pytest.fixture(scope="module")
def math_model(tmp_path_factory) -> str:
    """A 2-layer Llama whose tokenizer is trained on sums: its random samples end in a random digit or so."""
    from trainer_lib.demo.tiny_model import make_tiny_model

    texts = [f"{a} + {b} = {a + b}. The answer is \\boxed{{{a + b}}}." for a in range(10) for b in range(10)]
    out = tmp_path_factory.mktemp("models") / "math-tiny"
    return make_tiny_model(str(out), texts, vocab_size=120, num_layers=2, hidden_size=64, seed=0)


@pytest.fixture(scope="module")
def runs(tiny_model_dir, math_model, tmp_path_factory) -> dict[str, tuple[int, dict, str]]:
    """Every file run once, as `posttrain <command> THEIR_FILE` with the five overrides: name -> (exit code,
    mapping printed, output directory)."""
    out_root = tmp_path_factory.mktemp("trl-runs")
    results = {}
    for name, (command, data, steps) in RUNS.items():
        model = math_model if command in ("grpo", "rloo") else tiny_model_dir
        out = out_root / name.removesuffix(".yaml")
        argv = [command, os.path.join(TRL, name), f"model_name_or_path={model}"]
        argv += [f"dataset_name={os.path.join(TRL, 'data', data)}", f"output_dir={out}", "push_to_hub=false"]
        err = io.StringIO()
        with pytest.MonkeyPatch.context() as env, one_thread(), contextlib.redirect_stderr(err):
            env.setenv("POSTTRAIN_NO_PROGRESS", "1")
            env.setenv("POSTTRAIN_CACHE", str(out_root / "cache"))
            code = main([*argv, f"max_steps={steps}"])
        results[name] = (code, _mapping(err.getvalue()), str(out))
    return results


@pytest.mark.parametrize("name", RUNS)
def test_their_file_trains_and_saves_a_model(name, runs):
    code, mapping, out = runs[name]
    assert code == 0, mapping
    assert all(target.strip() for target in mapping.values()), mapping  # every line says what became of it
    assert mapping["model_name_or_path"] == "model.path" and mapping["dataset_name"] == "data.path"
    assert json.loads(open(os.path.join(out, "summary.json")).read())["steps"] == RUNS[name][2]
    assert os.path.isfile(os.path.join(out, "model.safetensors")) and os.path.isfile(os.path.join(out, "config.json"))


def test_what_their_keys_became(runs):
    sft, dpo, kto = runs["sft.yaml"][1], runs["dpo.yaml"][1], runs["kto.yaml"][1]
    assert sft["eos_token"].startswith("(each turn of a conversation already ends with")
    assert sft["use_peft"] == "(LoRA on, rank from lora_r)" and sft["packing"] == "data.packing"
    assert dpo["remove_unused_columns"].startswith("(no effect here") and dpo["eval_strategy"].startswith("(eval_steps")
    assert kto["warmup_steps"].startswith("warmup_steps=1 ") and kto["logging_first_step"].startswith("(no effect")
    assert runs["grpo.yaml"][1]["reward_funcs"] == "reward.functions=['accuracy_reward']"


@pytest.mark.parametrize("name, advantage", [("grpo.yaml", "grpo"), ("rloo.yaml", "rloo")])
def test_accuracy_reward_scores_their_math_rows(name, advantage, runs):
    out = runs[name][2]
    summary = json.loads(open(os.path.join(out, "summary.json")).read())
    assert summary["advantage"] == advantage  # `posttrain rloo` is GRPO's loop with leave-one-out advantages
    train = [r for r in map(json.loads, open(os.path.join(out, "metrics.jsonl"))) if r["split"] == "train"]
    # some sampled answers equal the solution column: it reached the reward, which math-verify scored
    assert train and any(record["rewards/accuracy_reward"] > 0 for record in train), train


def test_their_4bit_kto_command_is_refused_with_the_reason():
    with pytest.raises(ConfigError, match="load_in_4bit: true is not supported: quantized"):
        load_config(DPOConfig, [{**REQUIRED, "use_peft": True, "load_in_4bit": True}])


def test_grpo_keys():
    rl = {**REQUIRED, "reward_funcs": ["accuracy_reward", "think_format_reward", "my_lib.rewards.custom"]}
    on_the_command_line = load_config(GRPOConfig, [REQUIRED], ["reward_funcs=accuracy_reward,think_format_reward"])
    assert on_the_command_line.reward.functions == ["accuracy_reward", "think_format_reward"]
    cfg = load_config(GRPOConfig, [{**rl, "reward_weights": [1.0, 0.5, 0.25], "epsilon_high": 0.28, "epsilon": 0.1}])
    assert cfg.reward.functions == ["accuracy_reward", "think_format_reward", "my_lib.rewards:custom"]
    assert cfg.reward.weights == [1.0, 0.5, 0.25] and cfg.clip_range() == (0.1, 0.28)
    for loss_type, aggregation in [("grpo", "sequence"), ("dapo", "token"), ("bnpo", "token"), ("dr_grpo", "constant")]:
        cfg = load_config(GRPOConfig, [{**rl, "loss_type": loss_type}])
        assert (cfg.advantage, cfg.loss_aggregation) == ("grpo", aggregation)
    cfg = load_config(GRPOConfig, [{**rl, "scale_rewards": False, "loss_type": "dr_grpo"}])
    assert (cfg.advantage, cfg.loss_aggregation) == ("dr_grpo", "constant")  # the Dr. GRPO paper's pair
    assert load_config(GRPOConfig, [{**rl, "scale_rewards": "none"}]).loss_aggregation == "sequence"
    cfg = load_config(GRPOConfig, [{**rl, "importance_sampling_level": "sequence", "num_iterations": 2}])
    assert (cfg.objective, cfg.ppo_epochs) == ("gspo", 2)
    cfg = load_config(GRPOConfig, [{**rl, "max_prompt_length": 128, "temperature": 0.7, "use_vllm": False}])
    assert (cfg.data.max_length, cfg.rollout.temperature) == (128, 0.7)
    assert load_config(DPOConfig, [{**REQUIRED, "loss_type": "ipo"}]).loss == "ipo"  # DPO: the loss itself
    assert load_config(PPOConfig, [{**rl, "kl_coef": 0.2}]).kl.coef == 0.2
    layer = {"model": {"path": "m"}, "output_dir": "o", "datasets": [{"path": "trl-lib/Capybara", "split": "train"}]}
    cfg = load_config(SFTConfig, [layer])
    assert (cfg.data.path, cfg.data.split) == ("trl-lib/Capybara", "train")


@pytest.mark.parametrize(
    "layer, message",
    [
        ({"loss_type": "cispo"}, "loss_type: 'cispo' is not supported: not built in"),
        ({"scale_rewards": "batch"}, "scale_rewards: 'batch' is not supported: the std of the whole batch"),
        ({"reward_funcs": ["get_soft_overlong_punishment"]}, "set overlong_buffer"),
        ({"mask_truncated_completions": True}, "mask_truncated_completions: true is not supported"),
        ({"use_vllm": True}, "use_vllm: true is not supported"),
        ({"num_processes": 4}, "run `posttrain <stage> --nproc 4 ...`"),
        ({"datasets": [{"path": "a"}, {"path": "b", "data_files": "x.json"}]}, "datasets: b: data_files is not read"),
        ({"eos_token": "<eos>"}, "eos_token: '<eos>' is not supported"),
    ],
)
def test_their_keys_we_cannot_honour_are_refused(layer, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(GRPOConfig, [{**REQUIRED, "reward_funcs": ["accuracy_reward"], **layer}])
