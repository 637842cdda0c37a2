"""`python`: a stateful Python interpreter in the code sandbox, one sandbox session per episode session.

The session state is created on the episode's first `python` call (`POST /sessions` on the sandbox service)
and deleted when the episode session closes, so variables and imports persist across the episode's calls and
nothing leaks past it. Configure the sandbox with `{"python": {"sandbox_url": "http://host:port"}}` as the
service's `--tool-kwargs` or the in-process `tools_kwargs`, plus `"sandbox_token_file": PATH` for a sandbox
started with a token. A fault of the code (exception, time limit, memory
limit) is a normal observation for the model; a fault of the sandbox raises `ToolInfraError`, so the episode is
marked infra-failed instead of being trained on.

A task may prepare the interpreter: `tools_kwargs: {"python": {"setup": "import numpy\ndata = ..."}}`. The setup
then runs once, in a fork source session (`forkable`), and each episode's interpreter is a fork of it
(`POST /sessions/{id}/fork`): a group of rollouts branches from one prepared state instead of rebuilding it n
times. The source is shared by every open episode with the same setup, sandbox and token, and deleted when the
last of them closes. A setup that fails is the task's fault, never the model's: an infra error.

An episode survives the loss of its interpreter (the sandbox service restarted, the session reaped): the tool
keeps a replay log of the cells that built the state and the latest snapshot of the session's work dir, taken
only after a cell that changed it (each cell's result says `workspace_changed`, a stamp of the work dir's file
metadata; an unchanged cell costs no snapshot). When the sandbox no longer knows the session, the tool opens a
new one in the episode's first state (fresh, or a fork of the setup) and restores it (`POST
/sessions/{id}/restore`): the cells are replayed first, then the snapshot's files are laid down, so the work dir
is exactly the snapshot's whatever the replay wrote (a cell that draws random numbers or reads the clock writes
other files when replayed; laid down first, the files would be overwritten by it); the interpreter's state comes
from the replay. The result's metrics say `sandbox_restored`, `replayed_cells`, `restored_files` and
`restore_diverged` (1 when the replay wrote other files than the snapshot holds: the interpreter's variables may
then disagree with the files). Each open episode holds its latest snapshot (at most the sandbox's
`snapshot_max_bytes`, base64) and its replay log (REPLAY_LOG_BYTES). A work dir past the sandbox's snapshot limits
is rebuilt by the replay alone. A state built by a timed-out cell (partial effects) is not rebuilt: the episode
is then an infra error, as it is for any lost session with `restore: false`. See sandbox/snapshot.py for what a
restore guarantees.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from dataclasses import dataclass, field
from typing import Awaitable, Callable

from agentrl.auth import ServiceAuthError
from agentrl.tools.base import ToolError, ToolInfraError, ToolResult, tool
from sandbox.client import SandboxClient, SandboxInfraError, SandboxRequestError, SessionNotFoundError, cell_to_text
from sandbox.snapshot import CellLog

log = logging.getLogger(__name__)

# One pooled sandbox client per (event loop, sandbox url, token file): sessions share connections; a client never
# crosses event loops (httpx clients are bound to the loop that first used them).
_CLIENTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[str, str | None], SandboxClient]] = (
    weakref.WeakKeyDictionary())
TOKEN_KEY = "tools_kwargs.python.sandbox_token_file"
# The replay log's bound: the sandbox's default snapshot_log_bytes, so a restore of its largest snapshot fits
# its request body limit. Past it, a lost interpreter cannot be rebuilt.
REPLAY_LOG_BYTES = 512 * 1024


def _client(sandbox_url: str, token_file: str | None) -> SandboxClient:
    per_loop = _CLIENTS.setdefault(asyncio.get_running_loop(), {})
    key = (sandbox_url, token_file)
    if key not in per_loop:
        per_loop[key] = SandboxClient(sandbox_url, token_file=token_file, token_key=TOKEN_KEY)
    return per_loop[key]


@dataclass
class _Source:
    """A fork source that ran a task's setup, and how many open episodes hold a fork of it."""

    key: tuple
    session_id: str
    users: int = 0


# Per event loop: (sandbox url, token file, setup, memory limit) -> its fork source, and a lock per key (a source
# forks one request at a time; the first episode runs the setup while the others wait).
_SOURCES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple, _Source]] = weakref.WeakKeyDictionary()
_SOURCE_LOCKS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple, asyncio.Lock]] = (
    weakref.WeakKeyDictionary())


@dataclass
class PythonSession:
    client: SandboxClient
    session_id: str
    cell_timeout_s: float
    reopen: Callable[[], Awaitable[tuple[str, _Source | None]]]  # a new interpreter in the episode's first state
    source: _Source | None = None  # the fork source this session was forked from (a task's setup)
    log: CellLog = field(default_factory=lambda: CellLog(REPLAY_LOG_BYTES))  # the cells that made the state
    restore_lost: bool = True  # rebuild a lost interpreter (the tool's `restore`)
    snapshot: str | None = None  # the work dir's latest snapshot (base64 tar); None: nothing to lay down
    snapshot_current: bool = True  # it holds the work dir as the last cell left it

    async def aclose(self) -> None:
        try:
            await self.client.delete_session(self.session_id)
        except (SandboxInfraError, SandboxRequestError) as e:  # the sandbox reaps idle sessions itself
            log.warning("could not delete sandbox session %s: %s", self.session_id, e)
        if self.source is not None:
            await _release(self.client, self.source)

    def record(self, code: str, cell: dict) -> None:
        """Keep the replay log in step with the interpreter's state after `cell`."""
        self.log.record(code, cell)
        if cell["restarted"] and self.source is not None:  # a fork's fresh interpreter is no fork of the setup
            self.log.replayable = False

    async def track_workspace(self, cell: dict) -> dict:
        """After a cell that changed the work dir, take its snapshot; metrics `workspace_snapshots` when taken.
        A snapshot that cannot be taken (past the sandbox's limits) leaves the replay alone to rebuild it."""
        changed = cell.get("workspace_changed")
        if not self.restore_lost or changed is False:
            return {}
        self.snapshot, self.snapshot_current = None, False
        if changed is None:  # past the sandbox's snapshot limits (or a sandbox without snapshots)
            return {}
        try:
            self.snapshot = (await self.client.snapshot(self.session_id))["workspace"]
        except (SandboxInfraError, SandboxRequestError) as e:  # the next cell finds out whether the session is lost
            log.info("no snapshot of sandbox session %s: %s", self.session_id, e)
            return {}
        self.snapshot_current = True
        return {"workspace_snapshots": 1}

    async def restore(self) -> dict:
        """The sandbox lost this interpreter (service restarted, session reaped): open a new one in the episode's
        first state, replay every cell that built the state, then lay down the latest snapshot's files; returns
        the metrics of the restore."""
        lost = f"the sandbox lost interpreter session {self.session_id}"
        if not self.restore_lost:
            raise ToolInfraError(f"{lost} (the python tool's restore is off)", kind="sandbox_error")
        if not self.log.replayable:
            raise ToolInfraError(f"{lost}, and its state cannot be rebuilt (a cell timed out, a forked interpreter "
                                 "restarted, or the cells passed the replay log's size)", kind="sandbox_error")
        if self.source is not None:
            await _release(self.client, self.source)
            self.source = None
        self.session_id, self.source = await self.reopen()
        workspace = self.snapshot if self.snapshot_current else None
        try:
            done = await self.client.restore(self.session_id, self.log.cells, workspace, timeout=self.cell_timeout_s)
        except SessionNotFoundError:
            raise
        except SandboxRequestError as e:  # a replayed cell timed out or restarted: not the model's doing now
            raise ToolInfraError(f"{lost}, and restoring it failed: {e}", kind="sandbox_error") from None
        metrics = {"sandbox_restored": 1, "replayed_cells": done["replayed_cells"]}
        if workspace is not None:
            metrics.update(restored_files=done["files"], restore_diverged=int(bool(done["diverged"])))
        return metrics


async def _release(client: SandboxClient, source: _Source) -> None:
    source.users -= 1
    if source.users > 0:
        return
    sources = _SOURCES.get(asyncio.get_running_loop(), {})
    if sources.get(source.key) is source:
        del sources[source.key]
    try:
        await client.delete_session(source.session_id)
    except (SandboxInfraError, SandboxRequestError) as e:
        log.warning("could not delete sandbox fork source %s: %s", source.session_id, e)


async def _fork_prepared(client: SandboxClient, key: tuple, setup: str, setup_timeout_s: float,
                         memory_limit_MB: int, idle_ttl_s: float) -> tuple[str, _Source]:
    """A fork of the source that ran `setup` (made, and the setup run, by the first caller for `key`; made again
    when the sandbox lost it)."""
    loop = asyncio.get_running_loop()
    sources = _SOURCES.setdefault(loop, {})
    async with _SOURCE_LOCKS.setdefault(loop, {}).setdefault(key, asyncio.Lock()):
        for attempt in range(2):
            source = sources.get(key)
            if source is None:
                source_id = await client.create_session("python", memory_limit_MB=memory_limit_MB,
                                                        idle_ttl_s=idle_ttl_s, forkable=True)
                cell = await client.run_cell(source_id, setup, timeout=setup_timeout_s)
                if cell["status"] != "ok":
                    await client.delete_session(source_id)
                    raise ToolInfraError(f"the task's python setup failed ({cell['status']}): "
                                         f"{cell_to_text(cell)[:500]}", kind="sandbox_error")
                source = sources[key] = _Source(key, source_id)
            source.users += 1
            try:
                (child,) = await client.fork(source.session_id, 1)
                return child, source
            except SessionNotFoundError:  # the sandbox lost the source (restarted): prepare a new one
                if sources.get(key) is source:
                    del sources[key]
                await _release(client, source)
                if attempt:
                    raise
            except BaseException:
                await _release(client, source)
                raise
    raise AssertionError("unreachable")


async def python_session(sandbox_url: str | None = None, cell_timeout_s: float = 10.0, memory_limit_MB: int = 512,
                         idle_ttl_s: float = 600.0, sandbox_token_file: str | None = None, setup: str | None = None,
                         setup_timeout_s: float = 120.0, restore: bool = True) -> PythonSession:
    """Open one sandbox interpreter session (the `python` tool's per-episode state): a fresh interpreter, or with
    `setup` a fork of the interpreter that ran it. `restore: false`: a lost interpreter ends the episode (an
    infra error) instead of being rebuilt, and no snapshots are taken."""
    if not sandbox_url:
        raise ValueError("the python tool needs a sandbox: tools_kwargs {'python': {'sandbox_url': "
                         "'http://127.0.0.1:8080'}} or `--tool-kwargs` on the service")
    client = _client(sandbox_url, sandbox_token_file)

    async def reopen() -> tuple[str, _Source | None]:
        if not setup:
            return await client.create_session("python", memory_limit_MB=memory_limit_MB, idle_ttl_s=idle_ttl_s), None
        key = (sandbox_url, sandbox_token_file, setup, memory_limit_MB)
        return await _fork_prepared(client, key, setup, setup_timeout_s, memory_limit_MB, idle_ttl_s)

    try:
        session_id, source = await reopen()
    except SandboxInfraError as e:
        raise ToolInfraError(str(e), kind=e.kind) from None
    except ServiceAuthError as e:  # our token is missing or wrong: never the model's fault
        raise ToolInfraError(str(e), kind="server_error") from None
    except SandboxRequestError as e:  # e.g. a sandbox without forkable sessions (no zygote)
        raise ToolInfraError(f"the python tool could not prepare the task's setup: {e}", kind="sandbox_error") from None
    return PythonSession(client=client, session_id=session_id, cell_timeout_s=cell_timeout_s, reopen=reopen,
                         source=source, restore_lost=restore)


@tool(session_factory=python_session)
async def python(code: str, *, session: PythonSession) -> str:
    """Run Python code in a persistent interpreter and return what it printed (stdout, stderr, errors).

    Variables, functions and imports persist between calls in the same conversation. Use print() to see values.

    Args:
        code: Python source code to execute.
    """
    metrics = {}
    try:
        try:
            cell = await session.client.run_cell(session.session_id, code, timeout=session.cell_timeout_s,
                                                 track_workspace=session.restore_lost)
        except SessionNotFoundError:  # the episode survives a lost interpreter: rebuilt, then the cell runs
            metrics = await session.restore()
            cell = await session.client.run_cell(session.session_id, code, timeout=session.cell_timeout_s,
                                                 track_workspace=session.restore_lost)
        session.record(code, cell)
        metrics.update(await session.track_workspace(cell))
    except SandboxInfraError as e:
        raise ToolInfraError(str(e), kind=e.kind) from None
    except ServiceAuthError as e:
        raise ToolInfraError(str(e), kind="server_error") from None
    except SessionNotFoundError:
        raise ToolInfraError(f"the sandbox lost interpreter session {session.session_id} again while it was "
                             "being restored", kind="sandbox_error") from None
    except SandboxRequestError as e:  # e.g. the code is over the sandbox's size limit: the model's doing
        raise ToolError(str(e)) from None
    return ToolResult(content=cell_to_text(cell), metrics=metrics) if metrics else cell_to_text(cell)


__all__ = ["PythonSession", "python", "python_session"]
