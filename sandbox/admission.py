"""Admission control: at most `max_concurrency` runs at once, a bounded queue with a wait timeout, then 503."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import AsyncIterator


class Overloaded(Exception):
    """No slot within the queue limits; the HTTP layer answers 503 with Retry-After."""

    def __init__(self, message: str, retry_after_s: int):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Admission:
    def __init__(self, max_concurrency: int, max_queue: int, queue_timeout_s: float):
        self.max_concurrency = max_concurrency
        self.max_queue = max_queue
        self.queue_timeout_s = queue_timeout_s
        self._slots = asyncio.Semaphore(max_concurrency)
        self.running = 0
        self.waiting = 0
        self.rejected = 0
        self._recent_s = 1.0  # moving average of a run's duration, for Retry-After

    def _retry_after(self) -> int:
        backlog = (self.waiting + self.running) / max(1, self.max_concurrency)
        return max(1, min(30, int(backlog * self._recent_s + 0.999)))

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        if self.running >= self.max_concurrency and self.waiting >= self.max_queue:
            self.rejected += 1
            raise Overloaded(f"sandbox busy: {self.running} running and {self.waiting} queued "
                             f"(max_queue {self.max_queue})", self._retry_after())
        self.waiting += 1
        try:
            await asyncio.wait_for(self._slots.acquire(), self.queue_timeout_s)
        except asyncio.TimeoutError:
            self.rejected += 1
            raise Overloaded(f"sandbox busy: no run slot within {self.queue_timeout_s:g} s",
                             self._retry_after()) from None
        finally:
            self.waiting -= 1
        self.running += 1
        started = time.monotonic()
        try:
            yield
        finally:
            self.running -= 1
            self._slots.release()
            self._recent_s = 0.9 * self._recent_s + 0.1 * (time.monotonic() - started)
