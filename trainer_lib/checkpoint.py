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


def tag_for(step: int) -> str:
    return f"step-{step:08d}"


def stable_checkpoint_dir(cfg, root: str, stage: str) -> str:
    """A checkpoint location under ``root`` that a retried pod finds again: ``<root>/checkpoints/
    <stage>-<fingerprint>``, the fingerprint covering the whole config except where outputs go.

    In a pipeline the inputs' paths belong to the run, so the location is per run and per task,
    stable across retries of that task, and outside the output artifact (which then holds only
    the final model). KFP's ``minio://`` pipeline root is read as the S3 bucket it is.
    """
    from trainer_lib.config import to_dict

    settings = {k: v for k, v in to_dict(cfg).items() if k not in ("output_dir", "checkpoint_dir", "storage")}
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
    def __init__(self, output_dir: str, strategy, keep: int = 2, checkpoint_dir: str | None = None,
                 merge_lora: bool = True):
        self.output_dir = output_dir
        self.merge_lora = merge_lora
        self.strategy = strategy
        self.keep = keep
        self.remote = storage.is_remote(output_dir)
        self.local_dir = staging_dir(output_dir)
        self.ckpt_root = checkpoint_dir or storage.join(output_dir, "checkpoints")
        self.ckpt_remote = storage.is_remote(self.ckpt_root)
        self.ckpt_dir = staging_dir(self.ckpt_root)
        os.makedirs(self.ckpt_dir, exist_ok=True)
        os.makedirs(self.local_dir, exist_ok=True)

    @classmethod
    def for_stage(cls, cfg, strategy) -> "CheckpointManager":
        """From the shared training keys: output_dir, checkpoint_dir, save_total_limit, lora.merge."""
        return cls(cfg.output_dir, strategy, keep=cfg.save_total_limit, checkpoint_dir=cfg.checkpoint_dir,
                   merge_lora=cfg.lora.merge)

    # ------------------------------------------------------------------ discovery
    def complete_steps(self) -> list[int]:
        if not storage.isdir(self.ckpt_root):
            return []
        steps = []
        for name in storage.listdir(self.ckpt_root):
            name = name.rstrip("/")
            if name.startswith("step-") and storage.exists(storage.join(self.ckpt_root, name, MARKER)):
                steps.append(int(name.split("-", 1)[1]))
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
        if self.strategy.is_rank_0 and os.path.exists(local):  # a half-written earlier attempt
            shutil.rmtree(local)
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
        if self.keep <= 0:
            return
        for step in self.complete_steps()[:-self.keep]:
            tag = tag_for(step)
            if self.ckpt_remote:
                storage.delete(storage.join(self.ckpt_root, tag))
            shutil.rmtree(os.path.join(self.ckpt_dir, tag), ignore_errors=True)

    # ------------------------------------------------------------------ final output
    def finish(self, engine, tokenizer, summary: dict, extra_files: dict[str, str] | None = None) -> None:
        """End of training: HF model (or LoRA adapter) and summary.json at the output root, mirrored
        to the store."""
        self.strategy.save_hf_model(engine, tokenizer, self.local_dir, extra_files=extra_files,
                                    merge_lora=self.merge_lora)
        if self.strategy.is_rank_0:
            storage.write_text(os.path.join(self.local_dir, "summary.json"), json.dumps(summary, indent=2))
        self.publish()
        self.strategy.barrier()

    def publish(self, names: list[str] | None = None) -> None:
        """Mirror the staging root (final model, logs) to an output_dir URL; rank 0 only."""
        if not (self.remote and self.strategy.is_rank_0):
            return
        for name in names if names is not None else sorted(os.listdir(self.local_dir)):
            if name == "checkpoints":
                continue
            src = os.path.join(self.local_dir, name)
            storage.copy(src, storage.join(self.output_dir, name))
