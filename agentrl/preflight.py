"""Checks before any heavy work: what a typo in a config or on the command line can break, found in one pass.

`agentrl train` and `agentrl sft` call `check_train` / `check_sft` after the config loads and before Ray starts
or weights load; `agentrl eval` uses the same pieces. Checked: the model directory (config, weights, tokenizer),
every row of every data file (file, row number and field), reward specs, the tools every task names against the
tools the config serves (HTTP services are asked for their schemas, as training would at start), the packages of
the requested loggers, an explicit resume checkpoint. Every problem found is one line; `PreflightError` carries
them all and the command prints one `error:` line each. Cheap on purpose: no torch, no Ray, no model loading.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import json
from collections import defaultdict
from pathlib import Path

from agentrl.errors import UserError, one_line
from agentrl.types import Task

MAX_LINES = 3  # problems shown per file and check; the rest are counted in one more line
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")
LOGGER_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb"}  # trainer.loggers name -> package it imports


class PreflightError(UserError):
    """One or more problems found before starting; `problems` holds one line per problem."""

    def __init__(self, problems: list[str]):
        self.problems = [one_line(p) for p in problems]
        super().__init__("; ".join(self.problems))


def raise_problems(problems: list[str]) -> None:
    if problems:
        raise PreflightError(problems)


@dataclasses.dataclass
class TaskRows:
    """The tasks of one file with their 1-based row numbers, so messages name the file and the row."""

    path: str
    rows: list[tuple[int, Task]]


def _rows(numbers: list[int]) -> str:
    shown = ", ".join(map(str, numbers[:MAX_LINES]))
    more = f" and {len(numbers) - MAX_LINES} more" if len(numbers) > MAX_LINES else ""
    return f"row{'s' if len(numbers) > 1 else ''} {shown}{more}"


def _capped(lines: list[str], path: str, what: str) -> list[str]:
    if len(lines) <= MAX_LINES:
        return lines
    return lines[:MAX_LINES] + [f"{path}: {len(lines) - MAX_LINES} more {what}"]


def check_model_dir(path: str, key: str, *, tokenizer_path: str | None = None,
                    tokenizer_key: str = "model.tokenizer_path") -> list[str]:
    """A Hugging Face model directory: config.json, weights and a tokenizer (in `tokenizer_path` when given)."""
    if not path:
        return [f"{key} is not set; point it at a Hugging Face model directory (e.g. one built with "
                "`agentrl init-model runs/tiny-model`)"]
    p = Path(path)
    if not p.is_dir():
        state = "is a file, not a directory" if p.exists() else "does not exist"
        return [f"{key}: {p} {state}; build a model there with `agentrl init-model {p}` or fix the path"]
    problems = []
    config = p / "config.json"
    if not config.is_file():
        problems.append(f"{key}: {p} has no config.json, so it is not a Hugging Face model directory (expected "
                        "what save_pretrained or `agentrl init-model` writes)")
    elif not _json_object(config):
        problems.append(f"{key}: {config} is not a JSON object; rewrite it with save_pretrained")
    if not any(next(p.glob(pattern), None) for pattern in WEIGHT_PATTERNS):
        problems.append(f"{key}: {p} has no weights ({' or '.join(WEIGHT_PATTERNS)})")
    tok, tok_key = (Path(tokenizer_path), tokenizer_key) if tokenizer_path else (p, key)
    if not tok.is_dir():
        problems.append(f"{tok_key}: tokenizer directory {tok} does not exist")
    elif not any((tok / name).is_file() for name in TOKENIZER_FILES):
        problems.append(f"{tok_key}: {tok} has no tokenizer file (any of {', '.join(TOKENIZER_FILES)}); save one there "
                        "with tokenizer.save_pretrained or set model.tokenizer_path")
    return problems


def _json_object(path: Path) -> bool:
    try:
        return isinstance(json.loads(path.read_text(encoding="utf-8")), dict)
    except ValueError:  # not JSON, or not UTF-8
        return False


def read_task_files(paths: list[str], key: str) -> tuple[list[TaskRows], list[str]]:
    """Parse every row of every task file; returns the good rows per file and one line per problem."""
    from agentrl.data.tasks import TaskFileNotFoundError, TaskFormatError, read_tasks

    files, problems = [], []
    for path in paths:
        rows, bad = [], []
        try:
            for number, item in read_tasks(path):
                if isinstance(item, TaskFormatError):
                    bad.append(str(item))
                else:
                    rows.append((number, item))
        except TaskFileNotFoundError:
            problems.append(f"{key}: task file {path} does not exist; write it (`agentrl data make SUITE {path} "
                            "--split SPLIT --n N`) or fix the path")
            continue
        except TaskFormatError as e:
            problems.append(f"{key}: {e}")
            continue
        problems += _capped(bad, path, "malformed rows")
        if not rows and not bad:
            problems.append(f"{key}: task file {path} holds no task rows")
        files.append(TaskRows(path, rows))
    return files, problems


def check_rewards(files: list[TaskRows], reward_cfg, *, sandbox_key: str = "reward.sandbox_url") -> list[str]:
    """Every task's reward spec resolves to a function; code rewards (unit_tests, stdin_stdout) have a reachable
    sandbox."""
    from agentrl.agent_loop.rewards import SANDBOX_REWARDS, RewardSpecError, resolve_reward_fn
    from agentrl.config import ConfigError

    problems = []
    code_rows: dict[str, list[int]] = defaultdict(list)
    code_kinds: set[str] = set()
    for f in files:
        lines = []
        for number, task in f.rows:
            try:
                resolve_reward_fn(task.reward, reward_cfg, where=f"{f.path}:row {number}")
            except (RewardSpecError, ConfigError) as e:
                lines.append(str(e))
            if task.reward.get("type") in SANDBOX_REWARDS:
                code_rows[f.path].append(number)
                code_kinds.add(task.reward["type"])
        problems += _capped(lines, f.path, "rows with reward problems")
    if code_rows and reward_cfg.sandbox_url is None:
        path, numbers = next(iter(code_rows.items()))
        kinds = "/".join(sorted(code_kinds))
        problems.append(f"{sandbox_key} is not set, but {_rows(numbers)} of {path} have {kinds} rewards, which "
                        f"run in the sandbox; start one (`agentrl sandbox serve --port 8080`) and set {sandbox_key}")
    elif code_rows:
        problems += _check_sandbox(reward_cfg.sandbox_url, sandbox_key, reward_cfg.sandbox_token_file)
    return problems


def _check_sandbox(url: str, key: str, token_file: str | None = None) -> list[str]:
    from agentrl.auth import ServiceAuthError
    from sandbox.client import SandboxClient, SandboxInfraError

    async def ping() -> None:
        async with SandboxClient(url, timeout=10.0, retries=0, token_file=token_file) as client:
            await client.health()
            await client.ping()  # behind the sandbox's token, if it has one

    try:
        asyncio.run(ping())
    except ServiceAuthError as e:  # the token file is missing, or the sandbox refused it
        return [str(e)]
    except (SandboxInfraError, ValueError) as e:  # ValueError: a 4xx or non-JSON answer, so not a sandbox
        return [f"{key} {url}: no sandbox answers GET /health there ({e}); start one (`agentrl sandbox serve "
                "--port N`) or fix the url"]
    return []


def served_tools(tools, what: str = "tools") -> tuple[set[str] | None, list[str]]:
    """The tool names `tools` serve (the `tools:` section of a config, a `ToolsConfig`, or the path of a tools
    YAML), discovered as training discovers them (HTTP services answer GET /tools); (None, one line per failing
    service) when discovery fails. `what` names the setting in set-up errors."""
    return asyncio.run(_discover(tools, what))


async def _discover(tools, what: str) -> tuple[set[str] | None, list[str]]:
    from agentrl.tools.client import ToolRegistry

    failures = UserError  # every set-up error of the tools package (agentrl.tools.errors) is one
    try:
        if isinstance(tools, (str, Path)):
            registry = ToolRegistry.from_config(tools)
        else:
            registry = ToolRegistry.from_tools_config(tools)
    except (failures, ValueError) as e:  # unknown tools_kwargs, a bad functions entry, a missing tools YAML
        return None, [f"{what}: {e}"]
    try:
        try:
            await registry.start()
            return set(registry.names()), []
        except failures as e:
            first = str(e)
        # Discovery stops at the first failing service: ask each one alone, so every dead one is named at once.
        problems = []
        for backend in registry.backends:
            single = ToolRegistry([backend], subsets=registry.subsets,
                                  discovery_timeout_s=registry.discovery_timeout_s)
            try:
                await single.start()
            except failures as e:
                problems.append(str(e))
        return None, problems or [first]
    finally:
        await registry.aclose()  # closes every backend and the shared HTTP client


def check_task_tools(files: list[TaskRows], served: set[str]) -> list[str]:
    """Every tool a task names (in `tools` or `tools_kwargs`) is served; one line per file and missing set."""
    problems = []
    offered = ", ".join(sorted(served)) or "nothing"
    for f in files:
        by_missing: dict[tuple[str, ...], list[int]] = defaultdict(list)
        for number, task in f.rows:
            missing = tuple(sorted((set(task.tools or []) | set(task.tools_kwargs)) - served))
            if missing:
                by_missing[missing].append(number)
        lines = [f"{f.path}: {_rows(numbers)} use tool(s) {', '.join(missing)}, which the configured tools do not "
                 f"serve (they serve: {offered}); add them to the config's tools (tools.builtin, tools.services) "
                 "or fix the rows' tools" for missing, numbers in by_missing.items()]
        problems += _capped(lines, f.path, "sets of missing tools")
    return problems


def check_task_envs(files: list[TaskRows], agent_cfg) -> list[str]:
    """Every environment a task names is registered (built-in or `agent.envs`) and takes the row's kwargs; one
    line per file and problem."""
    from agentrl.envs.base import check_task_env

    problems = []
    for f in files:
        lines = []
        for number, task in f.rows:
            if task.env is None:
                continue
            try:
                check_task_env(task, agent_cfg.envs, f"{f.path}:row {number}")
            except UserError as e:
                lines.append(str(e) if str(e).startswith(str(f.path)) else f"{f.path}:row {number}: {e}")
        problems += _capped(list(dict.fromkeys(lines)), f.path, "environment problems")
    return problems


def check_loggers(loggers: list[str]) -> list[str]:
    """Each requested logger's package is installed (found, not imported: importing wandb is slow)."""
    return [f"trainer.loggers has {name!r} but the {LOGGER_PACKAGES[name]} package is not installed: "
            f"pip install -e '.[{name}]' (or pip install {LOGGER_PACKAGES[name]}), or drop it from trainer.loggers"
            for name in loggers if name in LOGGER_PACKAGES and importlib.util.find_spec(LOGGER_PACKAGES[name]) is None]


def check_resume(resume: str, run_dir: str) -> list[str]:
    """An explicit `trainer.resume` checkpoint is complete ("auto" and "never" need nothing)."""
    if resume in ("auto", "never"):
        return []
    from agentrl.trainer.checkpoint import resolve_resume  # imports torch: only for an explicit checkpoint

    try:
        resolve_resume(resume, run_dir)
    except FileNotFoundError as e:
        return [str(e)]
    return []


def check_train(cfg) -> None:
    """Everything `agentrl train` reads before it starts Ray (a `TrainConfig`); raises PreflightError."""
    problems = check_model_dir(cfg.model.path, "model.path", tokenizer_path=cfg.model.tokenizer_path)
    if not cfg.data.train_files:
        problems.append("data.train_files is empty; list the task files (.jsonl or .parquet), e.g. "
                        "data.train_files=[data/calc-train.jsonl]")
    train, train_problems = read_task_files(cfg.data.train_files, "data.train_files")
    val, val_problems = read_task_files(cfg.data.val_files, "data.val_files")
    problems += train_problems + val_problems + check_rewards(train + val, cfg.reward)
    served, tool_problems = served_tools(cfg.tools)
    problems += tool_problems
    if served is not None:
        problems += check_task_tools(train + val, served)
    problems += check_task_envs(train + val, cfg.agent)
    problems += check_loggers(cfg.trainer.loggers) + check_resume(cfg.trainer.resume, cfg.trainer.run_dir)
    raise_problems(problems)


def check_sft(cfg) -> None:
    """Everything `agentrl sft` reads before it loads weights (an `SFTConfig`); raises PreflightError."""
    from agentrl.data.demos import load_demos

    problems = check_model_dir(cfg.model.path, "model.path", tokenizer_path=cfg.model.tokenizer_path)
    if not cfg.data.train_files:
        problems.append("data.train_files is empty; list the demonstration files (`agentrl data demos SUITE "
                        "OUT.jsonl --n N` writes them), e.g. data.train_files=[data/calc-sft.jsonl]")
    for path in cfg.data.train_files:
        try:
            load_demos([path])
        except (FileNotFoundError, ValueError) as e:  # load_demos names the file, row and field
            problems.append(f"data.train_files: {e}")
    raise_problems(problems)


def check_output_path(path: str | Path, what: str, *, directory: bool = False) -> None:
    """Fail with one line when `path` cannot be written as a file (or a directory) because of what is there."""
    p = Path(path)
    if directory and p.exists() and not p.is_dir():
        raise UserError(f"{what} {p} exists and is a file; choose a directory path")
    if not directory and p.is_dir():
        raise UserError(f"{what} {p} is a directory; give a file path such as {p / 'tasks.jsonl'}")
    blocker = next((parent for parent in p.parents if parent.exists()), None)
    if blocker is not None and not blocker.is_dir():
        raise UserError(f"{what} {p}: {blocker} is a file, so nothing can be written below it")


__all__ = [
    "PreflightError",
    "TaskRows",
    "check_loggers",
    "check_model_dir",
    "check_output_path",
    "check_resume",
    "check_rewards",
    "check_sft",
    "check_task_tools",
    "check_train",
    "raise_problems",
    "read_task_files",
    "served_tools",
]
