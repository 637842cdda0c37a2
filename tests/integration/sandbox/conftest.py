"""One sandbox service (bwrap backend) shared by the sandbox integration tests, with small limits for speed."""

from __future__ import annotations

import os
import shutil
import sys

import httpx
import pytest

from helpers import free_port, service
from sandbox_testlib import SECRET
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


@pytest.fixture(scope="session")
def sandbox_url():
    reason = bwrap_unavailable_reason()
    if reason:
        pytest.skip(reason)
    port = free_port()
    args = ["python", "-m", "sandbox", "serve", "--port", str(port)]
    for item in SERVICE_SETTINGS:
        args += ["--set", item]
    url = f"http://127.0.0.1:{port}"
    with service(args, f"{url}/v1/ping", env={"AGENTRL_SANDBOX_TEST_SECRET": SECRET}):
        yield url


@pytest.fixture
def http(sandbox_url):
    with httpx.Client(base_url=sandbox_url, timeout=60) as client:
        yield client
