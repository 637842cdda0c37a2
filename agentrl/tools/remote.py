"""HTTP tool-service backend of the registry: discovery, bounded concurrency, timeouts, retries, error mapping.

Retries (with exponential backoff and jitter) happen only where the request certainly did not run the tool or
the service asked for it: a connection that could not be made, 503 (overloaded; Retry-After honoured up to
`max_backoff_s`) and 504. A read timeout or a connection lost mid-call is not retried: the tool may have run,
and running it twice is not safe in general. Concurrency slots are held only while a request is in flight,
never during a backoff sleep.

Error mapping: the service's own 200 results pass through (policy kinds); 404 with the tool list ->
unknown_tool; connection failures -> unreachable; timeouts -> timeout; 503 -> overloaded; other 5xx, malformed
bodies, lost sessions -> server_error.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from typing import Any
from urllib.parse import quote, urlsplit

import httpx

from agentrl.tools.base import ToolResult
from agentrl.tools.client import SessionOpenError, ToolServiceError
from agentrl.tools.config import ServiceConfig
from agentrl.tools.limits import Limit
from agentrl.tools.transport import Origin, PooledTransport, RawResponse, request_head, with_body

_NO_LIMIT = contextlib.nullcontext()


def _json_body(response: RawResponse) -> Any:
    """The decoded JSON body, or None when it is not JSON."""
    try:
        return json.loads(response.content)
    except ValueError:  # JSONDecodeError and UnicodeDecodeError
        return None


def _text(response: RawResponse) -> str:
    return response.content.decode("utf-8", errors="replace")


def backoff_delay(attempt: int, base_s: float, cap_s: float) -> float:
    """Equal-jitter exponential backoff: half of min(cap, base * 2^attempt) plus a random half."""
    d = min(cap_s, base_s * (2**attempt))
    return d / 2 + random.uniform(0, d / 2)


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds form); None when absent or an HTTP date."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def check_schemas(schemas: Any, where: str) -> list[dict]:
    """Validate a `GET /tools` body: a list of OpenAI function schemas. Raises ToolServiceError naming `where`."""
    if not isinstance(schemas, list):
        raise ToolServiceError(f"{where}: GET /tools must return a JSON list of function schemas, got "
                               f"{type(schemas).__name__}")
    for i, s in enumerate(schemas):
        fn = s.get("function") if isinstance(s, dict) else None
        if not isinstance(s, dict) or s.get("type") != "function" or not isinstance(fn, dict):
            raise ToolServiceError(f"{where}: schema #{i} is not {{\"type\": \"function\", \"function\": {{...}}}}: "
                                   f"{str(s)[:200]}")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ToolServiceError(f"{where}: schema #{i} has no function.name")
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict) or params.get("type") != "object":
            raise ToolServiceError(f"{where}: tool {fn['name']!r}: function.parameters must be a JSON schema "
                                   f"with \"type\": \"object\", got {str(params)[:200]}")
    return schemas


class HTTPToolService:
    """One tool service (`agentrl tools serve`, or anything speaking the same routes)."""

    def __init__(self, cfg: ServiceConfig, client: httpx.AsyncClient, transport: PooledTransport):
        self.cfg = cfg
        self.name = cfg.name
        self.client = client  # discovery and session closing
        self._transport = transport  # the client's own transport; requests below go to it directly
        self._origin = Origin.from_url(cfg.url)
        self._base_path = urlsplit(cfg.url).path
        self._headers = {"content-type": "application/json", **cfg.headers}
        self._heads: dict[tuple[str, str], bytes] = {}  # (method, path) -> request head, built once
        self.call_budget_s = cfg.call_budget_s
        self._own = Limit(cfg.max_concurrency)
        self._global: Limit | None = None
        self._stateful: set[str] = set()
        self._timeout = httpx.Timeout(cfg.timeout_s, connect=cfg.connect_timeout_s, pool=cfg.timeout_s)
        self.in_flight = 0  # requests on the wire now (tests and metrics read it)

    async def discover(self, limit: Limit) -> list[dict]:
        self._global = limit
        where = f"tool service {self.name} ({self.cfg.url})"
        try:
            tools = await self.client.get(f"{self.cfg.url}/tools", headers=self.cfg.headers, timeout=self._timeout)
            health = await self.client.get(f"{self.cfg.url}/health", headers=self.cfg.headers,
                                           timeout=self._timeout)
        except httpx.HTTPError as e:
            raise ToolServiceError(f"{where} is unreachable at start ({type(e).__name__}: {e}); start it (e.g. "
                                   f"`agentrl tools serve module:fn --port N`) or fix its url") from None
        if tools.status_code != 200:
            raise ToolServiceError(f"{where}: GET /tools answered HTTP {tools.status_code}: {tools.text[:200]}")
        try:
            schemas = check_schemas(tools.json(), where)
        except ValueError as e:  # JSON decode error
            raise ToolServiceError(f"{where}: GET /tools did not return JSON ({e})") from None
        if health.status_code == 200:
            try:
                stateful = health.json().get("stateful_tools", [])
            except (ValueError, AttributeError):
                stateful = []
            self._stateful = set(stateful) if isinstance(stateful, list) else set()
        return schemas

    def is_stateful(self, tool: str) -> bool:
        return tool in self._stateful

    def _request(self, method: str, path: str, body: Any) -> bytes:
        head = self._heads.get((method, path))
        if head is None:
            target = self._base_path + "/".join(quote(part, safe="") for part in path.split("/"))
            head = self._heads[(method, path)] = request_head(method, target, self._origin, self._headers)
        return with_body(head, json.dumps(body, ensure_ascii=False).encode() if body is not None else b"")

    async def _send(self, method: str, path: str, body: Any = None) -> RawResponse | ToolResult:
        """One logical request with retries; returns the response or an infra ToolResult."""
        data = self._request(method, path, body)
        attempt = 0
        while True:
            retry_after = None
            # Own limit first: calls queued behind this service must not hold global slots other services need.
            async with self._own, self._global or _NO_LIMIT:
                self.in_flight += 1
                try:
                    # The transport bounds connecting and the whole response (a trickling server too).
                    response = await self._transport.roundtrip(self._origin, data,
                                                               connect_timeout=self.cfg.connect_timeout_s,
                                                               read_timeout=self.cfg.timeout_s)
                except (httpx.ConnectError, httpx.ConnectTimeout) as e:
                    failure = ToolResult.error("unreachable", f"Error: tool service {self.name} is unreachable "
                                                              f"({type(e).__name__})")
                except httpx.TimeoutException as e:
                    return ToolResult.error("timeout", f"Error: tool service {self.name} did not answer within "
                                                       f"{self.cfg.timeout_s}s ({type(e).__name__})")
                except httpx.TransportError as e:
                    return ToolResult.error("unreachable", f"Error: connection to tool service {self.name} was "
                                                           f"lost during the call ({type(e).__name__})")
                else:
                    if response.status_code == 503:
                        retry_after = parse_retry_after(response.header("retry-after"))
                        failure = ToolResult.error("overloaded", f"Error: tool service {self.name} is overloaded "
                                                                 f"(HTTP 503)")
                    elif response.status_code == 504:
                        failure = ToolResult.error("timeout", f"Error: tool service {self.name} timed out "
                                                              f"(HTTP 504)")
                    else:
                        return response
                finally:
                    self.in_flight -= 1
            if attempt >= self.cfg.retries:
                failure.metrics["attempts"] = attempt + 1
                return failure
            if retry_after is not None:
                delay = min(retry_after, self.cfg.max_backoff_s)
            else:
                delay = backoff_delay(attempt, self.cfg.backoff_s, self.cfg.max_backoff_s)
            await asyncio.sleep(delay)
            attempt += 1

    async def call(self, tool: str, arguments: Any, session_id: str | None) -> ToolResult:
        body: dict[str, Any] = {"arguments": arguments}
        if session_id is not None:
            body["session_id"] = session_id
        response = await self._send("POST", f"/tools/{tool}", body)
        if isinstance(response, ToolResult):
            return response
        where = f"tool service {self.name}"
        payload = _json_body(response)
        if response.status_code == 200:
            return ToolResult.from_wire(payload, where=where)
        kind = payload.get("error_kind") if isinstance(payload, dict) else None
        detail = payload.get("detail") if isinstance(payload, dict) else _text(response)[:200]
        if response.status_code == 404 and kind == "unknown_tool":
            return ToolResult.error("unknown_tool", f"Error: {detail}")
        if response.status_code == 404 and kind == "unknown_session":
            return ToolResult.error("server_error", f"Error: {where} lost the session state ({detail})")
        return ToolResult.error("server_error", f"Error: {where} answered HTTP {response.status_code} for tool "
                                                f"'{tool}': {str(detail)[:300]}")

    async def open_session(self, tools_kwargs: dict[str, dict]) -> str:
        response = await self._send("POST", "/sessions", {"tools_kwargs": tools_kwargs})
        if isinstance(response, ToolResult):
            raise SessionOpenError(response)
        payload = _json_body(response) if response.status_code == 200 else None
        session_id = payload.get("session_id") if isinstance(payload, dict) else None
        if not isinstance(session_id, str):
            raise SessionOpenError(ToolResult.error(
                "server_error", f"Error: tool service {self.name} could not open a session (HTTP "
                                f"{response.status_code}: {_text(response)[:200]})"))
        return session_id

    async def close_session(self, session_id: str) -> None:
        # One short attempt, errors ignored: an episode must not wait on a sick service to finish, and the
        # service expires idle sessions itself.
        with contextlib.suppress(httpx.HTTPError):
            async with self._own, self._global or _NO_LIMIT:
                await self.client.delete(f"{self.cfg.url}/sessions/{session_id}", headers=self.cfg.headers,
                                         timeout=min(self.cfg.timeout_s, 5.0))

    async def aclose(self) -> None:
        return None  # the shared httpx client belongs to the registry


__all__ = ["HTTPToolService", "backoff_delay", "check_schemas", "parse_retry_after"]
