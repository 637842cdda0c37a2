"""`skyrl_gym`: a SkyRL-Gym text environment (the `skyrl-gym` package, as its authors ship it) as an agentrl Env.

Task row: {"prompt": [...], "env": {"name": "skyrl_gym", "kwargs": {"env_id": "gsm8k_multi_turn",
"extras": {"reward_spec": {"ground_truth": "72"}, "max_turns": 3}, "env_config": {}}}}. The arguments are the
ones SkyRL's generator passes: `skyrl_gym.make(env_id, env_config=..., extras=...)`, where `extras` is the
dataset row's per-task data (reward_spec, extra_info, ...) and `env_config` the environment's own settings
(an OmegaConf mapping, as SkyRL's config gives it). Then `env.init(prompt)` writes the prompt and each
`env.step(text of the model's turn)` returns {"observations", "reward", "done", "metadata"}.

SkyRL-Gym environments are synchronous and may block (SQL, search, code execution): their calls run in a thread.
Needs `pip install -e '.[envs]'`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from agentrl.envs.base import StepResult
from agentrl.types import Task

try:
    import skyrl_gym
    from omegaconf import OmegaConf
except ImportError as e:  # one line, through the registry's "cannot import module" error
    raise ImportError(f"{e.name} is not installed; the skyrl_gym environment needs it: pip install -e '.[envs]' "
                      "(or pip install skyrl-gym)") from None


class SkyRLGymEnv:
    """One skyrl_gym environment instance per episode."""

    def __init__(self, env_id: str, extras: dict[str, Any] | None = None, env_config: dict[str, Any] | None = None):
        self.env = skyrl_gym.make(env_id, env_config=OmegaConf.create(env_config or {}), extras=extras or {})

    async def reset(self, task: Task) -> list[dict]:
        prompt, _ = await asyncio.to_thread(self.env.init, [dict(m) for m in task.prompt])
        return prompt

    async def step(self, message: dict) -> StepResult:
        out = await asyncio.to_thread(self.env.step, message["content"])
        return StepResult(observation=list(out["observations"] or []), reward=float(out["reward"]),
                          done=bool(out["done"]), info=dict(out.get("metadata") or {}))

    async def close(self) -> None:
        await asyncio.to_thread(self.env.close)


__all__ = ["SkyRLGymEnv"]
