"""Task files -> `Task`s. JSONL or parquet; project rows and verl-style rows.

Project row:
    {"prompt": [messages], "tools": [names] | null, "reward": {"type": ..., "ground_truth": ..., ...},
     "data_source": str, "tools_kwargs": {tool: {...}}, "task_id": str, "extra": {...},
     "env": {"name": str, "kwargs": {...}}}
    A row with `env` is played against that environment (`agentrl.envs`) instead of tools: its `prompt` may be
    left out (the environment's reset() writes the prompt) and so may its `reward` (default {"type": "env"}:
    the environment's per-turn rewards are the whole return).
verl-style row (as written by verl's data preprocessing):
    {"prompt": [messages], "data_source": str, "reward_model": {"style": "rule", "ground_truth": ...},
     "extra_info": {"index": ..., "tools_kwargs": {...}, ...}, "agent_name": "tool_agent", "ability": ...}
    -> reward {"type": "verl", "ground_truth": ..., "data_source": ...}: scored as verl scores that data_source,
    or as reward.verl_reward_type / reward.custom_reward_function say (`agentrl.agent_loop.verl_reward`);
    `reward_model.style` must be "rule" (agentrl has no reward model); tools_kwargs from
    extra_info.tools_kwargs, each tool's "create_kwargs" unwrapped (they build the tool's per-episode state);
    tools: the row's own "tools" list if it has one, else the tools_kwargs keys (verl passes kwargs to exactly
    the tools an episode uses), else None (every configured tool); extra_info, agent_name and ability are kept
    in `Task.extra`.

A malformed row raises `TaskFormatError` naming the file, the 1-based row number and the field; a missing file
raises `TaskFileNotFoundError`. `read_tasks` yields every row's Task or error, so a checker reports them all.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

from agentrl.errors import UserError, one_line
from agentrl.types import Task

_ROLES = ("system", "user", "assistant", "tool")
_PROJECT_FIELDS = {"prompt", "tools", "reward", "data_source", "tools_kwargs", "task_id", "extra", "env"}
_ENV_FIELDS = {"name", "kwargs"}


class TaskFormatError(UserError, ValueError):
    """A task row is malformed; the message names the file, the row and the field."""


class TaskFileNotFoundError(UserError, FileNotFoundError):
    """A task file named in a config or on the command line does not exist."""


def read_tasks(path: str | Path, *,
               verl_reward_type: str = "verl") -> Iterator[tuple[int, Task | TaskFormatError]]:
    """(1-based row number, Task or the TaskFormatError of that row) for every row of a .jsonl or .parquet file.

    Raises TaskFileNotFoundError for a missing file and TaskFormatError for a file that cannot be read at all."""
    p = Path(path)
    if not p.is_file():
        raise TaskFileNotFoundError(f"task file {p} does not exist")
    for number, row in _read_parquet(p) if p.suffix == ".parquet" else _read_jsonl(p):
        if isinstance(row, TaskFormatError):
            yield number, row
            continue
        try:
            yield number, task_from_row(row, where=f"{p}:row {number}", verl_reward_type=verl_reward_type)
        except TaskFormatError as e:
            yield number, e


def load_tasks(path: str | Path, *, verl_reward_type: str = "verl", limit: int | None = None) -> list[Task]:
    """Read every row of a .jsonl/.json-lines or .parquet file as a Task (the first `limit` rows if given).

    `verl_reward_type`: the reward type verl rows get ("verl": by data_source, under the run's reward config)."""
    tasks = []
    for _, item in read_tasks(path, verl_reward_type=verl_reward_type):
        if limit is not None and len(tasks) >= limit:
            break
        if isinstance(item, TaskFormatError):
            raise item
        tasks.append(item)
    return tasks


def _read_jsonl(p: Path) -> Iterator[tuple[int, Any]]:
    """(row number, parsed row or the TaskFormatError of a line that is not JSON); blank lines are skipped."""
    with p.open(encoding="utf-8") as f:
        try:
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    yield number, json.loads(line)
                except json.JSONDecodeError as e:
                    yield number, TaskFormatError(f"{p}:row {number}: not valid JSON ({e.msg} at column {e.colno})")
        except UnicodeDecodeError:
            raise TaskFormatError(f"{p} is not UTF-8 text; a task file is JSONL (one JSON object per line) or "
                                  ".parquet") from None


def _read_parquet(p: Path) -> Iterator[tuple[int, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        rows = pq.read_table(p).to_pylist()
    except pa.ArrowException as e:
        raise TaskFormatError(f"{p} is not a readable parquet file ({one_line(str(e))[:200]})") from None
    yield from enumerate(rows, start=1)


def task_from_row(row: Any, *, where: str = "row", verl_reward_type: str = "verl") -> Task:
    """One row (dict) -> Task; `where` prefixes every error ("file:row N")."""
    if not isinstance(row, dict):
        raise TaskFormatError(f"{where}: a task row must be a JSON object, got {type(row).__name__}")
    if "reward_model" in row and "reward" not in row:
        return _verl_row(row, where, verl_reward_type)
    unknown = sorted(set(row) - _PROJECT_FIELDS)
    if unknown:
        raise TaskFormatError(f"{where}: unknown field(s) {unknown}; a task row has {sorted(_PROJECT_FIELDS)} "
                              "(or is a verl row with 'reward_model')")
    env = _env_field(row, where)
    if env is not None:
        row = {"reward": {"type": "env"}, "prompt": [], **row}
    if "reward" not in row:
        raise TaskFormatError(f"{where}: missing field 'reward' (e.g. {{\"type\": \"exact_match\", "
                              "\"ground_truth\": \"Paris\"}})")
    reward = row["reward"]
    if not isinstance(reward, dict) or not isinstance(reward.get("type"), str):
        raise TaskFormatError(f"{where}: field 'reward' must be an object with a 'type' string, got {reward!r}")
    # parquet rows carry every tool any row has kwargs for (None for the others)
    tools_kwargs = {name: kw for name, kw in _dict_field(row, "tools_kwargs", where).items() if kw is not None}
    return Task(
        prompt=_messages(row, where, allow_empty=env is not None),
        reward=reward,
        tools=_tools_field(row, where),
        data_source=_str_field(row, "data_source", where, default="unknown"),
        tools_kwargs=tools_kwargs,
        task_id=_str_field(row, "task_id", where, default=""),
        extra=_dict_field(row, "extra", where),
        env=env,
    )


def _env_field(row: dict, where: str) -> dict | None:
    """The row's {"name", "kwargs"} environment (kwargs default {}), or None."""
    env = row.get("env")
    if env is None:
        return None
    if not isinstance(env, dict) or not isinstance(env.get("name"), str) or not env["name"]:
        raise TaskFormatError(f"{where}: field 'env' must be an object with a 'name' string, e.g. "
                              f"{{\"name\": \"guess_number\", \"kwargs\": {{\"secret\": 3}}}}, got {env!r:.200}")
    unknown = sorted(set(env) - _ENV_FIELDS)
    if unknown:
        raise TaskFormatError(f"{where}: unknown field(s) {unknown} in 'env'; it has 'name' and 'kwargs'")
    kwargs = env.get("kwargs")
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, dict):
        raise TaskFormatError(f"{where}: field 'env.kwargs' must be an object, got {kwargs!r:.200}")
    return {"name": env["name"], "kwargs": kwargs}


def _verl_row(row: dict, where: str, reward_type: str) -> Task:
    spec = row["reward_model"]
    if not isinstance(spec, dict) or "ground_truth" not in spec:
        raise TaskFormatError(f"{where}: verl field 'reward_model' must be an object with 'ground_truth', got {spec!r}")
    if spec.get("style") not in (None, "rule"):
        raise TaskFormatError(f"{where}: verl field 'reward_model.style' is {spec['style']!r}; agentrl scores verl "
                              "rows by rule and has no reward model: set it to 'rule' and pick the score with "
                              "reward.verl_reward_type or reward.custom_reward_function")
    extra_info = row.get("extra_info") or {}
    if not isinstance(extra_info, dict):
        raise TaskFormatError(f"{where}: verl field 'extra_info' must be an object, got {type(extra_info).__name__}")
    tools_kwargs = extra_info.get("tools_kwargs") or {}
    if not isinstance(tools_kwargs, dict):
        raise TaskFormatError(f"{where}: verl field 'extra_info.tools_kwargs' must be an object, got {tools_kwargs!r}")
    # verl passes {"create_kwargs": {...}} to tool.create(); agentrl's per-session state takes those kwargs.
    # Parquet rows carry every tool any row has kwargs for, None for the tools this row does not use.
    tools_kwargs = {name: _create_kwargs(kw) for name, kw in tools_kwargs.items() if kw is not None}
    tools = _tools_field(row, where)
    if tools is None and tools_kwargs:
        tools = sorted(tools_kwargs)
    index = extra_info.get("index")
    extra = {"extra_info": extra_info}
    for key in ("agent_name", "ability"):
        if key in row:
            extra[key] = row[key]
    source = _str_field(row, "data_source", where, default="unknown")
    reward = {"type": reward_type, "ground_truth": spec["ground_truth"]}
    if reward_type == "verl":
        reward["data_source"] = source
    return Task(
        prompt=_messages(row, where),
        reward=reward,
        tools=tools,
        data_source=source,
        tools_kwargs=tools_kwargs,
        task_id="" if index is None else f"{source}-{index}",
        extra=extra,
    )


def _tools_field(row: dict, where: str) -> list[str] | None:
    tools = row.get("tools")
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, str) for t in tools)):
        raise TaskFormatError(f"{where}: field 'tools' must be a list of tool names or null, got {tools!r}")
    return tools


def _create_kwargs(kw: Any) -> Any:
    if isinstance(kw, dict) and "create_kwargs" in kw:
        return kw["create_kwargs"] or {}
    return kw


def _messages(row: dict, where: str, *, allow_empty: bool = False) -> list[dict]:
    if allow_empty and row["prompt"] in ([], None):
        return []
    if "prompt" not in row:
        raise TaskFormatError(f"{where}: missing field 'prompt' (a list of messages like "
                              "[{\"role\": \"user\", \"content\": \"...\"}])")
    prompt = row["prompt"]
    if not isinstance(prompt, list) or not prompt:
        raise TaskFormatError(f"{where}: field 'prompt' must be a non-empty list of messages, got {prompt!r:.200}")
    messages = []
    for i, m in enumerate(prompt):
        if not isinstance(m, dict):
            raise TaskFormatError(f"{where}: prompt[{i}] must be an object with 'role' and 'content'")
        if m.get("role") not in _ROLES:
            raise TaskFormatError(f"{where}: prompt[{i}].role is {m.get('role')!r}; expected one of {_ROLES}")
        if not isinstance(m.get("content"), str):
            raise TaskFormatError(f"{where}: prompt[{i}].content must be a string, got {m.get('content')!r:.80}")
        # parquet rows carry every struct field (None where absent); keep the message minimal
        messages.append({k: v for k, v in m.items() if v is not None})
    return messages


def _str_field(row: dict, key: str, where: str, *, default: str) -> str:
    value = row.get(key)
    if value is None:
        return default
    if not isinstance(value, str):
        raise TaskFormatError(f"{where}: field '{key}' must be a string, got {value!r}")
    return value


def _dict_field(row: dict, key: str, where: str) -> dict:
    value = row.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TaskFormatError(f"{where}: field '{key}' must be an object, got {value!r:.200}")
    return value


__all__ = ["TaskFileNotFoundError", "TaskFormatError", "load_tasks", "read_tasks", "task_from_row"]
