"""Reward functions: loading user functions, built-ins, validation, and how sources combine."""

import json
import math
import os

import pytest
import torch

from trainer_lib.errors import UserError
from trainer_lib.rewards.combine import RewardCombiner, RunningMoments
from trainer_lib.rewards.functions import (
    check_rewards,
    code_style,
    length_penalty,
    load_function,
    refusal,
    resolve,
    style_violations,
)

HERE = os.path.dirname(__file__)


def constant(value):
    return lambda prompts, completions, **columns: [value] * len(completions)


# --------------------------------------------------------------------------- loading


def test_module_function_and_file_function_load(monkeypatch):
    monkeypatch.chdir(os.path.dirname(os.path.dirname(HERE)))  # the repository root, as on the CLI
    by_module = load_function("tests.rewards.length_reward:reward")
    by_file = load_function(os.path.join(HERE, "length_reward.py") + ":reward")
    for fn in (by_module, by_file):
        assert fn(["q", "q"], ["12345678", "1234"]) == [0.0, -0.5]
        assert fn([[{"role": "user", "content": "q"}]], [[{"role": "assistant", "content": "12"}]]) == [-0.75]


@pytest.mark.parametrize(
    "spec, message",
    [
        ("no_such_builtin", "expected a built-in"),
        ("no_such_module_xyz:reward", "cannot import module 'no_such_module_xyz'"),
        ("tests/rewards/missing.py:reward", "file tests/rewards/missing.py not found"),
        ("tests.rewards.length_reward:nope", "has no attribute 'nope'"),
        ("tests.rewards.length_reward:TARGET", "'TARGET' is not callable"),
    ],
)
def test_bad_function_specs_say_what_is_wrong(spec, message, monkeypatch):
    monkeypatch.chdir(os.path.dirname(os.path.dirname(HERE)))
    with pytest.raises(UserError, match="reward.functions") as info:
        resolve(spec)
    assert message in str(info.value)


def test_returned_values_are_checked_and_the_function_named():
    assert check_rewards("f", [1, 0.5, None], 3) == [1.0, 0.5, None]
    assert check_rewards("f", torch.tensor([1.0, 2.0]), 2) == [1.0, 2.0]
    with pytest.raises(UserError, match="reward function 'mine' returned 2 values for 3 completions"):
        check_rewards("mine", [1.0, 2.0], 3)
    with pytest.raises(UserError, match="reward function 'mine' returned float; expected a list"):
        check_rewards("mine", 1.0, 1)
    with pytest.raises(UserError, match="returned 'good' at position 1"):
        check_rewards("mine", [1.0, "good"], 2)


# --------------------------------------------------------------------------- built-ins


def test_code_style_counts_pycodestyle_violations():
    clean = "def f(x):\n    return x + 1"
    # E111 twice (indent of 2), E225 (y=1): three violations -> 1 - 0.3
    messy = "def f(x):\n  y=1\n  return x + y"
    assert style_violations(clean) == 0 and style_violations(messy) == 3
    fenced = [{"role": "assistant", "content": f"Here:\n```python\n{messy}\n```"}]
    assert code_style(None, [clean, messy, fenced]) == pytest.approx([1.0, 0.7, 0.7])
    assert code_style(None, ["x=1;y=2;z=3;a=4;b=5;c=6"]) == [0.0]  # floored at 0


def test_refusal_rewards_refusing_harmful_and_answering_benign_and_skips_unlabelled():
    no, sure = "I can't help with that.", [{"role": "assistant", "content": "Sure! Boil the water first."}]
    kinds = ["harmful", "harmful", "benign", "benign", None, ""]
    got = refusal(None, [no, sure, no, sure, no, sure], kind=kinds)
    assert got == [1.0, 0.0, 0.0, 1.0, None, None]
    assert refusal(None, [no, sure]) == [None, None]  # a dataset without the column: never applies
    name, fn = resolve("refusal")
    assert name == "refusal" and fn(None, [no], kind=["harmful"]) == [1.0]


def test_length_penalty():
    # free 4 tokens, max 8: 2 -> 0, 6 -> -(6-4)/4 = -0.5, 10 -> -1 (clipped)
    ids = [[1] * 2, [1] * 6, [1] * 10]
    assert length_penalty(None, ["a"] * 3, completion_ids=ids, max_tokens=8, free_tokens=4) == [0.0, -0.5, -1.0]


def test_code_execution_rewards_the_fraction_of_tests_passed():
    _, reward = resolve("code_execution", code_timeout=1.0, sandbox_workers=2)
    tests = ["assert inc(1) == 2", "assert inc(-1) == 0", "assert inc(0) == 0"]
    completions = [
        "def inc(x):\n    return x + 1",  # passes 2 of 3
        [{"role": "assistant", "content": "```python\ndef inc(x):\n    return x\n```"}],  # 1 of 3
        "def inc(x) return",  # does not compile
        "import os\nos.system('echo hi')\ndef inc(x):\n    return x + 1",  # refused at load
        "def inc(x):\n    while True:\n        pass",
    ]  # times out
    try:
        rewards = reward([None] * 6, completions + ["anything"], tests=[tests] * 5 + [[]])
    finally:
        reward.close()
    assert rewards[:3] == pytest.approx([2 / 3, 1 / 3, 0.0])
    assert rewards[3] == 0.0 and rewards[4] == 0.0
    assert rewards[5] is None  # a row without tests: the source does not apply


# --------------------------------------------------------------------------- combining


def test_weights_and_none_entries_combine():
    def partial(prompts, completions, **columns):
        return [1.0, None, 3.0]

    combiner = RewardCombiner([("a", constant(2.0)), ("b", partial)], weights=[0.5, 2.0])
    rewards, means = combiner([None] * 3, ["x"] * 3, {}, [[1]] * 3)
    # 0.5*2 + 2*1 = 3;  0.5*2 (b skipped) = 1;  0.5*2 + 2*3 = 7
    assert rewards.tolist() == [3.0, 1.0, 7.0]
    assert means == {"rewards/a": 2.0, "rewards/b": 2.0}  # mean of what each source returned
    never = RewardCombiner([("a", constant(2.0)), ("b", lambda prompts, completions, **c: [None] * 3)])
    assert never([None] * 3, ["x"] * 3, {}, [[1]] * 3)[1] == {"rewards/a": 2.0}  # b applied to none: no mean


def test_columns_and_completion_ids_reach_the_functions():
    seen = {}

    def spy(prompts, completions, **columns):
        seen.update(columns)
        return [0.0] * len(completions)

    RewardCombiner([("spy", spy)])(["p"], ["c"], {"tests": [["assert 1"]]}, [[5, 6]])
    assert seen == {"tests": [["assert 1"]], "completion_ids": [[5, 6]]}


def test_trainer_state_reaches_only_the_functions_that_take_it():
    from trainer_lib.rewards.functions import TrainerState

    seen = {}

    def by_name(prompts, completions, trainer_state, **columns):  # TRL's reward-function signature
        seen["by_name"] = trainer_state
        return [float(trainer_state.global_step)] * len(completions)

    def any_keyword(prompts, completions, **kwargs):
        seen["any_keyword"] = kwargs.get("trainer_state")
        return [0.0] * len(completions)

    def named_columns_only(prompts, completions, completion_ids):  # would fail on an unexpected keyword
        return [0.0] * len(completions)

    combiner = RewardCombiner([("a", by_name), ("b", any_keyword), ("c", named_columns_only)])
    combiner.trainer_state = TrainerState(global_step=7, epoch=1.5, max_steps=10)
    rewards, means = combiner(["p"], ["c"], {}, [[1]])
    assert seen["by_name"] == seen["any_keyword"] == TrainerState(7, 1.5, 10)
    assert means["rewards/a"] == 7.0


def test_weights_must_match_the_sources():
    with pytest.raises(UserError, match="reward.weights: 1 weights for 2 reward sources"):
        RewardCombiner([("a", constant(1)), ("b", constant(1))], weights=[1.0])
    with pytest.raises(UserError, match="no reward source"):
        RewardCombiner([])


def test_clipping_after_batch_normalization():
    values = [1.0, 2.0, 3.0, 10.0]

    def fixed(prompts, completions, **columns):
        return values

    # mean 4, Bessel std = sqrt((9 + 4 + 1 + 36) / 3) = 4.0825 -> [-0.7348, -0.4899, -0.2449, 1.4697] -> clip 1
    combiner = RewardCombiner([("f", fixed)], normalize="batch", clip=1.0)
    rewards, _ = combiner([None] * 4, ["x"] * 4, {}, [[1]] * 4)
    assert rewards.tolist() == pytest.approx([-0.734847, -0.489898, -0.244949, 1.0], abs=1e-5)
    raw = RewardCombiner([("f", fixed)], clip=2.5)([None] * 4, ["x"] * 4, {}, [[1]] * 4)[0]
    assert raw.tolist() == [1.0, 2.0, 2.5, 2.5]


def test_running_normalization_uses_every_batch_so_far_and_round_trips():
    batches = iter([[1.0, 3.0], [5.0, 7.0]])

    def next_batch(prompts, completions, **columns):
        return next(batches)

    combiner = RewardCombiner([("f", next_batch)], normalize="running")
    first, _ = combiner([None] * 2, ["x"] * 2, {}, [[1]] * 2)
    # after [1, 3]: mean 2, std sqrt(2) -> [-0.7071, 0.7071]
    assert first.tolist() == pytest.approx([-1 / math.sqrt(2), 1 / math.sqrt(2)], abs=1e-6)
    second, _ = combiner([None] * 2, ["x"] * 2, {}, [[1]] * 2)
    # after [1, 3, 5, 7]: mean 4, std sqrt(20/3) = 2.5820 -> [0.3873, 1.1619]
    assert second.tolist() == pytest.approx([1 / 2.581989, 3 / 2.581989], abs=1e-5)
    restored = RewardCombiner([("f", constant(0.0))], normalize="running")
    restored.load_state_dict(json.loads(json.dumps(combiner.state_dict())))
    assert restored.moments.state_dict() == combiner.moments.state_dict()


def test_running_moments_merge_equals_one_pass():
    moments = RunningMoments()
    data = torch.tensor([0.5, -1.0, 2.0, 4.0, 4.5, -3.0], dtype=torch.float64)
    for chunk in (data[:1], data[1:4], data[4:]):
        moments.update(len(chunk), float(chunk.sum()), float((chunk**2).sum()))
    assert moments.mean == pytest.approx(float(data.mean()))
    assert moments.std == pytest.approx(float(data.std()))


# --------------------------------------------------------------------------- reward model


def test_reward_model_scores_are_normalized_with_the_stored_statistics(tiny_model_dir, tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from trainer_lib.config import ModelConfig
    from trainer_lib.data.preference_batches import encode_completion, encode_prompt
    from trainer_lib.models.heads import STATS_FILE
    from trainer_lib.rewards.model import load_reward_scorer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=1)
    model.config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    (tmp_path / STATS_FILE).write_text(json.dumps({"reward_mean": 0.25, "reward_std": 2.0}))

    scorer = load_reward_scorer(str(tmp_path), ModelConfig(path=str(tmp_path)), lambda m: m.eval(), batch_size=2)
    prompts = [
        [{"role": "user", "content": "Say hello."}],
        [{"role": "user", "content": "Name a color."}],
        [{"role": "user", "content": "Is the sky green?"}],
    ]
    completions = [[{"role": "assistant", "content": text}] for text in ("Hello there!", "Blue.", "No")]
    normalized = scorer(prompts, completions)
    with torch.no_grad():
        sequences = [
            encode_prompt(tokenizer, p) + encode_completion(tokenizer, p, c) for p, c in zip(prompts, completions)
        ]
        raw = [float(model.eval()(torch.tensor([ids])).logits) for ids in sequences]
    assert normalized == pytest.approx([(r - 0.25) / 2.0 for r in raw], abs=1e-5)
