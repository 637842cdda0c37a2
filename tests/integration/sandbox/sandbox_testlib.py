"""Helpers for the sandbox integration tests."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys

import httpx

SECRET = "agentrl-sandbox-test-secret-4f1d"  # set in the service's environment; must never reach the code


def run(http: httpx.Client, code: str, **fields) -> dict:
    resp = http.post("/run_code", json={"code": code, "language": "python", **fields})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["status"] != "SandboxError", body
    return body


def assert_benign(http: httpx.Client) -> None:
    """The service still answers a plain request correctly (after each adversarial case)."""
    body = run(http, "print(sum(range(10)))")
    assert body["status"] == "Success", body
    assert body["run_result"]["stdout"] == "45\n"


def check(body: dict, status: str, exit_reason: str, run_status: str = "Finished") -> None:
    assert body["status"] == status, body
    assert body["exit_reason"] == exit_reason, body
    assert body["run_result"]["status"] == run_status, body


SERVICE_SETTINGS = ["max_concurrency=2", "tmpfs_mb=64", "max_file_bytes=33554432", "pids_limit=64",
                    "default_memory_mb=256", "max_sessions=4", "max_output_bytes=65536",
                    "output_kill_bytes=8388608", "session_interrupt_grace_s=1.0"]


def bwrap_unavailable_reason() -> str | None:
    if not sys.platform.startswith("linux"):
        return "the bwrap backend needs Linux"
    if shutil.which("bwrap") is None:
        return "bubblewrap is not installed (make bwrap)"
    if os.geteuid() != 0:
        return "cgroup limits need root (or a delegated cgroup subtree)"
    return None


@contextlib.contextmanager
def sandbox_service(*settings: str):
    """A sandbox service of the test's own on a free loopback port, with SERVICE_SETTINGS and `settings`
    (`key=value`); yields a client of it, and stops it."""
    from helpers import free_port, service

    port = free_port()
    args = ["python", "-m", "sandbox", "serve", "--port", str(port)]
    for item in (*SERVICE_SETTINGS, *settings):
        args += ["--set", item]
    url = f"http://127.0.0.1:{port}"
    with service(args, f"{url}/v1/ping"), httpx.Client(base_url=url, timeout=120) as http:
        yield http


def session(http: httpx.Client, **fields) -> str:
    """A new python session's id (`forkable=True` for a fork source)."""
    resp = http.post("/sessions", json={"language": "python", **fields})
    assert resp.status_code == 200, resp.text
    return resp.json()["session_id"]


def cell(http: httpx.Client, sid: str, code: str, timeout: float = 5) -> dict:
    resp = http.post(f"/sessions/{sid}/run", json={"code": code, "timeout": timeout})
    assert resp.status_code == 200, resp.text
    return resp.json()


def fork(http: httpx.Client, sid: str, n: int) -> list[str]:
    resp = http.post(f"/sessions/{sid}/fork", params={"n": n})
    assert resp.status_code == 200, resp.text
    ids = resp.json()["session_ids"]
    assert len(ids) == n and len(set(ids)) == n and sid not in ids
    return ids


@contextlib.contextmanager
def python_session(http: httpx.Client, kind: str = "plain", setup: str = "", **fields):
    """A python session's id, deleted afterwards: a plain one, or (`kind="forked"`) a child forked from a fork
    source that ran `setup` (the source is deleted with it)."""
    if kind == "plain":
        sid = session(http, **fields)
        try:
            if setup:
                assert cell(http, sid, setup)["status"] == "ok"
            yield sid
        finally:
            http.delete(f"/sessions/{sid}")
        return
    source = session(http, forkable=True, **fields)
    try:
        if setup:
            assert cell(http, source, setup)["status"] == "ok"
        (child,) = fork(http, source, 1)
        try:
            yield child
        finally:
            http.delete(f"/sessions/{child}")
    finally:
        http.delete(f"/sessions/{source}")


# Output goes to unlinked files in /dev/shm, not pipes: a daemon the program leaves (holding its stdout) must not
# hold the cell, and a program filling /tmp or the work dir must not lose its output.
_PROGRAM_CELL = """
import base64 as _b64, subprocess as _sp, sys as _sys, tempfile as _tf
with open({script!r}, 'wb') as _f:
    _f.write(_b64.b64decode({code!r}))
_argv = {{'python': [_sys.executable, {script!r}], 'bash': ['/bin/bash', {script!r}]}}[{language!r}]
with _tf.TemporaryFile(dir="/dev/shm") as _in, _tf.TemporaryFile(dir="/dev/shm") as _out, \
        _tf.TemporaryFile(dir="/dev/shm") as _err:
    _in.write(_b64.b64decode({stdin!r}))
    _in.seek(0)
    try:
        _rc = _sp.run(_argv, stdin=_in, stdout=_out, stderr=_err, timeout={timeout!r}).returncode
    except _sp.TimeoutExpired:
        _rc = None
    _out.seek(0)
    _err.seek(0)
    print(repr((_rc, _out.read().decode(errors='replace'), _err.read().decode(errors='replace'))))
"""


def run_in_forked_session(http: httpx.Client, code: str, language: str = "python", run_timeout: float = 10,
                          stdin: str | None = None) -> dict:
    """`code` run as a program inside a freshly forked session (a process of the child's sandbox: its
    namespaces, seccomp filter, cgroup and uid), answered in `/run_code`'s shape (status, exit_reason,
    run_result) so the adversarial checks read it unchanged."""
    import base64

    script = "/workspace/main.py" if language == "python" else "/workspace/main.sh"
    text = _PROGRAM_CELL.format(script=script, code=base64.b64encode(code.encode()).decode(), language=language,
                                stdin=base64.b64encode((stdin or "").encode()).decode(), timeout=run_timeout)
    with python_session(http, "forked") as child:
        out = cell(http, child, text, timeout=run_timeout + 10)
    assert out["status"] == "ok", out
    rc, stdout, stderr = eval(out["stdout"])
    if rc is None:
        return {"status": "Failed", "exit_reason": "timeout",
                "run_result": {"status": "TimeLimitExceeded", "return_code": None, "stdout": "", "stderr": ""}}
    return {"status": "Success" if rc == 0 else "Failed", "exit_reason": "exit" if rc >= 0 else "signal",
            "run_result": {"status": "Finished", "return_code": rc if rc >= 0 else 128 - rc, "stdout": stdout,
                           "stderr": stderr}}
