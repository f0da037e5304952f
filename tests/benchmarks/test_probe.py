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
