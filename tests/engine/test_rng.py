"""RNG states in checkpoints: every generator comes back (CUDA's on every device once CUDA is in use), a
checkpoint written without CUDA states still loads, and all of it loads with weights_only."""

import random

import numpy as np
import pytest
import torch

from trainer_lib.engine.checkpoint import weights_only_loads
from trainer_lib.engine.rng import restore_rng_state, rng_state


def _draws() -> tuple:
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def _round_trip(state: dict, tmp_path) -> dict:
    torch.save(state, tmp_path / "rng_state_rank0.pt")
    with weights_only_loads():
        return torch.load(tmp_path / "rng_state_rank0.pt", weights_only=True)


def test_cpu_states_round_trip_and_carry_no_cuda_entry(tmp_path):
    state = rng_state()
    assert "cuda" not in state  # CUDA never initialised here
    expected = _draws()
    _draws()  # move every generator on
    restore_rng_state(_round_trip(state, tmp_path))
    assert _draws() == expected


def test_cuda_states_are_saved_and_restored_per_device(monkeypatch, tmp_path):
    devices = [torch.full((16,), i, dtype=torch.uint8) for i in range(2)]  # stand-ins for two devices' states
    restored = {}
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: devices)
    state = _round_trip(rng_state(), tmp_path)
    assert [t.tolist() for t in state["cuda"]] == [t.tolist() for t in devices]

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # a run that sees fewer devices restores those
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda s, device: restored.__setitem__(device, s.tolist()))
    restore_rng_state(state)
    assert restored == {0: devices[0].tolist()}


def test_a_checkpoint_with_cuda_states_loads_on_cpu_and_one_without_them_on_cuda(monkeypatch, tmp_path):
    state = rng_state()
    expected = _draws()
    with_cuda = _round_trip({**state, "cuda": [torch.zeros(16, dtype=torch.uint8)]}, tmp_path)
    restore_rng_state(with_cuda)  # no CUDA here: its states are skipped
    assert _draws() == expected

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda *a: pytest.fail("no CUDA states to restore"))
    restore_rng_state(_round_trip(state, tmp_path))  # written before CUDA states were saved
    assert _draws() == expected
