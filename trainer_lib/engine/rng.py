"""A rank's random-number generators, saved with every checkpoint and put back on resume, so a resumed
run draws the same numbers as one that never stopped (Python's, NumPy's, torch's CPU and CUDA generators)."""

from __future__ import annotations

import random


def rng_state() -> dict:
    """This process's RNG states as tensors and plain values (so they load with weights_only=True):
    Python's, NumPy's, torch's CPU generator and, once CUDA is initialised, every CUDA device's."""
    import numpy as np
    import torch

    version, keys, gauss = random.getstate()
    kind, words, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": [version, torch.tensor(keys, dtype=torch.int64), gauss],
        "torch": torch.get_rng_state(),
        "numpy": [kind, torch.from_numpy(words.astype(np.int64)), pos, has_gauss, cached],
    }
    if torch.cuda.is_initialized():  # (asking a CPU-only run would initialise CUDA for nothing)
        state["cuda"] = torch.cuda.get_rng_state_all()  # a list of uint8 tensors, one per visible device
    return state


def restore_rng_state(state: dict) -> None:
    """Put back what :func:`rng_state` saved. A checkpoint without CUDA states (written on CPU, or
    before they were saved) leaves the CUDA generators as seeded; CUDA states are skipped without CUDA,
    and restored device by device for the devices both runs see."""
    import numpy as np
    import torch

    version, keys, gauss = state["python"]
    random.setstate((version, tuple(keys.tolist()), gauss))
    kind, words, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, words.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        for device, device_state in enumerate(state["cuda"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(device_state, device)
