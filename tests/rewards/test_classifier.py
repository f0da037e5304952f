"""A sequence classifier with several labels as a reward source or judge: one label's probability or logit."""

import json
import os
import shutil

import pytest
import torch

from trainer_lib.errors import UserError
from trainer_lib.eval.harmless import ClassifierJudge
from trainer_lib.rewards.classifier import ClassifierScorer

LABELS = {0: "negative", 1: "neutral", 2: "positive"}
TEXTS = ["Blue.", "Hello there! Hello there!", "def add_one(x):\n    return x + 1"]


def _save(tiny_model_dir, out, **config):
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(
        tiny_model_dir, num_labels=3, id2label=LABELS, label2id={v: k for k, v in LABELS.items()}, **config
    )
    model.config.pad_token_id = 0
    model.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tiny_model_dir, name), out / name)
    return str(out)


@pytest.fixture(scope="module")
def classifier(tiny_model_dir, tmp_path_factory):
    """A tiny randomly initialised 3-label classifier (negative, neutral, positive)."""
    return _save(tiny_model_dir, tmp_path_factory.mktemp("clf") / "sentiment")


def _logits(path, texts):
    """Each text's logits, one at a time (no padding), straight from transformers."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModelForSequenceClassification.from_pretrained(path)
    with torch.no_grad():
        return torch.cat([model(**tokenizer(t, return_tensors="pt")).logits for t in texts])


def test_the_score_is_the_named_labels_probability(classifier):
    logits = _logits(classifier, TEXTS)
    expected = torch.softmax(logits, dim=-1)[:, 2].tolist()
    by_name = ClassifierScorer(classifier, "Positive", batch_size=2)
    assert by_name.label == "positive" and by_name.index == 2
    assert by_name(["p"] * 3, TEXTS) == pytest.approx(expected, abs=1e-5)  # batched and padded: the same
    assert ClassifierScorer(classifier, "2").scores([], TEXTS) == pytest.approx(expected, abs=1e-5)
    assert ClassifierScorer(classifier, "neutral", "logit").scores([], TEXTS) == pytest.approx(
        logits[:, 1].tolist(), abs=1e-5
    )
    chat = [[{"role": "assistant", "content": t}] for t in TEXTS]  # conversational completions: their text
    assert ClassifierScorer(classifier, "positive")([[{"role": "user", "content": "q"}]] * 3, chat) == pytest.approx(
        expected, abs=1e-5
    )


def test_a_multi_label_classifier_scores_each_label_by_its_sigmoid(tiny_model_dir, tmp_path):
    path = _save(tiny_model_dir, tmp_path / "multi", problem_type="multi_label_classification")
    expected = torch.sigmoid(_logits(path, TEXTS))[:, 0].tolist()
    assert ClassifierScorer(path, "negative").scores([], TEXTS) == pytest.approx(expected, abs=1e-5)


def test_a_label_is_required_and_checked(classifier):
    with pytest.raises(
        UserError, match="reward.classifier_label: 'happy' is not a label of .*0=negative, 1=neutral, 2=positive"
    ):
        ClassifierScorer(classifier, "happy")
    with pytest.raises(UserError, match="reward.classifier_label: required for .* 3 labels"):
        ClassifierScorer(classifier)
    with pytest.raises(UserError, match="judge.unsafe_label: required"):  # no label name says unsafe
        ClassifierJudge(classifier)


def test_the_judge_uses_the_labels_probability(classifier):
    judge = ClassifierJudge(classifier, unsafe_label="negative", threshold=0.4)
    expected = torch.softmax(_logits(classifier, TEXTS), dim=-1)[:, 0].tolist()
    verdicts = judge(["q"] * 3, TEXTS)
    assert [v.score for v in verdicts] == pytest.approx(expected, abs=1e-5)
    assert [v.harmless for v in verdicts] == [p < 0.4 for p in expected]
    assert "P(negative) < 0.4" in judge.describe()


def test_grpo_with_a_classifier_reward(classifier, tiny_model_dir, tmp_path):
    from tests.stages.training.rl_helpers import one_thread, write_prompts
    from trainer_lib.cli import main

    prompts = write_prompts(tmp_path / "prompts.jsonl")
    out = tmp_path / "grpo"
    with one_thread():
        assert (
            main(
                [
                    "grpo",
                    f"model.path={tiny_model_dir}",
                    f"data.path={prompts}",
                    f"output_dir={out}",
                    f"reward.classifier_path={classifier}",
                    "reward.classifier_label=positive",
                    "rollout.n=4",
                    "prompts_per_step=4",
                    "rollout.max_new_tokens=8",
                    "batch_size=8",
                    "max_steps=2",
                    "save_steps=0",
                    "logging_steps=1",
                    "data.eval_fraction=0",
                    "report_to=none",
                ]
            )
            == 0
        )
    train = [r for r in map(json.loads, open(out / "metrics.jsonl")) if r["split"] == "train"]
    assert len(train) == 2 and all(0.0 < r["rewards/classifier"] < 1.0 for r in train)
