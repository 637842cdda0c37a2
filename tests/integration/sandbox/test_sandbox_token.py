"""A real `agentrl sandbox serve --token-file` on loopback: /health is open, the SandboxClient and the training
preflight without the token or with a wrong one are refused with the key to set, and with the right one run code."""

from __future__ import annotations

import httpx
import pytest
from helpers import free_port, service
from sandbox_testlib import SERVICE_SETTINGS, bwrap_unavailable_reason

from agentrl.auth import ServiceAuthError
from agentrl.preflight import _check_sandbox
from sandbox.client import SandboxClient

pytestmark = pytest.mark.slow

TOKEN = "5b1e0c9d7a3f42e8b6c1d0e9f8a7b6c5"


def secret(path, token: str) -> str:
    path.write_text(token)
    path.chmod(0o600)
    return str(path)


@pytest.fixture(scope="module")
def guarded_sandbox(tmp_path_factory):
    reason = bwrap_unavailable_reason()
    if reason:
        pytest.skip(reason)
    token_file = secret(tmp_path_factory.mktemp("sandbox") / "token", TOKEN)
    port = free_port()
    args = ["python", "-m", "sandbox", "serve", "--port", str(port), "--token-file", token_file]
    for item in (*SERVICE_SETTINGS, "warm_pool=1"):
        args += ["--set", item]
    url = f"http://127.0.0.1:{port}"
    with service(args, f"{url}/health"):
        yield url


async def test_client_without_or_with_a_wrong_token_is_refused(guarded_sandbox, tmp_path):
    assert httpx.get(f"{guarded_sandbox}/health", timeout=30).json()["status"] == "ok"
    for token_file in (None, secret(tmp_path / "wrong", "wrong-token")):
        async with SandboxClient(guarded_sandbox, token_file=token_file) as client:
            with pytest.raises(ServiceAuthError, match=r"HTTP 401 .*: set reward\.sandbox_token_file"):
                await client.run_code("print(6 * 7)")


async def test_client_with_the_right_token_runs_code(guarded_sandbox, tmp_path):
    async with SandboxClient(guarded_sandbox, token_file=secret(tmp_path / "right", TOKEN)) as client:
        result = await client.run_code("print(6 * 7)")
        session = await client.create_session()
        cell = await client.run_cell(session, "print(1 + 1)")
        await client.delete_session(session)
    assert result["status"] == "Success" and result["run_result"]["stdout"] == "42\n"
    assert cell["stdout"] == "2\n"


def test_preflight_names_the_token_setting(guarded_sandbox, tmp_path):
    (problem,) = _check_sandbox(guarded_sandbox, "reward.sandbox_url")
    assert problem.startswith(f"sandbox {guarded_sandbox} refused the request with HTTP 401 (missing Authorization")
    assert "set reward.sandbox_token_file" in problem
    assert _check_sandbox(guarded_sandbox, "reward.sandbox_url", secret(tmp_path / "right", TOKEN)) == []
