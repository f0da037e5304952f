"""GRPO and PPO on a live prompt pool (buffer.mode=priority): the reward rises with priorities, dynamic
sampling and a feedback directory; a resumed run is bit-exact, also when a file arrives after the resume."""

import json
import os
import shutil

import pytest
import torch

from tests.conftest import repeatable
from tests.stages.training.rl_helpers import LENGTH_REWARD, mean_sampled_reward, weights, write_prompts
from trainer_lib.cli import main

pytestmark = pytest.mark.usefixtures("single_thread")


def _run(stage, model, data, out, *extra):
    args = [
        stage,
        f"model.path={model}",
        f"data.path={data}",
        f"output_dir={out}",
        "rollout.n=4",
        "prompts_per_step=4",
        "rollout.max_new_tokens=16",
        "batch_size=8",
        "data.eval_fraction=0",
        "buffer.mode=priority",
        "seed=3",
        *extra,
    ]
    assert main(args) == 0
    return [r for r in map(json.loads, open(os.path.join(out, "metrics.jsonl"))) if r["split"] == "train"]


def _feedback(directory, name: str, questions: list[str]) -> None:
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, name), "w", encoding="utf-8") as fh:
        for question in questions:
            fh.write(json.dumps({"prompt": [{"role": "user", "content": question}]}) + "\n")


def test_priority_grpo_with_dynamic_sampling_and_feedback_raises_a_custom_reward(tiny_model_dir, tmp_path):
    prompts = write_prompts(tmp_path / "prompts.jsonl")
    feedback = tmp_path / "feedback"
    _feedback(feedback, "a.jsonl", ["Count to three.", "Name a fruit."])
    (feedback / "b.jsonl").write_text('{"prompt": 3}\n')  # malformed: skipped with a warning
    out = tmp_path / "grpo"
    train = _run(
        "grpo",
        tiny_model_dir,
        prompts,
        out,
        f"reward.functions={LENGTH_REWARD}",
        f"data.feedback_path={feedback}",
        "buffer.dynamic_sampling=true",
        "buffer.temperature=0.5",
        "max_steps=30",
        "lr=1e-2",
        "save_steps=0",
        "logging_steps=5",
    )
    before, after = mean_sampled_reward(tiny_model_dir, prompts), mean_sampled_reward(out, prompts)
    assert after > before + 0.3, (before, after)
    assert train[-1]["reward"] > train[0]["reward"]
    last = train[-1]
    assert last["buffer/prompts"] == 26 and last["buffer/feedback_prompts"] == 2
    assert last["buffer/feedback_files"] == 1 and last["buffer/feedback_skipped_files"] == 1
    assert 0 < last["buffer/priority_mean"] < 1  # drawn prompts took their groups' reward std
    assert all(r["dynamic_sampling/unfilled_groups"] <= r["dynamic_sampling/dropped_groups"] for r in train)


def test_priority_ppo_runs_on_the_reward_deviation(tiny_model_dir, tmp_path):
    prompts = write_prompts(tmp_path / "prompts.jsonl")
    train = _run(
        "ppo",
        tiny_model_dir,
        prompts,
        tmp_path / "ppo",
        f"reward.functions={LENGTH_REWARD}",
        "max_steps=3",
        "save_steps=0",
        "logging_steps=1",
        "ppo_epochs=1",
        "rollout.max_new_tokens=8",
    )
    assert [r["step"] for r in train] == [1, 2, 3]
    assert all(0 < r["buffer/priority_mean"] <= 1 for r in train) and train[0]["buffer/priority_mean"] < 1


def test_resume_is_bit_exact_with_a_file_arriving_after_it(tiny_model_dir, tmp_path, monkeypatch):
    """A feedback file is there from the start; a reward function drops a second one into the directory
    while it scores step 3 (after the step-2 checkpoint). Losing everything after that checkpoint (the
    second file too) and rerunning ends with the same weights and the same pool."""
    prompts = write_prompts(tmp_path / "prompts.jsonl")
    feedback = tmp_path / "feedback"
    _feedback(feedback, "a.jsonl", ["Count to three."])
    (tmp_path / "dropping.py").write_text(
        "import json, os\n"
        "from tests.rewards.length_reward import reward as length\n\n"
        "def reward(prompts, completions, trainer_state, **kwargs):\n"
        "    if trainer_state.global_step == 2:\n"
        "        with open(os.path.join(os.environ['FEEDBACK_DIR'], 'b.jsonl'), 'w') as fh:\n"
        "            fh.write(json.dumps({'prompt': [{'role': 'user', 'content': 'Name a fruit.'}]}) + '\\n')\n"
        "    return length(prompts, completions)\n"
    )
    monkeypatch.setenv("FEEDBACK_DIR", str(feedback))
    out = tmp_path / "run"
    args = (
        f"reward.functions={tmp_path / 'dropping.py'}:reward",
        f"data.feedback_path={feedback}",
        "max_steps=5",
        "save_steps=2",
        "save_total_limit=0",
        "logging_steps=1",
        "reward.normalize=running",
        "lr=1e-2",
    )
    first = _run("grpo", tiny_model_dir, prompts, out, *args)
    reference = weights(out)
    state_file = out / "checkpoints" / "step-00000005" / "mp_rank_00_model_states.pt"
    reference_state = torch.load(state_file, weights_only=False)["prompt_buffer"]
    assert [name for name, _ in reference_state["files"]] == ["a.jsonl", "b.jsonl"]
    assert [r["buffer/prompts"] for r in first] == [25, 25, 25, 26, 26]  # b.jsonl joins before step 4
    for tag in ("step-00000004", "step-00000005"):
        shutil.rmtree(out / "checkpoints" / tag)
    os.remove(out / "model.safetensors")
    os.remove(feedback / "b.jsonl")
    again = _run("grpo", tiny_model_dir, prompts, out, *args)
    untimed = [[repeatable(r) for r in rs] for rs in (first, again)]
    assert untimed[0] == untimed[1]
    resumed = weights(out)
    assert all(torch.equal(reference[k], resumed[k]) for k in reference)
    state = torch.load(state_file, weights_only=False)["prompt_buffer"]
    assert state.keys() == reference_state.keys()
    assert all(
        torch.equal(state[k], reference_state[k])
        if isinstance(state[k], torch.Tensor)
        else state[k] == reference_state[k]
        for k in state
    )
