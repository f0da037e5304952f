"""The benchmark probe's profile summary: shares of self CPU time by operator and group."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from benchmarks.probe import profile_shares  # noqa: E402


def test_profile_shares_of_a_matmul_heavy_step():
    a, b = torch.randn(384, 384), torch.randn(384, 384)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(20):
            c = a @ b
        c.add_(1.0)
    shares = profile_shares(prof, top=3)
    assert shares["total_self_cpu_s"] > 0
    assert abs(sum(shares["groups"].values()) - 1.0) < 1e-9
    assert shares["groups"]["matmul"] > 0.5, shares  # 20 matmuls against one add
    assert shares["top"][0][0] == "aten::mm", shares["top"]
    assert len(shares["top"]) <= 3 and shares["top"] == sorted(shares["top"], key=lambda t: -t[1])


def test_the_probe_counts_the_tokens_of_our_decode_loop(tiny_model_dir, monkeypatch):
    """Our rollouts do not call ``generate``; the probe counts their tokens through the decode loop."""
    from types import SimpleNamespace

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from benchmarks.probe import Probe
    from trainer_lib.rl import decode as own
    from trainer_lib.rl.rollout import generate

    monkeypatch.setattr(own, "decode", own.decode)  # put back after the test
    counter = SimpleNamespace(generated_tokens=0, generate_rows=0)
    Probe._count_own_decode(counter)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    prompts = [tokenizer(t)["input_ids"] for t in ("Say hello.", "Name a color.")]
    rollout = generate(model, tokenizer, prompts, n=3, max_new_tokens=8, temperature=1.0, seed=0)
    assert counter.generate_rows == 6
    assert counter.generated_tokens == rollout.stats["generated_tokens"] > 0
