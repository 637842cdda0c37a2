"""Reward functions used by the tests through the `module:fn` escape hatch."""

from __future__ import annotations

import asyncio


def length_reward(task, episode, config) -> float:
    return float(len(episode.messages))


async def async_reward(task, episode, config) -> float:
    await asyncio.sleep(0)
    return 0.5


def raising_reward(task, episode, config) -> float:
    raise RuntimeError("grader crashed")


def wrong_arity(episode) -> float:
    return 0.0
