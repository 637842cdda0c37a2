"""Environments used by the tests through `agent.envs` (package.module:Class)."""

from __future__ import annotations

import asyncio

from agentrl.envs.base import StepResult

CLOSED: list[str] = []  # the `tag` of every environment closed, in order


class ScriptedEnv:
    """Answers turn i with observation "obs i" and reward rewards[i]; done after len(rewards) turns. `fail`:
    "constructor", "reset" or "step" raises there; "bad_reset", "bad_step", "no_reward" and
    "assistant_observation" return something malformed; "slow_step" sleeps."""

    def __init__(self, rewards: list[float] = (0.5,), fail: str = "", tag: str = "", role: str = "user"):
        if fail == "constructor":
            raise RuntimeError("cannot start the game server")
        self.rewards, self.fail, self.tag, self.role = list(rewards), fail, tag, role
        self.seen: list[dict] = []

    async def reset(self, task) -> list[dict]:
        if self.fail == "reset":
            raise ConnectionError("game server went away")
        if self.fail == "bad_reset":
            return "Start."
        return [{"role": "system", "content": "Play."}, {"role": "user", "content": "Start."}]

    async def step(self, message: dict):
        self.seen.append(message)
        if self.fail == "step":
            raise KeyError("board")
        if self.fail == "bad_step":
            return {"observation": []}
        if self.fail == "slow_step":
            await asyncio.sleep(30)
        if self.fail == "no_reward":
            return StepResult([{"role": "user", "content": "?"}], None)
        if self.fail == "assistant_observation":
            return StepResult([{"role": "assistant", "content": "I answer for you"}])
        i = len(self.seen) - 1
        done = i + 1 >= len(self.rewards)
        return StepResult([] if done else [{"role": self.role, "content": f"obs {i}"}], self.rewards[i], done,
                          {"turn": i})

    async def close(self) -> None:
        CLOSED.append(self.tag)


class NotAnEnv:
    def reset(self, task):  # not async
        return []
