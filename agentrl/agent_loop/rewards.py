"""Reward functions: Episode -> float, chosen by `task.reward["type"]`.

Built in: "exact_match" (normalised string equality), "numeric" (float within a tolerance), "unit_tests" (the
answer's code then the task's tests, run in the sandbox under a harness that proves every test passed) and
"stdin_stdout" (the program's stdout for each case's stdin); both code rewards go through
`agentrl.agent_loop.code_tests` and record why a run failed in `episode.metrics["reward_info"]`. Extra types come from
`reward.custom` ({name: "module:fn"}, checked at config load) or directly as `"type": "module:fn"` in the task.

A reward function has the signature `fn(task, episode, config) -> float` and may be async. `score_episode` tells
whose fault a failure is. The sandbox failing under a code reward (`SandboxInfraError`: unreachable, 5xx, overloaded)
is an infrastructure fault: the episode is marked `infra_error` and left out, like a tool service that is down.
Any other exception is the reward code's own bug (a user's `module:fn`, a bad spec, a non-finite value): by
default (`reward.on_error: raise`) it stops the caller with a `RewardError` naming the reward, the task and the
exception, since a broken grader must not train the policy; "zero" scores the episode 0 and "drop" flags it so the
trainer leaves its group out (`reward_failed`); both keep the error in `metrics["reward_error"]`.

Answers are read from the final assistant message: `<answer>...</answer>` (the last one), falling back to the
whole text, or as `reward.answer_from` says; for unit tests the last ```python block, else the answer.
Only an episode that ended on its own has a final answer (`answer_text`): one cut off by a length, turn or time
limit scores 0 with every built-in reward, whatever its unfinished last message holds. Otherwise a right answer
followed by tokens that never end the turn scores 1, and RL reinforces those tokens: measured in the quickstart,
where 41% of lookup rollouts came to run on past `</answer>` to the length limit (docs/quickstart.md).
`reward.score_unfinished: true` scores such messages as they are.

The code rewards run each distinct program once (`VerdictCache`): a GRPO group's samples often write the same
code (in the code-suite quickstart 9,656 rollouts held 2,455 distinct answers per group), and every copy gets the
verdict of one sandbox run under the same harness, tests and limits, marked `reward_info["reused"]`. A verdict
that depends on the machine's load (a timeout, a run that left no report) is never reused;
`reward.reuse_verdicts: false` runs every copy.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import math
import re
import traceback
from collections import OrderedDict
from fractions import Fraction
from pathlib import Path
from typing import Awaitable, Callable, Protocol

from agentrl.agent_loop.config import RewardConfig, check_reward_fn
from agentrl.auth import ServiceAuthError
from agentrl.config import import_object
from agentrl.errors import UserError
from agentrl.types import Episode, Task
from sandbox.client import SandboxInfraError

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_PYTHON_BLOCK = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)
_NUMBER = re.compile(r"[-+]?(?:\d[\d,]*\.?\d*|\.\d+)(?:[eE][-+]?\d+)?(?:\s*/\s*\d+)?")


class RewardFn(Protocol):
    def __call__(self, task: Task, episode: Episode, config: RewardConfig) -> float | Awaitable[float]: ...


class RewardSpecError(ValueError):
    """A task's reward spec is unusable (unknown type, missing field); the message names the task and the fix."""


def final_text(episode: Episode) -> str:
    """Content of the last assistant message ("" when the model never answered)."""
    for message in reversed(episode.messages):
        if message.get("role") == "assistant":
            return message.get("content") or ""
    return ""


# Episode.finish_reason of an episode whose last assistant message ended its turn (end-of-turn or eos token)
FINISHED = "stop"


def answer_text(episode: Episode, config: RewardConfig) -> str | None:
    """The final assistant message, as the answer the built-in rewards score; None when the episode did not end
    on its own (truncated at a length limit, out of turns or time), unless `reward.score_unfinished`."""
    if episode.finish_reason != FINISHED and not config.score_unfinished:
        return None
    return final_text(episode)


def _answer(episode: Episode, config: RewardConfig) -> str | None:
    """The answer string of a finished episode per `reward.answer_from`; None when there is none."""
    text = answer_text(episode, config)
    return None if text is None else extract_answer(text, config.answer_from)


def _no_code(episode: Episode, text: str | None) -> str:
    """Why a code reward found nothing to run; `text` is `answer_text`'s result."""
    return "the answer has no code" if text is not None else \
        f"the episode did not finish its answer ({episode.finish_reason})"


def extract_answer(text: str, answer_from: str) -> str | None:
    """The answer string per `answer_from`; None when "answer_tag_strict" finds no tag."""
    if answer_from == "final_text":
        return text.strip()
    tags = _ANSWER.findall(text)
    if tags:
        return tags[-1].strip()
    return None if answer_from == "answer_tag_strict" else text.strip()


def _normalise(s: str) -> str:
    return " ".join(s.split()).casefold()


def exact_match(task: Task, episode: Episode, config: RewardConfig) -> float:
    """1.0 when the answer equals `ground_truth` (or one of a list) after whitespace/case normalisation;
    `"case_sensitive": true` in the spec keeps case."""
    spec = task.reward
    answer = _answer(episode, config)
    if answer is None:
        return 0.0
    truths = spec["ground_truth"] if isinstance(spec["ground_truth"], list) else [spec["ground_truth"]]
    if spec.get("case_sensitive", False):
        return float(any(" ".join(answer.split()) == " ".join(str(t).split()) for t in truths))
    return float(any(_normalise(answer) == _normalise(str(t)) for t in truths))


def parse_number(text: str) -> float | None:
    """The last number in `text` ("1,234.5", "-3e2", "3/4" and "$12" read as numbers); None if there is none."""
    found = _NUMBER.findall(text)
    if not found:
        return None
    raw = found[-1].replace(",", "").replace(" ", "")
    try:
        return float(Fraction(raw)) if "/" in raw else float(raw)
    except (ValueError, ZeroDivisionError):
        return None


def numeric(task: Task, episode: Episode, config: RewardConfig) -> float:
    """1.0 when the answer's last number is within `tolerance` (absolute and relative, default 1e-6) of
    `ground_truth`."""
    spec = task.reward
    answer = _answer(episode, config)
    if answer is None:
        return 0.0
    got = parse_number(answer)
    truth = parse_number(str(spec["ground_truth"]))
    if truth is None:
        raise RewardSpecError(f"task {task.task_id!r}: numeric ground_truth {spec['ground_truth']!r} is not a number")
    if got is None:
        return 0.0
    tol = float(spec.get("tolerance", 1e-6))
    return float(math.isclose(got, truth, rel_tol=tol, abs_tol=tol))


def extract_code(text: str, answer_from: str) -> str | None:
    blocks = _PYTHON_BLOCK.findall(text)
    if blocks:
        return blocks[-1]
    return extract_answer(text, answer_from)


def _sandbox_url(task: Task, config: RewardConfig) -> str:
    if config.sandbox_url is None:
        raise RewardSpecError(f"task {task.task_id!r} has a {task.reward['type']} reward but reward.sandbox_url is "
                              "not set (e.g. reward.sandbox_url=http://127.0.0.1:8080)")
    return config.sandbox_url


def _token(config: RewardConfig) -> dict:
    """The sandbox token keyword of the code_tests runners, given only when the sandbox has a token."""
    return {"token_file": config.sandbox_token_file} if config.sandbox_token_file else {}


def _record(episode: Episode, report, reused: bool = False) -> float:
    """Keep why the run failed (which test, assertion or timeout) in the episode record; return the reward."""
    episode.metrics["reward_info"] = report.to_dict() | ({"reused": True} if reused else {})
    return report.reward


class VerdictCache:
    """Sandbox verdicts by program: identical (code, tests, limits) run once, in flight or done.

    Bounded (least recently used out). Copies that arrive while the first run is in flight wait for it; if that run
    raises, is cancelled or is not kept, one of them runs it again. Verdicts whose kind depends on the machine's
    load (`UNSTABLE`) are not kept."""

    UNSTABLE = frozenset({"timeout", "no_proof"})

    def __init__(self, size: int = 4096):
        self.size = size
        self._done: OrderedDict[str, object] = OrderedDict()
        self._running: dict[str, asyncio.Future] = {}

    @staticmethod
    def key(*parts) -> str:
        return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()

    async def run(self, key: str, run_once: Callable[[], Awaitable]) -> tuple[object, bool]:
        """(report, reused): the kept or in-flight verdict for `key`, else `await run_once()`."""
        loop = asyncio.get_running_loop()
        while True:
            if key in self._done:
                self._done.move_to_end(key)
                return self._done[key], True
            pending = self._running.get(key)
            if pending is None or pending.get_loop() is not loop:
                break
            report = await asyncio.shield(pending)
            if report is not None:
                return report, True
            # that run raised, was cancelled or is not kept: run it (or wait behind the copy that now does)
        future = loop.create_future()
        self._running[key] = future
        report = None
        try:
            report = await run_once()
            return report, False
        finally:
            stable = report is not None and report.kind not in self.UNSTABLE
            if self._running.get(key) is future:
                del self._running[key]
            future.set_result(report if stable else None)
            if stable:
                self._done[key] = report
                while len(self._done) > self.size:
                    self._done.popitem(last=False)


VERDICTS = VerdictCache()


async def _verdict(config: RewardConfig, parts: tuple, run_once: Callable[[], Awaitable]) -> tuple[object, bool]:
    if not config.reuse_verdicts:
        return await run_once(), False
    return await VERDICTS.run(VerdictCache.key(*parts), run_once)


async def unit_tests(task: Task, episode: Episode, config: RewardConfig) -> float:
    """1.0 when the harness proves that the answer's code ran and every test statement in `tests` passed.

    Scored by `agentrl.agent_loop.code_tests.run_unit_tests` (early exits, "always equal" objects and the other
    known hacks score 0); the outcome is in `episode.metrics["reward_info"]`. A sandbox fault (unreachable,
    5xx, SandboxError after retries) raises, so the episode becomes infra_error.
    """
    from agentrl.agent_loop.code_tests import TestReport, rewrite_tests, run_unit_tests

    spec = task.reward
    url = _sandbox_url(task, config)
    total = len(rewrite_tests(spec["tests"]).statements)
    text = answer_text(episode, config)
    code = None if text is None else extract_code(text, config.answer_from)
    if not code or not code.strip():
        return _record(episode, TestReport(0, total, "no_code", error=_no_code(episode, text)))
    entry_point = spec.get("entry_point")
    if entry_point and not re.search(rf"\b{re.escape(entry_point)}\b", code):
        # The required function is not even mentioned: skip the sandbox round trip.
        return _record(episode, TestReport(0, total, "no_code", error=f"the code never mentions {entry_point!r}"))
    report, reused = await _verdict(
        config, ("unit_tests", url, code, spec["tests"], config.unit_tests_timeout_s),
        lambda: run_unit_tests(url, code, spec["tests"], timeout_s=config.unit_tests_timeout_s, **_token(config)))
    return _record(episode, report, reused)


def extract_program(text: str, language: str, answer_from: str) -> str | None:
    """The last fenced block of `language` (```cpp / ```c++ for cpp), else the last python-or-bare block, else
    the answer."""
    if language == "python":
        return extract_code(text, answer_from)
    tags = {"cpp": "cpp|c\\+\\+|cc|cxx", "c": "c"}.get(language, re.escape(language))
    blocks = re.findall(rf"```(?:{tags})[ \t]*\n(.*?)```", text, re.DOTALL)
    if blocks:
        return blocks[-1]
    return extract_code(text, answer_from)


async def stdin_stdout(task: Task, episode: Episode, config: RewardConfig) -> float:
    """1.0 when the program, run once per case with `input` on stdin, prints each case's `output`
    (whitespace-normalised) and exits 0 within `timeout_s` (default reward.unit_tests_timeout_s).

    Spec: {"type": "stdin_stdout", "cases": [{"input": ..., "output": ...}], "language": "python" | "cpp"}.
    """
    from agentrl.agent_loop.code_tests import TestReport, run_stdin_stdout

    spec = task.reward
    url = _sandbox_url(task, config)
    cases = spec["cases"]
    if not isinstance(cases, list) or not all(isinstance(c, dict) and "output" in c for c in cases):
        raise RewardSpecError(f"task {task.task_id!r}: stdin_stdout cases must be a list of "
                              "{'input': ..., 'output': ...} mappings")
    language = spec.get("language", "python")
    text = answer_text(episode, config)
    code = None if text is None else extract_program(text, language, config.answer_from)
    if not code or not code.strip():
        return _record(episode, TestReport(0, len(cases), "no_code", error=_no_code(episode, text)))
    timeout = float(spec.get("timeout_s", config.unit_tests_timeout_s))
    report, reused = await _verdict(
        config, ("stdin_stdout", url, code, cases, language, timeout),
        lambda: run_stdin_stdout(url, code, cases, language=language, timeout_s=timeout, **_token(config)))
    return _record(episode, report, reused)


def env_only(task: Task, episode: Episode, config: RewardConfig) -> float:
    """Reward type "env" (the default of a task row with `env`): no outcome score; the environment's per-turn
    rewards (`Episode.turn_rewards`, added by the rollout to every episode's reward) are the whole return."""
    return 0.0


REWARDS: dict[str, Callable] = {"exact_match": exact_match, "numeric": numeric, "unit_tests": unit_tests,
                                 "stdin_stdout": stdin_stdout, "env": env_only}
SANDBOX_REWARDS = frozenset({"unit_tests", "stdin_stdout"})  # reward types that run code in the sandbox
_REQUIRED_FIELDS = {"exact_match": ("ground_truth",), "numeric": ("ground_truth",), "unit_tests": ("tests",),
                    "stdin_stdout": ("cases",), "env": ()}


def resolve_reward_fn(spec: dict, config: RewardConfig, where: str = "task") -> Callable:
    """The function for one reward spec; raises RewardSpecError naming `where` and the fix."""
    if not isinstance(spec, dict) or not isinstance(spec.get("type"), str):
        raise RewardSpecError(f"{where}: reward must be a mapping with a 'type' string, got {spec!r}")
    kind = spec["type"]
    if kind == "verl":  # a row in verl's format, scored as verl scores it (imported here: that module imports this)
        from agentrl.agent_loop.verl_reward import resolve_verl_reward
        return resolve_verl_reward(spec, config, where)
    if kind in REWARDS:
        missing = [f for f in _REQUIRED_FIELDS[kind] if f not in spec]
        if missing:
            raise RewardSpecError(f"{where}: reward type {kind!r} needs field(s) {missing}")
        return REWARDS[kind]
    if kind in config.custom:
        return import_object(config.custom[kind], f"reward.custom.{kind}")
    if ":" in kind:
        fn = import_object(kind, f"{where}: reward type")
        check_reward_fn(fn, f"{where}: reward type {kind!r}")
        return fn
    known = sorted(REWARDS) + sorted(config.custom)
    raise RewardSpecError(f"{where}: unknown reward type {kind!r}; use one of {known}, a name listed in "
                          "reward.custom, or 'package.module:function'")


def check_reward_specs(tasks: list[Task], config: RewardConfig) -> None:
    """Fail before rolling out if any task's reward spec cannot be scored."""
    for i, task in enumerate(tasks):
        resolve_reward_fn(task.reward, config, where=f"task {i} ({task.task_id or 'no task_id'})")


async def compute_reward(task: Task, episode: Episode, config: RewardConfig) -> float:
    """Score one episode. Exceptions propagate (`score_episode` decides whose fault they are)."""
    fn = resolve_reward_fn(task.reward, config, where=f"task {task.task_id!r}")
    value = fn(task, episode, config)
    if inspect.isawaitable(value):
        value = await value
    value = float(value)
    if not math.isfinite(value):
        raise RewardSpecError(f"reward for task {task.task_id!r} is {value} (must be finite)")
    return value


class RewardError(UserError):
    """The reward code raised while scoring an episode (`reward.on_error: raise`): a bug in the grader, not an
    infrastructure fault. One line names the reward, the task and the exception (with the line that raised it);
    the trainer fills in `origin` (the task's file and row) and `log_file` (where it wrote the traceback)."""

    def __init__(self, reward: str, task: Task, error: BaseException):
        super().__init__(reward, task.task_id, error)
        self.reward, self.task, self.error = reward, task, error
        self.origin: str | None = None
        self.log_file: str | None = None

    def __str__(self) -> str:
        task = f"task {self.task.task_id!r}" if self.task.task_id else "a task without task_id"
        if self.origin:
            task += f" ({self.origin})"
        trace = f"traceback in {self.log_file}" if self.log_file else "AGENTRL_DEBUG=1 shows the traceback"
        return (f"reward {self.reward} raised {describe_exception(self.error)} on {task}; fix the reward function "
                f"({trace}), or set reward.on_error=zero (score such episodes 0) or reward.on_error=drop (leave "
                "their groups out)")


def describe_exception(error: BaseException) -> str:
    """`KeyError: 'answer' (my_rewards.py:12)`: the exception and the line that raised it, cut to one short line."""
    text = f"{type(error).__name__}: {error}"
    text = text if len(text) <= 300 else text[:297] + "..."
    frames = traceback.extract_tb(error.__traceback__)
    return f"{text} ({Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else text


def reward_name(spec: dict, config: RewardConfig) -> str:
    """How errors name a task's reward: `'parity' (train_rewards:first_token_parity)`, `'mod:fn'`, `'numeric'`."""
    kind = spec.get("type") if isinstance(spec, dict) else spec
    return f"{kind!r} ({config.custom[kind]})" if kind in config.custom else repr(kind)


def reward_failed(episode: Episode) -> bool:
    """True when the episode's reward code raised and `reward.on_error` kept the episode (zero or drop)."""
    return "reward_error" in episode.metrics and not episode.infra_error


async def score_episode(task: Task, episode: Episode, config: RewardConfig) -> None:
    """Set `episode.reward`, deciding whose fault a failure is (see the module docstring): a sandbox fault marks
    the episode infra_error; the reward code's own exception raises `RewardError` or, per `reward.on_error`,
    scores 0 with `metrics["reward_error"]` set."""
    try:
        episode.reward = await compute_reward(task, episode, config)
    except SandboxInfraError as e:  # the sandbox failed, not the grader
        episode.reward, episode.infra_error = 0.0, True
        episode.metrics["reward_error"] = f"{type(e).__name__}: {e}"
        episode.metrics["infra_detail"] = f"sandbox ({e.kind}): {e}"
    except ServiceAuthError:  # the sandbox refused our token: a setting to fix, whatever reward.on_error says
        raise
    except Exception as e:  # noqa: BLE001 -- boundary: whatever the user's reward code raises is its own bug
        if config.on_error == "raise":
            raise RewardError(reward_name(task.reward, config), task, e) from e
        episode.reward = 0.0
        episode.metrics["reward_error"] = describe_exception(e)


__all__ = ["RewardFn", "RewardSpecError", "RewardError", "REWARDS", "SANDBOX_REWARDS", "VERDICTS", "VerdictCache",
           "compute_reward", "describe_exception", "reward_failed", "reward_name", "score_episode",
           "check_reward_specs", "resolve_reward_fn", "answer_text", "extract_answer", "extract_code",
           "extract_program", "final_text", "parse_number", "exact_match", "numeric", "unit_tests", "stdin_stdout"]
