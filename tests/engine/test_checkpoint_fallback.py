"""Resume past a damaged checkpoint, refuse a checkpoint of the old format with the way to convert it, and
refuse one a run of other settings wrote.

A real SFT run keeps its two newest checkpoints (steps 4 and 6). Damaging step 6 (a flipped byte,
caught by the marker's checksums; a truncated file under a marker without checksums, caught when it
fails to load) makes the rerun print one warning naming it and resume from step 4, ending with the
same weights as the undisturbed run. Both damaged: one error line, exit 2. A checkpoint written
before RNG states were saved as tensors: one error line with the convert command, which then makes
it resume bit-exact.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
import torch

from tests.stages.training.rl_helpers import one_thread
from trainer_lib.cli import main
from trainer_lib.engine.checkpoint import MARKER, tag_for


@pytest.fixture
def run(tiny_model_dir, chat_jsonl, tmp_path):
    """A finished 6-step SFT run in ``out`` (checkpoints 4 and 6) and a function to rerun it."""
    out = tmp_path / "run"
    args = [
        "sft",
        f"model.path={tiny_model_dir}",
        f"data.path={chat_jsonl}",
        "batch_size=2",
        "data.max_length=64",
        "data.packing=false",
        "max_steps=6",
        "save_steps=2",
        "logging_steps=1",
        "lr=3e-3",
        "seed=1",
        f"output_dir={out}",
    ]

    def again(capsys, *changes: str) -> tuple[int, str, str]:
        (out / "summary.json").unlink(missing_ok=True)
        capsys.readouterr()
        with one_thread():
            code = main(args + list(changes))
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    with one_thread():
        assert main(args) == 0
    return out, again


def _weights(out) -> dict:
    from safetensors.torch import load_file

    return load_file(os.path.join(out, "model.safetensors"))


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _marker(tag_dir, drop_checksums: bool = False) -> dict:
    path = tag_dir / MARKER
    content = json.loads(path.read_text())
    if drop_checksums:  # as markers were before they listed checksums
        content.pop("files")
        path.write_text(json.dumps(content))
    return content


def test_a_damaged_newest_checkpoint_is_skipped_with_one_warning(run, capsys):
    out, again = run
    ckpts, undisturbed = out / "checkpoints", _weights(out)
    newest = ckpts / tag_for(6)
    listed = _marker(newest)["files"]
    assert {"mp_rank_00_model_states.pt", "rng_state_rank0.pt", "loop_state_rank0.json"} <= set(listed)
    states = newest / "mp_rank_00_model_states.pt"
    assert listed[states.name]["size"] == states.stat().st_size

    body = bytearray(states.read_bytes())  # a flipped byte: same size, loads without complaint
    body[len(body) // 2] ^= 0xFF
    states.write_bytes(bytes(body))
    code, stdout, stderr = again(capsys)
    warnings = [line for line in stderr.splitlines() if line.startswith("warning: checkpoint")]
    assert code == 0 and len(warnings) == 1, stderr
    assert str(newest) in warnings[0] and "mp_rank_00_model_states.pt: checksum mismatch" in warnings[0]
    assert "resuming at step 4" in stdout
    assert _same(_weights(out), undisturbed)
    assert _marker(newest)["files"][states.name]["size"] == states.stat().st_size  # step 6 written anew

    states.write_bytes(states.read_bytes()[: states.stat().st_size // 2])  # under a marker without checksums
    _marker(newest, drop_checksums=True)
    code, stdout, stderr = again(capsys)
    warnings = [line for line in stderr.splitlines() if line.startswith("warning: checkpoint")]
    assert code == 0 and len(warnings) == 1 and "failed to load" in warnings[0], stderr
    assert "resuming at step 4" in stdout and _same(_weights(out), undisturbed)


def test_no_usable_checkpoint_and_an_old_one_are_one_error_line(run, capsys):
    out, again = run
    ckpts, undisturbed = out / "checkpoints", _weights(out)
    shutil.rmtree(ckpts / tag_for(6))
    rng = ckpts / tag_for(4) / "rng_state_rank0.pt"

    # the format before the weights-only change: the RNG states as Python's and NumPy's own objects
    new = torch.load(rng, weights_only=True)
    version, keys, gauss = new["python"]
    kind, words, pos, has_gauss, cached = new["numpy"]
    old = {
        "python": (version, tuple(keys.tolist()), gauss),
        "numpy": (kind, words.numpy().astype(np.uint32), pos, has_gauss, cached),
        "torch": new["torch"],
    }
    torch.save(old, rng)
    _marker(ckpts / tag_for(4), drop_checksums=True)
    code, stdout, stderr = again(capsys)
    last = stderr.strip().splitlines()[-1]
    assert code == 2 and "Traceback" not in stderr and "resuming" not in stdout
    command = f"python -m trainer_lib.engine.checkpoint convert {ckpts}"
    assert last.startswith("error: ") and "written before checkpoints were saved weights-only" in last, last
    assert command in last and "rng_state_rank0.pt" in last

    from trainer_lib.engine.checkpoint import main as checkpoint_main

    assert checkpoint_main(["convert", str(ckpts)]) == 0
    assert "converted rng_state_rank0.pt" in capsys.readouterr().out
    converted = torch.load(rng, weights_only=True)
    assert torch.equal(converted["numpy"][1], new["numpy"][1]) and torch.equal(converted["python"][1], keys)
    code, stdout, stderr = again(capsys)
    assert code == 0 and "resuming at step 4" in stdout and _same(_weights(out), undisturbed)

    for step in (4, 6):  # both damaged (step 6 rewritten by the run above): nothing to fall back to
        states = ckpts / tag_for(step) / "mp_rank_00_model_states.pt"
        states.write_bytes(states.read_bytes()[:-10])
    code, stdout, stderr = again(capsys)
    last = stderr.strip().splitlines()[-1]
    assert code == 2 and "Traceback" not in stderr and "resuming" not in stdout
    assert last.startswith(f"error: no usable checkpoint in {ckpts} (move them away, or set resume=false to start")
    assert f"over): {tag_for(6)}: mp_rank_00_model_states.pt has " in last, last  # (its marker has checksums)
    assert f"; {tag_for(4)}: failed to load: RuntimeError: " in last, last  # (its marker had them dropped above)


def test_a_rerun_with_other_settings_is_refused_and_a_longer_one_resumes(run, capsys):
    """Another lr or data selection is another run: one error naming the keys, exit 2, nothing trained or
    removed. More steps (and other cadences or trackers) continue the same run from its newest checkpoint."""
    out, again = run
    before = sorted(os.listdir(out / "checkpoints"))
    code, _, err = again(capsys, "lr=1e-3", "data.max_rows=8")
    assert code == 2
    assert "written by a run with other settings (data.max_rows, lr differ)" in err and "resume=false" in err
    assert sorted(os.listdir(out / "checkpoints")) == before and not (out / "summary.json").exists()
    code, out_text, err = again(capsys, "max_steps=8", "logging_steps=2", "report_to=[none]")
    assert code == 0, err
    assert "resuming at step 6" in out_text + err
    assert json.loads((out / "summary.json").read_text())["steps"] == 8
