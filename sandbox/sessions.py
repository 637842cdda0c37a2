"""Live sessions: creation under a cap, forks, idle reaping, and lookup by id.

A forked session lives in its source's pid namespace (fork_src.py): a source with live children is kept (not
reaped; a DELETE retires it) until its last child is gone, and counts against `max_sessions` until then."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from dataclasses import dataclass, field

from sandbox.backends.base import Backend, BackendError, ForkSourceGone, SessionProcess
from sandbox.snapshot import CellLog


class SessionLimit(Exception):
    """The live-session cap is reached (HTTP 503)."""


class SessionNotFound(KeyError):
    """Unknown or already reaped session id (HTTP 404)."""


class SessionConflict(Exception):
    """The session cannot do that now: fork a busy, dead or non-forkable session (HTTP 409)."""


@dataclass
class Session:
    id: str
    language: str
    memory_mb: int
    idle_ttl_s: float
    proc: SessionProcess
    log: CellLog  # the cells that built its interpreter's state (its snapshots carry them)
    last_used: float = field(default_factory=time.monotonic)
    busy: int = 0
    forkable: bool = False
    source: str | None = None  # the session it was forked from
    children: set[str] = field(default_factory=set)  # live sessions forked from it


class SessionManager:
    def __init__(self, backend: Backend, max_sessions: int, log_bytes: int):
        self.backend = backend
        self.max_sessions = max_sessions
        self.log_bytes = log_bytes  # per session: at most max_sessions of these logs are kept
        self.sessions: dict[str, Session] = {}
        self.retired: dict[str, Session] = {}  # deleted or reaped sources kept for their live children
        self._creating = 0
        self._reaper: asyncio.Task | None = None
        self.reaped = 0

    def start(self) -> None:
        self._reaper = asyncio.create_task(self._reap_loop())

    def _reserve(self, n: int) -> None:
        live = len(self.sessions) + len(self.retired) + self._creating
        if live + n > self.max_sessions:
            raise SessionLimit(f"{live} live sessions, {n} more asked (max_sessions {self.max_sessions}): delete "
                               "finished sessions or wait for idle ones to be reaped")
        self._creating += n

    async def create(self, language: str, memory_mb: int, idle_ttl_s: float, forkable: bool = False) -> Session:
        self._reserve(1)
        try:
            proc = await self.backend.open_session(language, memory_mb, forkable)
        finally:
            self._creating -= 1
        session = Session(secrets.token_hex(12), language, memory_mb, idle_ttl_s, proc, CellLog(self.log_bytes),
                          forkable=forkable)
        self.sessions[session.id] = session
        return session

    async def fork(self, session_id: str, n: int) -> list[Session]:
        """`n` sessions forked from `session_id` as it is now (each counts against max_sessions)."""
        source = self.get(session_id)
        if not source.forkable:
            raise SessionConflict(f"session {session_id!r} is not a fork source: create it with "
                                  "\"forkable\": true (forked sessions cannot be forked again)")
        if source.busy:
            raise SessionConflict(f"session {session_id!r} is running a cell: fork it between cells")
        dead = SessionConflict(f"session {session_id!r} is dead (its interpreter died: out of memory, exit or "
                               "kill): its state is lost; prepare a new source")
        if not source.proc.alive:
            raise dead
        self._reserve(n)
        source.busy += 1
        try:
            procs = await self.backend.fork_session(source.proc, n, source.memory_mb)
        except ValueError as e:
            raise SessionConflict(f"session {session_id!r} cannot be forked: {e}") from None
        except BackendError as e:  # it died before it could fork (killed while frozen between cells), perhaps
            if isinstance(e, ForkSourceGone) or not source.proc.alive:  # before its death reached its handle
                raise dead from None
            raise
        finally:
            self._creating -= n
            source.busy -= 1
            source.last_used = time.monotonic()
        children = [Session(secrets.token_hex(12), source.language, source.memory_mb, source.idle_ttl_s, proc,
                            source.log.copy(), source=source.id) for proc in procs]
        for child in children:
            self.sessions[child.id] = child
            source.children.add(child.id)
        return children

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
        await self._end(session)

    async def _end(self, session: Session) -> None:
        """Close a session that left `sessions`; a source with live children is retired until they end."""
        if session.children:
            self.retired[session.id] = session
            return
        await session.proc.close()
        source = self.sessions.get(session.source) or self.retired.get(session.source)
        if source is not None:
            source.children.discard(session.id)
            if not source.children and self.retired.pop(source.id, None) is not None:
                await self._end(source)

    async def _reap_loop(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            now = time.monotonic()
            for sid, s in list(self.sessions.items()):
                if not s.busy and not s.children and now - s.last_used > s.idle_ttl_s:
                    self.sessions.pop(sid, None)
                    self.reaped += 1
                    with contextlib.suppress(OSError, RuntimeError):
                        await self._end(s)

    async def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
        for sid in sorted(self.sessions, key=lambda sid: self.sessions[sid].source is None):  # children first
            with contextlib.suppress(SessionNotFound):
                await self.delete(sid)
