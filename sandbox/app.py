"""The sandbox HTTP service: SandboxFusion `/run_code`, sessions (forks, workspace snapshots), `/v1/ping`, `/health`.

Status semantics: `Success` = the program finished with exit code 0; `Failed` = anything the code did (non-zero
exit, timeout, OOM, output flood, fork bomb, signal); `SandboxError` = the sandbox itself failed (clients retry
it). Requests the service refuses get HTTP 400/413/422 naming the field, or 503 + Retry-After when busy.
With a token (`agentrl sandbox serve --token-file`) every route but `GET /health` needs `Authorization: Bearer
<token>` and answers 401 without it (`agentrl.auth`).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
import os
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from agentrl.auth import BearerAuth
from sandbox.admission import Admission, Overloaded
from sandbox.api import (
    CommandRunResult,
    CreateSessionRequest,
    CreateSessionResponse,
    ForkSessionResponse,
    RestoreRequest,
    RestoreResponse,
    RunCellRequest,
    RunCellResponse,
    RunCodeRequest,
    RunCodeResponse,
    SnapshotResponse,
    check_files,
)
from sandbox.backends.base import Backend, BackendError, ExecRequest, ExecResult, available_languages
from sandbox.config import SandboxConfig
from sandbox.sessions import SessionConflict, SessionLimit, SessionManager, SessionNotFound
from sandbox.snapshot import Entry, SnapshotError, digest, from_tar, restore, snapshot_of, to_tar

log = logging.getLogger("sandbox")

LANGUAGE_ALIASES = {"python3": "python", "py": "python", "node": "javascript", "js": "javascript",
                    "shell": "bash", "c++": "cpp", "cxx": "cpp"}


SNAPSHOTS_AT_ONCE = 2


class BadRequest(Exception):
    """A request field the service cannot accept (HTTP 400)."""


class BodyLimit:
    """ASGI middleware: 413 for bodies over `max_bytes` (Content-Length or counted while streaming)."""

    def __init__(self, app, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length", b"0")
        if length.isdigit() and int(length) > self.max_bytes:
            return await self._reject(send)
        seen = 0

        async def counted():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge
            return message

        try:
            await self.app(scope, counted, send)
        except _TooLarge:
            await self._reject(send)

    async def _reject(self, send):
        body = (f'{{"detail": "request body exceeds the {self.max_bytes} byte limit (max_body_bytes)"}}').encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


class _TooLarge(Exception):
    pass


async def make_backend(cfg: SandboxConfig) -> Backend:
    """The configured backend, started; without isolation only when `allow_unsafe` (never silently)."""
    from sandbox.backends.bwrap import BwrapBackend

    if cfg.backend == "docker":
        from sandbox.backends.docker import DockerBackend

        backend: Backend = DockerBackend(cfg)
    else:
        backend = BwrapBackend(cfg)
    try:
        await backend.start()
        return backend
    except BackendError as e:
        if not cfg.allow_unsafe:
            raise BackendError(f"{e}. Refusing to start without isolation (pass --allow-unsafe to override)") from e
        log.warning("NO ISOLATION: %s; running code as plain processes because --allow-unsafe was given", e)
        with contextlib.suppress(BackendError, OSError, RuntimeError):
            await backend.close()
        unsafe = BwrapBackend(cfg, isolate=False)
        await unsafe.start()
        return unsafe


class Service:
    def __init__(self, cfg: SandboxConfig):
        self.cfg = cfg
        self.backend: Backend | None = None
        self.admission = Admission(cfg.max_concurrency, cfg.max_queue, cfg.queue_timeout_s)
        self.sessions: SessionManager | None = None
        self.languages = available_languages()
        self.canary: dict = {}
        self._canary_lock = asyncio.Lock()
        self.counts = {"requests": 0, "sandbox_errors": 0}
        # Snapshots and restores that move a work dir's files at once: each holds a few copies of up to
        # snapshot_max_bytes in the service's memory while it runs.
        self.transfers = asyncio.Semaphore(SNAPSHOTS_AT_ONCE)

    async def start(self) -> None:
        self.backend = await make_backend(self.cfg)
        self.sessions = SessionManager(self.backend, self.cfg.max_sessions, self.cfg.snapshot_log_bytes)
        self.sessions.start()
        await self.run_canary()
        if not self.canary["ok"]:
            await self.close()
            raise BackendError(f"canary run failed: {self.canary}")

    async def close(self) -> None:
        if self.sessions is not None:
            await self.sessions.close()
        if self.backend is not None:
            await self.backend.close()

    async def run_canary(self) -> None:
        async with self._canary_lock:
            started = time.monotonic()
            result = await self.backend.execute(ExecRequest(code="print(6 * 7)", run_timeout=10,
                                                            memory_mb=self.cfg.default_memory_mb))
            ok = result.infra_error is None and result.return_code == 0 and result.stdout == "42\n"
            error = None if ok else (result.infra_error or f"{result.exit_reason}: {result.stderr[-300:]}")
            self.canary = {"ok": ok, "latency_s": round(time.monotonic() - started, 4), "at": time.time(),
                           "error": error}

    def language(self, name: str) -> str:
        lang = LANGUAGE_ALIASES.get(name.lower(), name.lower())
        if lang not in self.languages:
            raise BadRequest(f"language: {name!r} is not available here; available: {', '.join(self.languages)}")
        return lang

    def memory_mb(self, value: int) -> int:
        if value is None or value <= 0:
            return self.cfg.default_memory_mb
        if value > self.cfg.max_memory_mb:
            raise BadRequest(f"memory_limit_MB: {value} exceeds this sandbox's maximum of {self.cfg.max_memory_mb}")
        if value < 16:
            raise BadRequest(f"memory_limit_MB: {value} is below the 16 MB an interpreter needs")
        return value

    def timeout(self, value: float, field: str) -> float:
        if not 0 < value <= self.cfg.max_run_timeout_s:
            raise BadRequest(f"{field}: {value} must be in (0, {self.cfg.max_run_timeout_s:g}] seconds")
        return value


_MESSAGES = {"timeout": "time limit exceeded", "oom": "killed: out of memory",
             "output_limit": "killed: output limit exceeded", "pids_limit": "process/thread limit reached"}


def to_response(result: ExecResult) -> RunCodeResponse:
    if result.infra_error is not None:
        return RunCodeResponse(status="SandboxError", message=result.infra_error)
    compiled = CommandRunResult(**result.compile) if result.compile is not None else None
    if not result.ran:  # the compile step failed: SandboxFusion's `status: Failed`, `run_result: null`
        if compiled.status == "TimeLimitExceeded":
            message = "compile time limit exceeded"
        elif result.exit_reason in _MESSAGES:
            message = f"compiler {_MESSAGES[result.exit_reason]}"
        else:
            message = f"compilation failed with code {compiled.return_code}"
        return RunCodeResponse(status="Failed", message=message, compile_result=compiled, files=result.files,
                               exit_reason=result.exit_reason, truncated=result.truncated,
                               memory_peak_MB=result.memory_peak_mb)
    run = CommandRunResult(status=result.status, execution_time=result.execution_time,
                           return_code=result.return_code, stdout=result.stdout, stderr=result.stderr)
    # Success needs a clean exit as well as code 0: a program that exits 0 after its fork bomb hit the pids limit
    # (or whose supervisor faulted on what it left) has not run as asked.
    ok = result.status == "Finished" and result.return_code == 0 and result.exit_reason == "exit"
    message = "" if ok else {"exit": f"exited with code {result.return_code}",
                             "timeout": "time limit exceeded", "oom": "killed: out of memory",
                             "output_limit": "killed: output limit exceeded",
                             "pids_limit": "process/thread limit reached",
                             "signal": f"killed by signal {result.signal}",
                             "runner_fault": "the sandbox's supervisor failed on what the program left behind"
                             }[result.exit_reason]
    return RunCodeResponse(status="Success" if ok else "Failed", message=message, compile_result=compiled,
                           run_result=run, files=result.files, exit_reason=result.exit_reason,
                           truncated=result.truncated, signal=result.signal, memory_peak_MB=result.memory_peak_mb)


def create_app(cfg: SandboxConfig | None = None, *, token: str | None = None) -> FastAPI:
    cfg = cfg or SandboxConfig()
    svc = Service(cfg)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        if svc.backend is None:  # `sandbox serve` starts the service first, so a start failure is one line
            await svc.start()
        try:
            yield
        finally:
            await svc.close()

    app = FastAPI(title="agentrl sandbox", lifespan=lifespan)
    app.state.service = svc
    app.add_middleware(BodyLimit, max_bytes=cfg.max_body_bytes)
    if token is not None:
        app.add_middleware(BearerAuth, token=token)  # added last, so it runs first: no body is read for a 401

    @app.exception_handler(BadRequest)
    async def _bad(request: Request, exc: BadRequest):
        return JSONResponse({"detail": str(exc)}, status_code=400)

    @app.exception_handler(Overloaded)
    async def _busy(request: Request, exc: Overloaded):
        return JSONResponse({"detail": str(exc)}, status_code=503, headers={"Retry-After": str(exc.retry_after_s)})

    @app.exception_handler(SessionNotFound)
    async def _missing(request: Request, exc: SessionNotFound):
        return JSONResponse({"detail": exc.args[0]}, status_code=404)

    @app.exception_handler(SessionConflict)
    async def _conflict(request: Request, exc: SessionConflict):
        return JSONResponse({"detail": str(exc)}, status_code=409)

    @app.exception_handler(SnapshotError)
    async def _snapshot(request: Request, exc: SnapshotError):
        return JSONResponse({"detail": str(exc)}, status_code=exc.status)

    @app.exception_handler(SessionLimit)
    async def _full(request: Request, exc: SessionLimit):
        return JSONResponse({"detail": str(exc)}, status_code=503, headers={"Retry-After": "5"})

    @app.get("/v1/ping")
    async def ping():
        return PlainTextResponse("pong")

    @app.post("/run_code", response_model=RunCodeResponse, response_model_exclude_none=False)
    async def run_code(req: RunCodeRequest):
        svc.counts["requests"] += 1
        try:
            check_files(req.files, req.fetch_files)
        except ValueError as e:
            raise BadRequest(str(e)) from None
        exec_req = ExecRequest(
            code=req.code, language=svc.language(req.language), stdin=(req.stdin or "").encode(),
            files={p: c or "" for p, c in req.files.items()}, fetch_files=req.fetch_files,
            run_timeout=svc.timeout(req.run_timeout, "run_timeout"),
            compile_timeout=svc.timeout(req.compile_timeout, "compile_timeout"),
            memory_mb=svc.memory_mb(req.memory_limit_MB))
        async with svc.admission.slot():
            try:
                result = await svc.backend.execute(exec_req)
            except (OSError, RuntimeError, ValueError) as e:  # service boundary: an infra fault, never a crash
                log.exception("run_code failed inside the sandbox service")
                result = ExecResult(status="Error", return_code=None, exit_reason="exit",
                                    infra_error=f"{type(e).__name__}: {e}")
        symlinks = [p for p, why in result.file_errors.items() if why == "symlink"]
        if symlinks:
            raise BadRequest("fetch_files: " + ", ".join(f"{p!r} is or passes through a symlink (refused: O_NOFOLLOW)"
                                                         for p in symlinks))
        if result.infra_error is not None:
            svc.counts["sandbox_errors"] += 1
        return to_response(result)

    @app.post("/sessions", response_model=CreateSessionResponse)
    async def create_session(req: CreateSessionRequest):
        if svc.language(req.language) != "python":
            raise BadRequest(f"language: sessions support 'python' only, got {req.language!r}")
        ttl = cfg.default_idle_ttl_s if req.idle_ttl_s <= 0 else req.idle_ttl_s
        if ttl > cfg.max_idle_ttl_s:
            raise BadRequest(f"idle_ttl_s: {ttl} exceeds the maximum of {cfg.max_idle_ttl_s:g}")
        snapshot = restore_input(req.snapshot, "snapshot.") if req.snapshot is not None else None
        try:
            session = await svc.sessions.create("python", svc.memory_mb(req.memory_limit_MB), ttl, req.forkable)
        except BackendError as e:
            return JSONResponse({"detail": f"could not start a session interpreter: {e}"}, status_code=500)
        except ValueError as e:
            raise BadRequest(f"forkable: {e}") from None
        if snapshot is None:
            return CreateSessionResponse(session_id=session.id)
        try:
            restored = await restore_into(session.id, *snapshot)
        except BaseException:
            with contextlib.suppress(SessionNotFound):
                await svc.sessions.delete(session.id)
            raise
        return CreateSessionResponse(session_id=session.id, restore=restored)

    def restore_input(req: RestoreRequest, field: str = "") -> tuple[list[str], list[Entry] | None, float]:
        """(cells, checked entries or None, timeout) of a restore request; 400/413 before any session is touched."""
        timeout = svc.timeout(req.timeout, f"{field}timeout")
        if not req.replayable and req.cells:
            raise BadRequest(f"{field}replayable: false, so its cells cannot rebuild the state (a cell timed out, or "
                             f"the log passed snapshot_log_bytes): send {field}cells: [] to restore its files alone")
        if req.workspace is None:
            return req.cells, None, timeout
        try:
            data = base64.b64decode(req.workspace, validate=True)
        except (binascii.Error, ValueError) as e:
            raise BadRequest(f"{field}workspace: not valid base64 ({e})") from None
        return req.cells, from_tar(data, cfg), timeout

    async def restore_into(session_id: str, cells: list[str], entries: list[Entry] | None,
                           timeout: float) -> RestoreResponse:
        svc.sessions.get(session_id)
        async with svc.admission.slot(), svc.sessions.use(session_id) as session:
            return RestoreResponse(**await restore(session, cfg, cells, entries, timeout, svc.transfers))

    @app.post("/sessions/{session_id}/restore", response_model=RestoreResponse)
    async def restore_session(session_id: str, req: RestoreRequest):
        return await restore_into(session_id, *restore_input(req))

    @app.get("/sessions/{session_id}/snapshot", response_model=SnapshotResponse)
    async def snapshot_session(session_id: str):
        svc.sessions.get(session_id)
        async with svc.admission.slot(), svc.transfers, svc.sessions.use(session_id) as session:
            entries, skipped = await snapshot_of(session, cfg)
            cells, replayable = list(session.log.cells), session.log.replayable
        return SnapshotResponse(workspace=base64.b64encode(to_tar(entries)).decode(), digest=digest(entries),
                                files=sum(e.kind == "file" for e in entries),
                                bytes=sum(len(e.data) for e in entries), skipped=skipped, cells=cells,
                                replayable=replayable)

    @app.post("/sessions/{session_id}/fork", response_model=ForkSessionResponse)
    async def fork_session(session_id: str, n: int = 1):
        if not 1 <= n <= cfg.max_sessions:
            raise BadRequest(f"n: {n} must be in [1, {cfg.max_sessions}] (max_sessions)")
        svc.sessions.get(session_id)
        async with svc.admission.slot():
            try:
                children = await svc.sessions.fork(session_id, n)
            except BackendError as e:
                return JSONResponse({"detail": f"could not fork session {session_id!r}: {e}"}, status_code=500)
        return ForkSessionResponse(session_ids=[child.id for child in children])

    @app.post("/sessions/{session_id}/run", response_model=RunCellResponse)
    async def run_cell(session_id: str, req: RunCellRequest):
        timeout = svc.timeout(req.timeout, "timeout")
        svc.sessions.get(session_id)
        async with svc.admission.slot():
            async with svc.sessions.use(session_id) as session:
                try:
                    result = await session.proc.run_cell(req.code, timeout, req.track_workspace)
                    session.log.record(req.code, result)
                    return result
                except BackendError as e:
                    return JSONResponse({"detail": f"session interpreter could not be restarted: {e}"},
                                        status_code=500)

    @app.delete("/sessions/{session_id}")
    async def delete_session(session_id: str):
        await svc.sessions.delete(session_id)
        return {"deleted": True}

    @app.get("/health")
    async def health():
        if not svc.canary or time.time() - svc.canary["at"] > 15:
            await svc.run_canary()
        info = svc.backend.info()
        body = {"status": "ok" if svc.canary["ok"] else "degraded", **info,
                "unsafe": info["isolation"].startswith("none"), "languages": svc.languages,
                "queue_depth": svc.admission.waiting, "running": svc.admission.running,
                "max_concurrency": cfg.max_concurrency, "rejected": svc.admission.rejected,
                "live_sessions": len(svc.sessions.sessions), "max_sessions": cfg.max_sessions,
                "reaped_sessions": svc.sessions.reaped, "canary": svc.canary, **svc.counts, "pid": os.getpid()}
        return JSONResponse(body, status_code=200 if svc.canary["ok"] else 503)

    return app


def encode_files(files: dict[str, bytes]) -> dict[str, str]:
    """Helper for callers building `files`: raw bytes -> base64 strings."""
    return {path: base64.b64encode(data).decode() for path, data in files.items()}
