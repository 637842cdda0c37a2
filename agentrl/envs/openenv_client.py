"""`openenv`: an OpenEnv environment server (the openenv-core package's protocol) as an agentrl Env.

Each episode opens one session on the server through openenv-core's own `GenericEnvClient` (its WebSocket
session protocol: reset, step, close), so any OpenEnv server, local or remote, plays without installing its
package. Task row:

    {"prompt": [...], "env": {"name": "openenv", "kwargs": {"base_url": "http://127.0.0.1:8000",
     "action_field": "message", "observation_field": "echoed_message", "reset_kwargs": {"seed": 3}}}}

OpenEnv actions and observations are each environment's own JSON objects, so the text crosses as follows: the
model's turn becomes the action {action_field: text}; an observation becomes one user message holding its
`observation_field` (None: the whole observation as JSON, keys sorted). The reset observation, when it has text,
follows the task's prompt as a user message. The server's reward and done are the step's; the raw observation is
kept in the turn record (`info["observation"]`). Needs `pip install -e '.[envs]'`.
"""

from __future__ import annotations

import json
from typing import Any

from agentrl.envs.base import StepResult
from agentrl.types import Task

try:
    from openenv.core.generic_client import GenericEnvClient
except ImportError as e:  # one line, through the registry's "cannot import module" error
    raise ImportError(f"{e.name} is not installed; the openenv environment needs it: pip install -e '.[envs]' "
                      "(or pip install openenv-core)") from None


class OpenEnvEnv:
    """One server session per episode."""

    def __init__(self, base_url: str, action_field: str = "message", observation_field: str | None = None,
                 reset_kwargs: dict[str, Any] | None = None, message_timeout_s: float = 60.0):
        self.client = GenericEnvClient(base_url=base_url, message_timeout_s=message_timeout_s)
        self.action_field, self.observation_field = action_field, observation_field
        self.reset_kwargs = reset_kwargs or {}

    async def reset(self, task: Task) -> list[dict]:
        result = await self.client.reset(**self.reset_kwargs)
        text = self._text(result.observation)
        return [dict(m) for m in task.prompt] + ([{"role": "user", "content": text}] if text else [])

    async def step(self, message: dict) -> StepResult:
        result = await self.client.step({self.action_field: message["content"]})
        return StepResult(observation=[{"role": "user", "content": self._text(result.observation)}],
                          reward=float(result.reward or 0.0), done=bool(result.done),
                          info={"observation": result.observation})

    async def close(self) -> None:
        await self.client.close()

    def _text(self, observation: dict) -> str:
        if self.observation_field is not None:
            return str(observation.get(self.observation_field, ""))
        return json.dumps(observation, sort_keys=True, ensure_ascii=False)


__all__ = ["OpenEnvEnv"]
