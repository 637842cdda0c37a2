"""The HTTP side of the policy front (`openai_front.PolicyFront`): the OpenAI routes, as an app of their own
(`agentrl serve-policy`, the trainer's loopback front) or added to `agentrl engine serve`'s app."""

from __future__ import annotations

import asyncio
import contextlib

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from agentrl.agent_loop.openai_front import EPISODE_HEADER, PolicyFront, RequestError
from agentrl.inference.base import EngineError, PromptTooLongError


def _error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind}}, status_code=status)


def create_app(front: PolicyFront, *, token: str | None = None) -> FastAPI:
    """The FastAPI app over `front`. `token`: a bearer token every route but /health requires (None: no check)."""
    from agentrl.auth import BearerAuth

    app = FastAPI(title="agentrl policy (OpenAI-compatible)")
    if token is not None:
        app.add_middleware(BearerAuth, token=token)
    add_routes(app, front)

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    return app


def add_routes(app: FastAPI, front: PolicyFront) -> None:
    """Add the OpenAI routes of `front` to `app` (its own app, or `agentrl engine serve`'s beside /generate)."""
    app.state.front = front

    async def completions(request: Request, episode_id: str | None):
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "request body is not valid JSON")
        if not isinstance(body, dict):
            return _error(400, "request body must be a JSON object")
        episode_id = episode_id or request.headers.get(EPISODE_HEADER) or body.get("user")
        if not episode_id:
            return _error(400, f"no episode id: use base_url .../episodes/<id>/v1, the {EPISODE_HEADER} header or "
                               "the 'user' field")
        try:
            return JSONResponse(await front.complete(body, str(episode_id)))
        except (RequestError, PromptTooLongError) as e:
            return _error(400, str(e))
        except EngineError as e:
            return _error(503, f"engine: {e}", "server_error")

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await completions(request, None)

    @app.post("/episodes/{episode_id}/v1/chat/completions")
    async def episode_chat(episode_id: str, request: Request):
        return await completions(request, episode_id)

    def models():
        return {"object": "list", "data": [{"id": front.model_name, "object": "model", "created": 0,
                                            "owned_by": "agentrl"}]}

    app.get("/v1/models")(models)
    app.get("/episodes/{episode_id}/v1/models")(models)

    @app.get("/v1/episodes/{episode_id}")
    async def episode(episode_id: str):
        return {"episode_id": episode_id, "calls": [c.to_dict() for c in front.calls(episode_id)],
                "engine_error": front.errors.get(episode_id)}

    @app.delete("/v1/episodes/{episode_id}")
    async def forget(episode_id: str):
        return {"episode_id": episode_id, "calls": len(front.take(episode_id)[0])}


@contextlib.asynccontextmanager
async def serve_in_loop(app: FastAPI, host: str = "127.0.0.1"):
    """Serve `app` on a free port of `host` inside the running event loop; yields its base URL. Signals are left to
    the caller (a Ctrl-C stops the trainer, not just this server)."""
    import uvicorn

    from agentrl.services import bind_port

    class _Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self):
            yield

    sock = bind_port(host, 0)
    server = _Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()
                raise RuntimeError("the policy front stopped while starting")
            await asyncio.sleep(0.01)
        yield f"http://{host}:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await task
        sock.close()


__all__ = ["add_routes", "create_app", "serve_in_loop"]
