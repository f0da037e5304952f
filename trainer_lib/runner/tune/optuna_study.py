"""Run a checked search as an Optuna study in RDB storage, resuming what a killed search left.

    study = run_search(load_search("tune.yaml"))

Each trial draws its values (TPE by default), writes the stage's full config to
``<output_dir>/trials/NNNN/config.yaml`` and runs it as a process of its own
(:class:`~trainer_lib.runner.tune.trial_process.TrialProcess`); ``parallel`` trials run at once, one
thread of this process each. The eval records the stage logs while it trains (every ``eval_steps``) go
to the pruner, which may stop a trial early; the value of a finished trial is the metric in its
``summary.json``'s final ``eval``, or, with an ``evaluate`` section, the metric of an evaluate run on its
model, a process of its own (:mod:`~trainer_lib.runner.tune.trial_evaluate`).

A trial that fails (a non-zero exit, a non-finite loss or value, a sampled combination the stage
refuses, a timeout) is recorded failed, with its reason in ``user_attrs["failure"]``, and the search goes
on. An objective metric the stage does not write stops the search (exit 2).

Resuming. The study lives in Optuna's storage (``sqlite:///<output_dir>/study.db`` by default), and a
running trial sends heartbeats. A rerun of the same search counts the trials that finished (complete,
pruned or failed with a reason) and runs the rest. A trial that was running when the search died is
failed and run again with the same values (Optuna's ``RetryHeartbeatStaleTrialCallback``): with the default
storage at once, as this process holds ``<output_dir>/search.lock`` and so no other search of that
folder can be running it; with a storage URL of your own, once its heartbeat is older than the grace
period (3 heartbeats). No trial outlives the search: SIGTERM, SIGINT or SIGHUP kill every trial's process
group before the search exits, a reaper process kills them when the search dies of anything else
(SIGKILL included, :mod:`~trainer_lib.runner.tune.trial_reaper`), and what is left of an interrupted
trial is killed when the search resumes.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import sys
import threading
import warnings

from trainer_lib.errors import ConfigError, UserError
from trainer_lib.runner.stage_api import config_text
from trainer_lib.runner.tune.search_config import Search, metric_key
from trainer_lib.runner.tune.trial_evaluate import evaluate_command, evaluated_value, write_evaluate_config
from trainer_lib.runner.tune.trial_process import Outcome, TrialProcess, kill_group, kill_leftover
from trainer_lib.runner.tune.trial_reaper import TrialReaper
from trainer_lib.storage.file_lock import holder, try_lock

LOCK_FILE = "search.lock"
SUMMARY_FILE = "summary.json"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class TrialFailed(Exception):
    """A trial that ended without a value; recorded failed with its reason, and the search goes on."""


def search_identity(search: Search) -> dict:
    """What makes two runs one search: a rerun with other values here is another search."""
    tune = search.tune
    return {
        "stage": tune.stage,
        "space": {p.key: [p.kind, p.low, p.high, p.log, p.step, list(p.choices)] for p in search.params},
        "metric": tune.objective.metric,
        "direction": tune.objective.direction,
        # only when set, so that a study from before these keys is the same search
        **({"evaluate": tune.evaluate} if tune.evaluate else {}),
        **({"pruner_metric": tune.pruner.metric} if tune.pruner.metric else {}),
    }


def counted(trial) -> bool:
    """Whether a trial counts towards ``n_trials``: it finished, or it failed on its own (a trial that
    failed because its search died is run again instead)."""
    from optuna.trial import TrialState

    return trial.state in (TrialState.COMPLETE, TrialState.PRUNED) or (
        trial.state == TrialState.FAIL and "failure" in trial.user_attrs
    )


def make_sampler(search: Search, already: int):
    """The sampler, seeded with ``seed`` plus the trials the study already has, so a resumed search does
    not draw the values of its first run again."""
    import optuna

    tune = search.tune
    seed = tune.seed + already
    if tune.sampler.kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if tune.sampler.kind == "grid":
        return optuna.samplers.GridSampler({p.key: p.grid_values() for p in search.params}, seed=seed)
    with warnings.catch_warnings():  # constant_liar is marked experimental
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(
            seed=seed, n_startup_trials=tune.sampler.startup_trials, constant_liar=tune.parallel > 1
        )


def make_pruner(search: Search):
    import optuna

    pruner = search.tune.pruner
    if pruner.kind == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=pruner.startup_trials, n_warmup_steps=pruner.warmup_steps)
    if pruner.kind == "halving":
        return optuna.pruners.SuccessiveHalvingPruner()
    return optuna.pruners.NopPruner()


def rdb_storage_class():
    """Optuna's RDBStorage, with its trial state changes taken in turn by this process's threads.

    A queued (waiting) trial, such as a retry, is claimed by a change to RUNNING that checks it is still
    waiting, under SELECT ... FOR UPDATE; SQLite ignores FOR UPDATE, and two trial threads could both
    claim one trial and run it twice (Optuna then fails on "Cannot tell a COMPLETE trial").
    """
    from optuna.storages import RDBStorage

    class InTurnRDBStorage(RDBStorage):
        state_lock = threading.Lock()

        def set_trial_state_values(self, trial_id, state, values=None) -> bool:
            with self.state_lock:
                return super().set_trial_state_values(trial_id, state, values)

    return InTurnRDBStorage


def open_study(search: Search):
    """The study in its storage, created or loaded; a ConfigError when the storage holds another search
    under the same name."""
    import optuna
    from optuna.storages import RetryHeartbeatStaleTrialCallback

    tune = search.tune
    url = tune.storage_url
    with warnings.catch_warnings():  # heartbeats are marked experimental
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        storage = rdb_storage_class()(
            url,
            engine_kwargs={"connect_args": {"timeout": 60}} if url.startswith("sqlite") else None,
            heartbeat_interval=tune.heartbeat_s,
            grace_period=3 * tune.heartbeat_s,
            heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry=tune.max_retries),
        )
    names = [s.study_name for s in optuna.get_all_study_summaries(storage, include_best_trial=False)]
    already = (
        len(storage.get_all_trials(storage.get_study_id_from_name(tune.study_name))) if tune.study_name in names else 0
    )
    study = optuna.create_study(
        storage=storage,
        study_name=tune.study_name,
        direction=tune.objective.direction,
        sampler=make_sampler(search, already),
        pruner=make_pruner(search),
        load_if_exists=True,
    )
    identity = search_identity(search)
    stored = study.user_attrs.get("search")
    if stored is None:
        study.set_user_attr("search", identity)
    elif stored != identity:
        raise ConfigError(
            f"study_name: the study {tune.study_name!r} in {url} belongs to another search ({stored['stage']}, "
            f"{stored['metric']}, keys {sorted(stored['space'])}); give this one another study_name or output_dir"
        )
    return study, storage


def recover_interrupted(study, storage) -> list[int]:
    """Fail the trials that were running when the search died, kill what is left of their processes,
    and queue each again with the same values. Called only while this process holds the output
    folder's lock, so none of them can be running in another search."""
    from optuna.trial import TrialState

    study_id = storage.get_study_id_from_name(study.study_name)
    retry = storage.get_heartbeat_stale_trial_callback()
    recovered = []
    for trial in study.get_trials(states=(TrialState.RUNNING,)):
        if trial.user_attrs.get("config"):
            kill_leftover(trial.user_attrs["config"])
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, trial.number)
        storage.set_trial_state_values(trial_id, TrialState.FAIL)
        if retry is not None:
            retry(study, storage.get_trial(trial_id))
        recovered.append(trial.number)
    return recovered


class TrialRunner:
    """The objective Optuna calls, once per trial, from ``parallel`` threads; it keeps the trial
    processes that run now, so that a stopping search can kill them."""

    def __init__(self, search: Search, command: list[str], reaper: TrialReaper):
        self.search = search
        self.command = command
        self.reaper = reaper
        self.live: dict[int, TrialProcess] = {}
        self.lock = threading.Lock()

    def __call__(self, trial) -> float:
        search, tune = self.search, self.search.tune
        values = dict(search.fixed)
        for param in search.params:
            if param.active(values):
                values[param.key] = param.suggest(trial)
        chosen = {key: value for key, value in values.items() if key not in search.fixed}
        trial_dir = os.path.abspath(os.path.join(tune.output_dir, "trials", f"{trial.number:04d}"))
        try:
            cfg = search.stage_config(chosen, trial_dir)
        except ConfigError as exc:
            self.fail(trial, f"the stage refuses these values: {exc}")
        seed = cfg.seed + trial.number if tune.trial_seed == "per_trial" else cfg.seed
        cfg = dataclasses.replace(cfg, seed=seed)
        config_path = os.path.join(trial_dir, "config.yaml")
        os.makedirs(trial_dir, exist_ok=True)
        for stale in ("metrics.jsonl", SUMMARY_FILE):  # a folder an earlier study left: not this trial's records
            if os.path.exists(os.path.join(trial_dir, stale)):
                os.remove(os.path.join(trial_dir, stale))
        with open(config_path, "w", encoding="utf-8") as fh:
            fh.write(config_text(cfg))
        for key, value in {"output_dir": trial_dir, "config": config_path, "seed": seed}.items():
            trial.set_user_attr(key, value)
        process = TrialProcess(
            [*self.command, "--config", config_path], trial_dir, marker=config_path, on_start=self.reaper.add
        )
        last = None if getattr(cfg, "num_epochs", 0) else cfg.max_steps
        outcome = self.watch(trial, process, lambda step, record: self.report(trial, step, record, last))
        if tune.evaluate and outcome.stopped_at is None and outcome.returncode == 0:
            return self.evaluated(trial, trial_dir, config_path)
        return self.value(trial, trial_dir, outcome)

    def watch(self, trial, process: TrialProcess, on_eval) -> Outcome:
        """Follow one of the trial's processes to its end, killable by a stopping search meanwhile (the
        reaper has its group: ``on_start``, before the process ran its command)."""
        with self.lock:
            self.live[trial.number] = process
        try:
            return process.follow(on_eval, timeout_s=self.search.tune.trial_timeout_s)
        finally:
            with self.lock:
                self.live.pop(trial.number, None)
            self.reaper.remove(process.pgid)

    def evaluated(self, trial, trial_dir: str, marker: str) -> float:
        """The value of a trial whose stage finished: ``objective.metric`` of an evaluate run on its model,
        a process of its own carrying the trial's mark (``marker``), as the stage's process did."""
        metric = self.search.tune.objective.metric
        config_path = write_evaluate_config(self.search.tune, trial_dir)
        process = TrialProcess(
            evaluate_command(config_path), os.path.dirname(config_path), marker=marker, on_start=self.reaper.add
        )
        outcome = self.watch(trial, process, lambda step, record: False)
        if outcome.timed_out or outcome.returncode != 0:
            self.fail(trial, f"evaluate: {outcome.reason}")
        value = evaluated_value(trial_dir, metric)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            self.fail(trial, f"evaluate: {metric} is {value}")
        return float(value)

    def report(self, trial, step: int, record: dict, last: int | None) -> bool:
        """Hand one eval record to the pruner; True: prune. Step 0 evaluates the starting model, the
        same in every trial, and tells the pruner nothing; the ``last`` step's eval is the trial's
        result, which is kept rather than pruned."""
        tune = self.search.tune
        value = record.get(metric_key(tune.pruner_metric())) if tune.pruner_metric() else None
        if step == 0 or not isinstance(value, (int, float)) or not math.isfinite(value):
            return False
        trial.report(tune.pruner_sign() * float(value), step)
        return step != last and trial.should_prune()

    def value(self, trial, trial_dir: str, outcome) -> float:
        import optuna

        metric = self.search.tune.objective.metric
        if outcome.stopped_at is not None:
            trial.set_user_attr("pruned_at", outcome.stopped_at)
            raise optuna.TrialPruned(f"pruned at step {outcome.stopped_at}")
        if outcome.timed_out or outcome.returncode != 0:
            self.fail(trial, outcome.reason)
        with open(os.path.join(trial_dir, SUMMARY_FILE), encoding="utf-8") as fh:
            held_out = json.load(fh).get("eval") or {}
        key = self.search.tune.metric_key()
        if key not in held_out:
            trial.set_user_attr("failure", f"no {metric} in the held-out eval")
            stage = self.search.tune.stage
            raise ConfigError(
                f"objective.metric: {metric} is not in {stage}'s held-out eval"
                + (f"; it writes {', '.join(sorted(held_out))}" if held_out else "; it wrote none (no eval data?)")
            )
        value = held_out[key]
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            self.fail(trial, f"{metric} is {value}")
        return float(value)

    def fail(self, trial, reason: str) -> None:
        trial.set_user_attr("failure", reason)
        raise TrialFailed(reason)

    def kill_all(self) -> int:
        with self.lock:
            processes = list(self.live.values())
        for process in processes:
            kill_group(process.pgid)
        return len(processes)


def command(tune) -> list[str]:
    """What a trial runs, before ``--config FILE``."""
    return tune.trial_command or [sys.executable, "-m", "trainer_lib.cli", tune.stage]


def announce(study, trial) -> None:
    """One line per ended trial."""
    values = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in trial.params.items())
    if trial.state.name == "COMPLETE":
        result = f"{trial.value:.6g}"
    elif trial.state.name == "PRUNED":
        result = f"pruned at step {trial.user_attrs.get('pruned_at')}"
    else:
        result = f"failed: {trial.user_attrs.get('failure', 'stopped')}"
    print(f"tune: trial {trial.number} ({values}): {result}", flush=True)


def run_search(search: Search):
    """Run the search to its ``n_trials`` (those a killed run left), holding the output folder's lock;
    returns the study."""
    import optuna

    tune = search.tune
    os.makedirs(tune.output_dir, exist_ok=True)
    lock_path = os.path.join(tune.output_dir, LOCK_FILE)
    with open(lock_path, "a+") as lock:
        if not try_lock(lock):
            raise UserError(f"output_dir: another search runs in {tune.output_dir} ({holder(lock_path)})")
        lock.seek(0)
        lock.truncate()
        lock.write(f"pid {os.getpid()}, posttrain tune of {tune.stage}\n")
        lock.flush()
        optuna.logging.set_verbosity(optuna.logging.ERROR)  # our own line per trial instead
        study, storage = open_study(search)
        if not tune.storage:
            recovered = recover_interrupted(study, storage)
            if recovered:
                print(f"tune: trials {recovered} were running when the search stopped: queued again", flush=True)
        left = tune.n_trials - sum(counted(t) for t in study.get_trials())
        print(f"tune: {tune.stage}, {left} of {tune.n_trials} trials to run, {tune.parallel} at once", flush=True)
        if left > 0:
            with TrialReaper() as reaper, StopOnSignals(TrialRunner(search, command(tune), reaper)) as stop:
                study.optimize(
                    stop.runner,
                    n_trials=left,
                    timeout=tune.time_budget_s or None,
                    n_jobs=tune.parallel,
                    catch=(TrialFailed,),
                    callbacks=[announce],
                )
    return study


class StopOnSignals:
    """While it is entered, SIGTERM, SIGINT and SIGHUP kill every running trial's process group and end
    the search at once: the trials stay running in the storage, and a rerun runs them again. On the
    way out (an error included) any trial still running is killed."""

    def __init__(self, runner: TrialRunner):
        self.runner = runner
        self.previous: dict = {}

    def __enter__(self):
        for signum in STOP_SIGNALS:
            self.previous[signum] = signal.signal(signum, self.stop)
        return self

    def stop(self, signum, frame) -> None:
        killed = self.runner.kill_all()
        name = signal.Signals(signum).name
        print(f"tune: {name}: stopped, {killed} running trials killed; rerun to resume", file=sys.stderr, flush=True)
        os._exit(128 + signum)

    def __exit__(self, *exc) -> None:
        self.runner.kill_all()
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
