"""The tool service: a FastAPI app that serves a `ToolSet` over HTTP.

Routes (the contract in DESIGN.md):
- `GET /tools` -> list of OpenAI function schemas
- `POST /tools/{name}` {arguments, session_id?} -> {content, is_error, error_kind?, metrics?}; an unknown tool
  is a 404 whose body lists the known names; a session that is not open is a 404 with error_kind
  "unknown_session"; when more than `max_concurrency` calls are in flight the call is refused with
  503 + Retry-After (clients retry it), so an overloaded service sheds load instead of queueing without bound.
- `POST /sessions` {tools_kwargs?} -> {session_id}; `DELETE /sessions/{id}` -> {closed}
- `GET /health` -> {status, tools, stateful_tools, sessions, in_flight}

Tool faults never become 5xx: they are 200 responses with `is_error` and a policy `error_kind`. A 5xx means
the service itself is broken, which clients count as an infrastructure failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from agentrl.services import free_port
from agentrl.tools.toolset import ToolSet, UnknownSessionError

log = logging.getLogger(__name__)


def _json(body: Any, status: int = 200, headers: dict | None = None) -> Response:
    return Response(json.dumps(body, ensure_ascii=False).encode(), status_code=status, headers=headers,
                    media_type="application/json")


def create_app(tools: Iterable[Any] | ToolSet, *, defaults: dict[str, dict] | None = None,
               max_concurrency: int = 1024, idle_ttl_s: float = 3600.0, retry_after_s: float = 1.0) -> FastAPI:
    """A FastAPI app serving `tools` (functions, `@tool`s or a ready `ToolSet`).

    `defaults` maps tool name -> session_factory kwargs (e.g. {"lookup": {"kb_path": "kb.jsonl"}}), merged
    under each session's `tools_kwargs`. Sessions idle for `idle_ttl_s` are released.
    """
    toolset = tools if isinstance(tools, ToolSet) else ToolSet(tools, defaults=defaults, idle_ttl_s=idle_ttl_s)
    state = {"in_flight": 0, "calls": 0}

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
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

    app = FastAPI(title="agentrl tool service", lifespan=lifespan)
    app.state.toolset = toolset

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "tools": toolset.names(), "stateful_tools": toolset.stateful_names(),
                "sessions": len(toolset.sessions), "in_flight": state["in_flight"], "calls": state["calls"]}

    @app.get("/tools")
    async def list_tools() -> Response:
        return _json(toolset.schemas())

    @app.post("/tools/{name}")
    async def call_tool(name: str, request: Request) -> Response:
        if name not in toolset.tools:
            return _json({"detail": f"unknown tool '{name}'; known tools: {', '.join(toolset.names())}",
                          "error_kind": "unknown_tool", "tools": toolset.names()}, status=404)
        try:
            body = json.loads(await request.body() or b"{}")
        except json.JSONDecodeError as e:
            return _json({"detail": f"request body is not JSON: {e.msg}"}, status=400)
        if not isinstance(body, dict):
            return _json({"detail": "request body must be {\"arguments\": {...}, \"session_id\": ...}"}, status=400)
        if state["in_flight"] >= max_concurrency:
            return _json({"detail": f"tool service busy ({max_concurrency} calls in flight); retry later"},
                         status=503, headers={"Retry-After": f"{retry_after_s:g}"})
        state["in_flight"] += 1
        state["calls"] += 1
        try:
            result = await toolset.call(name, body.get("arguments", {}), body.get("session_id"))
        except UnknownSessionError:
            return _json({"detail": f"session {body.get('session_id')!r} is not open here (closed, expired or "
                                    f"the service restarted)", "error_kind": "unknown_session"}, status=404)
        except Exception as e:
            log.exception("tool %s crashed the service", name)
            return _json({"detail": f"tool service error in {name}: {type(e).__name__}: {e}"}, status=500)
        finally:
            state["in_flight"] -= 1
        return _json(result.to_wire())

    @app.post("/sessions")
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

    @app.delete("/sessions/{session_id}")
    async def close_session(session_id: str) -> JSONResponse:
        return JSONResponse({"closed": await toolset.close_session(session_id)})

    return app


def serve(tools: Iterable[Any] | ToolSet, *, host: str = "127.0.0.1", port: int = 8000,
          defaults: dict[str, dict] | None = None, max_concurrency: int = 1024, idle_ttl_s: float = 3600.0,
          log_level: str = "warning") -> None:
    """Serve `tools` until interrupted (the Python API behind `agentrl tools serve`)."""
    import uvicorn

    app = create_app(tools, defaults=defaults, max_concurrency=max_concurrency, idle_ttl_s=idle_ttl_s)
    uvicorn.run(app, host=host, port=port, log_level=log_level, access_log=False, timeout_graceful_shutdown=5)


@contextlib.contextmanager
def serve_in_thread(tools: Iterable[Any] | ToolSet, *, host: str = "127.0.0.1", port: int = 0,
                    defaults: dict[str, dict] | None = None, max_concurrency: int = 1024,
                    startup_timeout_s: float = 30.0) -> Iterator[str]:
    """Run a tool service in a background thread of this process; yields its base URL (notebooks, examples)."""
    import uvicorn

    port = port or free_port(host)
    app = create_app(tools, defaults=defaults, max_concurrency=max_concurrency)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, name=f"tool-service-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"tool service on {host}:{port} did not start within {startup_timeout_s}s")
        time.sleep(0.02)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
