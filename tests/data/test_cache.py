"""The build-once data cache: atomic entries, killed builds never reused, only local rank 0 builds."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from trainer_lib.data import cache


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("POSTTRAIN_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "data"


def _writer(value: str, calls: list):
    def build(tmp: str) -> dict:
        calls.append(value)
        with open(os.path.join(tmp, "x.txt"), "w") as fh:
            fh.write(value)
        return {"value": value}

    return build


def test_built_once_then_reused_and_keyed_by_every_part(cache_dir):
    calls = []
    entry, manifest = cache.cached("t", {"k": 1}, _writer("a", calls))
    assert manifest["value"] == "a" and open(os.path.join(entry, "x.txt")).read() == "a"
    again, manifest = cache.cached("t", {"k": 1}, _writer("b", calls))
    assert (again, manifest["value"], calls) == (entry, "a", ["a"])  # reused, not rebuilt
    other, manifest = cache.cached("t", {"k": 2}, _writer("c", calls))
    assert other != entry and manifest["value"] == "c" and calls == ["a", "c"]
    assert sorted(p.name for p in cache_dir.iterdir() if not p.name.endswith(".lock")) == sorted(
        os.path.basename(e) for e in (entry, other)
    )  # no temp dirs left


def test_failed_build_leaves_nothing(cache_dir):
    def build(tmp):
        open(os.path.join(tmp, "half.arrow"), "w").write("x")
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        cache.cached("t", {"k": 1}, build)
    assert [p.name for p in cache_dir.iterdir() if not p.name.endswith(".lock")] == []


CHILD = textwrap.dedent("""
    import json, os, sys, time
    from trainer_lib.data import cache

    log, pause = sys.argv[1], float(sys.argv[2])

    def build(tmp):
        with open(log, "a") as fh:
            fh.write(f"{os.environ.get('LOCAL_RANK', '0')} {tmp}\\n")
        with open(os.path.join(tmp, "part.arrow"), "w") as fh:
            fh.write("partial")
        time.sleep(pause)
        return {"value": os.environ.get("LOCAL_RANK", "0")}

    entry, manifest = cache.cached("t", {"k": 1}, build)
    print(json.dumps([entry, manifest["value"], sorted(os.listdir(entry))]))
""")


def _child(tmp_path, rank: int, pause: float) -> subprocess.Popen:
    env = {**os.environ, "LOCAL_RANK": str(rank), "POSTTRAIN_CACHE": str(tmp_path / "cache")}
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path / "builds.log"), str(pause)],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )


def _wait_for_log(tmp_path, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    log = tmp_path / "builds.log"
    while not (log.exists() and log.read_text().endswith("\n")):
        assert time.monotonic() < deadline, "the child never started building"
        time.sleep(0.05)
    return log.read_text()


def test_a_killed_build_is_never_reused(tmp_path, cache_dir):
    proc = _child(tmp_path, 0, pause=60)
    started = _wait_for_log(tmp_path)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    tmp_dir = started.split()[1]
    assert os.path.exists(os.path.join(tmp_dir, "part.arrow"))  # the half build is on disk...
    entry = cache.entry_path("t", {"k": 1})
    assert not os.path.exists(entry)  # ...but never under the entry's name
    calls = []
    built, manifest = cache.cached("t", {"k": 1}, _writer("fresh", calls))
    assert (built, manifest["value"], calls) == (entry, "fresh", ["fresh"])
    assert not os.path.exists(tmp_dir)  # left-overs of the killed build are removed

    # an entry without its manifest (e.g. copied half) is rebuilt, not reused
    os.remove(os.path.join(entry, cache.MANIFEST))
    built, manifest = cache.cached("t", {"k": 1}, _writer("again", calls))
    assert manifest["value"] == "again" and calls == ["fresh", "again"]


def test_only_local_rank_0_builds_the_other_ranks_wait(tmp_path, cache_dir):
    waiter = _child(tmp_path, 1, pause=0)  # starts first, must not build
    time.sleep(1.0)
    builder = _child(tmp_path, 0, pause=1.0)
    outs = [json.loads(p.communicate(timeout=120)[0]) for p in (waiter, builder)]
    assert waiter.returncode == builder.returncode == 0
    assert outs[0] == outs[1] and outs[0][1] == "0" and outs[0][2] == [cache.MANIFEST, "part.arrow"]
    assert [line.split()[0] for line in (tmp_path / "builds.log").read_text().splitlines()] == ["0"]


def test_tokenizer_fingerprint_sees_vocab_and_chat_template():
    from trainer_lib.demo.tiny_model import train_tokenizer

    a = train_tokenizer(["one two three four"] * 4, vocab_size=300)
    b = train_tokenizer(["one two three four"] * 4, vocab_size=300)
    assert cache.tokenizer_fingerprint(a) == cache.tokenizer_fingerprint(b)
    b.chat_template = "{{ messages }}"
    assert cache.tokenizer_fingerprint(a) != cache.tokenizer_fingerprint(b)
    c = train_tokenizer(["five six seven eight"] * 4, vocab_size=300)
    assert cache.tokenizer_fingerprint(a) != cache.tokenizer_fingerprint(c)
