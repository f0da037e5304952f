"""Prompt files that arrive while an RL stage trains (``data.feedback_path``).

A directory or ``s3://`` prefix is watched between steps. Each ``.jsonl`` file found there, in sorted
name order, is read once: it is known by its name and the SHA-256 of its content, so a file rewritten
with new content counts as a new file, and a resumed run (which restores the known files from its
checkpoint) reads nothing twice. Rows are validated like any prompt data file (same formats, one
text kind with the training prompts, errors naming file, line and field); a file with any bad row is
skipped whole, with one warning. Only the prompt and the columns the training prompts have are
kept (a missing column is null, as in a data.path file where some rows lack it): reward functions
see the same keyword columns every step. A label column therefore never changes the reward by
itself; it reaches the reward functions only if the training prompts have that column too.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile

from trainer_lib.errors import UserError

SUFFIX = ".jsonl"


@dataclasses.dataclass
class Arrival:
    """A feedback file not read before: its name under the watched path, content and content hash."""

    name: str
    data: bytes
    sha256: str
    fingerprint: str  # storage's cheap identity of the file (size and mtime, or ETag), to skip rereads


def prompt_key(prompt) -> str:
    """What makes two prompts the same (the pool keeps one of each)."""
    return json.dumps(prompt, sort_keys=True, ensure_ascii=False)


class FeedbackFiles:
    """The files of ``path`` and which of them were read.

    Args:
        path: a local directory or a URL prefix (``s3://bucket/feedback``); it may not exist yet.
        columns: the training prompt rows' columns (``prompt`` and the rest), the columns kept.
        conversational: whether the training prompts are conversations (feedback must match).
        fits: ``prompt -> bool``, False for a prompt over ``data.max_length`` tokens (dropped).
    """

    def __init__(self, path: str, columns: list[str], conversational: bool | None, fits):
        self.path, self.columns, self.conversational, self.fits = path, list(columns), conversational, fits
        self.known: set[tuple[str, str]] = set()  # (name, sha256) of every file read: checkpointed
        self.looked: dict[str, str] = {}  # name -> fingerprint when last read (in memory only)
        self.dir_fingerprint: str | None = None

    def names(self) -> list[str]:
        from trainer_lib import storage

        if not storage.is_remote(self.path) and not os.path.isdir(os.path.expanduser(self.path)):
            return []
        try:
            files = storage.list_files(self.path)
        except FileNotFoundError:
            return []
        return sorted(name for name in files if name.endswith(SUFFIX) and not os.path.basename(name).startswith("."))

    def poll(self) -> list[Arrival]:
        """Files whose content was not read before, in name order (nothing is remembered yet)."""
        from trainer_lib import storage

        names = self.names()
        if not names:
            return []
        whole = storage.fingerprint(self.path)
        if whole == self.dir_fingerprint:
            return []
        arrivals = []
        for name in names:
            location = storage.join(self.path, name)
            fingerprint = storage.fingerprint(location)
            if self.looked.get(name) == fingerprint:
                continue
            data = storage.read_bytes(location)
            sha = hashlib.sha256(data).hexdigest()
            if (name, sha) in self.known:
                self.looked[name] = fingerprint
                continue
            arrivals.append(Arrival(name, data, sha, fingerprint))
        if not arrivals:
            self.dir_fingerprint = whole
        return arrivals

    def remember(self, arrival: Arrival) -> None:
        self.known.add((arrival.name, arrival.sha256))
        self.looked[arrival.name] = arrival.fingerprint
        self.dir_fingerprint = None  # look again next time: more may have come while this was read

    def read(self, arrival: Arrival) -> tuple[list[dict], dict]:
        """``(prompt rows, counts)`` of a file: counts of ``rows``, ``empty`` and ``too_long`` rows
        dropped. Raises a :class:`~trainer_lib.errors.UserError` naming the file (and line and
        field) when any row is malformed."""
        from trainer_lib import storage
        from trainer_lib.data.dataset import Normalizer
        from trainer_lib.data.formats import is_empty
        from trainer_lib.data.sources import Source
        from trainer_lib.rl.prompts import PROMPT_FORMATS

        display = storage.join(self.path, arrival.name)
        normalizer = Normalizer(None, PROMPT_FORMATS, "RL feedback (a 'prompt' column)", self.conversational)
        rows, counts = [], {"rows": 0, "empty": 0, "too_long": 0}
        with tempfile.TemporaryDirectory() as tmp:
            local = os.path.join(tmp, "feedback" + SUFFIX)
            with open(local, "wb") as fh:
                fh.write(arrival.data)
            try:
                for location, raw in Source(display, local, "jsonl", key="data.feedback_path").rows():
                    row = normalizer(location, raw)
                    counts["rows"] += 1
                    if is_empty(row, normalizer.fmt):
                        counts["empty"] += 1
                    elif not self.fits(row["prompt"]):
                        counts["too_long"] += 1
                    else:
                        rows.append({column: row.get(column) for column in self.columns})
            except UserError as exc:
                text = str(exc).replace("data.path: ", "", 1)
                raise UserError(text if display in text else f"{display}: {text}") from None
        return rows, counts
