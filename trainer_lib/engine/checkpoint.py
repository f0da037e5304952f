"""Resumable checkpoints under ``checkpoint_dir/step-XXXXXXXX``, local or at a storage URL.

A checkpoint counts only once its ``COMPLETE`` marker exists; the marker is written (and, for
URL locations, uploaded) last, so a pod killed mid-save leaves a checkpoint that resume
skips. ``checkpoint_dir`` defaults to ``output_dir/checkpoints``; pointing it at a stable
object-store prefix lets a retried pod on another node resume even when ``output_dir`` is a
fresh local artifact directory. Each checkpoint also carries the ``metrics.jsonl`` written so
far, so the training curve survives the retry too. For URL outputs (s3://, gs://...) the stage
works in a local staging directory and mirrors it to the store.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time

from trainer_lib import storage

MARKER = "COMPLETE"
LOG_FILE = "metrics.jsonl"
SUMMARY = "summary.json"  # written last: an output root with it holds a complete model
FINAL_STAGING = ".final-model.tmp"


def tag_for(step: int) -> str:
    return f"step-{step:08d}"


#: config keys that say where results go or what happens to them at the end, not how the model trains.
OUTPUT_KEYS = ("output_dir", "checkpoint_dir", "storage", "hub", "loss_plot")


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
        self, output_dir: str, strategy, keep: int = 2, checkpoint_dir: str | None = None, merge_lora: bool = True
    ):
        self.output_dir = output_dir
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
        """From the shared training keys: output_dir, checkpoint_dir, save_total_limit, lora.merge."""
        return cls(
            cfg.output_dir,
            strategy,
            keep=cfg.save_total_limit,
            checkpoint_dir=cfg.checkpoint_dir,
            merge_lora=cfg.lora.merge,
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
        """Load the newest complete checkpoint into ``engine`` (and each of ``extra_engines``,
        e.g. PPO's critic, from its named subdirectory); its client state, or None."""
        step = self.latest_step()
        if step is None:
            return None
        tag = tag_for(step)
        local = os.path.join(self.ckpt_dir, tag)
        if self.ckpt_remote and self.strategy.local_rank == 0:
            storage.download_dir(storage.join(self.ckpt_root, tag), local)
        self.strategy.barrier()
        state = self.strategy.load_checkpoint(engine, self.ckpt_dir, tag)
        for name, extra in (extra_engines or {}).items():
            self.strategy.load_checkpoint(extra, os.path.join(self.ckpt_dir, tag), name)
        log = os.path.join(self.local_dir, LOG_FILE)
        if self.strategy.is_rank_0 and not os.path.exists(log) and os.path.exists(os.path.join(local, LOG_FILE)):
            shutil.copyfile(os.path.join(local, LOG_FILE), log)  # a fresh pod: keep the earlier curve
        self.strategy.print(f"resumed from {storage.join(self.ckpt_root, tag)}")
        return state

    def save(self, engine, step: int, client_state: dict, extra_engines: dict | None = None) -> None:
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
        if self.strategy.is_rank_0 and os.path.exists(os.path.join(self.local_dir, LOG_FILE)):
            shutil.copyfile(os.path.join(self.local_dir, LOG_FILE), os.path.join(local, LOG_FILE))
        self.strategy.barrier()
        if self.ckpt_remote and self.strategy.local_rank == 0:
            storage.upload_dir(local, storage.join(self.ckpt_root, tag))
        self.strategy.barrier()
        if self.strategy.is_rank_0:
            marker = json.dumps({"step": step, "time": time.time(), "world_size": self.strategy.world_size})
            storage.write_text(os.path.join(local, MARKER), marker)
            if self.ckpt_remote:
                storage.write_text(storage.join(self.ckpt_root, tag, MARKER), marker)
            self._prune()
        self.strategy.barrier()

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
