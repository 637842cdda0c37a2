"""Tools served by the tool-service integration tests (`agentrl tools serve tests/integration/tools/toolbox.py:...`).

Module globals hold server-side measurements (in-flight counts, released sessions) that the tests read back
through the `stats` tool, so assertions are made on what the service really saw.
"""

from __future__ import annotations

import asyncio
from typing import Literal

from agentrl.tools import ToolError, tool

STATS = {"in_flight": 0, "max_in_flight": 0, "released": 0, "opened": 0}


@tool
def describe(name: str, count: int, ratio: float = 0.5, loud: bool = False, tags: list[str] | None = None,
             mode: Literal["short", "long"] = "short") -> str:
    """Describe a thing.

    Args:
        name: The thing's name.
        count: How many.
        ratio: A fraction.
        loud: Shout it.
        tags: Labels.
        mode: Output style.
    """
    text = f"{count} x {name} ratio={ratio} tags={','.join(tags or [])} mode={mode}"
    return text.upper() if loud else text


@tool
async def sleep_for(seconds: float) -> str:
    """Sleep, then answer.

    Args:
        seconds: How long.
    """
    await asyncio.sleep(seconds)
    return f"slept {seconds}"


@tool
def boom(message: str) -> str:
    """Always raises.

    Args:
        message: The error text.
    """
    raise RuntimeError(message)


@tool
def refuse(message: str) -> str:
    """Fails the expected way.

    Args:
        message: The error text.
    """
    raise ToolError(message)


@tool
async def probe(ms: float) -> str:
    """Hold a call open for `ms` milliseconds while counting calls in flight.

    Args:
        ms: How long to hold.
    """
    STATS["in_flight"] += 1
    STATS["max_in_flight"] = max(STATS["max_in_flight"], STATS["in_flight"])
    try:
        await asyncio.sleep(ms / 1000)
    finally:
        STATS["in_flight"] -= 1
    return "ok"


@tool
def stats(reset: bool = False) -> dict:
    """Server-side measurements.

    Args:
        reset: Zero the counters after reading.
    """
    out = dict(STATS)
    if reset:
        STATS.update(max_in_flight=0, released=0, opened=0)
    return out


class Counter:
    def __init__(self, start: int = 0):
        self.value = start
        STATS["opened"] += 1

    def close(self) -> None:
        STATS["released"] += 1


@tool(session_factory=Counter)
def count(step: int = 1, *, session: Counter) -> int:
    """Add `step` to this session's counter and return it.

    Args:
        step: How much to add.
    """
    session.value += step
    return session.value
