"""Build a typed config from YAML files and ``key=value`` overrides, validated before any heavy work.

Each file and the overrides are one layer; TRL's and LLaMA-Factory's key names in a layer become ours
(:mod:`trainer_lib.config.aliases`) before the layers are merged, so a later layer wins whichever
names it uses. Errors are :class:`~trainer_lib.errors.ConfigError` naming the key; the CLI turns them
into exit code 2.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import keyword
import os
import types
import typing
from typing import Any, Literal, Union

import yaml

from trainer_lib.config import aliases
from trainer_lib.config.sections import lookup
from trainer_lib.errors import ConfigError
from trainer_lib.values import lookup_dotted, parse_bool, section_for

#: the most values a YAML text may hold with its aliases expanded (a config holds hundreds)
MAX_YAML_VALUES = 100_000


def safe_yaml(text, where: str):
    """``yaml.safe_load(text)``, refusing aliases that expand past :data:`MAX_YAML_VALUES` values or hold
    themselves. PyYAML shares an aliased value instead of copying it, so a few lines of aliases to aliases
    (an alias bomb) load at once, but whatever walks the result (a check, an error message, a JSON dump of
    the config) walks billions of values."""
    loaded = yaml.safe_load(text)
    expanded_size(loaded, where, {}, set())
    return loaded


def expanded_size(value, where: str, sizes: dict, open_ids: set) -> int:
    """How many values ``value`` holds with every alias expanded (``sizes``: counted containers by id;
    ``open_ids``: those being counted); a ConfigError naming ``where`` past :data:`MAX_YAML_VALUES`."""
    if not isinstance(value, (dict, list)):
        return 1
    if id(value) in sizes:
        return sizes[id(value)]
    if id(value) in open_ids:
        raise ConfigError(f"{where}: a YAML alias refers to a value that holds it")
    open_ids.add(id(value))
    items = [*value.keys(), *value.values()] if isinstance(value, dict) else value
    total = 1
    for item in items:
        total += expanded_size(item, where, sizes, open_ids)
        if total > MAX_YAML_VALUES:
            raise ConfigError(
                f"{where}: its YAML aliases expand to more than {MAX_YAML_VALUES:,} values (an alias bomb?)"
            )
    open_ids.discard(id(value))
    sizes[id(value)] = total
    return total


def _number(value: Any) -> int | float | None:
    """A number, or text of one ("3", "1e-4", and "200.0" as a pipeline backend writes whole numbers);
    None for anything else (booleans included)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, str):
        for parse in (int, float):
            try:
                return parse(value)
            except ValueError:
                pass
    return None


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Turn a YAML/CLI value into the declared type, or raise a ConfigError naming the key."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None or (isinstance(value, str) and value.lower() in ("null", "none", "~")):
            if type(None) in typing.get_args(tp):
                return None
        if len(args) == 1:
            return _coerce(value, args[0], key)
        for arg in args:  # e.g. batch_size: an integer, else "auto"
            try:
                return _coerce(value, arg, key)
            except ConfigError:
                pass
        raise ConfigError(f"{key}: expected {' or '.join(_type_name(a) for a in args)}, got {value!r}")
    if origin is Literal:
        allowed = typing.get_args(tp)
        if isinstance(value, str) and value.lower() in allowed:
            return value.lower()
        raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r}")
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if isinstance(value, str) and value.strip().startswith("["):  # a YAML/JSON list given as text
            try:
                value = safe_yaml(value, key)
            except yaml.YAMLError:
                raise ConfigError(f"{key}: expected a list, got {value!r}") from None
        elif isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        return [_coerce(v, item_tp, key) for v in value]
    if tp is bool:
        return parse_bool(value, key)
    if tp in (int, float):
        number = _number(value)
        if number is None or (tp is int and not float(number).is_integer()):
            raise ConfigError(f"{key}: expected {'an integer' if tp is int else 'a number'}, got {value!r}")
        return int(number) if tp is int else float(number)
    if tp is str:
        if isinstance(value, (dict, list)):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return str(value)
    if tp is dict or typing.get_origin(tp) is dict:
        if isinstance(value, str) and value.strip().startswith("{"):  # a YAML/JSON mapping given as text
            try:
                value = safe_yaml(value, key)
            except yaml.YAMLError:
                raise ConfigError(f"{key}: expected a mapping, got {value!r}") from None
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return dict(value)
    return value


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return " or ".join(repr(v) for v in typing.get_args(tp))
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(tp, str(tp))


def _fields(cls: type) -> dict[str, tuple[dataclasses.Field, Any]]:
    """``{key: (field, type)}``; a key that is a Python keyword (``env.class``) is held by the field named
    with a trailing underscore (``class_``), as PEP 8 advises."""
    hints = typing.get_type_hints(cls)
    return {key_of(f.name): (f, hints[f.name]) for f in dataclasses.fields(cls)}


def key_of(name: str) -> str:
    """The config key of a dataclass field: its name, without the underscore a keyword's field carries."""
    return name[:-1] if name.endswith("_") and keyword.iskeyword(name[:-1]) else name


def _build(cls: type, values: dict, prefix: str = "") -> Any:
    known = _fields(cls)
    kwargs = {}
    for name, value in values.items():
        key = f"{prefix}{name}"
        if name not in known:
            close = difflib.get_close_matches(name, list(known), n=1)
            hint = f" (did you mean '{prefix}{close[0]}'?)" if close else ""
            raise ConfigError(f"{key}: unknown key{hint}")
        f, tp = known[name]
        if dataclasses.is_dataclass(tp):
            if not isinstance(value, dict):
                raise ConfigError(f"{key}: expected a mapping of {tp.__name__} keys, got {value!r}")
            kwargs[f.name] = _build(tp, value, f"{key}.")
        else:
            kwargs[f.name] = _coerce(value, tp, key)
            choices = f.metadata.get("choices")
            if choices and kwargs[f.name] not in choices:
                raise ConfigError(f"{key}: expected one of {list(choices)}, got {kwargs[f.name]!r}")
    return cls(**kwargs)


def parse_overrides(overrides: list[str]) -> dict:
    """``["a.b=1", "c=x"]`` -> nested dict. Values are parsed as YAML scalars."""
    tree: dict = {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"{item}: expected key=value")
        key, raw = item.split("=", 1)
        key = key.strip().lstrip("-")
        try:
            value = safe_yaml(raw, key) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        if isinstance(value, (dict,)):
            value = raw
        node, last = section_for(tree, key, f"{key}: conflicts with an earlier override")
        node[last] = value
    return tree


def merge(base: dict, extra: dict) -> dict:
    """``extra`` laid over ``base``, nested mappings merged key by key (neither is changed)."""
    out = dict(base)
    for k, v in extra.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _one_line_yaml_error(exc) -> str:
    """PyYAML's multi-line message as one line: what went wrong and where (1-based line, column)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    context = getattr(exc, "context", None)
    return f"{where}{problem}" + (f" ({context})" if context else "")


def read_yaml(path: str) -> dict:
    """The top-level mapping of a YAML config file (a ConfigError naming the file otherwise)."""
    if not os.path.exists(path):
        raise ConfigError(f"--config {path}: file not found")
    with open(path, encoding="utf-8") as fh:
        try:
            loaded = safe_yaml(fh, path) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: invalid YAML: {_one_line_yaml_error(exc)}") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"{path}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start})"
            ) from None
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    return loaded


def has_key(cls: type, dotted: str) -> bool:
    """Whether config class ``cls`` has the (dotted) key, e.g. ``has_key(SFTConfig, "lora.r")``."""
    tp: Any = cls
    for part in dotted.split("."):
        if not dataclasses.is_dataclass(tp) or part not in _fields(tp):
            return False
        tp = _fields(tp)[part][1]
    return True


def load_config(
    cls: type,
    config_files: str | dict | list[str | dict] | None = None,
    overrides: list[str] | dict | None = None,
    validate: bool = True,
    stage: str | None = None,
) -> Any:
    """Build ``cls`` from YAML files (or already-read mappings), merged in order, then the
    overrides; then run ``validate()``.

    Each file and the overrides are one layer: TRL's and LLaMA-Factory's key names in a layer
    become ours (:mod:`trainer_lib.config.aliases`, the mapping printed once) before the layers
    are merged, so a later layer wins whichever names it uses. Two keys that say the same thing
    another way follow that rule too (:data:`ALTERNATIVES`): ``data.dataset`` from a later layer
    replaces an earlier ``data.path``; of ``max_steps`` and ``num_epochs``, the later layer decides,
    and within one layer ``max_steps > 0`` wins, as in transformers (:func:`steps_or_epochs`).
    ``stage`` is the stage being run, which LLaMA-Factory's ``stage`` key must match.
    """
    files = config_files if isinstance(config_files, list) else [config_files] if config_files else []
    layers = [f if isinstance(f, dict) else read_yaml(f) for f in files]
    if overrides:
        layers.append(overrides if isinstance(overrides, dict) else parse_overrides(list(overrides)))
    values: dict = {}
    lines: list[str] = []
    set_by: dict[str, str] = {}
    warmup: tuple | None = None
    decides = None  # which of max_steps / num_epochs decides the length of training
    for layer in layers:
        translated = aliases.translate(layer, lambda key: has_key(cls, key), stage)
        values = merge(_drop_alternatives(values, translated.values), translated.values)
        lines += translated.lines
        set_by.update(translated.set_by)
        if "warmup_steps" in translated.values or translated.warmup_ratio is not None:  # a later layer wins
            steps_too = "warmup_steps" in translated.values
            warmup = (
                None if translated.warmup_ratio is None else (translated.warmup_ratio, translated.warmup_key, steps_too)
            )
        decides = steps_or_epochs(translated.values, decides)
    if has_key(cls, "num_epochs"):
        lines += _settle_steps(values, decides)
    try:
        try:
            cfg = _build(cls, values)
            if warmup is not None:
                ratio, key, steps_too = warmup
                lines.append(aliases.resolve_warmup_ratio(cfg, ratio, steps_too, key))
        finally:
            aliases.announce(lines)
        if validate and hasattr(cfg, "validate"):
            cfg.validate()
    except ConfigError as exc:
        raise aliases.explain(exc, set_by) from None
    return cfg


#: Keys that give the same thing different ways: a layer that sets one drops the others from the
#: layers before it (a file's ``dataset: identity`` gives way to ``data.path=...`` on the command line).
ALTERNATIVES = (("data.path", "data.dataset", "data.sources"), ("data.eval_path", "data.eval_dataset"))


def _drop_alternatives(values: dict, layer: dict) -> dict:
    """``values`` without the keys that ``layer`` replaces by setting their alternative."""
    out = values
    for group in ALTERNATIVES:
        for key, other in ((k, o) for k in group for o in group if o != k):
            if lookup_dotted(layer, key)[0] and lookup_dotted(out, other)[0]:
                section, last = other.split(".")
                out = {**out, section: {k: v for k, v in out[section].items() if k != last}}
    return out


def steps_or_epochs(layer: dict, decided: str | None) -> str | None:
    """Which of ``max_steps`` and ``num_epochs`` decides the length of training after ``layer``: the one
    the layer gives, or with both ``max_steps`` when it is > 0 (as in transformers); else ``decided``."""
    steps, epochs = "max_steps" in layer, "num_epochs" in layer
    if steps and epochs:
        number = _number(layer["max_steps"])
        return "max_steps" if number is not None and number > 0 else "num_epochs"
    return "max_steps" if steps else "num_epochs" if epochs else decided


def _settle_steps(values: dict, decides: str | None) -> list[str]:
    """Drop the one of ``max_steps`` / ``num_epochs`` that does not decide; the line saying so (when both
    were given)."""
    steps, epochs = values.get("max_steps"), values.get("num_epochs")
    number = _number(epochs)
    if steps is None or epochs is None or number is None or number <= 0:
        return []
    if decides == "max_steps":
        values["num_epochs"] = 0
        return [f"max_steps={steps} wins over num_epochs={epochs} (max_steps > 0 decides, as in transformers)"]
    values.pop("max_steps")
    given = _number(steps)
    if given is None or given <= 0:  # transformers' -1: not set
        return []
    return [f"num_epochs={epochs} wins over max_steps={steps} (given in a later layer)"]


def to_dict(cfg: Any) -> dict:
    """A config as nested mappings of its keys (``env.class``, not the field ``class_``)."""
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        return {key_of(f.name): to_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    return _plain(cfg)


def _plain(value: Any) -> Any:
    """A value's copy as ``dataclasses.asdict`` makes it: lists, tuples and mappings copied deeply."""
    if isinstance(value, (list, tuple)):
        return type(value)(to_dict(v) for v in value)
    if isinstance(value, dict):
        return {k: to_dict(v) for k, v in value.items()}
    return copy.deepcopy(value)


def flat_dict(cfg: Any) -> dict[str, Any]:
    """``{"engine.zero_stage": 2, "lr": 1e-4, ...}``: every key of a config, dotted (trackers' params)."""

    def flatten(tree: dict, prefix: str) -> dict:
        out = {}
        for key, value in tree.items():
            if isinstance(value, dict) and dataclasses.is_dataclass(lookup(cfg, f"{prefix}{key}")):
                out.update(flatten(value, f"{prefix}{key}."))
            else:
                out[f"{prefix}{key}"] = value
        return out

    return flatten(to_dict(cfg), "")


def describe(cls: type, prefix: str = "") -> list[tuple[str, str, str]]:
    """(key, default, help) rows for every option, nested sections flattened."""
    rows = []
    for name, (f, tp) in _fields(cls).items():
        key = f"{prefix}{name}"
        if dataclasses.is_dataclass(tp):
            rows.extend(describe(tp, f"{key}."))
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if isinstance(default, list):
            default = ",".join(map(str, default))
        text = f.metadata.get("help", "")
        if f.metadata.get("choices"):
            text += f" One of: {', '.join(map(str, f.metadata['choices']))}."
        rows.append((key, "null" if default is None else str(default), text))
    return rows
