"""A set of in-process tools with per-session state: what a tool service serves and what in-process registries call.

A session is opened with per-tool keyword arguments (the task's `tools_kwargs`, merged over the set's
defaults). The state of a stateful tool is created lazily, on the session's first call of that tool, so an
episode that never runs Python never pays for a sandbox session. Closing the session releases every state
(`aclose()` or `close()` on the state object). Sessions idle for longer than `idle_ttl_s` are released by
`sweep_idle()` so a client that crashed does not leak sandbox sessions forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from agentrl.tools.base import Tool, ToolInfraError, ToolResult, as_tool
from agentrl.tools.errors import ToolSpecError

log = logging.getLogger(__name__)


class UnknownSessionError(KeyError):
    """The session id is not open here (closed, expired, or the service restarted and lost it)."""


@dataclass
class _Session:
    tools_kwargs: dict[str, dict]
    states: dict[str, Any] = field(default_factory=dict)
    locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    last_used: float = field(default_factory=time.monotonic)
    in_flight: int = 0


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


async def release_state(state: Any) -> None:
    """Release one tool state: `aclose()` if it has one, else `close()`; errors are logged, not raised."""
    try:
        if hasattr(state, "aclose"):
            await state.aclose()
        elif hasattr(state, "close"):
            await _maybe_await(state.close())
    except Exception:
        log.exception("releasing tool state %r failed", type(state).__name__)


class ToolSet:
    """Named tools plus their sessions. `defaults` maps tool name -> session_factory kwargs for every session."""

    def __init__(self, tools: Iterable[Any], defaults: dict[str, dict] | None = None, idle_ttl_s: float = 3600.0):
        self.tools: dict[str, Tool] = {}
        for obj in tools:
            t = as_tool(obj)
            if t.name in self.tools:
                raise ToolSpecError(f"two tools are named {t.name!r}: give one another name with @tool(name=...)")
            self.tools[t.name] = t
        self.defaults = dict(defaults or {})
        unknown = sorted(set(self.defaults) - set(self.tools))
        if unknown:
            raise ToolSpecError(f"session defaults given for unknown tools {unknown}; known tools: "
                                f"{sorted(self.tools)}: fix the tool names in --tool-kwargs / tools_kwargs")
        self.idle_ttl_s = idle_ttl_s
        self.sessions: dict[str, _Session] = {}

    def names(self) -> list[str]:
        return list(self.tools)

    def schemas(self) -> list[dict]:
        return [t.schema() for t in self.tools.values()]

    def stateful_names(self) -> list[str]:
        return [n for n, t in self.tools.items() if t.stateful]

    def open_session(self, tools_kwargs: dict[str, dict] | None = None) -> str:
        tools_kwargs = dict(tools_kwargs or {})
        for name, kwargs in tools_kwargs.items():
            if not isinstance(kwargs, dict):
                raise ValueError(f"tools_kwargs[{name!r}] must be a mapping of keyword arguments, got "
                                 f"{type(kwargs).__name__}")
        session_id = uuid.uuid4().hex
        self.sessions[session_id] = _Session(tools_kwargs=tools_kwargs)
        return session_id

    async def close_session(self, session_id: str) -> bool:
        """Release the session's states; False if it was not open (closing twice is harmless)."""
        session = self.sessions.pop(session_id, None)
        if session is None:
            return False
        await asyncio.gather(*(release_state(s) for s in session.states.values()))
        return True

    async def sweep_idle(self) -> int:
        """Close sessions idle for longer than `idle_ttl_s`; returns how many were closed."""
        now = time.monotonic()
        stale = [sid for sid, s in self.sessions.items() if s.in_flight == 0 and now - s.last_used > self.idle_ttl_s]
        for sid in stale:
            log.warning("closing tool session %s after %.0fs idle (the client never closed it)", sid, self.idle_ttl_s)
            await self.close_session(sid)
        return len(stale)

    async def _state(self, t: Tool, session: _Session) -> Any:
        lock = session.locks.setdefault(t.name, asyncio.Lock())
        async with lock:  # two parallel first calls must not build two sandbox sessions
            if t.name not in session.states:
                kwargs = {**self.defaults.get(t.name, {}), **session.tools_kwargs.get(t.name, {})}
                session.states[t.name] = await _maybe_await(t.session_factory(**kwargs))
            return session.states[t.name]

    async def call(self, name: str, arguments: Any, session_id: str | None = None) -> ToolResult:
        """Run tool `name`. Raises UnknownSessionError for a session that is not open; never for tool faults.

        A stateful tool called without a session gets a one-call session, released right after.
        """
        t = self.tools.get(name)
        if t is None:
            return ToolResult.error("unknown_tool", f"Error: unknown tool '{name}'. Available tools: "
                                                    f"{', '.join(self.tools) or 'none'}.")
        if not t.stateful:
            return await t.invoke(arguments)
        ephemeral = session_id is None
        if ephemeral:
            session_id = self.open_session()
        session = self.sessions.get(session_id)
        if session is None:
            raise UnknownSessionError(session_id)
        session.in_flight += 1
        try:
            try:
                state = await self._state(t, session)
            except Exception as e:  # noqa: BLE001 - a state that cannot be built (sandbox down, bad kb_path)
                return _state_failure(t, e)
            return await t.invoke(arguments, state)
        finally:
            session.in_flight -= 1
            session.last_used = time.monotonic()
            if ephemeral:
                await self.close_session(session_id)

    async def aclose(self) -> None:
        for sid in list(self.sessions):
            with contextlib.suppress(Exception):
                await self.close_session(sid)


def _state_failure(t: Tool, e: Exception) -> ToolResult:
    if isinstance(e, ToolInfraError):
        return ToolResult.error(e.kind, f"Error: tool '{t.name}' could not start its session: {e}")
    # A factory that rejects its kwargs is a configuration fault (a task's tools_kwargs, the service's
    # defaults), never the policy's: treat it as infra so the episode is not trained on.
    return ToolResult.error("server_error", f"Error: tool '{t.name}' could not start its session: "
                                            f"{type(e).__name__}: {e}")


__all__ = ["ToolSet", "UnknownSessionError", "release_state"]
