"""Live sessions: creation under a cap, idle reaping, and lookup by id."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from dataclasses import dataclass, field

from sandbox.backends.base import Backend, SessionProcess


class SessionLimit(Exception):
    """The live-session cap is reached (HTTP 503)."""


class SessionNotFound(KeyError):
    """Unknown or already reaped session id (HTTP 404)."""


@dataclass
class Session:
    id: str
    language: str
    memory_mb: int
    idle_ttl_s: float
    proc: SessionProcess
    last_used: float = field(default_factory=time.monotonic)
    busy: int = 0


class SessionManager:
    def __init__(self, backend: Backend, max_sessions: int):
        self.backend = backend
        self.max_sessions = max_sessions
        self.sessions: dict[str, Session] = {}
        self._creating = 0
        self._reaper: asyncio.Task | None = None
        self.reaped = 0

    def start(self) -> None:
        self._reaper = asyncio.create_task(self._reap_loop())

    async def create(self, language: str, memory_mb: int, idle_ttl_s: float) -> Session:
        if len(self.sessions) + self._creating >= self.max_sessions:
            raise SessionLimit(f"{len(self.sessions)} live sessions (max_sessions {self.max_sessions}): delete "
                               "finished sessions or wait for idle ones to be reaped")
        self._creating += 1
        try:
            proc = await self.backend.open_session(language, memory_mb)
        finally:
            self._creating -= 1
        session = Session(secrets.token_hex(12), language, memory_mb, idle_ttl_s, proc)
        self.sessions[session.id] = session
        return session

    def get(self, session_id: str) -> Session:
        try:
            session = self.sessions[session_id]
        except KeyError:
            raise SessionNotFound(f"no session {session_id!r}: it was deleted, reaped after its idle TTL, or the "
                                  "service restarted; create a new one") from None
        session.last_used = time.monotonic()
        return session

    @contextlib.asynccontextmanager
    async def use(self, session_id: str):
        session = self.get(session_id)
        session.busy += 1
        try:
            yield session
        finally:
            session.busy -= 1
            session.last_used = time.monotonic()

    async def delete(self, session_id: str) -> None:
        session = self.sessions.pop(session_id, None)
        if session is None:
            raise SessionNotFound(f"no session {session_id!r}")
        await session.proc.close()

    async def _reap_loop(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            now = time.monotonic()
            for sid, s in list(self.sessions.items()):
                if not s.busy and now - s.last_used > s.idle_ttl_s:
                    self.sessions.pop(sid, None)
                    self.reaped += 1
                    with contextlib.suppress(OSError, RuntimeError):
                        await s.proc.close()

    async def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
        for sid in list(self.sessions):
            with contextlib.suppress(SessionNotFound):
                await self.delete(sid)
