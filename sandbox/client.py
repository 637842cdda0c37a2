"""Async HTTP client for the sandbox service, with the code-fault / infrastructure-fault split.

The one rule callers rely on: a fault of the *code* (non-zero exit, exception, timeout, OOM, output limit) is a
normal return value, because it is the model's doing and must reach the model as an observation. A fault of the
*sandbox* (service unreachable, HTTP 5xx, overloaded past the retries, `status: SandboxError`) raises
`SandboxInfraError`, whose `kind` is one of agentrl.tools' INFRA_ERROR_KINDS, so an episode it ruins is marked
`infra_error` instead of being trained on as reward 0.

A sandbox started with a token (`agentrl sandbox serve --token-file`) needs `token_file` here: the client sends
`Authorization: Bearer <token>` with every request, and a 401 raises `agentrl.auth.ServiceAuthError` naming the
URL and `token_key` (the config key that holds the path), never a retry.

    client = SandboxClient("http://127.0.0.1:8080")
    result = await client.run_code("print(1 + 1)")          # SandboxFusion response dict
    sid = await client.create_session()
    cell = await client.run_cell(sid, "x = 41\nprint(x + 1)")  # {"status": "ok", "stdout": "42\n", ...}
    print(cell_to_text(cell))
    await client.delete_session(sid)
    await client.aclose()
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from agentrl.auth import bearer_headers, unauthorized
from agentrl.retry import backoff_delay, parse_retry_after

# Values of SandboxInfraError.kind; equal to the infra kinds of agentrl.tools.base.INFRA_ERROR_KINDS.
UNREACHABLE = "unreachable"
TIMEOUT = "timeout"
SERVER_ERROR = "server_error"
OVERLOADED = "overloaded"
SANDBOX_ERROR = "sandbox_error"


class SandboxInfraError(RuntimeError):
    """The sandbox (not the code) failed: unreachable, HTTP 5xx, overloaded, or SandboxError after retries."""

    def __init__(self, message: str, kind: str):
        super().__init__(message)
        self.kind = kind


class SandboxRequestError(ValueError):
    """The service refused the request itself (HTTP 4xx): e.g. a bad field, a body over the size limit."""

    def __init__(self, message: str, status_code: int, detail: Any = None):
        super().__init__(message)
        self.status_code = status_code
        self.detail = detail


class SessionNotFoundError(SandboxRequestError):
    """The session id is unknown: it was deleted, reaped after its idle TTL, or the service restarted."""


class SandboxClient:
    """Client for one sandbox service (`base_url`), or several replicas (`base_url` a list: round-robin).

    `timeout` is the HTTP timeout added on top of the code's own time limit; `retries` is how many extra
    attempts a stateless call (`run_code`, session creation) gets on an infrastructure fault, with jittered
    exponential backoff from `backoff_s` up to `max_backoff_s` (`agentrl.retry`; a 503's Retry-After is
    honoured up to `max_backoff_s`). `token_file`: the sandbox's token (see the module docstring), configured at
    `token_key`.
    """

    def __init__(self, base_url: str | list[str], *, timeout: float = 30.0, retries: int = 2,
                 backoff_s: float = 0.25, max_backoff_s: float = 10.0,
                 transport: httpx.AsyncBaseTransport | None = None, token_file: str | None = None,
                 token_key: str = "reward.sandbox_token_file"):
        urls = [base_url] if isinstance(base_url, str) else list(base_url)
        if not urls:
            raise ValueError("SandboxClient needs at least one base_url, e.g. 'http://127.0.0.1:8080'")
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries}")
        self.base_urls = [u.rstrip("/") for u in urls]
        self.timeout = timeout
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self._next = 0
        self._session_url: dict[str, str] = {}
        self.token_key = token_key
        self._http = httpx.AsyncClient(timeout=timeout, transport=transport,
                                       headers=bearer_headers(token_file, token_key))

    def _pick_url(self) -> str:
        url = self.base_urls[self._next % len(self.base_urls)]
        self._next += 1
        return url

    async def _request(self, method: str, base: str, path: str, *, json: dict | None, timeout: float,
                       retry: bool) -> httpx.Response:
        """One call with retries on infra faults; returns a 2xx/4xx response or raises SandboxInfraError."""
        attempts = self.retries + 1 if retry else 1
        last: SandboxInfraError | None = None
        for attempt in range(attempts):
            retry_after = None
            try:
                resp = await self._http.request(method, base + path, json=json, timeout=timeout)
            except httpx.TimeoutException as e:
                last = SandboxInfraError(f"sandbox {base}{path} timed out after {timeout:.0f}s: {e!r}", TIMEOUT)
                if not retry:
                    break
            except httpx.TransportError as e:
                last = SandboxInfraError(f"sandbox {base} unreachable: {e!r}", UNREACHABLE)
                # A connection that never opened cannot have run anything: safe to retry even a session cell.
                if not retry and not isinstance(e, httpx.ConnectError):
                    break
            else:
                if resp.status_code == 401:
                    raise unauthorized(f"sandbox {base}", self.token_key, _detail(resp))
                if resp.status_code == 503:
                    last = SandboxInfraError(f"sandbox {base} overloaded (503): {resp.text[:300]}", OVERLOADED)
                    retry_after = parse_retry_after(resp.headers.get("retry-after"))
                elif resp.status_code >= 500:
                    last = SandboxInfraError(f"sandbox {base}{path} answered HTTP {resp.status_code}: "
                                             f"{resp.text[:500]}", SERVER_ERROR)
                    if not retry:
                        break
                else:
                    return resp
            if attempt + 1 < attempts:
                await asyncio.sleep(self._backoff(attempt, retry_after))
        assert last is not None
        raise last

    def _backoff(self, attempt: int, retry_after: float | None = None) -> float:
        return backoff_delay(attempt, self.backoff_s, self.max_backoff_s, retry_after_s=retry_after)

    @staticmethod
    def _check_4xx(resp: httpx.Response, what: str) -> None:
        if resp.status_code < 400:
            return
        detail = _detail(resp)
        cls = SessionNotFoundError if resp.status_code == 404 else SandboxRequestError
        raise cls(f"sandbox refused {what} (HTTP {resp.status_code}): {detail}", resp.status_code, detail)

    async def run_code(self, code: str, language: str = "python", run_timeout: float = 10, **fields) -> dict:
        """SandboxFusion `POST /run_code`; returns its response dict (`status` Success or Failed).

        Extra SandboxFusion fields (`stdin`, `files`, `fetch_files`, `memory_limit_MB`, ...) pass through.
        `status: SandboxError` is retried, then raised as SandboxInfraError(kind="sandbox_error").
        """
        body = {"code": code, "language": language, "run_timeout": run_timeout, **fields}
        timeout = self.timeout + float(run_timeout) + float(fields.get("compile_timeout", 0) or 0)
        last_message = ""
        for attempt in range(self.retries + 1):
            resp = await self._request("POST", self._pick_url(), "/run_code", json=body, timeout=timeout, retry=True)
            self._check_4xx(resp, "run_code")
            result = resp.json()
            if result.get("status") != "SandboxError":
                return result
            last_message = str(result.get("message", ""))
            if attempt < self.retries:
                await asyncio.sleep(self._backoff(attempt))
        raise SandboxInfraError(f"sandbox reported SandboxError {self.retries + 1} times: {last_message}",
                                SANDBOX_ERROR)

    async def create_session(self, language: str = "python", memory_limit_MB: int = 512,
                             idle_ttl_s: float = 600, forkable: bool = False) -> str:
        """Start a stateful interpreter; returns its session id (use it with run_cell / delete_session; a
        `forkable` one also with fork)."""
        base = self._pick_url()
        body = {"language": language, "memory_limit_MB": memory_limit_MB, "idle_ttl_s": idle_ttl_s,
                "forkable": forkable}
        resp = await self._request("POST", base, "/sessions", json=body, timeout=self.timeout, retry=True)
        self._check_4xx(resp, "session creation")
        session_id = resp.json()["session_id"]
        self._session_url[session_id] = base
        return session_id

    async def snapshot(self, session_id: str) -> dict:
        """`GET /sessions/{id}/snapshot`: {workspace (base64 tar), digest, files, bytes, skipped, cells,
        replayable}. A work dir past the service's snapshot limits is a SandboxRequestError with status 413."""
        base = self._session_url.get(session_id, self.base_urls[0])
        resp = await self._request("GET", base, f"/sessions/{session_id}/snapshot", json=None,
                                   timeout=self.timeout, retry=False)
        self._check_4xx(resp, f"a snapshot of session {session_id}")
        return resp.json()

    async def restore(self, session_id: str, cells: list[str], workspace: str | None = None,
                      timeout: float = 10) -> dict:
        """Replay `cells` in the session, then lay down the snapshot's `workspace` (base64 tar; None: keep what
        the replay wrote): {replayed_cells, diverged, digest, files}. Not retried (the cells change the state)."""
        base = self._session_url.get(session_id, self.base_urls[0])
        body = {"cells": cells, "workspace": workspace, "timeout": timeout}
        resp = await self._request("POST", base, f"/sessions/{session_id}/restore", json=body,
                                   timeout=self.timeout + float(timeout) * (len(cells) + 1), retry=False)
        self._check_4xx(resp, f"restoring session {session_id}")
        return resp.json()

    async def fork(self, session_id: str, n: int) -> list[str]:
        """`n` new sessions whose state is `session_id`'s now (copy-on-write), on the same service. Not retried
        (a fork that timed out may have made sessions; they are reaped when idle)."""
        base = self._session_url.get(session_id, self.base_urls[0])
        resp = await self._request("POST", base, f"/sessions/{session_id}/fork?n={int(n)}", json=None,
                                   timeout=self.timeout + 2.0 * n, retry=False)
        self._check_4xx(resp, f"forking session {session_id}")
        children = resp.json()["session_ids"]
        for child in children:
            self._session_url[child] = base
        return children

    async def run_cell(self, session_id: str, code: str, timeout: float = 10, track_workspace: bool = False) -> dict:
        """Run one cell in a session: {status: ok|error|timeout, stdout, stderr, error, execution_count,
        restarted, workspace_changed (with `track_workspace`), ...}. A cell is not retried once sent (it may have
        changed the session's state)."""
        base = self._session_url.get(session_id, self.base_urls[0])
        body = {"code": code, "timeout": timeout, "track_workspace": track_workspace}
        resp = await self._request("POST", base, f"/sessions/{session_id}/run", json=body,
                                   timeout=self.timeout + float(timeout), retry=False)
        self._check_4xx(resp, f"cell in session {session_id}")
        return resp.json()

    async def delete_session(self, session_id: str) -> None:
        """End a session; an unknown (already reaped) session is not an error."""
        base = self._session_url.pop(session_id, self.base_urls[0])
        resp = await self._request("DELETE", base, f"/sessions/{session_id}", json=None, timeout=self.timeout,
                                   retry=True)
        if resp.status_code != 404:
            self._check_4xx(resp, f"deleting session {session_id}")

    async def ping(self) -> None:
        """`GET /v1/ping`, a route behind the token: raises ServiceAuthError when the token is missing or wrong."""
        resp = await self._request("GET", self.base_urls[0], "/v1/ping", json=None, timeout=self.timeout, retry=False)
        self._check_4xx(resp, "ping")

    async def health(self) -> dict:
        resp = await self._request("GET", self.base_urls[0], "/health", json=None, timeout=self.timeout, retry=False)
        self._check_4xx(resp, "health")
        return resp.json()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> "SandboxClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()


def _detail(resp: httpx.Response) -> Any:
    """The `detail` of the service's JSON error body, else the start of the body."""
    try:
        return resp.json().get("detail")
    except (ValueError, AttributeError):
        return resp.text[:500]


def cell_to_text(cell: dict) -> str:
    """Render a session cell result as the observation a model sees: stdout, stderr, then the error."""
    parts = []
    if cell.get("restarted"):
        parts.append("[the interpreter was restarted: variables and imports from earlier cells are lost]")
    if cell.get("stdout"):
        parts.append(cell["stdout"].rstrip("\n"))
    if cell.get("stderr"):
        parts.append(cell["stderr"].rstrip("\n"))
    error = cell.get("error")
    if error:
        parts.append(error.get("traceback") or f"{error.get('name')}: {error.get('value')}")
    if cell.get("status") == "timeout" and not error:
        parts.append("TimeoutError: the cell exceeded its time limit and was interrupted")
    if cell.get("truncated"):
        parts.append("[output truncated]")
    return "\n".join(parts) if parts else "(no output)"


def run_result_to_text(result: dict) -> str:
    """Render a /run_code response for a model: stdout, stderr and why the run stopped when it failed."""
    run = result.get("run_result") or {}
    parts = [s.rstrip("\n") for s in (run.get("stdout"), run.get("stderr")) if s]
    reason = result.get("exit_reason")
    if run.get("status") == "TimeLimitExceeded":
        parts.append("TimeoutError: the program exceeded its time limit")
    elif reason and reason != "exit":
        parts.append(f"[stopped: {reason}, return code {run.get('return_code')}]")
    elif run.get("return_code") not in (0, None):
        parts.append(f"[exit code {run.get('return_code')}]")
    return "\n".join(parts) if parts else "(no output)"
