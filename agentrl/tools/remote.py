"""HTTP tool-service backend of the registry: discovery, bounded concurrency, timeouts, retries, error mapping.

Retries (backoff and jitter from `agentrl.retry`) happen only where the request certainly did not run the tool or
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
import os
from typing import Any
from urllib.parse import quote, urlsplit

import httpx

from agentrl.auth import unauthorized
from agentrl.errors import one_line
from agentrl.retry import backoff_delay, parse_retry_after
from agentrl.tools.base import ToolResult
from agentrl.tools.config import ServiceConfig, field_key
from agentrl.tools.errors import SessionOpenError, ToolServiceError
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


def unreachable_reason(error: httpx.HTTPError, cfg: ServiceConfig) -> str:
    """A short reason for a failed connection: "connection refused", "no connection within 5.0s", ..."""
    if isinstance(error, httpx.ConnectTimeout):
        return f"no connection within {cfg.connect_timeout_s}s"
    if isinstance(error, httpx.TimeoutException):
        return f"no answer within {cfg.timeout_s}s"
    cause = error.__cause__ or error.__context__
    if isinstance(cause, OSError) and isinstance(cause.errno, int) and cause.errno > 0:
        text = os.strerror(cause.errno)  # asyncio's "Connect call failed (...)" -> "Connection refused"
    else:
        text = cause.strerror if isinstance(cause, OSError) and cause.strerror else str(error)
    return excerpt(text[:1].lower() + text[1:]) or type(error).__name__


def excerpt(text: str, limit: int = 120) -> str:
    """`text` on one line, cut to `limit` characters: a service's answer quoted in a one-line error."""
    folded = one_line(text)
    return folded if len(folded) <= limit else folded[:limit - 3] + "..."


def check_schemas(schemas: Any, where: str) -> list[dict]:
    """Validate a `GET /tools` body: a list of OpenAI function schemas. Raises ToolServiceError naming `where`."""
    fix = "serve the tools with `agentrl tools serve`, or make GET /tools return [{\"type\": \"function\", ...}]"
    if not isinstance(schemas, list):
        raise ToolServiceError(f"{where}: GET /tools must return a JSON list of function schemas, got "
                               f"{type(schemas).__name__}; {fix}")
    for i, s in enumerate(schemas):
        fn = s.get("function") if isinstance(s, dict) else None
        if not isinstance(s, dict) or s.get("type") != "function" or not isinstance(fn, dict):
            raise ToolServiceError(f"{where}: schema #{i} is not {{\"type\": \"function\", \"function\": {{...}}}}: "
                                   f"{excerpt(str(s))}; {fix}")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ToolServiceError(f"{where}: schema #{i} has no function.name; {fix}")
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict) or params.get("type") != "object":
            raise ToolServiceError(f"{where}: tool {fn['name']!r}: function.parameters must be a JSON schema "
                                   f"with \"type\": \"object\", got {excerpt(str(params))}")
    return schemas


class HTTPToolService:
    """One tool service (`agentrl tools serve`, or anything speaking the same routes).

    `key` is where the service is configured (e.g. "tools.services[0]"), named in set-up errors.
    """

    def __init__(self, cfg: ServiceConfig, client: httpx.AsyncClient, transport: PooledTransport, *,
                 key: str = "services[?]"):
        self.cfg = cfg
        self.name = cfg.name
        self.key = key
        self.where = f"tool service {cfg.name!r} at {cfg.url}"
        self.client = client  # discovery and session closing
        self._transport = transport  # the client's own transport; requests below go to it directly
        self._origin = Origin.from_url(cfg.url)
        self._base_path = urlsplit(cfg.url).path
        self._auth_headers = cfg.request_headers(key)  # headers + the bearer token: every request sends them
        self._headers = {"content-type": "application/json", **self._auth_headers}
        self._heads: dict[tuple[str, str], bytes] = {}  # (method, path) -> request head, built once
        self.call_budget_s = cfg.call_budget_s
        self._own = Limit(cfg.max_concurrency)
        self._global: Limit | None = None
        self._stateful: set[str] = set()
        self._timeout = httpx.Timeout(cfg.timeout_s, connect=cfg.connect_timeout_s, pool=cfg.timeout_s)
        self.in_flight = 0  # requests on the wire now (tests and metrics read it)

    async def discover(self, limit: Limit) -> list[dict]:
        self._global = limit
        url_key = field_key(self.key, "url")
        not_ours = f"is {self.cfg.url} an agentrl tool service (`agentrl tools serve`)? fix {url_key} or the service"
        try:
            tools = await self.client.get(f"{self.cfg.url}/tools", headers=self._auth_headers, timeout=self._timeout)
            health = await self.client.get(f"{self.cfg.url}/health", headers=self._auth_headers,
                                           timeout=self._timeout)
        except httpx.HTTPError as e:
            port = urlsplit(self.cfg.url).port or "PORT"
            raise ToolServiceError(f"{self.where} is unreachable ({unreachable_reason(e, self.cfg)}): start it "
                                   f"with `agentrl tools serve module:fn --port {port}` or fix {url_key}") from None
        if tools.status_code == 401:
            detail = _json_body(tools)
            raise unauthorized(self.where, field_key(self.key, "token_file"),
                               excerpt(str(detail.get("detail") if isinstance(detail, dict) else tools.text)))
        if tools.status_code != 200:
            raise ToolServiceError(f"{self.where} answered GET /tools with HTTP {tools.status_code} "
                                   f"({excerpt(tools.text)}): {not_ours}")
        try:
            body = tools.json()
        except ValueError:  # JSON decode error
            raise ToolServiceError(f"{self.where} answered GET /tools with something that is not JSON "
                                   f"({excerpt(tools.text)}): {not_ours}") from None
        schemas = check_schemas(body, self.where)
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
            await asyncio.sleep(backoff_delay(attempt, self.cfg.backoff_s, self.cfg.max_backoff_s,
                                              retry_after_s=retry_after))
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
                await self.client.delete(f"{self.cfg.url}/sessions/{session_id}", headers=self._auth_headers,
                                         timeout=min(self.cfg.timeout_s, 5.0))

    async def aclose(self) -> None:
        return None  # the shared httpx client belongs to the registry


__all__ = ["HTTPToolService", "check_schemas", "excerpt", "unreachable_reason"]
