"""A download into the storage cache that waits on another process's lock says so, then gives up."""

import fcntl
import logging
import os

import pytest

from trainer_lib import storage
from trainer_lib.errors import UserError
from trainer_lib.storage import file_lock


def test_a_held_download_lock_is_named_then_given_up(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("POSTTRAIN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv(file_lock.LOCK_WAIT_ENV, "1")
    url = "memory://locks/corpus.jsonl"
    storage.write_text(url, '{"text": "a"}\n')
    local = storage._cache_location(url)
    lock = os.path.join(os.path.dirname(local), f".{os.path.basename(local)}.lock")
    os.makedirs(os.path.dirname(lock), exist_ok=True)
    with open(lock, "a+") as held:  # another open file: flock refuses it as it would another process
        fcntl.flock(held, fcntl.LOCK_EX)
        held.write("pid 4242 on node-7, downloading memory://locks/corpus.jsonl\n")
        held.flush()
        with caplog.at_level(logging.WARNING), pytest.raises(UserError) as raised:
            storage.localize(url)
    message = str(raised.value)
    assert message.startswith("storage cache: gave up after 1 s waiting for the lock"), message
    assert "pid 4242 on node-7" in message
    assert any("waiting for the lock" in r.getMessage() and "pid 4242" in r.getMessage() for r in caplog.records)
    assert not os.path.exists(local)  # nothing half-downloaded
    assert open(storage.localize(url)).read() == '{"text": "a"}\n'  # the lock released: the download goes ahead
