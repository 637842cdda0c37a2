"""`python`: a stateful Python interpreter in the code sandbox, one sandbox session per episode session.

The session state is created on the episode's first `python` call (`POST /sessions` on the sandbox service)
and deleted when the episode session closes, so variables and imports persist across the episode's calls and
nothing leaks past it. Configure the sandbox with `{"python": {"sandbox_url": "http://host:port"}}` as the
service's `--tool-kwargs` or the in-process `tools_kwargs`, plus `"sandbox_token_file": PATH` for a sandbox
started with a token. A fault of the code (exception, time limit, memory
limit) is a normal observation for the model; a fault of the sandbox raises `ToolInfraError`, so the episode is
marked infra-failed instead of being trained on.
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
class PythonSession:
    client: SandboxClient
    session_id: str
    cell_timeout_s: float

    async def aclose(self) -> None:
        try:
            await self.client.delete_session(self.session_id)
        except (SandboxInfraError, SandboxRequestError) as e:  # the sandbox reaps idle sessions itself
            log.warning("could not delete sandbox session %s: %s", self.session_id, e)


async def python_session(sandbox_url: str | None = None, cell_timeout_s: float = 10.0, memory_limit_MB: int = 512,
                         idle_ttl_s: float = 600.0, sandbox_token_file: str | None = None) -> PythonSession:
    """Open one sandbox interpreter session (the `python` tool's per-episode state)."""
    if not sandbox_url:
        raise ValueError("the python tool needs a sandbox: tools_kwargs {'python': {'sandbox_url': "
                         "'http://127.0.0.1:8080'}} or `--tool-kwargs` on the service")
    client = _client(sandbox_url, sandbox_token_file)
    try:
        session_id = await client.create_session("python", memory_limit_MB=memory_limit_MB, idle_ttl_s=idle_ttl_s)
    except SandboxInfraError as e:
        raise ToolInfraError(str(e), kind=e.kind) from None
    except ServiceAuthError as e:  # our token is missing or wrong: never the model's fault
        raise ToolInfraError(str(e), kind="server_error") from None
    return PythonSession(client=client, session_id=session_id, cell_timeout_s=cell_timeout_s)


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
