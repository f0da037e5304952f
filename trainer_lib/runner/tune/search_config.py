"""The search file of ``posttrain tune``, and every check made before the first trial starts.

    stage: dpo
    config: [dpo.yaml]                 # the stage's config files (optional), then
    overrides: {max_steps: 40}         # stage keys laid over them (optional)
    space:
      lr: {low: 1.0e-5, high: 1.0e-3, log: true}
      beta: {low: 0.05, high: 0.5}
      loss: {choices: [sigmoid, ipo]}
      label_smoothing: {low: 0.0, high: 0.2, when: {loss: sigmoid}}
    objective: {metric: logps/accuracy, direction: maximize}
    n_trials: 8
    parallel: 2

A search-space entry's ``type`` (float, int, categorical) defaults to what the key takes (``choices``:
categorical). Before any trial, each of these stops the search with one line naming the key (a
:class:`~trainer_lib.errors.ConfigError`, exit 2): a key the stage does not have, an empty range, a type
the key cannot take, a bound or choice the stage's own checks refuse, a ``when`` on an unknown key or a
value it can never take, and an objective whose scale depends on a searched key (DPO's loss is a function
of ``beta``: trials with different betas cannot be ranked by it).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal, Union

from trainer_lib.config import describe, has_key, load_config, lookup, opt, read_yaml
from trainer_lib.errors import ConfigError
from trainer_lib.runner.stage_api import stage_config
from trainer_lib.runner.tune.trial_evaluate import check_evaluate
from trainer_lib.stages import STAGES, stage_module

KINDS = ("float", "int", "categorical")
SPEC_KEYS = ("type", "low", "high", "log", "step", "choices", "when")
DIRECTIONS = ("maximize", "minimize")
PRUNERS = ("median", "halving", "none")
SAMPLERS = ("tpe", "random", "grid")

#: Held-out metrics whose scale follows other keys of the stage, per stage. Trials that search one of
#: those keys cannot be ranked by the metric: DPO's loss is -log sigmoid(beta * margin), its implicit
#: rewards are beta * log-ratios, and the loss variants and their weights are different functions.
#: A key ending in "." stands for its whole section (an RL stage's reward sources and weights); a metric
#: ending in "/" for every metric under it.
_PREFERENCE_LOSS_KEYS = (
    "beta",
    "loss",
    "label_smoothing",
    "simpo_gamma",
    "rpo_alpha",
    "kto_desirable_weight",
    "kto_undesirable_weight",
)
_REWARD_KEYS = ("beta", "loss")
_RL = {"reward": ("reward.",), "rewards/": ("reward.",)}  # "rewards/": each source's mean reward
SCALED_BY: dict[str, dict[str, tuple[str, ...]]] = {
    "dpo": {
        "loss": _PREFERENCE_LOSS_KEYS,
        "rewards/chosen": _REWARD_KEYS,
        "rewards/rejected": _REWARD_KEYS,
        "rewards/margins": _REWARD_KEYS,
    },
    "grpo": _RL,
    "rloo": _RL,
    "ppo": _RL,
}
SCALED_BY["kto"] = SCALED_BY["dpo"]
#: What to rank by instead, named in the refusal.
RANKABLE = {"dpo": "logps/accuracy or rewards/accuracy", "kto": "logps/accuracy or rewards/accuracy"}
#: Keys that choose or cut the held-out rows themselves: no metric ranks trials that search them.
HELD_OUT_KEYS = (
    "data.path",
    "data.dataset",
    "data.sources",
    "data.eval_",
    "data.max_length",
    "data.over_length",
)


@dataclass
class ObjectiveConfig:
    metric: str = opt(
        "",
        "A metric of the stage's held-out eval (summary.json's eval), e.g. logps/accuracy, eval_loss, reward; "
        "with an evaluate section, a metric of that evaluate run, e.g. task_pass_rate.",
    )
    direction: str = opt("maximize", "Whether a higher or a lower value is better.", DIRECTIONS)


@dataclass
class SamplerConfig:
    kind: str = opt(
        "tpe",
        "How trials' values are drawn: Optuna's TPE, uniformly at random, or grid (every combination in turn; "
        "each key searched with choices, as an int, or with a step).",
        SAMPLERS,
    )
    startup_trials: int = opt(4, "TPE: trials drawn at random before it models the space.")


@dataclass
class PrunerConfig:
    kind: str = opt(
        "median",
        "Stop a trial early on its eval records: median (worse than the median of earlier trials at the same "
        "step), halving (successive halving), none.",
        PRUNERS,
    )
    startup_trials: int = opt(2, "median: trials that finish before any is pruned.")
    warmup_steps: int = opt(0, "median: training steps before a trial can be pruned.")
    metric: str = opt(
        "",
        "The stage's held-out eval metric the pruner reads while a trial trains; default objective.metric, "
        "and with an evaluate section none (nothing is pruned) unless set.",
    )
    direction: str = opt("", "Whether a higher or a lower pruner.metric is better; default objective.direction.")


@dataclass
class KatibConfig:
    name: str = opt("", "The Experiment's name (default posttrain-<stage>-<study_name>).")
    namespace: str = opt("", "The Experiment's namespace (default: the one kubectl applies it in).")
    gpus_per_step: int = opt(0, "Accelerators per trial pod (0: the CPU image; more: the CUDA image, a process each).")
    nodes: int = opt(1, "Nodes per trial: more than 1 runs each trial as a Kubeflow Trainer TrainJob.")
    accelerator: str = opt("", "The accelerator's resource name (default nvidia.com/gpu).")
    image: str = opt("", "The trials' image (default: our CPU build, or the CUDA build with gpus_per_step > 0).")
    goal: float | None = opt(None, "Katib stops the search once a trial reaches this objective value.")
    max_failed_trials: int = opt(-1, "Failed trials after which Katib fails the search (-1: n_trials).")


@dataclass
class TuneConfig:
    stage: str = opt("", "The stage searched, e.g. dpo.")
    config: list[str] = opt([], "The stage's config files, merged in order (as posttrain <stage> --config).")
    overrides: dict = opt({}, "Stage keys laid over those files (nested, or dotted as on the command line).")
    space: dict = opt({}, "Stage key -> {low, high, log, step} or {choices}, with an optional type and when.")
    objective: ObjectiveConfig = opt(ObjectiveConfig, "The held-out metric trials are ranked by.")
    evaluate: dict = opt(
        {},
        "posttrain evaluate keys (nested or dotted): after each trial's stage, evaluate its model and rank by "
        "objective.metric of that run (e.g. task_pass_rate); empty: the stage's own held-out eval.",
    )
    n_trials: int = opt(8, "Trials in the search; a resumed search runs those left.")
    parallel: int = opt(1, "Trials run at once, each a process of its own.")
    time_budget_s: float = opt(0.0, "No trial starts after this many seconds of this run (0: no limit).")
    trial_timeout_s: float = opt(0.0, "A trial running longer is stopped and recorded failed (0: no limit).")
    seed: int = opt(0, "Seed of the sampler.")
    trial_seed: str = opt(
        "same",
        "same: every trial trains with the config's seed; per_trial: that seed + the trial number.",
        ("same", "per_trial"),
    )
    sampler: SamplerConfig = opt(SamplerConfig, "How trials' values are drawn.")
    pruner: PrunerConfig = opt(PrunerConfig, "Which trials stop early.")
    output_dir: str = opt("runs/tune", "Local folder of the trials, the study, best.yaml and report.html.")
    storage: str = opt("", "Optuna storage, any SQLAlchemy URL; default sqlite:///<output_dir>/study.db.")
    study_name: str = opt("search", "The study's name in the storage.")
    heartbeat_s: int = opt(10, "Heartbeat of a running trial; silent for 3 of them, it counts as dead and is retried.")
    max_retries: int = opt(2, "How often one trial cut off by a dead search is run again.")
    trial_command: list[str] = opt(
        [], "Command a trial runs, followed by --config FILE; default: this Python, -m trainer_lib.cli <stage>."
    )
    katib: KatibConfig = opt(KatibConfig, "posttrain tune --target katib: the Experiment's settings (docs/tuning.md).")

    def validate(self) -> None:
        if self.stage not in STAGES or STAGES[self.stage].kind != "training":
            training = sorted(name for name, stage in STAGES.items() if stage.kind == "training")
            raise ConfigError(f"stage: expected a training stage, one of {training}, got {self.stage!r}")
        if not self.objective.metric:
            raise ConfigError("objective.metric: required, e.g. logps/accuracy or eval_loss (see docs/tuning.md)")
        if not self.space:
            raise ConfigError("space: required, at least one stage key to search")
        if self.pruner.direction not in ("", *DIRECTIONS):
            raise ConfigError(f"pruner.direction: expected maximize or minimize, got {self.pruner.direction!r}")
        for key in ("n_trials", "parallel", "heartbeat_s"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{key}: expected a positive integer, got {getattr(self, key)}")
        for key in ("time_budget_s", "trial_timeout_s", "max_retries", "sampler.startup_trials"):
            if lookup(self, key) < 0:
                raise ConfigError(f"{key}: expected 0 or more, got {lookup(self, key)}")

    @property
    def storage_url(self) -> str:
        return self.storage or f"sqlite:///{os.path.abspath(os.path.join(self.output_dir, 'study.db'))}"

    def metric_key(self) -> str:
        return metric_key(self.objective.metric)

    def pruner_metric(self) -> str:
        """The stage's held-out metric the pruner reads ("": none, so nothing is pruned)."""
        return self.pruner.metric or ("" if self.evaluate else self.objective.metric)

    def pruner_sign(self) -> float:
        """-1 when pruner.metric improves the other way than the objective (the pruner reads it negated)."""
        direction = self.pruner.direction or self.objective.direction
        return 1.0 if direction == self.objective.direction else -1.0


def metric_key(metric: str) -> str:
    """A metric's key in the stage's eval records: ``eval_loss`` and ``eval/loss`` are ``loss``."""
    for prefix in ("eval/", "eval_"):
        if metric.startswith(prefix):
            return metric[len(prefix) :]
    return metric


@dataclass(frozen=True)
class Param:
    """One searched key: a float or int range (``log``, ``step``) or a list of choices, used only
    when every ``when`` key has one of its listed values."""

    key: str
    kind: str
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: tuple = ()
    when: tuple[tuple[str, tuple], ...] = ()

    def active(self, values: dict) -> bool:
        return all(values.get(key) in accepted for key, accepted in self.when)

    def suggest(self, trial) -> Any:
        if self.kind == "float":
            return trial.suggest_float(self.key, self.low, self.high, log=self.log, step=self.step)
        if self.kind == "int":
            return trial.suggest_int(self.key, int(self.low), int(self.high), step=int(self.step or 1), log=self.log)
        return trial.suggest_categorical(self.key, list(self.choices))

    def grid_values(self) -> list | None:
        """Every value a grid search tries (None: a float range without a step has no grid)."""
        if self.kind == "categorical":
            return list(self.choices)
        if self.kind == "float" and self.step is None:
            return None
        step = self.step or 1
        count = int(math.floor((self.high - self.low) / step + 1e-9)) + 1
        if self.kind == "int":
            return [int(self.low) + i * int(step) for i in range(count)]
        return [round(self.low + i * step, 12) for i in range(count)]

    def probes(self) -> list:
        """The values checked against the stage before any trial: the bounds, or every choice."""
        return list(self.choices) if self.kind == "categorical" else [self.low, self.high]


@dataclass(frozen=True)
class Search:
    """A checked search: its settings, the stage's base layers, the params in the order they are drawn
    (a ``when`` key before the params it gates), and the base config's values of the ``when`` keys."""

    tune: TuneConfig
    layers: list
    params: tuple[Param, ...]
    fixed: dict

    def stage_config(self, values: dict, output_dir: str, seed: int | None = None):
        extra = {**values, "output_dir": output_dir, **({} if seed is None else {"seed": seed})}
        return stage_config(self.tune.stage, [*self.layers, extra], config_files=self.tune.config)


def load_search(path: str, overrides: list[str] | None = None) -> Search:
    """The search file at ``path`` with ``key=value`` overrides of its own keys, fully checked."""
    tune = load_config(TuneConfig, [read_yaml(path)], overrides or None)
    return check_search(tune)


def check_search(tune: TuneConfig, base: list | tuple = ()) -> Search:
    """Check ``tune`` before any trial; ``base``: config layers under the search file's ``overrides`` (a
    pipeline's training task's own, :mod:`~trainer_lib.runner.tune.pipeline_search`)."""
    layers = [*base, *([tune.overrides] if tune.overrides else [])]
    base = Search(tune, layers, (), {})
    try:
        base_cfg = base.stage_config({}, os.path.join(tune.output_dir, "trials", "check"))
    except ConfigError as exc:
        raise ConfigError(f"base config of {tune.stage}: {exc}") from None
    cls = stage_module(tune.stage).CONFIG
    params = [parse_param(cls, key, spec) for key, spec in flatten_space(tune.space).items()]
    searched = {p.key: p for p in params}
    fixed = {}
    for param in params:
        for key, _ in param.when:
            if not has_key(cls, key):
                raise ConfigError(f"space.{param.key}.when.{key}: the stage has no such key")
            if key not in searched:
                fixed[key] = lookup(base_cfg, key)
    params = [typed_conditions(base, p, searched) for p in params]
    ordered = draw_order(params)
    search = Search(tune, layers, tuple(ordered), fixed)
    for param in ordered:
        check_probes(search, param, base_cfg)
    if tune.evaluate:
        check_evaluate(tune)
    check_objective(tune, base_cfg, [p.key for p in ordered])
    if tune.sampler.kind == "grid":
        check_grid(tune, ordered)
    return search


def check_grid(tune: TuneConfig, params: list[Param]) -> None:
    """A grid search tries each combination once: every key needs a finite list of values, and
    ``n_trials`` cannot exceed their product (Katib's grid refuses that too)."""
    combinations = 1
    for param in params:
        values = param.grid_values()
        if values is None:
            raise ConfigError(f"space.{param.key}: sampler.kind grid needs a step on a float range (or choices)")
        if param.when:
            raise ConfigError(f"space.{param.key}.when: sampler.kind grid takes no conditions")
        combinations *= len(values)
    if tune.n_trials > combinations:
        raise ConfigError(f"n_trials: {tune.n_trials} is more than the grid's {combinations} combinations")


def flatten_space(space: dict, prefix: str = "") -> dict[str, dict]:
    """``{lora: {r: {...}}}`` and ``{lora.r: {...}}`` alike -> ``{"lora.r": {...}}``."""
    out = {}
    for key, spec in space.items():
        dotted = f"{prefix}{key}"
        if not isinstance(spec, dict):
            raise ConfigError(f"space.{dotted}: expected a mapping such as {{low: 1, high: 8}}, got {spec!r}")
        if spec and not set(spec) & set(SPEC_KEYS):
            out.update(flatten_space(spec, f"{dotted}."))
        else:
            out[dotted] = spec
    return out


def key_type(cls: type, dotted: str) -> Any:
    """The declared type of a dotted key of config class ``cls`` (None made optional is dropped);
    a ConfigError naming the key, with the closest known key, when ``cls`` has no such key."""
    tp: Any = cls
    for part in dotted.split("."):
        fields = {f.name: f for f in dataclasses.fields(tp)} if dataclasses.is_dataclass(tp) else {}
        if part not in fields:
            keys = [row[0] for row in describe(cls)]
            close = difflib.get_close_matches(dotted, keys, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError(f"space.{dotted}: the stage has no such key{hint}")
        tp = typing.get_type_hints(tp)[part]
    if typing.get_origin(tp) in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        tp = args[0] if len(args) == 1 else tp
    if dataclasses.is_dataclass(tp):
        raise ConfigError(f"space.{dotted}: a section, not a key; search one of its keys")
    return tp


def parse_param(cls: type, key: str, spec: dict) -> Param:
    unknown = [name for name in spec if name not in SPEC_KEYS]
    if unknown:
        raise ConfigError(f"space.{key}.{unknown[0]}: unknown; expected some of {', '.join(SPEC_KEYS)}")
    tp = key_type(cls, key)
    kind = spec.get("type") or ("categorical" if "choices" in spec else default_kind(tp, key))
    if kind not in KINDS:
        raise ConfigError(f"space.{key}.type: expected one of {', '.join(KINDS)}, got {kind!r}")
    when = tuple((str(k), tuple(v if isinstance(v, list) else [v])) for k, v in (spec.get("when") or {}).items())
    if kind == "categorical":
        choices = spec.get("choices")
        if not isinstance(choices, list) or not choices:
            raise ConfigError(f"space.{key}.choices: expected a non-empty list, got {choices!r}")
        if any(isinstance(c, (list, dict)) for c in choices):
            raise ConfigError(f"space.{key}.choices: each choice is one value (a list goes as 'a,b' text)")
        return Param(key, kind, choices=tuple(choices), when=when)
    if tp not in (int, float) or (kind == "float" and tp is int):
        takes = type_words(tp)
        raise ConfigError(f"space.{key}: the key takes {takes}, it cannot be searched as a {kind} range")
    low, high = (range_bound(spec, key, name) for name in ("low", "high"))
    step = range_bound(spec, key, "step") if spec.get("step") is not None else None
    log = bool(spec.get("log", False))
    if kind == "int" and not all(float(v).is_integer() for v in (low, high, step or 1)):
        raise ConfigError(f"space.{key}: an int range needs whole low, high and step, got {low}..{high}")
    if not low < high:
        raise ConfigError(f"space.{key}: empty range, low {low} is not below high {high}")
    if log and low <= 0:
        raise ConfigError(f"space.{key}: a log range needs low > 0, got {low}")
    if log and step is not None and kind == "float":
        raise ConfigError(f"space.{key}: a log range takes no step")
    if step is not None and not 0 < step <= high - low:
        raise ConfigError(f"space.{key}.step: expected 0 < step <= high - low, got {step}")
    return Param(key, kind, low, high, log, step, (), when)


def default_kind(tp: Any, key: str) -> str:
    if tp is float:
        return "float"
    if tp is int:
        return "int"
    raise ConfigError(f"space.{key}: the key takes {type_words(tp)}; search it with choices: [...]")


def type_words(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(map(repr, typing.get_args(tp)))
    names = {int: "an integer", float: "a number", bool: "true or false", str: "text", dict: "a mapping"}
    return names.get(tp, "a list" if typing.get_origin(tp) is list else str(tp))


def range_bound(spec: dict, key: str, name: str) -> float:
    value = spec.get(name)
    if isinstance(value, str):  # YAML reads 1e-5 (no dot) as text
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"space.{key}.{name}: expected a number, got {value!r}")
    return value


def typed_conditions(search: Search, param: Param, searched: dict[str, Param]) -> Param:
    """``param`` with its ``when`` values typed as the keys take them (``"0.1"`` -> 0.1), each checked:
    a searched key must be able to take it (one of its choices), a key not searched must have it."""
    typed = []
    for key, accepted in param.when:
        if key == param.key:
            raise ConfigError(f"space.{param.key}.when: a key cannot depend on itself")
        other = searched.get(key)
        if other is not None and other.kind != "categorical":
            raise ConfigError(f"space.{param.key}.when.{key}: a condition needs a key searched with choices")
        values = tuple(lookup(search.stage_config({key: value}, "check"), key) for value in accepted)
        typed.append((key, values))
        possible = {lookup(search.stage_config({key: c}, "check"), key) for c in other.choices} if other else None
        if possible is not None and not set(values) & possible:
            raise ConfigError(f"space.{param.key}.when.{key}: {list(accepted)} is none of its choices")
    return dataclasses.replace(param, when=tuple(typed))


def draw_order(params: list[Param]) -> list[Param]:
    """The params with each ``when`` key drawn before the params it gates; a circle is a ConfigError."""
    by_key, ordered, state = {p.key: p for p in params}, [], {}

    def visit(param: Param, trail: list[str]) -> None:
        if state.get(param.key) == "done":
            return
        if state.get(param.key) == "open":
            raise ConfigError(f"space: conditions go in a circle: {' -> '.join([*trail, param.key])}")
        state[param.key] = "open"
        for key, _ in param.when:
            if key in by_key:
                visit(by_key[key], [*trail, param.key])
        state[param.key] = "done"
        ordered.append(param)

    for param in params:
        visit(param, [])
    return ordered


def check_probes(search: Search, param: Param, base_cfg) -> None:
    """Build the stage's config with each bound or choice of ``param`` (and its conditions met): the
    stage's own checks refuse a value it cannot take, before any trial."""
    condition = {key: accepted[0] for key, accepted in param.when}
    if any(key in search.fixed and search.fixed[key] not in accepted for key, accepted in param.when):
        raise ConfigError(f"space.{param.key}.when: never met with this base config, so it is never searched")
    for value in param.probes():
        try:
            search.stage_config({**condition, param.key: value}, os.path.join(search.tune.output_dir, "check"))
        except ConfigError as exc:
            raise ConfigError(f"space.{param.key}: {value!r} is refused by {search.tune.stage}: {exc}") from None


def check_objective(tune: TuneConfig, base_cfg, searched: list[str]) -> None:
    """Refuse a stage metric (the objective, or the pruner's) that trials cannot be ranked by, saying why.
    An objective from an evaluate run without a pruner metric reads nothing of the stage's eval."""
    metrics = {"pruner.metric": tune.pruner.metric} if tune.pruner.metric else {}
    if not tune.evaluate:
        metrics["objective.metric"] = tune.objective.metric
    if not metrics:
        return
    for key in searched:
        if any(key == held or (held.endswith("_") and key.startswith(held)) for held in HELD_OUT_KEYS):
            raise ConfigError(
                f"space.{key}: it changes the held-out rows that {' and '.join(metrics)} is measured on, so no "
                f"two trials would be ranked on the same data; fix it in the base config"
            )
        for name, metric in metrics.items():
            check_scale(tune, name, metric, key)
    data = getattr(base_cfg, "data", None)
    shuffled = getattr(data, "eval_by", None) == "shuffle" and not (
        getattr(data, "eval_path", None) or getattr(data, "eval_dataset", None)
    )
    if tune.trial_seed == "per_trial" and shuffled:
        raise ConfigError(
            "trial_seed: per_trial draws other held-out rows for each trial (data.eval_by=shuffle splits them "
            "off data.path by the seed); set data.eval_path, or data.eval_by=hash, or trial_seed: same"
        )


def check_scale(tune: TuneConfig, name: str, metric: str, key: str) -> None:
    """Refuse ranking by ``metric`` (the search file's key ``name``) when searched ``key`` changes its scale."""
    table = SCALED_BY.get(tune.stage, {})
    held = metric_key(metric)
    scaled = table.get(held) or next((v for k, v in table.items() if k.endswith("/") and held.startswith(k)), ())
    if any(key == s or (s.endswith(".") and key.startswith(s)) for s in scaled):
        other = RANKABLE.get(tune.stage)
        raise ConfigError(
            f"{name}: {metric} of {tune.stage} changes scale with {key}, which is searched: trials with "
            f"different {key} cannot be ranked by it" + (f"; rank them by {other}" if other else "")
        )
