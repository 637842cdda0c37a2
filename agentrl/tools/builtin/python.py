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
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from dataclasses import dataclass

from agentrl.auth import ServiceAuthError
from agentrl.tools.base import ToolError, ToolInfraError, tool
from sandbox.client import SandboxClient, SandboxInfraError, SandboxRequestError, SessionNotFoundError, cell_to_text

log = logging.getLogger(__name__)

# One pooled sandbox client per (event loop, sandbox url, token file): sessions share connections; a client never
# crosses event loops (httpx clients are bound to the loop that first used them).
_CLIENTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[str, str | None], SandboxClient]] = (
    weakref.WeakKeyDictionary())
TOKEN_KEY = "tools_kwargs.python.sandbox_token_file"


def _client(sandbox_url: str, token_file: str | None) -> SandboxClient:
    per_loop = _CLIENTS.setdefault(asyncio.get_running_loop(), {})
    key = (sandbox_url, token_file)
    if key not in per_loop:
        per_loop[key] = SandboxClient(sandbox_url, token_file=token_file, token_key=TOKEN_KEY)
    return per_loop[key]


@dataclass
class _Source:
    """A fork source that ran a task's setup, and how many open episodes hold a fork of it."""

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
    source_key: tuple | None = None  # the fork source this session was forked from (a task's setup)

    async def aclose(self) -> None:
        try:
            await self.client.delete_session(self.session_id)
        except (SandboxInfraError, SandboxRequestError) as e:  # the sandbox reaps idle sessions itself
            log.warning("could not delete sandbox session %s: %s", self.session_id, e)
        if self.source_key is not None:
            await _release(self.client, self.source_key)


async def _release(client: SandboxClient, key: tuple) -> None:
    sources = _SOURCES.get(asyncio.get_running_loop(), {})
    source = sources.get(key)
    if source is None:
        return
    source.users -= 1
    if source.users == 0:
        del sources[key]
        try:
            await client.delete_session(source.session_id)
        except (SandboxInfraError, SandboxRequestError) as e:
            log.warning("could not delete sandbox fork source %s: %s", source.session_id, e)


async def _fork_prepared(client: SandboxClient, key: tuple, setup: str, setup_timeout_s: float,
                         memory_limit_MB: int, idle_ttl_s: float) -> str:
    """A fork of the source that ran `setup` (made, and the setup run, by the first caller for `key`)."""
    loop = asyncio.get_running_loop()
    sources = _SOURCES.setdefault(loop, {})
    async with _SOURCE_LOCKS.setdefault(loop, {}).setdefault(key, asyncio.Lock()):
        source = sources.get(key)
        if source is None:
            source_id = await client.create_session("python", memory_limit_MB=memory_limit_MB,
                                                    idle_ttl_s=idle_ttl_s, forkable=True)
            cell = await client.run_cell(source_id, setup, timeout=setup_timeout_s)
            if cell["status"] != "ok":
                await client.delete_session(source_id)
                raise ToolInfraError(f"the task's python setup failed ({cell['status']}): {cell_to_text(cell)[:500]}",
                                     kind="sandbox_error")
            source = sources[key] = _Source(source_id)
        source.users += 1
        try:
            (child,) = await client.fork(source.session_id, 1)
        except BaseException:
            await _release(client, key)
            raise
    return child


async def python_session(sandbox_url: str | None = None, cell_timeout_s: float = 10.0, memory_limit_MB: int = 512,
                         idle_ttl_s: float = 600.0, sandbox_token_file: str | None = None, setup: str | None = None,
                         setup_timeout_s: float = 120.0) -> PythonSession:
    """Open one sandbox interpreter session (the `python` tool's per-episode state): a fresh interpreter, or with
    `setup` a fork of the interpreter that ran it."""
    if not sandbox_url:
        raise ValueError("the python tool needs a sandbox: tools_kwargs {'python': {'sandbox_url': "
                         "'http://127.0.0.1:8080'}} or `--tool-kwargs` on the service")
    client = _client(sandbox_url, sandbox_token_file)
    key = (sandbox_url, sandbox_token_file, setup, memory_limit_MB) if setup else None
    try:
        if key is None:
            session_id = await client.create_session("python", memory_limit_MB=memory_limit_MB,
                                                     idle_ttl_s=idle_ttl_s)
        else:
            session_id = await _fork_prepared(client, key, setup, setup_timeout_s, memory_limit_MB, idle_ttl_s)
    except SandboxInfraError as e:
        raise ToolInfraError(str(e), kind=e.kind) from None
    except ServiceAuthError as e:  # our token is missing or wrong: never the model's fault
        raise ToolInfraError(str(e), kind="server_error") from None
    except SandboxRequestError as e:  # e.g. a sandbox without forkable sessions (no zygote)
        raise ToolInfraError(f"the python tool could not prepare the task's setup: {e}", kind="sandbox_error") from None
    return PythonSession(client=client, session_id=session_id, cell_timeout_s=cell_timeout_s, source_key=key)


@tool(session_factory=python_session)
async def python(code: str, *, session: PythonSession) -> str:
    """Run Python code in a persistent interpreter and return what it printed (stdout, stderr, errors).

    Variables, functions and imports persist between calls in the same conversation. Use print() to see values.

    Args:
        code: Python source code to execute.
    """
    try:
        cell = await session.client.run_cell(session.session_id, code, timeout=session.cell_timeout_s)
    except SandboxInfraError as e:
        raise ToolInfraError(str(e), kind=e.kind) from None
    except ServiceAuthError as e:
        raise ToolInfraError(str(e), kind="server_error") from None
    except SessionNotFoundError:
        raise ToolInfraError(f"the sandbox lost interpreter session {session.session_id} (restarted or expired)",
                             kind="sandbox_error") from None
    except SandboxRequestError as e:  # e.g. the code is over the sandbox's size limit: the model's doing
        raise ToolError(str(e)) from None
    return cell_to_text(cell)


__all__ = ["PythonSession", "python", "python_session"]
