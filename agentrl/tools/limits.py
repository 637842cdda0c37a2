"""A concurrency limit usable from any event loop.

`asyncio.Semaphore` binds itself to the first loop that waits on it, so a registry built once and used from
two `asyncio.run` calls (scripts, data generation, tests) would fail with "bound to a different event loop".
`Limit` keeps one semaphore per running loop; within a loop it is an ordinary semaphore.
"""

from __future__ import annotations

import asyncio
import weakref


class Limit:
    def __init__(self, value: int):
        if value < 1:
            raise ValueError(f"a concurrency limit must be >= 1, got {value}")
        self.value = value
        self._per_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary())
        self._last: tuple[weakref.ref, asyncio.Semaphore] | None = None  # the latest loop's: skips the dict lookup

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        last = self._last
        if last is not None and last[0]() is loop:
            return last[1]
        sem = self._per_loop.get(loop)
        if sem is None:
            sem = self._per_loop[loop] = asyncio.Semaphore(self.value)
        self._last = (weakref.ref(loop), sem)
        return sem

    async def __aenter__(self) -> None:
        await self._semaphore().acquire()

    async def __aexit__(self, *exc: object) -> None:
        self._semaphore().release()


__all__ = ["Limit"]
