"""benchmarks/gpu_check.py in its CPU mode (a tiny model): every part runs as a real stage process and the
one JSON it writes is complete and sane, so the script a GPU machine runs cannot rot unseen."""

from __future__ import annotations

import datetime
import json

import pytest

from benchmarks import gpu_check

RAN = ("build", "sft", "dpo", "grpo", "resume", "auto_batch", "evaluate", "export")
SKIPPED_ON_CPU = ("two_rank", "tensor_parallel", "pipeline_parallel", "sequence_parallel", "vllm", "vs_trl")


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("gpu_check") / "gpu_check.json"
    code = gpu_check.main(["--device", "cpu", "--tiny", "--out", str(out)])
    report = json.loads(out.read_text())
    assert code == 0, json.dumps(report["parts"], indent=1)[-6000:]
    return report


@pytest.mark.slow
def test_every_part_is_there_and_passes(report):
    assert list(report["parts"]) == [
        "build",
        "sft",
        "dpo",
        "grpo",
        "two_rank",
        "tensor_parallel",
        "pipeline_parallel",
        "sequence_parallel",
        "resume",
        "auto_batch",
        "evaluate",
        "export",
        "vllm",
        "vs_trl",
    ]
    assert report["passed"] is True
    for name in RAN:
        part = report["parts"][name]
        assert part["status"] == "passed", (name, part)
        assert part["required"] is True
        assert part["exit_code"] == 0 and part["wall_s"] > 0
    for name in SKIPPED_ON_CPU:
        assert report["parts"][name]["status"] == "skipped" and report["parts"][name]["note"]


@pytest.mark.slow
def test_figures_are_sane(report):
    parts = report["parts"]
    for name in ("sft", "dpo", "grpo", "auto_batch"):
        assert parts[name]["tokens_per_s"] > 0, name
        assert parts[name]["peak_memory_bytes"] > 50 * 2**20, name  # a child with torch loaded
    assert parts["sft"]["mfu"] > 0 and parts["dpo"]["mfu"] > 0 and report["peak_flops"] > 0
    assert "mfu" not in parts["grpo"]  # generation-bound: not computed
    build = parts["build"]
    assert build["model_vocab"] > build["tokenizer_vocab"] and build["parameters"] > 0
    resume = parts["resume"]
    assert resume["max_abs_diff"] == 0
    assert resume["killed_at_checkpoint"] is True and resume["resumed_at_step"] == 2
    assert resume["runs"]["killed"]["exit_code"] == -9 and resume["runs"]["rerun"]["exit_code"] == 0
    auto = parts["auto_batch"]
    assert auto["auto_batch_size"] >= 1 and auto["auto_batch_size"] * auto["accumulation"] == 8
    evaluate = parts["evaluate"]  # fp32 on CPU; 2 ranks merge to the one-rank numbers
    assert evaluate["precision"] == "fp32" and evaluate["two_ranks_equal"] is True
    assert set(evaluate["metrics"]) >= {"task_pass_rate", "harmless_rate", "over_refusal_rate"}
    export = parts["export"]
    assert export["fp32"]["max_abs_diff"] < 1e-4 < export["fp16"]["max_abs_diff"] < 0.1  # FP16 is FP16, and close
    assert 0 <= export["fp16"]["top1_agreement"] <= 1 and export["fp16_source"].startswith("converted")  # on CPU
    assert export["serve"]["status"] == "passed", export["serve"]  # tritonserver of .venv-triton, CPU instance
    assert export["serve"]["instance_kind"] == "cpu" and isinstance(export["serve"]["served"], str)
    assert all(report["versions"][k] for k in ("torch", "deepspeed", "transformers", "python"))
    assert datetime.datetime.fromisoformat(report["date"]).year >= 2026
    assert report["device"] == "cpu" and report["gpu_count"] == 0 and report["settings"]["layers"] == 2


def test_gpu_model_has_qwen25_05b_shapes():
    import torch
    from transformers import Qwen2ForCausalLM

    with torch.device("meta"):
        model = Qwen2ForCausalLM(gpu_check.qwen2_config(gpu_check.GPU, gpu_check.GPU.model_vocab, pad=0, eos=1))
    assert sum(p.numel() for p in model.parameters()) == 494_032_768  # Qwen2.5-0.5B's count


def test_throughput_weights_each_window_by_its_length(tmp_path):
    records = [
        {"step": 1, "split": "train", "time": 1.0, "tokens_per_s": 10.0},
        {"step": 2, "split": "train", "time": 2.0, "tokens_per_s": 200.0},
        {"step": 2, "split": "eval", "time": 2.5, "loss": 1.0},
        {"step": 3, "split": "train", "time": 4.0, "tokens_per_s": 50.0},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert gpu_check.throughput(str(tmp_path), warmup=1) == pytest.approx((200 * 1 + 50 * 2) / 3)
    assert gpu_check.throughput(str(tmp_path), warmup=2) == pytest.approx(50)
    assert gpu_check.throughput(str(tmp_path / "missing"), warmup=1) is None


def test_default_out_follows_the_device_tool(monkeypatch):
    monkeypatch.setenv("OUT", "/tmp/device-out")
    assert gpu_check.default_out() == "/tmp/device-out/gpu_check.json"
    monkeypatch.delenv("OUT")
    assert gpu_check.default_out() == "runs/gpu_check.json"
