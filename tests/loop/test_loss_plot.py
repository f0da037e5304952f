"""loss_plot (LLaMA-Factory's plot_loss): the curves read back from metrics.jsonl, smoothed, drawn as PNG files."""

import json
import math
import struct

import pytest

from trainer_lib.cli import main
from trainer_lib.loop.loss_plot import curves, smooth, write_loss_plots

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's header chunk, which must come first."""
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR", data[:16]
    return struct.unpack(">II", data[16:24])


def test_smoothing_is_an_ema_whose_weight_grows_with_the_points():
    w2 = 1.8 * (1 / (1 + math.exp(-0.1)) - 0.5)  # 2 points: 0.04497
    assert smooth([1.0, 0.0]) == pytest.approx([1.0, w2])
    assert smooth([]) == [] and smooth([3.0] * 50) == pytest.approx([3.0] * 50)
    values = [float(i % 2) for i in range(200)]  # a zigzag: heavily smoothed at 200 points (w = 0.90)
    late = smooth(values)[100:]
    assert max(late) - min(late) < 0.2 and sum(late) / len(late) == pytest.approx(0.5, abs=0.05)


def test_curves_take_the_losses_of_each_split_and_skip_the_rest():
    records = [
        {"step": 0, "split": "eval", "loss": 3.0, "reward": 0.1},
        {"step": 2, "split": "train", "loss": 2.5, "lr": 1e-3, "policy_loss": 0.3},
        {"step": 4, "split": "train", "loss": float("nan"), "reward": 0.5},
        {"step": 4, "split": "eval", "loss": 2.0},
        {"step": 6, "split": "test", "loss": 9.0},
    ]
    assert curves(records) == {
        "loss": ([2], [2.5]),
        "policy_loss": ([2], [0.3]),
        "reward": ([4], [0.5]),
        "eval_loss": ([0, 4], [3.0, 2.0]),
        "eval_reward": ([0], [0.1]),
    }
    assert curves([{"step": 1, "split": "train", "lr": 0.1}]) == {}


def test_no_metrics_no_plot(tmp_path):
    assert write_loss_plots(str(tmp_path)) == []
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "split": "train", "lr": 0.1}) + "\n")
    assert write_loss_plots(str(tmp_path)) == [] and not list(tmp_path.glob("*.png"))


def test_plots_are_written_through_storage_to_a_url():
    from trainer_lib import storage

    rows = [{"step": s, "split": "train", "loss": 1.0 / s} for s in range(1, 6)]
    storage.write_text("memory://plots/run/metrics.jsonl", "\n".join(json.dumps(r) for r in rows) + "\n")
    assert write_loss_plots("memory://plots/run") == ["training_loss.png"]
    assert png_size(storage.read_bytes("memory://plots/run/training_loss.png")) == (640, 480)


def test_an_sft_run_with_loss_plot_draws_the_train_and_eval_loss(s3_bucket, tiny_model_dir, chat_jsonl, capsys):
    """Drawn before the output root is mirrored to the store, so the plots reach an s3:// output_dir."""
    from trainer_lib import storage

    out = f"s3://{s3_bucket}/sft"
    args = [
        "sft",
        f"model.path={tiny_model_dir}",
        f"data.path={chat_jsonl}",
        f"output_dir={out}",
        "max_steps=4",
        "batch_size=4",
        "data.max_length=64",
        "logging_steps=1",
        "eval_steps=2",
        "save_steps=0",
        "report_to=none",
        "lr=3e-3",
    ]
    assert main([*args, "plot_loss=true"]) == 0  # LLaMA-Factory's name for loss_plot
    assert "sft: loss_plot: training_eval_loss.png, training_loss.png" in capsys.readouterr().out
    pngs = [name for name in storage.listdir(out) if name.endswith(".png")]
    assert sorted(pngs) == ["training_eval_loss.png", "training_loss.png"]
    for name in pngs:
        data = storage.read_bytes(f"{out}/{name}")
        assert png_size(data) == (640, 480) and len(data) > 10_000, (name, len(data))
    drawn = curves([json.loads(line) for line in storage.read_text(f"{out}/metrics.jsonl").splitlines()])
    assert drawn["loss"][0] == [1, 2, 3, 4] and drawn["eval_loss"][0] == [0, 2, 4]
