"""Feedback files (data.feedback_path): prompts that arrive while training join the pool between steps,
each file once; a malformed file is skipped with one warning naming it; locally and on S3."""

import json
import logging

import pytest

from tests.rl.test_prompt_buffer import OneProcess, _config
from trainer_lib import storage
from trainer_lib.rl.buffer import BufferedSchedule, PromptBuffer
from trainer_lib.rl.feedback import FeedbackFiles


class Printed(OneProcess):
    def __init__(self):
        self.lines = []

    def print(self, *args):
        self.lines.append(" ".join(map(str, args)))


def _schedule(path: str, strategy) -> BufferedSchedule:
    rows = [{"prompt": f"question {i}", "row": i} for i in range(4)]
    feedback = FeedbackFiles(path, ["prompt", "row"], False, fits=lambda prompt: len(prompt) <= 40)
    return BufferedSchedule(_config(), PromptBuffer(rows, 0, True), strategy, lambda g, m: g.std(1), feedback)


def _jsonl(*rows) -> str:
    return "".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows)


def _exercise(root: str, caplog):
    """The same story on a local directory and on an S3 prefix."""
    strategy = Printed()
    schedule = _schedule(root, strategy)
    schedule.before_step(0)  # the directory does not exist yet: nothing happens
    assert len(schedule.prompts) == 4
    storage.write_text(
        storage.join(root, "b.jsonl"),
        _jsonl(
            {"prompt": "new one", "label": 1.0},  # a column the training prompts lack: dropped; row: null
            {"prompt": "question 2"},  # already in the pool
            {"prompt": "x" * 41},  # over the length limit
            {"prompt": "new two", "row": 7},
        ),
    )
    storage.write_text(storage.join(root, "a.jsonl"), _jsonl({"prompt": "fine"}, {"prompt": ["not", "text"]}))
    storage.write_text(storage.join(root, "notes.txt"), "not a feedback file")
    with caplog.at_level(logging.WARNING):
        schedule.before_step(1)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "a.jsonl:2" in warnings[0] and "'prompt'" in warnings[0]  # file, line and field
    assert schedule.prompts[4:] == [{"prompt": "new one", "row": None}, {"prompt": "new two", "row": 7}]
    assert schedule.buffer.priority[4:] == [1.0, 1.0]
    assert strategy.lines == [
        "feedback: before step 2: b.jsonl: 2 of 4 prompts added (1 already in the pool, 1 too long); 6 prompts"
    ]
    assert schedule.counts == {"files": 1, "skipped_files": 1, "prompts": 2}
    caplog.clear()
    schedule.before_step(2)  # each file once: no second warning, nothing added twice
    assert not caplog.records and len(schedule.prompts) == 6
    state = schedule.state_dict()
    assert state["files"] == sorted(state["files"]) and [name for name, _ in state["files"]] == ["a.jsonl", "b.jsonl"]
    storage.write_text(storage.join(root, "a.jsonl"), _jsonl({"prompt": "fine"}))  # fixed: new content, read again
    schedule.before_step(3)
    assert schedule.prompts[-1] == {"prompt": "fine", "row": None} and schedule.counts["files"] == 2
    # a resumed run restores the files it read: nothing is read twice, the pool is the same
    resumed = _schedule(root, Printed())
    resumed.load_state_dict(schedule.state_dict())
    with caplog.at_level(logging.WARNING):
        resumed.before_step(4)
    assert not caplog.records and resumed.prompts == schedule.prompts and resumed.counts == schedule.counts


def test_feedback_files_join_the_pool_between_steps(tmp_path, caplog):
    _exercise(str(tmp_path / "feedback"), caplog)


def test_feedback_files_on_s3(s3_bucket, caplog):
    _exercise(f"s3://{s3_bucket}/feedback", caplog)


def test_feedback_needs_a_live_pool():
    from tests.stages.training.rl_helpers import LENGTH_REWARD
    from trainer_lib.config import load_config
    from trainer_lib.errors import ConfigError
    from trainer_lib.stages.training.grpo import GRPOConfig

    base = [
        "model.path=m",
        "data.path=x.jsonl",
        "output_dir=/tmp/x",
        f"reward.functions={LENGTH_REWARD}",
    ]
    for bad, message in [
        (["data.feedback_path=/tmp/f"], "data.feedback_path: needs a live prompt pool"),
        (["buffer.dynamic_sampling=true"], "buffer.dynamic_sampling: needs a live prompt pool"),
        (["buffer.mode=priority", "buffer.temperature=0"], "buffer: expected temperature > 0"),
        (["buffer.mode=fifo"], "buffer.mode: expected one of"),
    ]:
        with pytest.raises(ConfigError, match=message):
            load_config(GRPOConfig, None, [*base, *bad])
    cfg = load_config(GRPOConfig, None, base)
    assert cfg.buffer.mode == "shuffle" and cfg.data.feedback_path is None and not cfg.buffer.dynamic_sampling
