"""beta-DPO in the DPO stage: the running statistics by hand, exact resume, and a tiny run that trains."""

import json
import os
from types import SimpleNamespace

import pytest
import torch

from tests.conftest import CHAT_ROWS, repeatable
from trainer_lib.cli import main
from trainer_lib.losses import dpo_sigmoid_loss
from trainer_lib.stages.training.dpo import DynamicBetaDPO


def logps(chosen, rejected):
    return SimpleNamespace(
        chosen=torch.tensor(chosen, dtype=torch.float64), rejected=torch.tensor(rejected, dtype=torch.float64)
    )


REFERENCE = logps([0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0])


def test_running_statistics_follow_the_moving_average():
    objective = DynamicBetaDPO(0.1, alpha=1.0, momentum=0.5, filter_ratio=0.0, label_smoothing=0.0, seed=0)
    # margins (1, 3, 1, 3): mean 2, population std 1 -> M0 = 0.5 * 0 + 0.5 * 2 = 1, sigma = 0.5
    losses = objective(logps([1.0, 3.0, 1.0, 3.0], [0.0] * 4), REFERENCE, {})
    assert (objective.margin_mean, objective.margin_std, objective.updates) == (1.0, 0.5, 1)
    # beta = 0.1 * (1 + 1 * (2 - 1)) = 0.2: the batch is wider than the running mean
    assert objective.last_beta == pytest.approx(0.2)
    expected = dpo_sigmoid_loss(torch.tensor([1.0, 3.0, 1.0, 3.0], dtype=torch.float64), *[torch.zeros(4)] * 3, 0.2)
    torch.testing.assert_close(losses, expected.double())
    # margins all 0: M0 = 0.5 * 1 + 0 = 0.5, sigma = 0.25; beta = 0.1 * (1 + (0 - 0.5)) = 0.05
    objective(logps([0.0] * 4, [0.0] * 4), REFERENCE, {})
    assert (objective.margin_mean, objective.margin_std) == (0.5, 0.25)
    assert objective.last_beta == pytest.approx(0.05)
    assert objective.log_values() == {"beta": objective.last_beta, "beta/kept": 1.0, "beta/margin_mean": 0.5}


def test_restored_statistics_continue_exactly():
    """A copy restored from state_dict (what a checkpoint holds) computes the same next losses and draws."""
    batches = [logps([float(i), 2.0, -1.0, 0.5 * i], [0.0, 1.0, 0.0, -1.0]) for i in range(6)]

    def fresh():
        return DynamicBetaDPO(0.1, alpha=0.5, momentum=0.9, filter_ratio=0.5, label_smoothing=0.0, seed=3)

    straight = fresh()
    expected = [straight(batch, REFERENCE, {}) for batch in batches]
    first = fresh()
    for batch in batches[:3]:
        first(batch, REFERENCE, {})
    resumed = fresh()
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    for batch, want in zip(batches[3:], expected[3:], strict=True):
        assert torch.equal(resumed(batch, REFERENCE, {}), want)
    assert resumed.state_dict() == straight.state_dict()
    assert sum(int((loss == 0).sum()) for loss in expected) == 2 * len(batches)  # half of each batch dropped


def test_off_by_default_and_checked():
    from trainer_lib.errors import ConfigError
    from trainer_lib.runner.stage_api import stage_config

    base = ["model.path=m", "data.path=d", "output_dir=o"]
    cfg = stage_config("dpo", base)
    assert (cfg.beta_alpha, cfg.beta_filter, cfg.beta_momentum) == (0.0, 0.0, 0.9)
    assert DynamicBetaDPO.from_config(cfg, None) is None  # plain DPO: the stage's code path is unchanged
    assert DynamicBetaDPO.from_config(stage_config("dpo", [*base, "beta_filter=0.2"]), None) is not None
    for bad in (["loss=ipo", "beta_alpha=0.5"], ["beta_filter=1.0"], ["beta_momentum=1"], ["beta_alpha=-1"]):
        with pytest.raises(ConfigError, match="beta_"):
            stage_config("dpo", [*base, *bad])


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    path = tmp_path_factory.mktemp("beta_dpo") / "pairs.jsonl"
    with open(path, "w", encoding="utf-8") as fh:
        for i, (question, answer) in enumerate(CHAT_ROWS):
            for j, (_, other) in enumerate(CHAT_ROWS):
                if i != j:
                    fh.write(json.dumps({"prompt": question, "chosen": answer, "rejected": other}) + "\n")
    return str(path)


def _run(tiny_model_dir, pairs, out, *extra):
    args = [
        "dpo",
        f"model.path={tiny_model_dir}",
        f"data.path={pairs}",
        f"output_dir={out}",
        "batch_size=4",
        "data.max_length=64",
        "data.eval_fraction=0",
        "lr=1e-3",
        "lr_scheduler=constant",
        "logging_steps=1",
        "seed=4",
        *extra,
    ]
    assert main(args) == 0
    records = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"), encoding="utf-8")]
    return [r for r in records if r.get("split") == "train"]


def _weights(out):
    from safetensors.torch import load_file

    return load_file(os.path.join(out, "model.safetensors"))


def test_stage_trains_logs_beta_and_resumes_exactly(tiny_model_dir, pairs, tmp_path):
    keys = ["beta_alpha=1.0", "beta_filter=0.25", "beta_momentum=0.5", "save_steps=2"]
    straight = _run(tiny_model_dir, pairs, tmp_path / "straight", "max_steps=4", *keys)
    assert all(0 < r["beta/kept"] < 1 for r in straight)  # 3 of every 4 pairs (1 of a last pair of 2)
    assert straight[0]["beta"] == pytest.approx(0.1)  # step 0: policy == reference, every margin 0
    assert len({r["beta"] for r in straight}) > 1  # then beta moves with the margins
    # stopped after 2 steps and rerun to 4: the checkpoint's statistics carry on exactly
    _run(tiny_model_dir, pairs, tmp_path / "resumed", "max_steps=2", *keys)
    resumed = _run(tiny_model_dir, pairs, tmp_path / "resumed", "max_steps=4", *keys)
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]

    def steady(records):  # without wall-clock values
        return [repeatable(r) for r in records]

    assert steady(resumed) == steady(straight)
    a, b = _weights(tmp_path / "straight"), _weights(tmp_path / "resumed")
    assert all(torch.equal(a[k], b[k]) for k in a)
