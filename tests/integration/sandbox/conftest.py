"""One sandbox service (bwrap backend) shared by the sandbox integration tests, with small limits for speed."""

from __future__ import annotations

import functools

import httpx
import pytest
from helpers import free_port, service
from sandbox_testlib import SECRET, SERVICE_SETTINGS, bwrap_unavailable_reason, run, run_in_forked_session


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


@pytest.fixture(params=["run_code", "forked_session"])
def program(request, http):
    """Runs a program and answers in `/run_code`'s shape: through `/run_code`, then inside a forked session
    (the adversarial checks hold for both)."""
    if request.param == "run_code":
        return functools.partial(run, http)
    return functools.partial(run_in_forked_session, http)


@pytest.fixture(params=["plain", "forked"])
def session_kind(request):
    """A session test runs on a plain session and on one forked from a fork source (sandbox_testlib)."""
    return request.param
