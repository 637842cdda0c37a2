"""The environment protocol: what answers a model's turns when a task names an `env` instead of tools.

An environment is a class whose instances run one episode each (gym style, async):

    env = Cls(**task.env["kwargs"])
    messages = await env.reset(task)               # the prompt: OpenAI-format messages
    result = await env.step(assistant_message)     # StepResult(observation, reward, done, info), per model turn
    await env.close()                              # always, however the episode ended

`EnvAgentLoop` (agentrl/envs/loop.py) drives it with the same token bookkeeping as the tool agent: the
observation messages are rendered by the chat template and get mask 0. Anything an environment raises is an
infrastructure fault (the episode is dropped from training), never a reward of 0.

Names: a task row's `env.name` is a built-in name (`BUILTIN_ENVS`) or one a config registers under `agent.envs`
(`name: package.module:Class`), checked against this protocol when the config loads.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from agentrl.config import ConfigError, import_object
from agentrl.errors import UserError
from agentrl.types import Task

BUILTIN_ENVS: dict[str, str] = {
    "guess_number": "agentrl.envs.guess_number:GuessNumberEnv",
    "skyrl_gym": "agentrl.envs.skyrl:SkyRLGymEnv",
    "openenv": "agentrl.envs.openenv_client:OpenEnvEnv",
}
OBSERVATION_ROLES = ("user", "tool", "system")  # what step() may write
PROMPT_ROLES = ("system", "user", "assistant")  # what reset() may write


@dataclass
class StepResult:
    """What an environment answers to one assistant message.

    observation: messages appended to the transcript (role user, tool or system; mask 0); may be empty only when
    `done`. reward: this turn's reward (Episode.turn_rewards). done: the episode is over. info: JSON values,
    kept in the episode's turn record (`Episode.turns[i]["env"]`)."""

    observation: list[dict] = field(default_factory=list)
    reward: float = 0.0
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Env(Protocol):
    async def reset(self, task: Task) -> list[dict]: ...

    async def step(self, message: dict) -> StepResult: ...

    async def close(self) -> None: ...


class UnknownEnvError(UserError, ValueError):
    """A task names an environment no config registers."""


def check_env_class(cls: Any, what: str) -> None:
    """Raise ConfigError unless `cls` is a class with async reset(task), step(message) and close()."""
    if not inspect.isclass(cls):
        raise ConfigError(f"{what} is not a class; give package.module:Class of an environment")
    for name, arity in (("reset", 1), ("step", 1), ("close", 0)):
        method = getattr(cls, name, None)
        if not inspect.iscoroutinefunction(method):
            raise ConfigError(f"{what} needs an async method {name}() (see agentrl.envs.base.Env)")
        try:
            inspect.signature(method).bind(None, *([None] * arity))
        except TypeError as e:
            raise ConfigError(f"{what}.{name} must take {arity} argument(s) besides self: {e}") from None


def check_env_names(registered: dict[str, str]) -> None:
    """`agent.envs`: each entry imports to an Env class and no entry shadows a built-in name."""
    for name, spec in registered.items():
        if name in BUILTIN_ENVS:
            raise ConfigError(f"agent.envs.{name} shadows the built-in environment {name!r} ({BUILTIN_ENVS[name]}); "
                              "register yours under another name")
        check_env_class(import_object(spec, f"agent.envs.{name}"), f"agent.envs.{name} ({spec})")


def env_class(name: str, registered: dict[str, str]) -> type:
    """The class a task's `env.name` stands for (imported now); UnknownEnvError naming the fix."""
    spec = registered.get(name) or BUILTIN_ENVS.get(name)
    if spec is None:
        raise UnknownEnvError(f"environment {name!r} is not registered (built-in: {sorted(BUILTIN_ENVS)}; "
                              f"agent.envs: {sorted(registered) or 'none'}); add agent.envs.{name}: "
                              "package.module:Class to the config or fix the task's env.name")
    cls = import_object(spec, f"environment {name!r}")
    check_env_class(cls, f"environment {name!r} ({spec})")
    return cls


def check_task_env(task: Task, registered: dict[str, str], where: str) -> None:
    """A task's env names a known class whose constructor accepts the task's kwargs; raises UserError."""
    cls = env_class(task.env["name"], registered)
    try:
        inspect.signature(cls).bind(**task.env["kwargs"])
    except TypeError as e:
        raise UnknownEnvError(f"{where}: env {task.env['name']!r} does not accept kwargs "
                              f"{sorted(task.env['kwargs'])}: {e}") from None


def make_env(spec: dict, registered: dict[str, str]) -> Env:
    """A new environment for one episode: Cls(**kwargs) for the task's {"name", "kwargs"}."""
    return env_class(spec["name"], registered)(**spec["kwargs"])


def check_messages(messages: Any, what: str, *, roles: tuple[str, ...], allow_empty: bool) -> list[dict]:
    """`messages` if it is a list of {"role": one of `roles`, "content": str} messages; else ValueError naming
    `what` (the environment call that returned it)."""
    if not isinstance(messages, list) or (not messages and not allow_empty):
        raise ValueError(f"{what} returned {messages!r:.120} instead of a non-empty list of messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("content"), str):
            raise ValueError(f"{what}: message {i} is not a dict with string 'content': {m!r:.120}")
        if m.get("role") not in roles:
            raise ValueError(f"{what}: message {i} has role {m.get('role')!r}, expected one of {roles}")
    return messages


__all__ = ["BUILTIN_ENVS", "Env", "StepResult", "UnknownEnvError", "check_env_class", "check_env_names",
           "check_messages", "check_task_env", "env_class", "make_env"]
