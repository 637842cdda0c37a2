"""Which of several engine backends (SGLang servers, engine replicas) gets a request.

An episode's turns (same `session_id`) go to the backend that served its first turn, so that backend's prefix
cache holds the shared prefix; new sessions and session-less requests go to the backend with the fewest
requests in flight (ties taken in turn). A backend in `exclude` (tried already, or down) is never picked while
another is left; a session pinned to it moves to the one picked instead.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict

MAX_STICKY_SESSIONS = 100_000  # sessions remembered; the least recently used are forgotten first


class StickyRouter:
    def __init__(self, n: int, max_sessions: int = MAX_STICKY_SESSIONS):
        if n < 1:
            raise ValueError(f"a router needs at least one backend, got {n}")
        self.in_flight = [0] * n  # requests each backend holds now: the caller counts them up and down
        self.max_sessions = max_sessions
        self._sticky: OrderedDict[str, int] = OrderedDict()
        self._turn = itertools.count()

    def __len__(self) -> int:
        return len(self.in_flight)

    def pick(self, session_id: str | None, exclude: set[int] | frozenset[int] = frozenset()) -> int:
        """The backend for a request of `session_id` (None: no session). With every backend excluded, the
        least loaded of all."""
        if session_id is not None:
            idx = self._sticky.get(session_id)
            if idx is not None and idx not in exclude:
                self._sticky.move_to_end(session_id)
                return idx
        candidates = [i for i in range(len(self)) if i not in exclude] or list(range(len(self)))
        low = min(self.in_flight[i] for i in candidates)
        tied = [i for i in candidates if self.in_flight[i] == low]
        idx = tied[next(self._turn) % len(tied)]
        if session_id is not None:
            self._sticky[session_id] = idx
            self._sticky.move_to_end(session_id)
            while len(self._sticky) > self.max_sessions:
                self._sticky.popitem(last=False)
        return idx

    def pinned(self, session_id: str) -> int | None:
        """The backend `session_id` is pinned to (None before its first request)."""
        return self._sticky.get(session_id)


__all__ = ["MAX_STICKY_SESSIONS", "StickyRouter"]
