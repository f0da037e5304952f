"""The cadence every training stage shares around its loop body, kept in one place.

OpenRLHF keeps logging, evaluation and checkpointing in one ``save_logs_and_checkpoints``; here it
is one small object, and each stage keeps its algorithm and loop body in its own file::

    cadence = Cadence(cfg, strategy, "sft", steps, engine, evaluate=lambda: {"loss": ...})
    cadence.restore("1000 train / 50 eval examples")  # checkpoint, tracker, step-0 eval, a banner
    for step in cadence.steps():
        ...                                  # the stage's own forward / backward / step
        cadence.window.add("loss", loss)     # its metrics, plus cadence.window.count(samples, tokens)
        cadence.after_step(step, epoch=epoch)  # log, evaluate, checkpoint on their schedules
    summary = cadence.finish({...})          # final evaluation, last checkpoint, tracker closed, loss plots
    cadence.save_model(tokenizer, summary)   # HF model + summary.json at output_dir, published (and to the hub)

Schedules come from the shared training keys (``logging_steps``, ``eval_steps``, ``save_steps``,
``save_total_limit``, ``checkpoint_dir``, ``resume``; trackers from ``report_to``). A log record
holds the window's means, the same throughput keys in every stage (``samples_per_s``,
``tokens_per_s``, ``tokens``), ``lr`` and ``grad_norm`` of the main engine, ``memory_gb`` (:func:`memory_gb`),
``epoch`` when the stage passes one, and ``log_extra()``. At the end, ``loss_plot`` draws the loss
curves into output_dir (:mod:`trainer_lib.loop.loss_plot`) and ``hub.push`` uploads the output root to a hub repo
(:mod:`trainer_lib.storage.hub`), both on rank 0.

While ``steps()`` runs, SIGTERM stops the run at the end of the step in progress, every rank at the
same step, with a checkpoint of that step and :class:`~trainer_lib.engine.preemption.Preempted`
(exit status 75), within ``preemption.grace_s`` (:mod:`trainer_lib.engine.preemption`). Each
checkpoint also keeps every rank's metric sums not logged yet, so a run resumed from a step between
two log records logs the same numbers as one that never stopped.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Iterator

from trainer_lib.config import flat_dict
from trainer_lib.engine.checkpoint import CheckpointManager
from trainer_lib.engine.preemption import PREEMPTED_EXIT, Preempted, Preemption
from trainer_lib.errors import NonFiniteLossError
from trainer_lib.loop.heartbeat import Heartbeat
from trainer_lib.loop.metrics import MetricSum, MetricsWindow
from trainer_lib.loop.samples import SampleLog
from trainer_lib.loop.stage_record import redacted
from trainer_lib.loop.tracking import MLFLOW_RUN_FILE, Tracker
from trainer_lib.models.load import count_parameters


class Cadence:
    def __init__(
        self,
        cfg,
        strategy,
        stage: str,
        total_steps: int,
        engine,
        *,
        evaluate: Callable[[], dict] | None = None,
        stateful: dict | None = None,
        extra_engines: dict | None = None,
        log_extra: Callable[[], dict] | None = None,
        window_keys: tuple[str, ...] = (),
    ):
        """``engine`` trains the main model (its parameters are counted for the start banner);
        ``evaluate()`` returns eval metrics (None: the stage has no eval data); ``stateful`` names the
        stage's own objects with ``state_dict()`` / ``load_state_dict()`` (the reward sources' running
        statistics, PPO's KL controller), saved in every checkpoint and restored from it;
        ``extra_engines`` are checkpointed with the main one (PPO's critic); ``log_extra()`` adds keys to
        each train log record; ``window_keys`` are metrics a rank may see no value of."""
        self.cfg, self.strategy, self.stage, self.total = cfg, strategy, stage, total_steps
        self.engine, self.extra_engines = engine, extra_engines or {}
        self.evaluate = evaluate
        self.stateful = stateful or {}
        self.log_extra = log_extra or (lambda: {})
        self.ckpt = CheckpointManager.for_stage(cfg, strategy)
        self.window = MetricsWindow(window_keys)
        self.start = 0
        self.tracker: Tracker | None = None
        self.heartbeat = Heartbeat(
            self.ckpt.local_dir, stage, total_steps, enabled=strategy.is_rank_0, config=redacted(flat_dict(cfg))
        )
        section = getattr(cfg, "preemption", None)
        self.preemption = Preemption(section.grace_s if section is not None else 0.0)
        self.last_save_s: float | None = None  # how long this run's last checkpoint took to write

    @property
    def output_dir(self) -> str:
        """The local directory the stage's logs and final model are written to."""
        return self.ckpt.local_dir

    def restore(self, what: str) -> dict | None:
        """Resume from the newest complete checkpoint (if ``resume``), print the start banner (the
        stage's ``what``, then steps, parameters, world size), open the tracker, on a fresh start log
        the step-0 evaluation, and put the main engine in train mode. Returns the checkpoint's client
        state, or None."""
        state = self.ckpt.restore(self.engine, self.extra_engines) if self.cfg.resume else None
        self.start = int(state["step"]) if state else 0
        for name, owner in self.stateful.items() if state else ():
            owner.load_state_dict(state[name])
        trainable, total = count_parameters(self.strategy.unwrap(self.engine))
        self.strategy.print(
            f"{self.stage}: {what}, {self.total} steps, {trainable:,}/{total:,} trainable params, "
            f"world size {self.strategy.world_size}" + (f", resuming at step {self.start}" if self.start else "")
        )
        self.tracker = Tracker(
            self.ckpt.local_dir,
            enabled=self.strategy.is_rank_0,
            total_steps=self.total,
            initial_step=self.start,
            desc=self.stage,
            report_to=self.cfg.report_to,
            params=flat_dict(self.cfg),
        )
        self.write_ds_config()
        self.samples = SampleLog(self.ckpt.local_dir, self.start, enabled=self.strategy.is_rank_0)
        self.heartbeat.start(self.start)
        if state is None and self.evaluate is not None:
            with self.heartbeat.failing():
                self.tracker.log(0, self.evaluate(), split="eval")
        self.engine.train()  # (models load in eval mode; gradient checkpointing runs only in train mode)
        self.window = MetricsWindow(self.window.keys)  # throughput counts from here
        kept = self.ckpt.rank_state(self.start) if state else None
        if kept and "window" in kept:
            self.load_window(kept["window"])
        return state

    def window_state(self) -> dict:
        """This rank's metric sums not logged yet, as plain numbers (a float64 sum is exact as a float)."""
        sums = {key: [float(entry.total), entry.count] for key, entry in self.window.sums.items()}
        return {"sums": sums, "samples": self.window.samples, "tokens": self.window.tokens}

    def load_window(self, kept: dict) -> None:
        for key, (total, count) in kept["sums"].items():
            self.window.sums[key] = MetricSum(total, count)
        self.window.samples, self.window.tokens = kept["samples"], kept["tokens"]

    def write_ds_config(self) -> None:
        """``ds_config.json`` next to the metrics: the DeepSpeed config the main engine got (after
        ``engine.deepspeed_config`` was laid over ours), as the start of the run logged it."""
        config = getattr(self.strategy, "effective_config", None)
        if config is not None and self.strategy.is_rank_0:
            os.makedirs(self.ckpt.local_dir, exist_ok=True)
            with open(os.path.join(self.ckpt.local_dir, "ds_config.json"), "w", encoding="utf-8") as fh:
                json.dump(config, fh, indent=2, sort_keys=True)

    def steps(self) -> Iterator[int]:
        """The steps left to run, with SIGTERM handled while they run (given back when they end). A loop left
        early (an error in the stage's body) marks the heartbeat ``failed``, unless preemption marked it."""
        self.preemption.install()
        try:
            yield from range(self.start, self.total)
        except GeneratorExit:
            self.heartbeat.end("failed")
            raise
        finally:
            self.preemption.uninstall()

    def logs_at(self, step: int) -> bool:
        """Whether optimizer step ``step`` (0-based) ends with a log record."""
        done = step + 1
        return done % self.cfg.logging_steps == 0 or done == self.total

    def log_samples(self, step: int, rows: Callable[[], list[dict]]) -> None:
        """At a logging step, ``rows()`` to ``samples.jsonl`` (:mod:`trainer_lib.loop.samples`); call before
        :meth:`after_step`. ``rows`` is called only then, on rank 0."""
        if self.logs_at(step):
            self.samples.write(step + 1, rows)

    def after_step(self, step: int, epoch: int | None = None) -> None:
        """After optimizer step ``step`` (0-based): log, evaluate and checkpoint on their schedules;
        the last step's evaluation and checkpoint are left to :meth:`finish`."""
        cfg, done = self.cfg, step + 1
        self.check_finite(done)
        self.tracker.advance()
        self.heartbeat.step(done)
        if self.logs_at(step):
            record = self.window.reduce(self.strategy)
            record.update(lr=self.engine.get_lr()[0], grad_norm=self.strategy.grad_norm(self.engine))
            record["memory_gb"] = memory_gb(self.strategy.device)
            if epoch is not None:
                record["epoch"] = epoch
            record.update(self.log_extra())
            self.tracker.log(done, record)
        if done == self.total:
            return
        if self.evaluate is not None and cfg.eval_steps and done % cfg.eval_steps == 0:
            self.tracker.log(done, self.evaluate(), split="eval")
        saved = bool(cfg.save_steps and done % cfg.save_steps == 0)
        if saved:
            self.save_checkpoint(done)
        if self.preemption.requested(self.strategy):
            self.stop_preempted(done, saved)

    def stop_preempted(self, done: int, saved: bool) -> None:
        """SIGTERM reached a rank: checkpoint step ``done`` (unless it just was, or an earlier save of this
        run took longer than the time left, on any rank) and raise :class:`Preempted`."""
        if not saved:
            fits = self.last_save_s is None or self.last_save_s < self.preemption.seconds_left()
            if self.preemption.agreed(self.strategy, fits):
                self.save_checkpoint(done)
        self.tracker.close()
        self.heartbeat.end("preempted")
        latest = self.ckpt.latest_step()
        kept = f"step {latest} in {self.ckpt.ckpt_root}" if latest is not None else "none: the retry starts over"
        raise Preempted(
            f"{self.stage}: SIGTERM: stopped after step {done} of {self.total}; newest complete checkpoint: {kept}; "
            f"exit status {PREEMPTED_EXIT}, a retry resumes from it"
        )

    def check_finite(self, done: int) -> None:
        """Stop the run when a loss of this window (``loss``, ``*_loss``) or the main engine's
        gradient norm is NaN or inf on any rank.

        The window's sums hold every loss since the last log, so the first non-finite one shows
        here at its own step; a non-finite gradient norm means this step's update already spoiled
        the weights (the loss only shows it a step later). All ranks take part in one all-reduce
        and raise together; nothing of this step is logged or saved, so the newest checkpoint is
        the last good one. The losses' sums stay on the device: one flag for all of them travels in
        that all-reduce, and reading it back is this check's one wait for the device."""
        losses = [k for k in self.window.sums if k == "loss" or k.endswith("_loss")]
        norm = self.strategy.recorded_grad_norm(self.engine)
        bad_norm = norm is not None and not math.isfinite(norm)
        flag = self.window.nonfinite(losses) + (1.0 if bad_norm else 0.0)
        if float(self.strategy.all_reduce(flag, op="max")) == 0.0:
            return
        bad = {k: v for k, v in self.window.totals(losses).items() if not math.isfinite(v)}
        if bad_norm:
            bad["grad_norm"] = norm
        found = ", ".join(f"{k}={v}" for k, v in bad.items()) or "on another rank"
        self.heartbeat.end("failed")
        latest = self.ckpt.latest_step()
        kept = (
            f"the last complete checkpoint is step {latest} in {self.ckpt.ckpt_root}"
            if latest is not None
            else "no checkpoint was saved"
        )
        raise NonFiniteLossError(
            f"{self.stage}: step {done}: loss or gradient is not finite ({found}); stopped without "
            f"saving this step, {kept} (lower lr, or check the data and model)"
        )

    def save_checkpoint(self, step: int) -> None:
        began = time.monotonic()
        own = {name: owner.state_dict() for name, owner in self.stateful.items()}
        rank_state = {"window": self.window_state()}
        self.ckpt.save(self.engine, step, {"step": step, **own}, self.extra_engines, rank_state=rank_state)
        self.last_save_s = time.monotonic() - began

    def finish(self, summary: dict) -> dict:
        """Final evaluation (``summary["eval"]``), the last checkpoint, tracker closed, and with
        ``loss_plot`` the loss curves drawn from metrics.jsonl."""
        with self.heartbeat.failing():  # (an error here leaves no finished model: the run failed)
            summary = {**summary, "steps": self.total, "output_dir": self.cfg.output_dir}
            if self.evaluate is not None:
                summary["eval"] = self.evaluate()
                if self.start < self.total:  # (resumed from the last checkpoint: that logged it already)
                    self.tracker.log(self.total, summary["eval"], split="eval")
            if self.cfg.save_steps and self.start < self.total:
                self.save_checkpoint(self.total)
            self.tracker.close()
            if self.cfg.loss_plot and self.strategy.is_rank_0:
                from trainer_lib.loop.loss_plot import write_loss_plots

                drawn = write_loss_plots(self.ckpt.local_dir)
                self.strategy.print(
                    f"{self.stage}: loss_plot: {', '.join(drawn) or 'no loss was logged, nothing drawn'}"
                )
            return summary

    def save_model(self, tokenizer, summary: dict, extra_files: dict[str, str] | None = None) -> dict:
        """The Hugging Face model (LoRA merged, or the adapter alone with ``lora.merge=false``) and
        ``summary.json`` at the output root, published; with ``hub.push`` then uploaded to the hub."""
        files = dict(extra_files or {})
        if self.strategy.is_rank_0:  # what made this model, for a release's lineage (trainer_lib/release/lineage.py)
            from trainer_lib.loop.stage_record import LINEAGE_FILE, stage_record
            from trainer_lib.models.load import load_processor
            from trainer_lib.models.vision import processor_files

            record = stage_record(self.cfg, self.stage, getattr(self.strategy, "effective_config", None))
            files[LINEAGE_FILE] = json.dumps(record, indent=2)
            # a vision-language model's processor files beside the tokenizer's: it loads back with AutoProcessor
            files.update(processor_files(load_processor(self.cfg.model, tokenizer)))
        with self.heartbeat.failing():
            self.ckpt.finish(self.engine, tokenizer, summary, extra_files=files)
        self.heartbeat.end("finished")
        if self.cfg.hub.push and self.strategy.is_rank_0:
            self.push_to_hub()
        return summary

    def push_to_hub(self) -> None:
        """Upload the output root to ``hub.model_id`` in one commit: the model, tokenizer, summary.json,
        metrics.jsonl, TensorBoard events and loss plots; not the checkpoints, the staging folder or the
        MLflow and W&B stores. Rank 0, after the model is saved (the other ranks do not wait for it)."""
        from trainer_lib.storage.hub import push_folder

        ignored = [".*", "mlflow.db", f"{MLFLOW_RUN_FILE}*", "wandb*"]  # (".*": the staging folder too)
        inside = os.path.relpath(self.ckpt.ckpt_dir, self.ckpt.local_dir)
        if inside != "." and not inside.startswith(".."):  # checkpoint_dir under output_dir: not uploaded
            ignored += [inside, f"{inside}/*"]
        hub = self.cfg.hub
        url = push_folder(
            self.ckpt.local_dir,
            hub.model_id,
            private=hub.private,
            commit_message=f"posttrain {self.stage}: {self.total} steps",
            ignore_patterns=ignored,
        )
        self.strategy.print(f"{self.stage}: hub.push: uploaded output_dir to {hub.model_id} ({url})")


def memory_gb(device) -> float:
    """This process's memory in GiB, for the log: the accelerator's peak allocation on CUDA, else the
    resident set (rank 0's; the other ranks' are alike in a data-parallel run)."""
    if getattr(device, "type", str(device)) == "cuda":
        import torch

        return round(torch.cuda.max_memory_allocated(device) / 2**30, 3)
    import psutil

    return round(psutil.Process().memory_info().rss / 2**30, 3)
