"""samples.jsonl: rows at a step, long text cut, a size cap, and a resume that drops the replayed steps."""

import json

from trainer_lib.loop import samples
from trainer_lib.loop.samples import SampleLog


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_rows_are_written_cut_and_capped(tmp_path, monkeypatch):
    log = SampleLog(str(tmp_path), initial_step=0)
    calls = []

    def rows():
        calls.append(1)
        return [{"kind": "rollout", "completion": "x" * (samples.MAX_TEXT + 50), "reward": 0.123456789}] * 40

    log.write(5, rows)
    written = _rows(tmp_path / "samples.jsonl")
    assert len(written) == samples.ROWS_PER_LOG and written[0]["step"] == 5
    assert written[0]["completion"] == "x" * samples.MAX_TEXT + " [...]" and written[0]["reward"] == 0.123457
    monkeypatch.setattr(samples, "MAX_BYTES", (tmp_path / "samples.jsonl").stat().st_size + 10)
    log.write(10, rows)  # crosses the cap: written, then the capped row
    log.write(15, rows)  # nothing more, and the rows are not even built
    written = _rows(tmp_path / "samples.jsonl")
    assert [r["step"] for r in written].count(10) == samples.ROWS_PER_LOG + 1
    assert written[-1] == {"step": 10, "kind": "capped", "max_bytes": samples.MAX_BYTES}
    assert len(calls) == 2
    assert SampleLog(str(tmp_path), initial_step=10).capped  # a resumed run stays capped


def test_a_resumed_run_drops_the_rows_of_the_steps_it_replays(tmp_path):
    log = SampleLog(str(tmp_path), initial_step=0)
    for step in (5, 10, 15):
        log.write(step, lambda step=step: [{"kind": "pair", "margin": float(step)}])
    SampleLog(str(tmp_path), initial_step=10)  # resumed from the checkpoint of step 10
    assert [r["step"] for r in _rows(tmp_path / "samples.jsonl")] == [5, 10]
    assert not SampleLog(str(tmp_path), initial_step=10, enabled=False).capped
