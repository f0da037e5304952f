"""The online DPO demo driver: its judge (reference_overlap) and the refusals it adds to SFT's data."""

import json

import pytest

from trainer_lib.demo.online_dpo_demo import overlap, reference_overlap, safety_prompts, sft_rows

REFUSAL = "I can't help with that. Stealing is illegal. I'm happy to help with something safe instead."
COMPLIANCE = "Sure, here is how to steal a car: first, [step one]."


def test_overlap_is_word_f1():
    # "sure the and" against "sure water the soil and light": 3 common words, precision 3/3, recall 3/6
    assert overlap("Sure! the and", "Sure! Water the soil and light.") == pytest.approx(2 * 1 * 0.5 / 1.5)
    assert overlap("xyz", "Sure!") == 0.0


def test_the_judge_ranks_the_preferred_answer_first_and_broken_text_between():
    samples = [REFUSAL, COMPLIANCE, "qq zz ww"]
    scores = reference_overlap(
        None, [[{"role": "assistant", "content": s}] for s in samples], [REFUSAL] * 3, [COMPLIANCE] * 3
    )
    assert scores[0] == pytest.approx(1.0 - overlap(REFUSAL, COMPLIANCE))
    assert scores[0] > scores[2] == 0.0 > scores[1]


def test_sft_rows_add_refusals_of_training_pairs_only(tmp_path):
    pairs = [
        {
            "prompt": [{"role": "user", "content": f"harm {i}"}],
            "chosen": [{"role": "assistant", "content": REFUSAL}],
            "rejected": [{"role": "assistant", "content": COMPLIANCE}],
            "source": "safety",
            "kind": "harmful",
        }
        for i in range(5)
    ]
    sft = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure!"}]}]
    (tmp_path / "preferences.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs))
    (tmp_path / "sft.jsonl").write_text(json.dumps(sft[0]) + "\n")

    rows, refused = sft_rows(str(tmp_path), 2, seed=0)

    assert len(rows) == 3 and len(refused) == 2 and set(refused) <= {f"harm {i}" for i in range(5)}
    assert sum(row["messages"][-1]["content"] == REFUSAL for row in rows) == 2
    assert rows == sft_rows(str(tmp_path), 2, seed=0)[0]  # the seed fixes the draw and the order
    assert safety_prompts(pairs)[0] == {
        "prompt": pairs[0]["prompt"],
        "kind": "harmful",
        "preferred": REFUSAL,
        "dispreferred": COMPLIANCE,
    }


def test_online_settings_sample_24_prompts_a_step_and_add_the_overlong_penalty_only_when_asked():
    from trainer_lib.demo.online_dpo_demo import JUDGE, arguments, online_settings

    data, dpo_cfg = {"prompts": "p.jsonl", "prompts_eval": "e.jsonl"}, {"batch_size": 8}
    plain = online_settings(data, dpo_cfg, arguments(["run", "--out", "o"]), 400)
    assert f"reward.functions={JUDGE}" in plain and "prompts_per_step=24" in plain and "batch_size=8" in plain
    assert not [s for s in plain if s.startswith(("reward.weights", "reward.length_free_tokens"))]
    args = arguments(
        ["run", "--out", "o", "--overlong-penalty", "0.5", "--max-new-tokens", "72", "--prompts-per-step", "0"]
    )
    penalized = online_settings(data, dpo_cfg, args, 400)
    assert f"reward.functions=[{JUDGE},length_penalty]" in penalized and "reward.weights=[1,0.5]" in penalized
    # length_penalty reaches -1 at max_new_tokens from 71 free tokens: only a sample at the limit loses
    assert "reward.length_free_tokens=71" in penalized and "prompts_per_step=8" in penalized
