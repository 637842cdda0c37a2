"""MCP servers as tool services: discover and call tools over streamable HTTP with the official `mcp` SDK.

A registry entry `{kind: mcp, url: http://host:port/mcp}` becomes an `MCPToolService`. One MCP client
connection per service is owned by a background task (the SDK's transport lives in an anyio task group, which
must be entered and left by the same task); calls from any task are multiplexed over it. A connection that
breaks is rebuilt on the next call. Arguments are checked against the tool's input schema before sending, so
a malformed call is labelled `bad_arguments` (the policy's) rather than a generic tool error. MCP tools have no
per-episode state here: `is_stateful` is False.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from agentrl.errors import one_line
from agentrl.retry import backoff_delay
from agentrl.tools.base import ToolResult
from agentrl.tools.config import ServiceConfig, field_key
from agentrl.tools.errors import ToolServiceError
from agentrl.tools.limits import Limit

log = logging.getLogger(__name__)

CONNECTION_CLOSED = -32000  # JSON-RPC error code the SDK raises when the transport went away


def mcp_tool_to_openai(tool: Any) -> dict:
    """An MCP `Tool` (name, description, input_schema) as an OpenAI function schema."""
    params = dict(tool.input_schema or {"type": "object", "properties": {}})
    params.pop("title", None)
    for prop in (params.get("properties") or {}).values():
        if isinstance(prop, dict):
            prop.pop("title", None)
    return {"type": "function",
            "function": {"name": tool.name, "description": tool.description or "", "parameters": params}}


def _result_text(result: Any) -> str:
    parts = []
    for item in result.content or []:
        text = getattr(item, "text", None)
        parts.append(text if text is not None else f"[{getattr(item, 'type', 'content')} content]")
    if not parts and result.structured_content is not None:
        import json

        return json.dumps(result.structured_content, ensure_ascii=False)
    return "\n".join(parts)


def _leaf(error: BaseException | None) -> BaseException | None:
    """The first real error inside (possibly nested) anyio exception groups."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return error


class _Connection:
    """An open MCP client owned by one background task; `close()` asks that task to leave the context."""

    def __init__(self, url: str, timeout_s: float, headers: dict[str, str] | None = None):
        self.url = url
        self.timeout_s = timeout_s
        self.headers = dict(headers or {})
        self.client: Any = None
        self.ready = asyncio.Event()
        self.stop = asyncio.Event()
        self.error: BaseException | None = None
        self.task = asyncio.create_task(self._own(), name=f"mcp-client-{url}")

    async def _own(self) -> None:
        from mcp import Client

        try:
            async with contextlib.AsyncExitStack() as stack:
                server: Any = self.url
                if self.headers:  # e.g. Authorization: the SDK takes them on its own HTTP client
                    import httpx2
                    from mcp.client.streamable_http import streamable_http_client

                    http = await stack.enter_async_context(httpx2.AsyncClient(
                        headers=self.headers, timeout=httpx2.Timeout(30.0, read=300.0)))
                    server = streamable_http_client(self.url, http_client=http)
                client = await stack.enter_async_context(Client(server, read_timeout_seconds=self.timeout_s))
                self.client = client
                self.ready.set()
                await self.stop.wait()
        except BaseException as e:  # noqa: BLE001 - recorded for the caller; the connection is simply dead
            self.error = e
        finally:
            self.client = None
            self.ready.set()

    @property
    def alive(self) -> bool:
        return self.client is not None and not self.task.done()

    async def close(self) -> None:
        self.stop.set()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(self.task, 5.0)


class MCPToolService:
    """One MCP server. `key` is where it is configured (e.g. "tools.services[1]"), named in set-up errors."""

    def __init__(self, cfg: ServiceConfig, *, key: str = "services[?]"):
        self.cfg = cfg
        self.name = cfg.name
        self.key = key
        self.where = f"MCP server {cfg.name!r} at {cfg.url}"
        self.call_budget_s = cfg.call_budget_s
        self._own = Limit(cfg.max_concurrency)
        self._global: Limit | None = None
        self._conn: _Connection | None = None
        self._conn_lock = asyncio.Lock()
        self._validators: dict[str, Any] = {}
        self._headers = cfg.request_headers(key)

    async def _connection(self) -> _Connection:
        async with self._conn_lock:
            if self._conn is None or not self._conn.alive:
                if self._conn is not None:
                    await self._conn.close()
                conn = _Connection(self.cfg.url, self.cfg.timeout_s, self._headers)
                try:
                    await asyncio.wait_for(conn.ready.wait(), self.cfg.connect_timeout_s + self.cfg.timeout_s)
                except TimeoutError:
                    await conn.close()
                    raise ConnectionError(f"no MCP handshake within "
                                          f"{self.cfg.connect_timeout_s + self.cfg.timeout_s}s") from None
                if not conn.alive:
                    raise ConnectionError(f"{_leaf(conn.error)!r}")
                self._conn = conn
            return self._conn

    async def discover(self, limit: Limit) -> list[dict]:
        import jsonschema

        self._global = limit
        try:
            conn = await self._connection()
            tools, cursor = [], None
            while True:
                page = await conn.client.list_tools(cursor=cursor)
                tools.extend(page.tools)
                cursor = page.next_cursor
                if not cursor:
                    break
        except (ConnectionError, OSError) as e:
            raise ToolServiceError(f"{self.where} is unreachable ({one_line(str(e))[:200]}): start it or fix "
                                   f"{field_key(self.key, 'url')} (the streamable HTTP endpoint, usually "
                                   f"http://host:port/mcp)") from None
        schemas = []
        for t in tools:
            schema = mcp_tool_to_openai(t)
            try:
                cls = jsonschema.validators.validator_for(schema["function"]["parameters"])
                cls.check_schema(schema["function"]["parameters"])
            except jsonschema.SchemaError as e:
                raise ToolServiceError(f"{self.where}: tool {t.name!r} has an invalid input schema: "
                                       f"{one_line(e.message)[:200]}; fix the tool on that server") from None
            self._validators[t.name] = cls(schema["function"]["parameters"])
            schemas.append(schema)
        return schemas

    def is_stateful(self, tool: str) -> bool:
        return False

    async def open_session(self, tools_kwargs: dict[str, dict]) -> str:
        return ""  # never called: no MCP tool is stateful

    async def close_session(self, session_id: str) -> None:
        return None

    def _check_arguments(self, tool: str, arguments: Any) -> ToolResult | None:
        validator = self._validators.get(tool)
        if not isinstance(arguments, dict):
            return ToolResult.error("bad_arguments", f"Error: arguments for tool '{tool}' must be a JSON object")
        if validator is None:
            return None
        problems = [f"'{'.'.join(map(str, e.path)) or 'arguments'}': {e.message}"
                    for e in validator.iter_errors(arguments)]
        if problems:
            return ToolResult.error("bad_arguments", f"Error: bad arguments for tool '{tool}': {'; '.join(problems)}")
        return None

    async def call(self, tool: str, arguments: Any, session_id: str | None) -> ToolResult:
        bad = self._check_arguments(tool, arguments)
        if bad is not None:
            return bad
        attempt = 0
        while True:
            async with self._own, self._global or contextlib.nullcontext():  # own first: see remote._slot
                try:
                    conn = await self._connection()
                except (ConnectionError, OSError) as e:
                    failure = ToolResult.error("unreachable", f"Error: MCP server {self.name} is unreachable ({e})")
                else:
                    try:
                        async with asyncio.timeout(self.cfg.timeout_s):
                            result = await conn.client.call_tool(tool, arguments)
                    except TimeoutError:
                        return ToolResult.error("timeout", f"Error: MCP tool '{tool}' on {self.name} did not answer "
                                                           f"within {self.cfg.timeout_s}s")
                    except Exception as e:  # noqa: BLE001 - SDK/transport errors vary by version: infra
                        if getattr(e, "code", None) == CONNECTION_CLOSED or not conn.alive:
                            await self._drop(conn)  # rebuilt on the next call (the server may come back)
                            return ToolResult.error("unreachable", f"Error: connection to MCP server {self.name} "
                                                                   f"was lost ({type(e).__name__}: {e})")
                        return ToolResult.error("server_error", f"Error: MCP server {self.name} failed tool "
                                                                f"'{tool}': {type(e).__name__}: {e}")
                    text = _result_text(result)
                    if result.is_error:
                        return ToolResult.error("tool_error", text if text.startswith("Error") else f"Error: {text}")
                    return ToolResult(content=text)
            if attempt >= self.cfg.retries:
                failure.metrics["attempts"] = attempt + 1
                return failure
            await asyncio.sleep(backoff_delay(attempt, self.cfg.backoff_s, self.cfg.max_backoff_s))
            attempt += 1

    async def _drop(self, conn: _Connection) -> None:
        async with self._conn_lock:
            if self._conn is conn:
                self._conn = None
        await conn.close()

    async def aclose(self) -> None:
        if self._conn is not None:
            await self._conn.close()
            self._conn = None


__all__ = ["MCPToolService", "mcp_tool_to_openai"]
