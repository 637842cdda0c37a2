"""Defining tools: `@tool` turns a typed Python function into a `Tool` with an OpenAI function schema.

The schema comes from the type hints (through pydantic, which also validates the arguments, so the schema the
model sees and the check its arguments pass are the same thing) and from the Google-style docstring (through
`parse_google_docstring`). Arguments are validated before the function runs; a validation failure, an
unknown tool or an exception inside the tool become a `ToolResult` for the model, never an exception.

Every failed result carries an `error_kind`. Policy kinds are the model's own mistakes and are trained on;
infrastructure kinds (service unreachable, timeout after retries, 5xx, sandbox down) mark the episode as
infra-failed so the trainer can drop it instead of training it as reward 0.

Stateful tools take a keyword-only `session` parameter and a `session_factory`: the factory builds one state
object per episode session (from the service defaults merged with the task's `tools_kwargs[tool_name]`), the
tool receives it as `session=`, and the state's `aclose()`/`close()` runs when the session is released.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import enum
import functools
import inspect
import json
import os
import re
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pydantic

from agentrl.tools.errors import ToolDefinitionError

SYNC_TOOL_THREADS = 64  # blocking (sync) tools run on a dedicated pool: asyncio's default has only cpu+4 threads
_EXECUTOR: concurrent.futures.ThreadPoolExecutor | None = None


def _executor() -> concurrent.futures.ThreadPoolExecutor:
    global _EXECUTOR
    if _EXECUTOR is None:
        _EXECUTOR = concurrent.futures.ThreadPoolExecutor(max_workers=SYNC_TOOL_THREADS, thread_name_prefix="tool")
    return _EXECUTOR


POLICY_ERROR_KINDS = frozenset({"bad_arguments", "unknown_tool", "tool_raised", "tool_error"})
INFRA_ERROR_KINDS = frozenset({"unreachable", "timeout", "server_error", "overloaded", "sandbox_error"})
ERROR_KINDS = POLICY_ERROR_KINDS | INFRA_ERROR_KINDS


@dataclass
class ToolResult:
    """What a tool call produced. `content` is the text the model sees (the error message on failure)."""

    content: str
    is_error: bool = False
    error_kind: str | None = None
    metrics: dict = field(default_factory=dict)
    latency_s: float = 0.0

    def __post_init__(self) -> None:
        if self.error_kind is not None:
            if self.error_kind not in ERROR_KINDS:
                raise ValueError(f"ToolResult.error_kind {self.error_kind!r} is not one of {sorted(ERROR_KINDS)}")
            self.is_error = True

    @property
    def infra_error(self) -> bool:
        """True when the failure is the infrastructure's, not the policy's (drop the episode, do not train it)."""
        return self.error_kind in INFRA_ERROR_KINDS

    @classmethod
    def error(cls, kind: str, message: str, **metrics: Any) -> ToolResult:
        return cls(content=message, is_error=True, error_kind=kind, metrics=dict(metrics))

    def to_wire(self) -> dict:
        """The tool-service response body: {content, is_error, error_kind?, metrics?}."""
        body: dict[str, Any] = {"content": self.content, "is_error": self.is_error}
        if self.error_kind is not None:
            body["error_kind"] = self.error_kind
        if self.metrics:
            body["metrics"] = self.metrics
        return body

    @classmethod
    def from_wire(cls, body: Any, *, where: str) -> ToolResult:
        """Parse a tool-service response body; a malformed body is the service's fault (server_error)."""
        if not isinstance(body, dict) or not isinstance(body.get("content"), str):
            return cls.error("server_error", f"{where} returned a malformed result (need a JSON object with a "
                                             f"string 'content'): {str(body)[:200]}")
        kind = body.get("error_kind")
        if kind is not None and kind not in ERROR_KINDS:
            return cls.error("server_error", f"{where} returned unknown error_kind {kind!r}: {body['content'][:200]}")
        metrics = body.get("metrics") or {}
        return cls(content=body["content"], is_error=bool(body.get("is_error", False)) or kind is not None,
                   error_kind=kind if kind is not None else ("tool_error" if body.get("is_error") else None),
                   metrics=metrics if isinstance(metrics, dict) else {})


class ToolError(Exception):
    """Raise inside a tool for an expected failure the model should read (e.g. "no entity named X").

    It becomes `error_kind="tool_error"` (the policy's): the message is shown as is, without a traceback.
    """


class ToolInfraError(Exception):
    """Raise inside a tool when a dependency failed (sandbox down, database unreachable): an infra error."""

    def __init__(self, message: str, kind: str = "server_error"):
        if kind not in INFRA_ERROR_KINDS:
            raise ValueError(f"ToolInfraError kind {kind!r} is not one of {sorted(INFRA_ERROR_KINDS)}")
        super().__init__(message)
        self.kind = kind


class ArgumentsError(ValueError):
    """Arguments did not match the tool's schema; the message is written for the model."""


def _strip_titles(node: Any) -> Any:
    """Drop pydantic's auto-generated "title" keys (noise for the model); keep properties that are named title."""
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key == "title" and isinstance(value, str):
                continue
            if key == "properties" and isinstance(value, dict):
                out[key] = {name: _strip_titles(sub) for name, sub in value.items()}
            else:
                out[key] = _strip_titles(value)
        return out
    if isinstance(node, list):
        return [_strip_titles(v) for v in node]
    return node


def _inline_refs(node: Any, defs: dict, seen: tuple[str, ...] = ()) -> Any:
    """Replace {"$ref": "#/$defs/X"} by the definition: chat templates show the schema to the model verbatim."""
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            name = ref.removeprefix("#/$defs/")
            if name in seen:
                raise TypeError(f"recursive argument type {name!r} cannot be shown to a model as a flat JSON schema")
            merged = {**defs[name], **{k: v for k, v in node.items() if k != "$ref"}}
            return _inline_refs(merged, defs, seen + (name,))
        return {k: _inline_refs(v, defs, seen) for k, v in node.items() if k != "$defs"}
    if isinstance(node, list):
        return [_inline_refs(v, defs, seen) for v in node]
    return node


def _to_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    if isinstance(value, pydantic.BaseModel):
        return value.model_dump_json()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, (dict, list, tuple, int, float, bool)):
        return json.dumps(value, ensure_ascii=False, default=str)
    return str(value)


def _type_label(prop: dict) -> str:
    if "enum" in prop:
        return " | ".join(json.dumps(v) for v in prop["enum"])
    if "anyOf" in prop:
        return " | ".join(_type_label(p) for p in prop["anyOf"])
    kind = prop.get("type", "any")
    if kind == "array" and isinstance(prop.get("items"), dict):
        return f"array of {_type_label(prop['items'])}"
    return kind if isinstance(kind, str) else " | ".join(kind)


def _format_validation_error(tool_name: str, err: pydantic.ValidationError, parameters: dict) -> str:
    problems = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "arguments"
        if e["type"] == "extra_forbidden":
            problems.append(f"unexpected argument '{loc}'")
        elif e["type"] == "missing":
            problems.append(f"missing required argument '{loc}'")
        else:
            problems.append(f"'{loc}': {e['msg']} (got {json.dumps(e.get('input'), default=str)[:80]})")
    props = parameters.get("properties", {})
    required = set(parameters.get("required", []))
    expected = ", ".join(f"{n}: {_type_label(p)}{'' if n in required else ' (optional)'}" for n, p in props.items())
    return (f"Error: bad arguments for tool '{tool_name}': {'; '.join(problems)}. "
            f"Expected: {expected or 'no arguments'}.")


@dataclass
class Tool:
    """A callable tool: schema, argument validation and invocation. Build it with `@tool`.

    Calling the Tool object directly (`calculator("1+2")`) calls the wrapped function unchanged.
    """

    name: str
    description: str
    fn: Callable
    parameters: dict
    args_model: type[pydantic.BaseModel]
    session_factory: Callable[..., Any] | None = None
    timeout_s: float | None = None
    inline: bool = False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    @property
    def stateful(self) -> bool:
        return self.session_factory is not None

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    def schema(self) -> dict:
        """The OpenAI function schema: {"type": "function", "function": {name, description, parameters}}."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}

    def validate(self, arguments: Any) -> dict:
        """Check `arguments` against the schema and return the keyword arguments for the function."""
        if not isinstance(arguments, dict):
            raise ArgumentsError(f"Error: arguments for tool '{self.name}' must be a JSON object, "
                                 f"got {type(arguments).__name__}: {str(arguments)[:80]}")
        try:
            model = self.args_model.model_validate(arguments)
        except pydantic.ValidationError as e:
            raise ArgumentsError(_format_validation_error(self.name, e, self.parameters)) from None
        return {name: getattr(model, name) for name in type(model).model_fields}

    async def invoke(self, arguments: Any, state: Any = None) -> ToolResult:
        """Validate and run; every failure becomes a ToolResult (the service boundary for in-process tools)."""
        start = time.perf_counter()
        try:
            kwargs = self.validate(arguments)
        except ArgumentsError as e:
            return ToolResult.error("bad_arguments", str(e))
        if self.stateful:
            kwargs["session"] = state
        try:
            if self.is_async:
                coro = self.fn(**kwargs)
            elif self.inline:
                coro = None
                value = self.fn(**kwargs)
            else:
                coro = asyncio.get_running_loop().run_in_executor(_executor(), functools.partial(self.fn, **kwargs))
            if coro is not None:
                value = await (asyncio.wait_for(coro, self.timeout_s) if self.timeout_s else coro)
        except ToolError as e:
            result = ToolResult.error("tool_error", f"Error: {e}")
        except ToolInfraError as e:
            result = ToolResult.error(e.kind, f"Error: tool '{self.name}' failed for a reason outside the model's "
                                              f"control: {e}")
        except TimeoutError as e:
            limit = (f"did not finish within {self.timeout_s}s" if self.timeout_s
                     else f"timed out ({e or 'TimeoutError'})")
            result = ToolResult.error("timeout", f"Error: tool '{self.name}' {limit}")
        except Exception as e:  # noqa: BLE001 - the tool boundary: the model reads what went wrong
            last = traceback.format_exception_only(type(e), e)[-1].strip()
            result = ToolResult.error("tool_raised", f"Error: tool '{self.name}' raised {last}")
        else:
            result = value if isinstance(value, ToolResult) else ToolResult(content=_to_text(value))
        result.latency_s = time.perf_counter() - start
        return result


_SECTION_RE = re.compile(r"(Args|Arguments|Parameters|Returns?|Yields?|Raises|Examples?|Notes?|Attributes|Warnings?"
                         r"|See Also|Todo):")
_ARG_RE = re.compile(r"(\w+)\s*(?:\([^()]*\))?\s*:(?:\s+(.*))?")


def parse_google_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """(description, {argument name: description}) from a Google-style docstring.

    The description is the text before the first section header (`Args:`, `Returns:`, ...). In `Args:`, an
    entry is `name: text` or `name (type): text`; lines indented deeper than the entries continue the entry
    and are joined with single spaces. Other sections are ignored (the schema has no place for them).
    """
    description: list[str] = []
    args: dict[str, list[str]] = {}
    section: str | None = None
    current: str | None = None
    entry_indent: int | None = None
    for line in inspect.cleandoc(doc).splitlines():
        text = line.strip()
        header = _SECTION_RE.fullmatch(text)
        if header:
            section, current, entry_indent = header.group(1), None, None
            continue
        if section is None:
            description.append(line)
        elif section in ("Args", "Arguments", "Parameters") and text:
            indent = len(line) - len(line.lstrip())
            entry = _ARG_RE.fullmatch(text)
            if entry and (entry_indent is None or indent <= entry_indent):
                current, entry_indent = entry.group(1), indent
                args[current] = [entry.group(2) or ""]
            elif current is not None:
                args[current].append(text)
    return "\n".join(description).strip(), {k: " ".join(p for p in v if p) for k, v in args.items()}


def _parse_docstring(fn: Callable) -> tuple[str, dict[str, str]]:
    doc = inspect.getdoc(fn)
    return parse_google_docstring(doc) if doc else ("", {})


def _defined_at(fn: Callable) -> str:
    """Where a function is defined, for errors: "my_tools.py:12" (or "module.qualname" without a source file)."""
    try:
        path, line = inspect.getsourcefile(fn), inspect.getsourcelines(fn)[1]
        if path is None:
            raise OSError
        relative = os.path.relpath(path)
        return f"{path if relative.startswith('..') else relative}:{line}"
    except (TypeError, OSError):
        return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def _build_args_model(fn: Callable, name: str, has_session: bool) -> tuple[type[pydantic.BaseModel], dict]:
    sig = inspect.signature(fn)
    where = f"tool {name!r} ({_defined_at(fn)})"
    try:
        hints = inspect.get_annotations(fn, eval_str=True)
    except NameError as e:
        raise ToolDefinitionError(f"{where}: cannot resolve a type hint ({e}): import the type at module level"
                                  ) from None
    fields: dict[str, Any] = {}
    for pname, param in sig.parameters.items():
        if pname == "session" and has_session:
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ToolDefinitionError(f"{where}: *{'*' if param.kind is param.VAR_KEYWORD else ''}{pname} cannot "
                                      f"be described to a model (*args/**kwargs): name every parameter")
        if pname not in hints:
            default = param.default
            example = ("str" if default is inspect.Parameter.empty else "str | None" if default is None
                       else type(default).__name__)
            raise ToolDefinitionError(f"{where}: parameter {pname!r} needs a type hint, e.g. `{pname}: {example}`"
                                      f" (the hints become the JSON schema the model sees)")
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[pname] = (hints[pname], default)
    try:
        model = pydantic.create_model(f"{name}_arguments", __config__=pydantic.ConfigDict(extra="forbid"), **fields)
        schema = model.model_json_schema()
        schema = _strip_titles(_inline_refs(schema, schema.get("$defs", {})))
    except (TypeError, pydantic.PydanticUserError) as e:  # a type pydantic cannot describe, a recursive type
        raise ToolDefinitionError(f"{where}: its parameter types cannot become a JSON schema "
                                  f"({str(e).splitlines()[0]}): use str, int, float, bool, lists, dicts, "
                                  f"Literal, dataclasses or pydantic models") from None
    schema.pop("additionalProperties", None)
    schema.setdefault("properties", {})
    schema.setdefault("required", [])
    return model, schema


def tool(fn: Callable | None = None, *, name: str | None = None, description: str | None = None,
         session_factory: Callable[..., Any] | None = None, timeout_s: float | None = None,
         inline: bool = False) -> Any:
    """Turn a typed function (sync or async) into a `Tool`. Usable as `@tool` or `@tool(name=..., ...)`.

    - `session_factory(**kwargs)` (sync or async) builds per-session state; the function must then take a
      keyword-only `session` parameter, which is injected and hidden from the schema.
    - `timeout_s` bounds one run of the function (async functions and threaded sync ones).
    - `inline=True` runs a sync function on the event loop instead of a worker thread: only for fast, pure
      functions (a calculator), never for anything that blocks.
    """

    def wrap(f: Callable) -> Tool:
        if isinstance(f, Tool):
            return f
        tool_name = name or f.__name__
        params = inspect.signature(f).parameters
        has_session = "session" in params
        if has_session and session_factory is None:
            raise ToolDefinitionError(f"tool {tool_name!r} ({_defined_at(f)}) takes a `session` parameter but has "
                                      f"no session_factory: pass @tool(session_factory=...) or rename the parameter")
        if session_factory is not None and not has_session:
            raise ToolDefinitionError(f"tool {tool_name!r} ({_defined_at(f)}) has a session_factory but no "
                                      f"keyword-only `session` parameter: add `*, session` to its signature")
        if has_session and params["session"].kind is not inspect.Parameter.KEYWORD_ONLY:
            raise ToolDefinitionError(f"tool {tool_name!r} ({_defined_at(f)}): `session` must be keyword-only "
                                      f"(def {f.__name__}(..., *, session))")
        doc_description, arg_docs = _parse_docstring(f)
        model, parameters = _build_args_model(f, tool_name, has_session)
        for pname, text in arg_docs.items():
            if pname in parameters["properties"]:
                parameters["properties"][pname].setdefault("description", text)
        return Tool(name=tool_name, description=description or doc_description, fn=f, parameters=parameters,
                    args_model=model, session_factory=session_factory, timeout_s=timeout_s, inline=inline)

    return wrap(fn) if fn is not None else wrap


def as_tool(obj: Any) -> Tool:
    """A Tool from a Tool or a plain typed function (wrapped with default options)."""
    if isinstance(obj, Tool):
        return obj
    if callable(obj):
        return tool(obj)
    raise ToolDefinitionError(f"expected a function or a @tool, got {type(obj).__name__}: {str(obj)[:80]!r}")


__all__ = [
    "ERROR_KINDS",
    "INFRA_ERROR_KINDS",
    "POLICY_ERROR_KINDS",
    "ArgumentsError",
    "Tool",
    "ToolError",
    "ToolInfraError",
    "ToolResult",
    "as_tool",
    "parse_google_docstring",
    "tool",
]
