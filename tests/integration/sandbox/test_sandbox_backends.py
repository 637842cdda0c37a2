"""Backend selection: never silently unisolated; --allow-unsafe is explicit and visible; docker when available."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest
from helpers import REPO_ROOT, free_port, service
from sandbox_testlib import assert_benign, bwrap_unavailable_reason, run, sandbox_service

pytestmark = pytest.mark.slow

NO_BWRAP_ENV = {"PATH": "/nonexistent-agentrl-test-bin"}  # bwrap cannot be found; absolute paths still work


def test_refuses_to_start_without_isolation():
    port = free_port()
    out = subprocess.run([sys.executable, "-m", "sandbox", "serve", "--port", str(port)], cwd=REPO_ROOT,
                         env={**os.environ, **NO_BWRAP_ENV}, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "bwrap" in out.stderr and "--allow-unsafe" in out.stderr


def test_allow_unsafe_is_explicit_and_reported():
    port = free_port()
    agentrl = os.path.join(os.path.dirname(sys.executable), "agentrl")
    url = f"http://127.0.0.1:{port}"
    with service([agentrl, "sandbox", "serve", "--port", str(port), "--allow-unsafe"], f"{url}/v1/ping",
                 env=NO_BWRAP_ENV):
        with httpx.Client(base_url=url, timeout=30) as http:
            health = http.get("/health").json()
            assert health["unsafe"] is True and health["isolation"].startswith("none")
            assert health["canary"]["ok"] is True
            assert_benign(http)


def _docker_unavailable() -> str | None:
    try:
        import docker
    except ImportError:
        return "the docker SDK is not installed (pip install 'agentrl[docker]')"
    try:
        client = docker.from_env()
        client.ping()
        client.images.get("python:3.11-slim")
    except docker.errors.ImageNotFound:
        return "the Docker engine has no python:3.11-slim image (docker pull python:3.11-slim)"
    except docker.errors.DockerException as e:
        return f"no Docker engine answers on this machine ({type(e).__name__}); docker backend not exercised"
    return None


@pytest.mark.docker
def test_docker_backend_isolates():
    reason = _docker_unavailable()
    if reason:
        pytest.skip(reason)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with service(["python", "-m", "sandbox", "serve", "--port", str(port), "--backend", "docker"],
                 f"{url}/v1/ping", timeout=120):
        with httpx.Client(base_url=url, timeout=60) as http:
            assert http.get("/health").json()["isolation"] == "docker"
            assert_benign(http)
            net = run(http, "import socket\ntry:\n    socket.create_connection(('1.1.1.1', 53), timeout=1)\n"
                            "    print('CONNECTED')\nexcept OSError:\n    print('blocked')")
            assert net["run_result"]["stdout"] == "blocked\n"
            oom = run(http, "x = bytearray(512 * 2**20)", memory_limit_MB=128)
            assert oom["status"] == "Failed" and oom["exit_reason"] == "oom"
            loop = run(http, "while True: pass", run_timeout=1)
            assert loop["run_result"]["status"] == "TimeLimitExceeded"
            assert_benign(http)


def test_docker_backend_without_engine_refuses_to_start():
    if _docker_unavailable() is None:
        pytest.skip("a Docker engine answers here: test_docker_backend_isolates covers this backend")
    port = free_port()
    out = subprocess.run([sys.executable, "-m", "sandbox", "serve", "--port", str(port), "--backend", "docker"],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "docker" in out.stderr.lower() and "--allow-unsafe" in out.stderr


def test_bwrap_per_sandbox_without_the_zygote():
    """`zygote=false`: every sandbox is a bwrap process (the path without cgroups too): same results."""
    if reason := bwrap_unavailable_reason():
        pytest.skip(reason)
    with sandbox_service("zygote=false") as http:
        assert http.get("/health").json()["zygote"] is False
        body = run(http, "import os, sys\nprint(input(), sorted(os.listdir('/')))\nopen('out.txt', 'w').write('x')\n"
                   "sys.exit(3)", stdin="hello\n", fetch_files=["out.txt"])
        assert body["status"] == "Failed" and body["run_result"]["return_code"] == 3, body
        assert body["run_result"]["stdout"].startswith("hello ['bin', 'dev', 'etc', ") and body["files"]["out.txt"]
        body = run(http, "import os\nwhile True:\n    os.fork()", run_timeout=2)
        assert body["status"] == "Failed" and body["exit_reason"] == "pids_limit", body
        sid = http.post("/sessions", json={"language": "python"}).json()["session_id"]
        http.post(f"/sessions/{sid}/run", json={"code": "x = 41", "timeout": 10})
        cell = http.post(f"/sessions/{sid}/run", json={"code": "x + 1", "timeout": 10}).json()
        assert cell["status"] == "ok" and cell["stdout"] == "42\n", cell
        assert_benign(http)


def test_a_zygote_that_cannot_start_falls_back_to_bwrap(monkeypatch):
    import asyncio

    from sandbox.backends.base import BackendError, ExecRequest
    from sandbox.backends.bwrap import BwrapBackend
    from sandbox.backends.zygote import Zygote
    from sandbox.config import SandboxConfig

    if reason := bwrap_unavailable_reason():
        pytest.skip(reason)

    async def broken(self):
        raise BackendError("the sandbox zygote did not start: test")

    monkeypatch.setattr(Zygote, "ensure", broken)

    async def main():
        backend = BwrapBackend(SandboxConfig(max_concurrency=2, warm_pool=2))
        await backend.start()
        try:
            info = backend.info()
            result = await backend.execute(ExecRequest(code="print(6 * 7)"))
        finally:
            await backend.close()
        return info, result

    info, result = asyncio.run(main())
    assert info["zygote"] is False and "test" in info["zygote_error"] and info["isolation"] == "bwrap+cgroups"
    assert result.infra_error is None and result.stdout == "42\n"
