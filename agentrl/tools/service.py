"""The tool service: an ASGI app that serves a `ToolSet` over HTTP (tool calls on raw ASGI, the rest on FastAPI).

Routes (the HTTP contract of docs/tools.md):
- `GET /tools` -> list of OpenAI function schemas
- `POST /tools/{name}` with the JSON body `{"arguments": {...}, "session_id": "..."}` (`CALL_BODY`):
  `arguments` (required) is the JSON object of the tool's arguments, shaped by its schema from `GET /tools`;
  `session_id` (optional; omit or null for a one-call session) is an id from `POST /sessions`, for stateful
  tools. A body that is not a JSON object, lacks `arguments` or has other fields is a 400 saying so. Answers
  `{content, is_error, error_kind?, metrics?}`: arguments that do not match the schema (a non-object included)
  are a 200 with error_kind "bad_arguments", since the model wrote them; an unknown tool is a 404 whose body
  lists the known names; a session that is not open is a 404 with error_kind "unknown_session"; when more
  than `max_concurrency` calls are in flight the call is refused with 503 + Retry-After (clients retry it), so
  an overloaded service sheds load instead of queueing without bound.
- `POST /sessions` {tools_kwargs?} -> {session_id}; `DELETE /sessions/{id}` -> {closed}
- `GET /health` -> {status, tools, stateful_tools, sessions, in_flight}

With a `token` (`agentrl tools serve --token-file`), every route but `GET /health` needs `Authorization: Bearer
<token>` and answers 401 without it (`agentrl.auth`).

Tool faults never become 5xx: they are 200 responses with `is_error` and a policy `error_kind`. A 5xx means
the service itself is broken, which clients count as an infrastructure failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from agentrl.auth import BearerAuth, require_token
from agentrl.services import bind_port, serve_asgi
from agentrl.tools.toolset import ToolSet, UnknownSessionError

log = logging.getLogger(__name__)

CALL_BODY = '{"arguments": {...}, "session_id": ...}'


class CallBodyError(ValueError):
    """A `POST /tools/{name}` body that is not `CALL_BODY`; the message is the 400's detail."""


def parse_call_body(raw: bytes) -> tuple[Any, str | None]:
    """(arguments, session_id) from a `POST /tools/{name}` body; raises CallBodyError saying what is wrong.

    `arguments` is returned as sent (not necessarily an object): checking it against the tool's schema is the
    tool's job, and its failure is the model's (a 200 with error_kind "bad_arguments").
    """
    if not raw.strip():
        raise CallBodyError(f"body must be {CALL_BODY}: the body is empty")
    try:
        body = json.loads(raw)
    except json.JSONDecodeError as e:
        raise CallBodyError(f"body must be {CALL_BODY}: it is not JSON ({e.msg})") from None
    if not isinstance(body, dict):
        raise CallBodyError(f"body must be {CALL_BODY}: got a JSON {_json_type(body)}, not an object")
    if "arguments" not in body:
        raise CallBodyError(f'body must be {CALL_BODY}: missing "arguments" (send {{}} for a tool without '
                            f'arguments)')
    extra = sorted(set(body) - {"arguments", "session_id"})
    if extra:
        raise CallBodyError(f"body must be {CALL_BODY}: unknown field(s) {', '.join(map(json.dumps, extra))}")
    session_id = body.get("session_id")
    if session_id is not None and not isinstance(session_id, str):
        raise CallBodyError(f'"session_id" must be a string from POST /sessions, or null; got a JSON '
                            f'{_json_type(session_id)}')
    return body["arguments"], session_id


def _json_type(value: Any) -> str:
    return {list: "array", str: "string", bool: "boolean", int: "number", float: "number"}.get(type(value), "null")


def _json(body: Any, status: int = 200, headers: dict | None = None) -> Response:
    return Response(json.dumps(body, ensure_ascii=False).encode(), status_code=status, headers=headers,
                    media_type="application/json")


class ToolServiceApp:
    """The tool service's ASGI app. `POST /tools/{name}`, the route every tool call takes, is handled here on raw
    ASGI (FastAPI's routing, dependency solving and middleware were ~2/3 of the service's CPU per call); every
    other route and the lifespan go to the FastAPI app `api`. Arguments are still validated by the tool's own
    pydantic model (`Tool.invoke`)."""

    def __init__(self, api: FastAPI, toolset: ToolSet, max_concurrency: int, retry_after_s: float,
                 token: str | None = None):
        self.api = api
        self.toolset = toolset
        self.max_concurrency = max_concurrency
        self.retry_after = f"{retry_after_s:g}".encode()
        self.in_flight = 0
        self.calls = 0
        self._entry = self._route if token is None else BearerAuth(self._route, token)

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        await self._entry(scope, receive, send)

    async def _route(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"].startswith("/tools/"):
            await self._call_tool(scope["path"][len("/tools/"):], receive, send)
        else:
            await self.api(scope, receive, send)

    async def _call_tool(self, name: str, receive: Callable, send: Callable) -> None:
        toolset = self.toolset
        if name not in toolset.tools:
            await _send_json(send, 404, {"detail": f"unknown tool '{name}'; known tools: "
                                                   f"{', '.join(toolset.names())}",
                                         "error_kind": "unknown_tool", "tools": toolset.names()})
            return
        raw = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client went away before sending the whole body
            raw += message.get("body", b"")
            if not message.get("more_body", False):
                break
        try:
            arguments, session_id = parse_call_body(raw)
        except CallBodyError as e:
            await _send_json(send, 400, {"detail": str(e)})
            return
        if self.in_flight >= self.max_concurrency:
            await _send_json(send, 503, {"detail": f"tool service busy ({self.max_concurrency} calls in flight); "
                                                   f"retry later"}, [(b"retry-after", self.retry_after)])
            return
        self.in_flight += 1
        self.calls += 1
        try:
            result = await toolset.call(name, arguments, session_id)
        except UnknownSessionError:
            status, reply = 404, {"detail": f"session {session_id!r} is not open here (closed, expired or the "
                                            f"service restarted)", "error_kind": "unknown_session"}
        except Exception as e:  # the service boundary: a crash becomes a 500 the client maps
            log.exception("tool %s crashed the service", name)
            status, reply = 500, {"detail": f"tool service error in {name}: {type(e).__name__}: {e}"}
        else:
            status, reply = 200, result.to_wire()
        finally:
            self.in_flight -= 1
        await _send_json(send, status, reply)


async def _send_json(send: Callable, status: int, body: Any, headers: list | None = None) -> None:
    data = json.dumps(body, ensure_ascii=False).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(data)),
                            *(headers or ())]})
    await send({"type": "http.response.body", "body": data})


def create_app(tools: Iterable[Any] | ToolSet, *, defaults: dict[str, dict] | None = None,
               max_concurrency: int = 1024, idle_ttl_s: float = 3600.0, retry_after_s: float = 1.0,
               token: str | None = None) -> ToolServiceApp:
    """The ASGI app serving `tools` (functions, `@tool`s or a ready `ToolSet`).

    `defaults` maps tool name -> session_factory kwargs (e.g. {"lookup": {"kb_path": "kb.jsonl"}}), merged
    under each session's `tools_kwargs`. Sessions idle for `idle_ttl_s` are released. `token`: the bearer token
    every route but /health requires (None: no check).
    """
    toolset = tools if isinstance(tools, ToolSet) else ToolSet(tools, defaults=defaults, idle_ttl_s=idle_ttl_s)

    @contextlib.asynccontextmanager
    async def lifespan(api: FastAPI):
        async def sweep() -> None:
            while True:
                await asyncio.sleep(min(60.0, max(toolset.idle_ttl_s / 2, 0.05)))
                await toolset.sweep_idle()

        sweeper = asyncio.create_task(sweep())
        try:
            yield
        finally:
            sweeper.cancel()
            await toolset.aclose()  # release sandbox sessions and other per-session state on shutdown

    api = FastAPI(title="agentrl tool service", lifespan=lifespan)
    app = ToolServiceApp(api, toolset, max_concurrency, retry_after_s, token)

    @api.get("/health")
    async def health() -> dict:
        return {"status": "ok", "tools": toolset.names(), "stateful_tools": toolset.stateful_names(),
                "sessions": len(toolset.sessions), "in_flight": app.in_flight, "calls": app.calls}

    @api.get("/tools")
    async def list_tools() -> Response:
        return _json(toolset.schemas())

    @api.post("/sessions")
    async def open_session(request: Request) -> Response:
        raw = await request.body()
        try:
            body = json.loads(raw) if raw else {}
        except json.JSONDecodeError as e:
            return _json({"detail": f"request body is not JSON: {e.msg}"}, status=400)
        tools_kwargs = (body.get("tools_kwargs") or {}) if isinstance(body, dict) else None
        if not isinstance(tools_kwargs, dict):
            return _json({"detail": "body must be {\"tools_kwargs\": {tool_name: {...}}}"}, status=400)
        try:
            session_id = toolset.open_session(tools_kwargs)
        except ValueError as e:
            return _json({"detail": str(e)}, status=400)
        return _json({"session_id": session_id})

    @api.delete("/sessions/{session_id}")
    async def close_session(session_id: str) -> JSONResponse:
        return JSONResponse({"closed": await toolset.close_session(session_id)})

    return app


class _CoalescedWrites:
    """A transport proxy: the writes made within one event-loop step leave as one `write` after the step."""

    def __init__(self, transport: asyncio.Transport):
        self._transport = transport
        self._pending: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self._pending:
            asyncio.get_running_loop().call_soon(self._flush)
        self._pending.append(data)

    def _flush(self) -> None:
        if self._pending:
            data = b"".join(self._pending)
            self._pending.clear()
            if not self._transport.is_closing():
                self._transport.write(data)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


@functools.cache
def http_protocol() -> type | str:
    """uvicorn's httptools protocol with each response's head and body sent in one socket write.

    uvicorn writes the head and the body of a response separately: two `send()` calls in the service and often
    two wake-ups in the client per tool call; one write costs less service CPU per call and lowers the p99
    (`agentrl bench tools`, docs/benchmarks.md). Falls back to uvicorn's own choice if its httptools protocol moves.
    """
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return "auto"

    class OneWriteHttpToolsProtocol(HttpToolsProtocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(_CoalescedWrites(transport))  # type: ignore[arg-type]

    return OneWriteHttpToolsProtocol


def serve(tools: Iterable[Any] | ToolSet, *, host: str = "127.0.0.1", port: int = 8000,
          defaults: dict[str, dict] | None = None, max_concurrency: int = 1024, idle_ttl_s: float = 3600.0,
          log_level: str = "warning", token: str | None = None) -> None:
    """Serve `tools` until interrupted (the Python API behind `agentrl tools serve`; port 0 picks a free one).

    Prints "tool service ready on URL (...)" on stderr once it accepts calls; a taken port raises PortInUseError.
    Beyond loopback a `token` is required (`agentrl.auth.require_token`).
    """
    require_token(host, token, "the tool service", fix="pass token=... or host='127.0.0.1'")
    app = create_app(tools, defaults=defaults, max_concurrency=max_concurrency, idle_ttl_s=idle_ttl_s, token=token)
    names = app.toolset.names()
    with bind_port(host, port) as sock:
        # A process of its own: move everything built so far (imports, tools) out of the collector's sight, so a
        # full collection walks only what is allocated while serving and never pauses every call in flight for
        # the tens of ms a walk of the start-up heap takes.
        gc.collect()
        gc.freeze()
        listing = f"{len(names)} tool{'s' * (len(names) != 1)}: {', '.join(names)}"
        serve_asgi(app, sock, lambda url: f"tool service ready on {url} ({listing})",
                   log_level=log_level, access_log=False, timeout_graceful_shutdown=5, proxy_headers=False,
                   http=http_protocol())


@contextlib.contextmanager
def serve_in_thread(tools: Iterable[Any] | ToolSet, *, host: str = "127.0.0.1", port: int = 0,
                    defaults: dict[str, dict] | None = None, max_concurrency: int = 1024,
                    startup_timeout_s: float = 30.0, token: str | None = None) -> Iterator[str]:
    """Run a tool service in a background thread of this process; yields its base URL (notebooks, examples)."""
    import uvicorn

    require_token(host, token, "serve_in_thread", fix="pass token=... or host='127.0.0.1'")
    app = create_app(tools, defaults=defaults, max_concurrency=max_concurrency, token=token)
    sock = bind_port(host, port)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, proxy_headers=False,
                                           http=http_protocol()))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name=f"tool-service-{port}",
                              daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            sock.close()
            raise RuntimeError(f"tool service on {host}:{port} did not start within {startup_timeout_s}s")
        time.sleep(0.02)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
