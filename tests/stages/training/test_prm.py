"""Process reward models: the GSM8K step-labelled set (one calculation corrupted, that step and the rest
labelled wrong, held out by problem), steps found and tokenized, and `posttrain reward objective=process`
on the tiny model: the step loss falls and held-out solutions are ranked."""

import json
import random

import pytest

from tests.conftest import CHAT_ROWS
from trainer_lib.config import load_config
from trainer_lib.data.step_labels import (
    CALCULATION,
    corrupt_calculation,
    encode_steps,
    gsm8k_step_rows,
    split_steps,
    write_gsm8k_step_set,
)
from trainer_lib.errors import ConfigError

GSM8K = [
    {
        "question": f"Tom has {n} apples and buys {n} more. Then he gives away 3. How many are left?",
        "answer": f"He has {n}+{n} = <<{n}+{n}={2 * n}>>{2 * n} apples.\n"
        f"He gives away 3, so {2 * n}-3 = <<{2 * n}-3={2 * n - 3}>>{2 * n - 3} are left.\n#### {2 * n - 3}",
    }
    for n in range(5, 45)
] + [{"question": "What is seven?", "answer": "It is seven.\n#### 7"}]  # no calculation: left out


def test_the_gsm8k_set_corrupts_one_calculation_and_labels_the_rest_wrong(tmp_path):
    train, evals = gsm8k_step_rows(GSM8K, eval_fraction=0.3, seed=1)
    rows = train + evals
    assert len(rows) == 2 * 40 and evals and train
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in evals}  # held out by problem
    for right, wrong in zip(rows[::2], rows[1::2]):
        assert right["prompt"] == wrong["prompt"] and right["labels"] == [True, True, True]
        at = wrong["corrupted_step"]
        assert wrong["labels"] == [True] * at + [False] * (3 - at)
        changed = [i for i, (a, b) in enumerate(zip(right["completions"], wrong["completions"])) if a != b]
        assert changed == [at]
        (good,), (bad,) = CALCULATION.findall(right["completions"][at]), CALCULATION.findall(wrong["completions"][at])
        assert good[0] == bad[0] and good[1] != bad[1] and bad[1] == bad[2]  # same sum, another result, shown
    assert corrupt_calculation("Paid $<<0.2*50=10>>10.", random.Random(0)).endswith(".")
    source = tmp_path / "gsm8k.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in GSM8K))
    train_path, eval_path = write_gsm8k_step_set(str(source), str(tmp_path / "prm"), limit=10, eval_fraction=0.3)
    assert sum(1 for _ in open(train_path)) + sum(1 for _ in open(eval_path)) == 20


def test_steps_are_split_and_scored_at_their_last_token(tiny_model_dir):
    from transformers import AutoTokenizer

    assert split_steps("Step 1: add.\nStep 2: halve.\n\nSo 4.\n\n\n#### 4") == [
        "Step 1: add.",
        "Step 2: halve.",
        "So 4.",
        "#### 4",
    ]
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids, ends = encode_steps(tokenizer, "Add one.", ["x + 1", "def f(x): return x + 1"], max_length=64)
    assert len(ends) == 2 and ends[-1] < len(ids)
    assert tokenizer.decode(ids[: ends[0] + 1]).rstrip().endswith("x + 1")
    short, kept = encode_steps(tokenizer, "Add one.", ["x + 1", "def f(x): return x + 1"], max_length=ends[0] + 3)
    assert kept == ends[:1] and len(short) <= ends[0] + 3  # a step that does not fit is left out


def _step_rows(count: int, seed: int) -> list[dict]:
    """Each problem twice: clean steps, and a copy whose step k says 'oops' (labelled wrong from k on)."""
    rng = random.Random(seed)
    rows = []
    for i in range(count):
        question = CHAT_ROWS[i % len(CHAT_ROWS)][0] + f" Case {i}."
        steps = [CHAT_ROWS[(i + j) % len(CHAT_ROWS)][1].split("\n")[0] for j in range(3)]
        at = rng.randrange(3)
        bad = [*steps[:at], "oops " + steps[at], *steps[at + 1 :]]
        rows.append({"prompt": question, "completions": steps, "labels": [True] * 3})
        rows.append({"prompt": question, "completions": bad, "labels": [True] * at + [False] * (3 - at)})
    return rows


@pytest.fixture(scope="module")
def trained_prm(tiny_model_dir, tmp_path_factory):
    """A PRM trained on the tiny model for 40 steps; held-out problems in data.eval_path."""
    import torch

    from trainer_lib.cli import main

    root = tmp_path_factory.mktemp("prm")
    data, held_out = root / "train.jsonl", root / "eval.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _step_rows(40, 0)))
    held_out.write_text("".join(json.dumps(r) + "\n" for r in _step_rows(12, 1)))
    out = root / "prm"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        code = main(
            [
                "reward",
                "objective=process",
                f"model.path={tiny_model_dir}",
                f"data.path={data}",
                f"data.eval_path={held_out}",
                f"output_dir={out}",
                "max_steps=40",
                "batch_size=8",
                "lr=3e-3",
                "logging_steps=10",
                "eval_steps=0",
                "save_steps=0",
                "seed=0",
            ]
        )
    finally:
        torch.set_num_threads(threads)
    assert code == 0
    return out


def test_a_prm_trains_on_step_labels_and_ranks_held_out_solutions(trained_prm):
    log = [json.loads(line) for line in open(trained_prm / "metrics.jsonl")]
    train = [r for r in log if r["split"] == "train"]
    assert train[-1]["loss"] < 0.7 * train[0]["loss"], [r["loss"] for r in train]
    summary = json.loads((trained_prm / "summary.json").read_text())
    assert summary["eval"]["ranking_accuracy"] >= 0.8, summary["eval"]
    assert summary["eval"]["step_accuracy"] > 0.7
    assert json.loads((trained_prm / "prm.json").read_text())["step_join"] == "\n\n"


def test_the_prm_scores_generated_steps_and_is_a_grpo_reward(trained_prm, tiny_model_dir, tmp_path):
    from tests.stages.training.rl_helpers import one_thread, run_rl, write_prompts
    from trainer_lib.config import ModelConfig
    from trainer_lib.rewards.prm_scorer import load_prm_scorer

    row = _step_rows(1, 5)[0]
    clean = "\n\n".join(row["completions"])
    broken = "\n\n".join([row["completions"][0], "oops " + row["completions"][1], row["completions"][2]])
    scores = {}
    for aggregation in ("min", "last", "mean"):
        scorer = load_prm_scorer(str(trained_prm), ModelConfig(path=tiny_model_dir), lambda m: m, "fp32", aggregation)
        scores[aggregation] = scorer([row["prompt"]] * 3, [clean, broken, ""])
    assert scores["min"][0] > scores["min"][1] and scores["min"][2] == 0.0  # no step: 0
    assert scores["min"][1] <= scores["mean"][1] and all(0 <= v <= 1 for v in scores["last"])

    out = tmp_path / "grpo"
    with one_thread():
        run_rl(
            "grpo",
            tiny_model_dir,
            write_prompts(tmp_path / "prompts.jsonl", count=8),
            out,
            3,
            "max_steps=2",
            "logging_steps=1",
            "save_steps=0",
            f"reward.prm_path={trained_prm}",
            "reward.prm_aggregation=mean",
        )
    train = [r for r in map(json.loads, open(out / "metrics.jsonl")) if r["split"] == "train"]
    assert len(train) == 2 and all(0 < r["rewards/prm"] < 1 for r in train)


def test_the_process_keys_are_checked(tiny_model_dir):
    from trainer_lib.stages.training.reward import RewardConfig

    base = [f"model.path={tiny_model_dir}", "data.path=x.jsonl", "output_dir=/tmp/x", "objective=process"]
    assert load_config(RewardConfig, None, base).step_join == "\n\n"
    with pytest.raises(ConfigError, match="step_join"):
        load_config(RewardConfig, None, [*base, "step_join=;"])
    with pytest.raises(ConfigError, match="step_separator: not a regular expression"):
        load_config(RewardConfig, None, [*base, "step_separator=(("])


def test_step_scores_land_on_the_tokens_that_end_each_step(trained_prm, tiny_model_dir):
    """reward.prm_aggregation=steps: each step's score on the response token whose text completes the step,
    nothing on a completion without steps; the completion's training reward leaves the PRM out, while its
    logged score (the mean of the steps) stays."""
    import torch
    from transformers import AutoTokenizer

    from trainer_lib.config import ModelConfig
    from trainer_lib.rewards.combine import RewardCombiner
    from trainer_lib.rewards.prm_scorer import load_prm_scorer
    from trainer_lib.rl.experience import step_token_rewards
    from trainer_lib.rl.rollout import Rollout

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    scorer = load_prm_scorer(str(trained_prm), ModelConfig(path=tiny_model_dir), lambda m: m, "fp32", "steps")
    row = _step_rows(1, 5)[0]
    texts = ["\n\n".join(row["completions"]), "no steps here"[:0]]
    ids = [tokenizer(text, add_special_tokens=False)["input_ids"] or [tokenizer.pad_token_id] for text in texts]
    width = max(map(len, ids))
    response = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r in ids])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in ids])
    mask[1] = 0
    prompt = torch.tensor([[5, 6]] * 2)
    rollout = Rollout(prompt, torch.ones_like(prompt), response, mask, texts, [True, True], {})
    rollout.prompts = [row["prompt"]] * 2
    combiner = RewardCombiner([("prm", scorer)], [2.0])

    placed = step_token_rewards(combiner, rollout, tokenizer)
    steps = scorer.step_scores(rollout.prompts, texts)
    assert len(steps[0]) == len(row["completions"]) and steps[1] == []
    ends = [int(t) for t in placed[0].nonzero()]
    assert len(ends) == len(steps[0]) and not placed[1].any()
    for token, (end, score) in zip(ends, steps[0]):
        assert len(tokenizer.decode(ids[0][: token + 1])) >= end > len(tokenizer.decode(ids[0][:token]))
        assert placed[0, token].item() == pytest.approx(2.0 * score)
    table = combiner.table(rollout.prompts, texts, {}, ids)
    assert combiner.combine(table).tolist() == [0.0, 0.0]  # not in the completion's reward
    mean = sum(score for _, score in steps[0]) / len(steps[0])
    assert table[0, 0].item() == pytest.approx(mean)


def test_ppo_takes_a_prms_step_scores_and_resumes_bit_exact(trained_prm, tiny_model_dir, tmp_path, capsys):
    """PPO with the PRM's step scores as token rewards: it trains with them (rewards/prm logged), and losing
    everything after the step-2 checkpoint and rerunning ends with the same weights and metrics."""
    import os
    import shutil

    import torch

    from tests.stages.training.rl_helpers import one_thread, run_rl, weights, write_prompts

    out, prompts = tmp_path / "ppo", write_prompts(tmp_path / "prompts.jsonl", count=8)
    args = ("max_steps=4", "save_steps=2", "save_total_limit=0", "logging_steps=1")
    args += (f"reward.prm_path={trained_prm}", "reward.prm_aggregation=steps", "rollout.max_new_tokens=24")

    def records():
        drop = ("time", "_per_s", "memory_gb")
        rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
        return [{k: v for k, v in r.items() if not any(d in k for d in drop)} for r in rows]

    with one_thread():
        run_rl("ppo", tiny_model_dir, prompts, out, 3, *args)
        reference, logged = weights(out), records()
        shutil.rmtree(out / "checkpoints" / "step-00000004")
        os.remove(out / "model.safetensors")
        capsys.readouterr()
        run_rl("ppo", tiny_model_dir, prompts, out, 3, *args)
    assert "resuming at step 2" in capsys.readouterr().out
    train = [r for r in logged if r["split"] == "train"]
    assert len(train) == 4 and all(0 < r["rewards/prm"] < 1 for r in train)
    # step 1: no KL yet (the policy is its reference), so all the tokens got beyond the completion's reward
    # (0 here: the PRM is its only source) is the step scores, a sum per completion of what rewards/prm averages
    assert train[0]["non_score_reward"] >= train[0]["rewards/prm"] - 1e-6 > 0
    resumed = weights(out)
    assert all(torch.equal(reference[k], resumed[k]) for k in reference)
    assert records() == logged


def test_only_ppo_takes_step_rewards(tiny_model_dir):
    from trainer_lib.stages.training.grpo import GRPOConfig
    from trainer_lib.stages.training.ppo import PPOConfig

    base = ["model.path=m", "data.path=d", "output_dir=o", "reward.prm_path=p", "reward.prm_aggregation=steps"]
    assert load_config(PPOConfig, None, base).reward.prm_aggregation == "steps"
    with pytest.raises(ConfigError, match="reward.prm_aggregation=steps: rewards on each step's last token are PPO"):
        load_config(GRPOConfig, None, [*base, "batch_size=4"])
