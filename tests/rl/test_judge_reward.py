"""The LLM judge as an RL reward source (reward.judge.*): GRPO for 2 steps on the tiny model with the judge
at a local stand-in endpoint whose score depends on the completion; the logged reward is what the endpoint
gave, its counts are logged per step, and the planted API key is in no output file and no log."""

import json
import logging
import os

import pytest

from tests.http_helpers import serving
from tests.stages.training.rl_helpers import one_thread, run_rl, write_prompts
from trainer_lib.config import load_config
from trainer_lib.errors import ConfigError

KEY = "sk-CANARY-judge-4f9a1c77e2"
ENV = "POSTTRAIN_TEST_RL_JUDGE_KEY"


class VowelJudge:
    """Grades an answer by its vowels (1 + count, at most 10); records each score it gave, in order."""

    def __init__(self):
        self.scores: list[int] = []

    def handle(self, request):
        text = request.json()["messages"][0]["content"]
        answer = text.split("[Answer]\n", 1)[1].rsplit("\n\nJudge whether", 1)[0]
        score = min(1 + sum(ch in "aeiou" for ch in answer), 10)
        self.scores.append(score)
        content = f"Counted the vowels.\nScore: {score}"
        return 200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]}


def test_grpo_with_an_endpoint_judge_logs_its_scores_and_never_its_key(
    tiny_model_dir, tmp_path, monkeypatch, caplog, capsys
):
    monkeypatch.setenv(ENV, KEY)
    caplog.set_level(logging.DEBUG)
    prompts = write_prompts(tmp_path / "prompts.jsonl", count=8)
    out = tmp_path / "grpo"
    app = VowelJudge()
    with serving(app) as server, one_thread():
        run_rl(
            "grpo",
            tiny_model_dir,
            prompts,
            out,
            3,
            "max_steps=2",
            "logging_steps=1",
            "save_steps=0",
            "reward.weights=1,0.5",
            f"reward.judge.url={server.url}/v1",
            "reward.judge.model=stand-in",
            f"reward.judge.api_key_env={ENV}",
            "reward.judge.concurrency=2",
        )
    assert server.requests and all(r.headers["authorization"] == f"Bearer {KEY}" for r in server.requests)
    train = [r for r in map(json.loads, open(out / "metrics.jsonl")) if r["split"] == "train"]
    assert [r["step"] for r in train] == [1, 2]
    sent = 0
    for row in train:
        # 4 prompts x 4 distinct completions a step, none seen before: one request each, nothing failed
        assert (row["judge/requests"], row["judge/cache_hits"], row["judge/failures"]) == (16, 0, 0)
        given = app.scores[sent : sent + 16]
        sent += 16
        # metrics.jsonl keeps 6 significant digits
        assert row["rewards/llm_judge"] == pytest.approx(sum((s - 1) / 9 for s in given) / 16, rel=1e-5)
        assert row["reward"] == pytest.approx(row["rewards/reward"] + 0.5 * row["rewards/llm_judge"], rel=1e-5)
    assert sent == len(app.scores)

    logged = "\n".join(r.getMessage() for r in caplog.records)
    captured = capsys.readouterr()
    assert KEY not in logged + captured.out + captured.err
    files = [os.path.join(d, name) for d, _, names in os.walk(out) for name in names]
    assert any(f.endswith("metrics.jsonl") for f in files) and len(files) > 3
    for path in files:
        with open(path, "rb") as fh:
            assert KEY.encode() not in fh.read(), path


def test_the_judge_keys_are_checked(tiny_model_dir, tmp_path):
    from trainer_lib.stages.training.grpo import GRPOConfig

    base = [f"model.path={tiny_model_dir}", "data.path=p.jsonl", "output_dir=/tmp/x"]
    cfg = load_config(GRPOConfig, None, [*base, "reward.judge.url=http://127.0.0.1:1/v1", "reward.judge.model=m"])
    assert cfg.reward.judge.enabled and cfg.reward.functions == []  # the judge alone is a reward source
    for bad, message in [
        ([], "reward.functions: required"),
        (["reward.judge.url=http://h/v1", "reward.judge.path=/m"], "set one"),
        (["reward.judge.url=http://h/v1"], "reward.judge.model: required"),
        (["reward.judge.path=/m", "reward.judge.min_score=5", "reward.judge.max_score=5"], "expected min < max"),
        (["reward.judge.path=/m", "reward.judge.default=2"], "reward.judge.default"),
        (["reward.judge.path=/m", "reward.judge.tries=0"], "reward.judge.tries"),
        (["reward.judge.path=/m", "reward.judge.rubric=Rate it."], "no {completion}"),
    ]:
        with pytest.raises(ConfigError, match=message):
            load_config(GRPOConfig, None, [*base, *bad])


def test_a_local_causal_lm_judge_is_built_from_the_keys(tiny_model_dir):
    from trainer_lib.config.judge import LLMJudgeConfig
    from trainer_lib.rewards.llm_judge import LocalJudge, build_judge

    judge = build_judge(LLMJudgeConfig(path=tiny_model_dir, max_new_tokens=4, default=0.25, batch_size=2))
    assert isinstance(judge.backend, LocalJudge) and judge.backend.max_new_tokens == 4
    # the random tiny model writes no 'Score: N': every completion gets the default, counted
    assert judge(["Say hi.", "Count."], ["hi", "one"]) == [0.25, 0.25]
    assert judge.step_counts()["judge/failures"] == 2.0
