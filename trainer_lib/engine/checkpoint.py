"""Resumable checkpoints under ``checkpoint_dir/step-XXXXXXXX``, local or at a storage URL.

A checkpoint counts only once its ``COMPLETE`` marker exists; the marker is written (and, for
URL locations, uploaded) last, so a pod killed mid-save leaves a checkpoint that resume
skips. ``checkpoint_dir`` defaults to ``output_dir/checkpoints``; pointing it at a stable
object-store prefix lets a retried pod on another node resume even when ``output_dir`` is a
fresh local artifact directory. Each checkpoint also carries the ``metrics.jsonl`` written so
far, so the training curve survives the retry too. For URL outputs (s3://, gs://...) the stage
works in a local staging directory and mirrors it to the store.

The marker lists the size and SHA-256 of every file of the checkpoint that rank 0 sees (on
several nodes with an object-store ``checkpoint_dir``: those of rank 0's node). Resume checks
them before loading; a checkpoint that fails the check, or fails to load, is named in one
warning and the previous complete one is used instead; none usable is one error line.
Checkpoints written before RNG states were saved as tensors (weights-only loading) are refused
with the command that converts them: ``python -m trainer_lib.engine.checkpoint convert DIR``.

The marker also holds a digest of each setting that shapes what is learned (:func:`run_identity`:
the model, the data and its selection, the objective and optimizer settings, the seed). A rerun whose
settings differ is refused with the keys that changed, instead of resuming a run it is not: a
checkpoint of 109 steps on all pairs would otherwise finish a 40-step run on 320 of them at once.
What may change on a resume: where things go, how long and how often, trackers, the engine.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from trainer_lib import storage
from trainer_lib.errors import UserError

MARKER = "COMPLETE"
LOG_FILE = "metrics.jsonl"
SUMMARY = "summary.json"  # written last: an output root with it holds a complete model
FINAL_STAGING = ".final-model.tmp"
RANK_STATE = "loop_state_rank{rank}.json"  # what one rank's training loop keeps (its unlogged metric sums)


#: Settings a resumed run may change (a key, or a section ending in "."): where things go, how long and how
#: often, trackers, the engine and the object store. The parallel layout is checked on its own.
RESUMABLE_CHANGES = (
    "output_dir",
    "checkpoint_dir",
    "resume",
    "max_steps",
    "num_epochs",
    "save_steps",
    "save_total_limit",
    "eval_steps",
    "logging_steps",
    "eval_batch_size",
    "report_to",
    "loss_plot",
    "data.num_workers",
    "engine.",
    "parallel.",
    "storage.",
    "hub.",
    "preemption.",
)


def run_identity(cfg) -> dict[str, str]:
    """``{key: digest of its value}`` of every setting of ``cfg`` but :data:`RESUMABLE_CHANGES`: what a
    checkpoint's run was. Digests, not values: a marker never holds a location's credentials."""
    from trainer_lib.config.loader import flat_dict
    from trainer_lib.data.cache import digest

    sections = tuple(key for key in RESUMABLE_CHANGES if key.endswith("."))
    return {
        key: digest(value)[:16]
        for key, value in flat_dict(cfg).items()
        if key not in RESUMABLE_CHANGES and not key.startswith(sections)
    }


def tag_for(step: int) -> str:
    return f"step-{step:08d}"


class UnusableCheckpointError(UserError):
    """No complete checkpoint can be resumed from (each failed its checksums or its load), or one was
    written in a format this version no longer loads: a retry would fail the same way."""


def file_digests(directory: str, names: list[str] | None = None) -> dict[str, dict]:
    """``{relative path: {"size", "sha256"}}`` of ``names`` under ``directory`` (default: every file but
    the marker).

    Files are hashed in parallel (hashlib lets other threads run while it hashes a large buffer);
    after a save they are read once more, mostly from the page cache."""
    if names is None:
        names = sorted(
            os.path.relpath(os.path.join(root, name), directory)
            for root, _, files in os.walk(directory)
            for name in files
            if name != MARKER
        )
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        sums = list(pool.map(lambda rel: _sha256(os.path.join(directory, rel)), names))
    return {
        rel: {"size": os.path.getsize(os.path.join(directory, rel)), "sha256": digest}
        for rel, digest in zip(names, sums)
    }


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(8 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def check_digests(directory: str, expected: dict[str, dict]) -> str | None:
    """What is wrong with ``directory``'s files against a marker's ``files`` (None: nothing)."""
    for rel, want in sorted(expected.items()):
        path = os.path.join(directory, rel)
        if not os.path.isfile(path):
            return f"{rel} is missing"
        if os.path.getsize(path) != want["size"]:
            return f"{rel} has {os.path.getsize(path)} bytes, its marker says {want['size']}"
    found = file_digests(directory, sorted(expected))
    bad = [rel for rel in sorted(expected) if found[rel]["sha256"] != expected[rel]["sha256"]]
    return f"{bad[0]}: checksum mismatch (its sha256 differs from the marker's)" if bad else None


#: what a file of a checkpoint saved before RNG states were tensors holds (NumPy's generator state)
_OLD_RNG_GLOBALS = re.compile(r"^numpy\.")


def old_format_files(directory: str) -> list[str]:
    """The RNG state files of ``directory`` written before the weights-only change (NumPy arrays in a
    pickle, which weights-only loading refuses). Read without unpickling anything."""
    import torch

    old = []
    for name in sorted(os.listdir(directory)):
        if name.startswith("rng_state_rank") and name.endswith(".pt"):
            try:
                found = torch.serialization.get_unsafe_globals_in_checkpoint(os.path.join(directory, name))
            except Exception:  # (not a readable archive: loading it decides)
                continue
            if found and all(_OLD_RNG_GLOBALS.match(g) for g in found):
                old.append(name)
    return old


#: config keys that say where results go or what happens to them at the end (or on SIGTERM), not how
#: the model trains.
OUTPUT_KEYS = ("output_dir", "checkpoint_dir", "storage", "hub", "loss_plot", "preemption")


def stable_checkpoint_dir(cfg, root: str, stage: str) -> str:
    """A checkpoint location under ``root`` that a retried pod finds again: ``<root>/checkpoints/
    <stage>-<fingerprint>``, the fingerprint covering the whole config except where outputs go.

    In a pipeline the inputs' paths belong to the run, so the location is per run and per task,
    stable across retries of that task, and outside the output artifact (which then holds only
    the final model). KFP's ``minio://`` pipeline root is read as the S3 bucket it is.
    """
    from trainer_lib.config import to_dict

    settings = {k: v for k, v in to_dict(cfg).items() if k not in OUTPUT_KEYS}
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]
    root = root.replace("minio://", "s3://", 1).rstrip("/")
    return storage.join(root, "checkpoints", f"{stage}-{digest}")


def staging_dir(location: str) -> str:
    """Local working directory for a location (itself, when it is local)."""
    if not storage.is_remote(location):
        return os.path.abspath(os.path.expanduser(location))
    digest = hashlib.sha1(location.encode()).hexdigest()[:16]
    return os.path.join(storage.cache_root(), "staging", digest)


class CheckpointManager:
    def __init__(
        self,
        output_dir: str,
        strategy,
        keep: int = 2,
        checkpoint_dir: str | None = None,
        merge_lora: bool = True,
        identity: dict | None = None,
    ):
        self.output_dir = output_dir
        self.identity = identity
        self.merge_lora = merge_lora
        self.strategy = strategy
        self.keep = keep
        self.remote = storage.is_remote(output_dir)
        self.local_dir = staging_dir(output_dir)
        self.ckpt_root = checkpoint_dir or storage.join(output_dir, "checkpoints")
        self.ckpt_remote = storage.is_remote(self.ckpt_root)
        self.ckpt_dir = staging_dir(self.ckpt_root)
        for location in {output_dir, self.ckpt_root}:  # fail now, not at the first save
            storage.require_bucket(location)
        os.makedirs(self.ckpt_dir, exist_ok=True)
        os.makedirs(self.local_dir, exist_ok=True)

    @classmethod
    def for_stage(cls, cfg, strategy) -> CheckpointManager:
        """From the shared training keys: output_dir, checkpoint_dir, save_total_limit, lora.merge; the
        run's identity (:func:`run_identity`) from all of them."""
        return cls(
            cfg.output_dir,
            strategy,
            keep=cfg.save_total_limit,
            checkpoint_dir=cfg.checkpoint_dir,
            merge_lora=cfg.lora.merge,
            identity=run_identity(cfg),
        )

    # ------------------------------------------------------------------ discovery
    def complete_steps(self) -> list[int]:
        return [step for step, complete in self._saved_steps() if complete]

    def _saved_steps(self) -> list[tuple[int, bool]]:
        """(step, has its marker) of every ``step-*`` directory, oldest first."""
        if not storage.isdir(self.ckpt_root):
            return []
        steps = []
        for name in storage.listdir(self.ckpt_root):
            name = name.rstrip("/")
            if name.startswith("step-") and name[5:].isdigit():
                steps.append((int(name[5:]), storage.exists(storage.join(self.ckpt_root, name, MARKER))))
        return sorted(steps)

    def latest_step(self) -> int | None:
        steps = self.complete_steps()
        return steps[-1] if steps else None

    # ------------------------------------------------------------------ save / restore
    def restore(self, engine, extra_engines: dict | None = None) -> dict | None:
        """Load the newest usable complete checkpoint into ``engine`` (and each of ``extra_engines``,
        e.g. PPO's critic, from its named subdirectory); its client state, or None when there is none.

        A checkpoint whose files fail their marker's checksums, or that fails to load, is named in one
        warning and the previous complete one is tried; all ranks agree on each verdict. None usable:
        an :class:`UnusableCheckpointError` naming each (and what went wrong)."""
        failed = []
        for step in reversed(self.complete_steps()):
            tag = tag_for(step)
            problem = self._fetch_and_check(tag)
            state = None
            if problem is None:
                problem, state = self._load(engine, extra_engines or {}, tag)
            if problem is None:
                self._keep_log(tag)
                self.strategy.print(f"resumed from {storage.join(self.ckpt_root, tag)}")
                return state
            failed.append(f"{tag}: {problem}")
            if self.strategy.is_rank_0:
                print(
                    f"warning: checkpoint {storage.join(self.ckpt_root, tag)} is not usable ({problem}); "
                    "trying the previous complete one",
                    file=sys.stderr,
                    flush=True,
                )
        if failed:
            raise UnusableCheckpointError(
                f"no usable checkpoint in {self.ckpt_root} (move them away, or set resume=false to start "
                f"over): {'; '.join(failed)}"
            )
        return None

    def _layout(self) -> dict:
        parallel = self.strategy.parallel
        return {"tensor": parallel.tensor, "pipeline": parallel.pipeline, "sequence": parallel.sequence}

    def _other_layout(self, saved: dict | None) -> str | None:
        """Why a checkpoint of another tensor/pipeline/sequence layout cannot load here (its files hold other
        shards and stages, its data order another split), or None; markers from before a size was recorded
        have it 1."""
        saved, here = {"tensor": 1, "pipeline": 1, "sequence": 1, **(saved or {})}, self._layout()
        if saved == here:
            return None
        keys = [k for k in here if k != "sequence" or 1 < max(saved[k], here[k])]

        def named(layout: dict) -> str:
            return " ".join(f"parallel.{k}={layout[k]}" for k in keys)

        return f"saved with {named(saved)}, this run has {named(here)}; resume with the layout it was saved with"

    def _changed_settings(self, saved: dict | None) -> list[str]:
        """The settings whose values differ from the run that wrote a checkpoint (markers from before the
        identity was recorded: none)."""
        if not saved or self.identity is None:
            return []
        return sorted(key for key in set(saved) | set(self.identity) if saved.get(key) != self.identity.get(key))

    def _fetch_and_check(self, tag: str) -> str | None:
        """Download ``tag`` (URL locations) and check its files against its marker, once per node;
        what is wrong with it, agreed by every rank (None: nothing). A checkpoint of other settings is
        an error: every checkpoint of that run is."""
        local = os.path.join(self.ckpt_dir, tag)
        problem, old, changed = None, [], []
        if self.strategy.local_rank == 0:
            try:
                if self.ckpt_remote:
                    storage.download_dir(storage.join(self.ckpt_root, tag), local)
                with open(os.path.join(local, MARKER), encoding="utf-8") as fh:
                    marker = json.load(fh)
                files = marker.get("files")
                problem = check_digests(local, files) if files else None
                problem = problem or self._other_layout(marker.get("parallel"))
                changed = [] if problem else self._changed_settings(marker.get("config"))
                old = [] if problem or changed else old_format_files(local)
            except storage.StorageError as exc:  # a transient failure stays one: exit 1 and a retry
                if "checksum mismatch" not in str(exc):
                    raise
                problem = " ".join(str(exc).split())
            except (OSError, ValueError, RuntimeError) as exc:  # an unreadable marker or pickle
                problem = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
        verdict = self.strategy.all_reduce(3.0 if changed else 2.0 if old else 1.0 if problem else 0.0, op="max")
        if verdict == 3.0:
            shown = ", ".join(changed[:8]) + (f" and {len(changed) - 8} more" if len(changed) > 8 else "")
            raise UserError(
                f"{storage.join(self.ckpt_root, tag)}: written by a run with other settings "
                f"({shown or 'on another rank'} differ); rerun with the settings it was saved with to continue "
                "it, or move the checkpoints away (or set resume=false) to start over"
            )
        if verdict == 2.0:
            where = storage.join(self.ckpt_root, tag)
            files = f" ({', '.join(old)}: NumPy arrays)" if old else ""
            local_copy = "a local copy of " if self.ckpt_remote else ""
            raise UnusableCheckpointError(
                f"{where}: written before checkpoints were saved weights-only{files}; convert it once with "
                f"`python -m trainer_lib.engine.checkpoint convert {local_copy}{self.ckpt_root}` (rewrites the RNG "
                "state files as tensors, nothing else changes), or set resume=false to start over"
            )
        return (problem or "failed its checks on another node") if verdict else None

    def _load(self, engine, extra_engines: dict, tag: str) -> tuple[str | None, dict | None]:
        """(what went wrong, client state): a load failure on any rank fails the checkpoint on all."""
        import pickle
        import zipfile

        problem, state = None, None
        try:
            state = self.strategy.load_checkpoint(engine, self.ckpt_dir, tag)
            for name, extra in extra_engines.items():
                self.strategy.load_checkpoint(extra, os.path.join(self.ckpt_dir, tag), name)
        except UserError as exc:  # (a pickle refused by weights-only loading)
            problem = " ".join(str(exc).split())
        except (
            OSError,
            EOFError,
            RuntimeError,
            ValueError,
            KeyError,
            pickle.UnpicklingError,
            zipfile.BadZipFile,
        ) as exc:
            problem = f"failed to load: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        if self.strategy.all_reduce(1.0 if problem else 0.0, op="max"):
            return problem or "failed to load on another rank", None
        return None, state

    def _keep_log(self, tag: str) -> None:
        """A fresh pod: keep the earlier curve (the checkpoint's metrics.jsonl, when output_dir has none)."""
        local, log = os.path.join(self.ckpt_dir, tag), os.path.join(self.local_dir, LOG_FILE)
        if self.strategy.is_rank_0 and not os.path.exists(log) and os.path.exists(os.path.join(local, LOG_FILE)):
            shutil.copyfile(os.path.join(local, LOG_FILE), log)

    def save(
        self,
        engine,
        step: int,
        client_state: dict,
        extra_engines: dict | None = None,
        rank_state: dict | None = None,
    ) -> None:
        """Checkpoint ``step``: every engine, ``client_state`` (rank 0's), ``rank_state`` (each rank's own,
        plain JSON data) and metrics.jsonl, then the marker with the files' checksums."""
        tag = tag_for(step)
        local = os.path.join(self.ckpt_dir, tag)
        if self.strategy.is_rank_0:  # a half-written earlier attempt
            shutil.rmtree(local, ignore_errors=True)
            if self.ckpt_remote:
                storage.delete(storage.join(self.ckpt_root, tag))
        self.strategy.barrier()
        self.strategy.save_checkpoint(engine, self.ckpt_dir, tag, client_state)
        for name, extra in (extra_engines or {}).items():  # inside the tag: one marker covers all
            self.strategy.save_checkpoint(extra, local, name, {})
        if rank_state is not None:
            storage.write_text(os.path.join(local, RANK_STATE.format(rank=self.strategy.rank)), json.dumps(rank_state))
        if self.strategy.is_rank_0 and os.path.exists(os.path.join(self.local_dir, LOG_FILE)):
            shutil.copyfile(os.path.join(self.local_dir, LOG_FILE), os.path.join(local, LOG_FILE))
        self.strategy.barrier()
        if self.ckpt_remote and self.strategy.local_rank == 0:
            storage.upload_dir(local, storage.join(self.ckpt_root, tag))
        self.strategy.barrier()
        if self.strategy.is_rank_0:
            marker = json.dumps(
                {
                    "step": step,
                    "time": time.time(),
                    "world_size": self.strategy.world_size,
                    "parallel": self._layout(),
                    "config": self.identity,
                    "files": file_digests(local),
                }
            )
            storage.write_text(os.path.join(local, MARKER), marker)
            if self.ckpt_remote:
                storage.write_text(storage.join(self.ckpt_root, tag, MARKER), marker)
            self._prune()
        self.strategy.barrier()

    def rank_state(self, step: int) -> dict | None:
        """This rank's ``rank_state`` in the (restored) checkpoint of ``step``, or None."""
        path = os.path.join(self.ckpt_dir, tag_for(step), RANK_STATE.format(rank=self.strategy.rank))
        if not os.path.exists(path):
            return None
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)

    def _prune(self) -> None:
        """Keep the newest ``keep`` complete checkpoints (all, if ``keep`` <= 0), and drop what a save
        killed before its marker left behind, once a newer checkpoint is complete."""
        saved = self._saved_steps()
        complete = [step for step, done in saved if done]
        drop = [step for step, done in saved if not done and step < complete[-1]]
        if self.keep > 0:
            drop += complete[: -self.keep]
        for step in sorted(drop):
            tag = tag_for(step)
            if self.ckpt_remote:
                storage.delete(storage.join(self.ckpt_root, tag))
            shutil.rmtree(os.path.join(self.ckpt_dir, tag), ignore_errors=True)

    # ------------------------------------------------------------------ final output
    def finish(self, engine, tokenizer, summary: dict, extra_files: dict[str, str] | None = None) -> None:
        """End of training: HF model (or LoRA adapter) and summary.json at the output root, mirrored
        to the store.

        ``summary.json`` marks a complete model: it is removed first and written last, and the model
        is written to a temporary directory whose files are then renamed into the root, so a pod
        killed meanwhile leaves no truncated file and no summary.json."""
        staged = os.path.join(self.local_dir, FINAL_STAGING)
        if self.strategy.is_rank_0:
            for stale in (os.path.join(self.local_dir, SUMMARY), staged):
                storage.delete(stale)
            if self.remote:
                storage.delete(storage.join(self.output_dir, SUMMARY))
        self.strategy.save_hf_model(engine, tokenizer, staged, extra_files=extra_files, merge_lora=self.merge_lora)
        if self.strategy.is_rank_0:
            for name in sorted(os.listdir(staged)):
                target = os.path.join(self.local_dir, name)
                if os.path.isdir(target):  # os.replace swaps files atomically, not directories
                    shutil.rmtree(target)
                os.replace(os.path.join(staged, name), target)
            os.rmdir(staged)
            storage.write_text(os.path.join(self.local_dir, SUMMARY), json.dumps(summary, indent=2))
        self.publish()
        self.strategy.barrier()

    def publish(self, names: list[str] | None = None) -> None:
        """Mirror the staging root (final model, logs) to an output_dir URL, summary.json last;
        rank 0 only."""
        if not (self.remote and self.strategy.is_rank_0):
            return
        names = sorted(os.listdir(self.local_dir)) if names is None else names
        for name in sorted(names, key=lambda name: name == SUMMARY):
            if name in ("checkpoints", FINAL_STAGING):
                continue
            src = os.path.join(self.local_dir, name)
            storage.copy(src, storage.join(self.output_dir, name))


# ---------------------------------------------------------------------- converting old checkpoints
def convert_old_rng_files(tag_dir: str) -> list[str]:
    """Rewrite the RNG state files of a checkpoint saved before the weights-only change as tensors
    (what :func:`trainer_lib.engine.rng.rng_state` writes now); the names of those rewritten.

    The old files are read with ``weights_only=True`` too, allowing only NumPy's array classes (the
    generator state is a uint32 array): nothing else is rebuilt. The weights, optimizer and client
    state files are left as they are; a marker with checksums gets the new files' checksums."""
    import numpy as np
    import torch

    try:  # NumPy 2 (a pickle of NumPy 1 names numpy.core, which NumPy 2 still reads)
        from numpy._core.multiarray import _reconstruct
    except ImportError:
        from numpy.core.multiarray import _reconstruct
    allowed = [(_reconstruct, f"numpy.{core}.multiarray._reconstruct") for core in ("_core", "core")]
    names = old_format_files(tag_dir)
    for name in names:
        path = os.path.join(tag_dir, name)
        with torch.serialization.safe_globals([*allowed, np.ndarray, np.dtype, type(np.dtype(np.uint32))]):
            old = torch.load(path, weights_only=True)
        version, keys, gauss = old["python"]
        kind, words, pos, has_gauss, cached = old["numpy"]
        new = {
            "python": [version, torch.tensor(list(keys), dtype=torch.int64), gauss],
            "torch": old["torch"],
            "numpy": [kind, torch.from_numpy(np.asarray(words).astype(np.int64)), pos, has_gauss, cached],
        }
        if old.get("cuda") is not None:
            new["cuda"] = old["cuda"]
        torch.save(new, path + ".tmp")
        os.replace(path + ".tmp", path)
    marker = os.path.join(tag_dir, MARKER)
    if names and os.path.exists(marker):
        with open(marker, encoding="utf-8") as fh:
            content = json.load(fh)
        if "files" in content:
            content["files"] = file_digests(tag_dir)
            storage.write_text(marker, json.dumps(content))
    return names


def main(argv: list[str]) -> int:
    """``python -m trainer_lib.engine.checkpoint convert DIR``: convert every checkpoint under a local
    checkpoint directory (or one ``step-*`` directory) saved before the weights-only change."""
    if len(argv) != 2 or argv[0] != "convert" or not os.path.isdir(argv[1]):
        print(
            "usage: python -m trainer_lib.engine.checkpoint convert CHECKPOINT_DIR (a local directory; for "
            "s3://... download it, convert, upload)",
            file=sys.stderr,
        )
        return 2
    root = argv[1].rstrip("/")
    tags = (
        [root]
        if os.path.basename(root).startswith("step-")
        else [os.path.join(root, n) for n in sorted(os.listdir(root)) if n.startswith("step-")]
    )
    for tag in tags:
        done = convert_old_rng_files(tag)
        print(f"{tag}: " + (f"converted {', '.join(done)}" if done else "already in the current format"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


def checkpoint_globals() -> list:
    """The classes DeepSpeed pickles into its checkpoint files besides tensors and plain containers
    (ZeRO optimizer states): the only ones :func:`weights_only_loads` lets torch.load rebuild."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address]


@contextlib.contextmanager
def weights_only_loads():
    """Within it, every ``torch.load`` reads with ``weights_only=True``, also DeepSpeed's (which asks
    for False), through torch's documented ``TORCH_FORCE_WEIGHTS_ONLY_LOAD`` switch, and only
    :func:`checkpoint_globals` may be rebuilt besides torch's own safe types."""
    import torch

    previous = os.environ.get("TORCH_FORCE_WEIGHTS_ONLY_LOAD")
    os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "1"
    try:
        with torch.serialization.safe_globals(checkpoint_globals()):
            yield
    finally:
        if previous is None:
            del os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"]
        else:
            os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = previous
