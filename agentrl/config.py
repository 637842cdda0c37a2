"""Typed configuration: YAML files + dotted CLI overrides -> nested dataclasses.

Each component owns its dataclass (e.g. `agentrl.trainer.config.ActorConfig`); this module holds the machinery
that loads and validates them and the top-level `TrainConfig` that composes them. Rules:

- an unknown key fails at load time naming the key, the file and the nearest valid key;
- a value of the wrong type fails naming the key and the expected type;
- the resolved config is written into the run directory (`save_config`).
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import importlib
import types
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

import yaml

from agentrl.errors import UserError

T = TypeVar("T")


class ConfigError(UserError, ValueError):
    """A configuration problem the user can fix; the message names the key, the source and the fix."""


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        return " | ".join(_type_name(a) for a in get_args(tp))
    if origin is not None:
        args = ", ".join(_type_name(a) for a in get_args(tp))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, key: str, source: str) -> Any:
    """Check `value` against the annotation `tp` and return it (nested dataclasses are built)."""
    origin = get_origin(tp)
    if tp is Any:
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping for {tp.__name__}, got {type(value).__name__} {value!r} ({source})")
        return _build(tp, value, key, source)
    if origin in (Union, types.UnionType):
        options = get_args(tp)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(value, option, key, source)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(f"{key}: expected {_type_name(tp)}, got {type(value).__name__} {value!r} ({source})")
    if origin is Literal:
        allowed = get_args(tp)
        if value not in allowed:
            close = difflib.get_close_matches(str(value), [str(a) for a in allowed], n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{key}: {value!r} is not one of {', '.join(repr(a) for a in allowed)}{hint} ({source})")
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected {_type_name(tp)}, got {type(value).__name__} {value!r} ({source})")
        (item_tp, *_) = get_args(tp) or (Any,)
        return [_coerce(v, item_tp, f"{key}[{i}]", source) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected {_type_name(tp)}, got {type(value).__name__} {value!r} ({source})")
        _, val_tp = get_args(tp) or (Any, Any)
        return {k: _coerce(v, val_tp, f"{key}.{k}", source) for k, v in value.items()}
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected float, got {type(value).__name__} {value!r} ({source})")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected int, got {type(value).__name__} {value!r} ({source})")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected bool (true/false), got {type(value).__name__} {value!r} ({source})")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected str, got {type(value).__name__} {value!r} ({source})")
        return value
    if isinstance(tp, type) and not isinstance(value, tp):
        raise ConfigError(f"{key}: expected {_type_name(tp)}, got {type(value).__name__} {value!r} ({source})")
    return value


def _all_keys(cls: type, prefix: str = "") -> list[str]:
    keys = []
    for f in dataclasses.fields(cls):
        full = f"{prefix}{f.name}"
        keys.append(full)
        hint = get_type_hints(cls)[f.name]
        if dataclasses.is_dataclass(hint):
            keys.extend(_all_keys(hint, full + "."))
    return keys


def _build(cls: type[T], data: dict, prefix: str, source: str) -> T:
    hints = get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for key in data:
        if key not in names:
            full = f"{prefix}.{key}" if prefix else str(key)
            candidates = [f"{prefix}.{n}" if prefix else n for n in names]
            close = difflib.get_close_matches(full, candidates, n=1, cutoff=0.6)
            hint = f"; did you mean '{close[0]}'?" if close else f"; valid keys here: {', '.join(sorted(candidates))}"
            raise ConfigError(f"unknown config key '{full}' in {source}{hint}")
    kwargs = {}
    for name, value in data.items():
        full = f"{prefix}.{name}" if prefix else name
        kwargs[name] = _coerce(value, hints[name], full, source)
    try:
        obj = cls(**kwargs)
    except TypeError as e:  # a required field is missing
        raise ConfigError(f"{prefix or cls.__name__}: {e} ({source})") from None
    except ValueError as e:  # __post_init__ validation
        raise ConfigError(f"{prefix or cls.__name__}: {e} ({source})") from None
    return obj


def parse_override(item: str) -> tuple[list[str], Any]:
    """`a.b.c=value` -> (["a", "b", "c"], yaml-parsed value)."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like key.path=value (e.g. actor.lr=1e-6)")
    key, raw = item.split("=", 1)
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {item!r}: empty key segment")
    value = yaml.safe_load(raw) if raw != "" else ""
    # YAML reads 1e-6 as a string (it wants 1.0e-6); users type 1e-6 on the command line.
    if isinstance(value, str):
        try:
            value = float(raw) if any(c in raw for c in ".eE") else value
        except ValueError:
            pass
    return key.split("."), value


def _merge(base: dict, path: list[str], value: Any) -> None:
    node = base
    for part in path[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[path[-1]] = value


def load_config(cls: type[T], path: str | Path | None = None, overrides: list[str] | None = None,
                data: dict | None = None) -> T:
    """Build `cls` from a YAML file (or `data`) plus dotted overrides, validating every key and type."""
    source = str(path) if path else "<defaults>"
    raw: dict = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {p} does not exist")
        try:
            loaded = yaml.safe_load(p.read_text())
        except yaml.YAMLError as e:
            raise ConfigError(f"{p} is not valid YAML: {e}") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{p}: the top level must be a mapping of config keys, got {type(loaded).__name__}")
        raw = loaded
    if data:
        raw = {**raw, **data}
    for item in overrides or []:
        keys, value = parse_override(item)
        _merge(raw, keys, value)
    if overrides:
        source = f"{source} + overrides {' '.join(overrides)}"
    return _build(cls, raw, "", source)


def to_dict(cfg: Any) -> dict:
    return dataclasses.asdict(cfg)


def absolute_paths(tree: dict, path_keys: tuple[str, ...]) -> dict:
    """`tree` with the paths under the dotted `path_keys` (a path or a list of paths) made absolute where they
    exist, so a record resolves from any directory; a name that is no local path (a Hugging Face id) stays."""
    def absolute(value):
        if isinstance(value, list):
            return [absolute(v) for v in value]
        return str(Path(value).resolve()) if isinstance(value, str) and value and Path(value).exists() else value

    tree = copy.deepcopy(tree)
    for key in path_keys:
        *parents, leaf = key.split(".")
        node = tree
        for part in parents:
            node = node[part]
        node[leaf] = absolute(node[leaf])
    return tree


def save_config(cfg: Any, run_dir: str | Path, name: str = "config.yaml", *, path_keys: tuple[str, ...] = ()) -> Path:
    """Write the resolved config (every default filled in) into the run directory, the paths under `path_keys`
    absolute (`absolute_paths`)."""
    out = Path(run_dir) / name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump(absolute_paths(to_dict(cfg), path_keys), sort_keys=False))
    return out


def import_object(spec: str, what: str) -> Any:
    """Resolve a `module:attr` escape hatch, with a clear error naming `what` it was for."""
    if ":" not in spec:
        raise ConfigError(f"{what}: {spec!r} must look like 'package.module:function'")
    module_name, attr = spec.split(":", 1)
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(f"{what}: cannot import module {module_name!r} ({e})") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ConfigError(f"{what}: module {module_name!r} has no attribute {attr!r}") from None


__all__ = ["ConfigError", "absolute_paths", "load_config", "save_config", "to_dict", "parse_override", "import_object"]
