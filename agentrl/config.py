"""Typed configuration: YAML files + dotted CLI overrides -> pydantic models.

Each component owns its model (e.g. `agentrl.trainer.config.ActorConfig`), a `ConfigModel`; this module holds the
base model, the loader and the translation of pydantic's errors into one line a user can act on:

- an unknown key fails at load time naming the key, the file and the nearest valid key (or, for a knob of
  another mode of a `tagged_union`, the mode it belongs to);
- a value of the wrong type fails naming the key and the expected type; a value out of range names the bound;
- the resolved config is written into the run directory (`save_config`) and loads back as the same config.
"""

from __future__ import annotations

import copy
import difflib
import importlib
import types
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, TypeVar, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Discriminator, Tag, ValidationError

from agentrl.errors import UserError, one_line

M = TypeVar("M", bound="ConfigModel")


class ConfigError(UserError, ValueError):
    """A configuration problem the user can fix; the message names the key, the source and the fix."""


class ConfigModel(BaseModel):
    """Base of every config section. Unknown keys are errors; types are strict as YAML users expect: an int is
    neither a bool nor a string, a float takes an int, a bool is true or false, a string is a string. Built in
    Python (`EngineConfig(max_batch_size=0)`) it raises the same one-line `ConfigError` as a config file."""

    model_config = ConfigDict(extra="forbid", strict=True)
    # The section's key in a training config ("engine", "agent", ...), named by a bound's message when the section
    # is validated alone, as the training config would name it.
    section: ClassVar[str] = ""

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as e:
            raise ConfigError(explain(e, type(self))) from None

    # Nested sections are validated as pydantic's own __init__ would (the error is translated once, at the top).
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]


# ------------------------------------------------------------------------------------------- modes keyed on a name


def tagged_union(key: str, *modes: type[ConfigModel], other: type[ConfigModel] | None = None) -> Any:
    """The annotation of a section that is one of `modes`, chosen by its `key` field (each mode declares
    `key: Literal["its name"] = "its name"`; a missing key means the first mode). A value no mode names goes to
    `other` (e.g. a `package.module:function` mode, which validates the name itself). A knob of another mode
    that holds that mode's default is dropped, so configs saved with every knob listed still load."""
    names = {m.model_fields[key].default: m for m in modes}
    first = next(iter(names))

    def name_of(value: Any) -> str | None:
        name = value.get(key, first) if isinstance(value, dict) else getattr(value, key, None)
        return name if name in names else "other" if other is not None and isinstance(name, str) else None

    def drop_other_defaults(value: Any) -> Any:
        chosen = names.get(name_of(value)) if isinstance(value, dict) else None
        if chosen is None:
            return value
        return {k: v for k, v in value.items() if k in chosen.model_fields or not _default_elsewhere(k, v, modes)}

    members = [Annotated[m, Tag(name)] for name, m in names.items()]
    if other is not None:
        members.append(Annotated[other, Tag("other")])
    return Annotated[Union[tuple(members)], Discriminator(name_of), BeforeValidator(drop_other_defaults)]


def _default_elsewhere(name: str, value: Any, modes: tuple[type[ConfigModel], ...]) -> bool:
    return any(name in m.model_fields and m.model_fields[name].default == value for m in modes)


def _modes(tp: Any) -> dict[str, type[BaseModel]]:
    """Tag -> model of a `tagged_union` annotation (empty for any other annotation)."""
    found = {}
    for member in get_args(tp) if get_origin(tp) in (Union, types.UnionType) else ():
        if get_origin(member) is Annotated:
            for meta in member.__metadata__:
                if isinstance(meta, Tag):
                    found[meta.tag] = get_args(member)[0]
    return found


# ------------------------------------------------------------------------------------- pydantic errors -> one line


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    if origin is Annotated:
        return _type_name(get_args(tp)[0])
    if origin in (Union, types.UnionType):
        return " | ".join(_type_name(a) for a in get_args(tp))
    if origin is not None:
        args = ", ".join(_type_name(a) for a in get_args(tp))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def _unwrap(tp: Any) -> Any:
    """`X | None` -> X (pydantic puts no step for the None branch in `loc`), Annotated[X, ...] -> X."""
    while True:
        if get_origin(tp) is Annotated:
            tp = get_args(tp)[0]
        elif get_origin(tp) in (Union, types.UnionType) and not _modes(tp):
            options = [a for a in get_args(tp) if a is not type(None)]
            if len(options) != 1:
                return tp
            tp = options[0]
        else:
            return tp


class _Place:
    """Where an error's `loc` points: the dotted key, the annotation there, the model holding the last key and,
    when the path went through a `tagged_union`, the chosen mode and all modes."""

    def __init__(self, cls: type[BaseModel], loc: tuple) -> None:
        self.key, self.tp, self.parent = "", cls, cls
        self.mode: tuple[str, str, dict[str, type[BaseModel]]] | None = None  # (union key, chosen tag, modes)
        tp: Any = cls
        key_tp = None  # the key annotation of the last mapping passed
        for part in loc:
            tp = _unwrap(tp)
            if isinstance(tp, type) and issubclass(tp, BaseModel):
                self.parent = tp
                self.key = f"{self.key}.{part}" if self.key else str(part)
                field = tp.model_fields.get(part)
                tp = self.tp = field.annotation if field else None
            elif get_origin(tp) in (list, tuple) and isinstance(part, int):
                self.key += f"[{part}]"
                tp = self.tp = (get_args(tp) or (Any,))[0]
            elif get_origin(tp) is dict and part != "[key]":
                self.key += f".{part}"
                key_tp, tp = get_args(tp) or (Any, Any)
                self.tp = tp
            elif part == "[key]" and key_tp is not None:  # the mapping's key itself was refused
                tp = self.tp = key_tp
            elif _modes(tp) and part in _modes(tp):
                self.mode = (self.key, part, _modes(tp))
                tp = _modes(tp)[part]
            elif get_origin(tp) in (Union, types.UnionType):
                continue  # a union member's name (str | list[str] -> "list[str]")
            else:
                break


_BOUNDS = {"greater_than": ("gt", ">"), "greater_than_equal": ("ge", ">="), "less_than": ("lt", "<"),
           "less_than_equal": ("le", "<=")}


def _unknown_key(place: _Place, source: str) -> str:
    *_, name = place.key.rsplit(".", 1)
    if place.mode is not None:
        mode_key, chosen, modes = place.mode
        owners = [tag for tag, m in modes.items() if name in m.model_fields and tag != "other"]
        if owners:
            field = next(k for k, f in modes[owners[0]].model_fields.items() if f.default == owners[0])
            return (f"{place.key} belongs to {field} {' or '.join(repr(t) for t in owners)}, not {chosen!r}: "
                    f"set {mode_key}.{field}={owners[0]} or drop the key ({source})")
    prefix = place.key[: -len(name)]
    candidates = [prefix + n for n in place.parent.model_fields]
    close = difflib.get_close_matches(place.key, candidates, n=1, cutoff=0.6)
    hint = f"; did you mean '{close[0]}'?" if close else f"; valid keys here: {', '.join(sorted(candidates))}"
    return f"unknown config key '{place.key}' in {source}{hint}"


def _describe(err: dict, cls: type[BaseModel], source: str) -> str:
    place = _Place(cls, err["loc"])
    key, kind, value, ctx = place.key or cls.__name__, err["type"], err.get("input"), err.get("ctx") or {}
    where = f" ({source})" if source else ""
    if kind == "extra_forbidden":
        return _unknown_key(place, source or "the arguments")
    if kind in ("value_error", "assertion_error") and "error" in ctx:
        message = str(ctx["error"])  # a validator's own message, prefixed with the key unless it starts with it
        first = message.split(" ", 1)[0].rstrip(":,")
        named = not place.key or first.startswith(place.key) or first.endswith(place.key.rsplit(".", 1)[-1])
        return (message if named else f"{key}: {message}") + where
    if kind == "literal_error":
        allowed = _literals(place.tp)
        close = difflib.get_close_matches(str(value), [str(a) for a in allowed], n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return f"{key}: {value!r} is not one of {', '.join(repr(a) for a in allowed)}{hint}{where}"
    if kind in _BOUNDS:
        bound, op = _BOUNDS[kind]
        section = getattr(cls, "section", "")  # a section validated alone still names its key as a run's config does
        named = f"{section}.{key}" if section and place.key else key
        return f"{named} must be {op} {ctx[bound]}, got {value!r}{where}"
    if kind in ("too_short", "too_long"):
        return f"{key} must hold {ctx.get('min_length', ctx.get('max_length'))} items, got {value!r}{where}"
    if kind == "missing":
        return f"{key} is required (no default){where}"
    if kind in ("model_type", "model_attributes_type", "union_tag_not_found"):
        section = _unwrap(place.tp)
        what = f"a mapping for {section.__name__}" if isinstance(section, type) else "a mapping"
        return f"{key}: expected {what}, got {type(value).__name__} {value!r}{where}"
    if kind.endswith(("_type", "_parsing")) or kind == "int_from_float":
        expected = "bool (true/false)" if kind.startswith("bool") else _type_name(place.tp)
        return f"{key}: expected {expected}, got {type(value).__name__} {value!r}{where}"
    return f"{key}: {err['msg']}{where}"


def _literals(tp: Any) -> list:
    tp = _unwrap(tp)
    if get_origin(tp) is Literal:
        return list(get_args(tp))
    return [a for member in get_args(tp) for a in _literals(member)]


def explain(error: ValidationError, cls: type[BaseModel], source: str = "") -> str:
    """pydantic's first error as one line naming the key, what was wrong and, where it helps, the fix."""
    return _describe(error.errors(include_url=False)[0], cls, source)


# --------------------------------------------------------------------------------------------------- the loader


def parse_override(item: str) -> tuple[list[str], Any]:
    """`a.b.c=value` -> (["a", "b", "c"], yaml-parsed value)."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like key.path=value (e.g. actor.lr=1e-6)")
    key, raw = item.split("=", 1)
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {item!r}: empty key segment")
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError as e:
        raise ConfigError(f"override {item!r}: the value is not valid YAML ({one_line(e)})") from None
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


def load_config(cls: type[M], path: str | Path | None = None, overrides: list[str] | None = None,
                data: dict | None = None, *, source: str | None = None) -> M:
    """Build `cls` from a YAML file (or `data`, read from `source`) plus dotted overrides, validating every key
    and type."""
    source = str(path) if path else source or "<defaults>"
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
    try:
        return cls.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(explain(e, cls, source)) from None


def to_dict(cfg: BaseModel) -> dict:
    """The config as plain YAML-ready data (what `save_config` writes and `load_config` reads back)."""
    return cfg.model_dump()


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


def save_config(cfg: BaseModel, run_dir: str | Path, name: str = "config.yaml", *,
                path_keys: tuple[str, ...] = ()) -> Path:
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


__all__ = ["ConfigError", "ConfigModel", "absolute_paths", "explain", "import_object", "load_config", "parse_override",
           "save_config", "tagged_union", "to_dict"]
