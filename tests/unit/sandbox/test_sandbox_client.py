"""SandboxClient: code faults come back as results, sandbox faults raise SandboxInfraError with the right kind."""

from __future__ import annotations

import httpx
import pytest

from sandbox.client import (
    SandboxClient,
    SandboxInfraError,
    SandboxRequestError,
    SessionNotFoundError,
    cell_to_text,
    run_result_to_text,
)

FAILED = {"status": "Failed", "message": "exited with code 1", "compile_result": None,
          "run_result": {"status": "Finished", "execution_time": 0.01, "return_code": 1, "stdout": "",
                         "stderr": "Traceback...\nZeroDivisionError: division by zero\n"},
          "files": {}, "exit_reason": "exit"}


def client_for(handler, retries: int = 2) -> tuple[SandboxClient, list]:
    calls = []

    def wrapped(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return handler(request, len(calls))

    return SandboxClient("http://sandbox", retries=retries, backoff_s=0.001,
                         transport=httpx.MockTransport(wrapped)), calls


async def test_code_fault_is_a_result_not_an_exception():
    client, calls = client_for(lambda req, n: httpx.Response(200, json=FAILED))
    result = await client.run_code("1/0")
    assert result["status"] == "Failed" and len(calls) == 1
    assert "ZeroDivisionError" in run_result_to_text(result) and "[exit code 1]" in run_result_to_text(result)


async def test_sandbox_error_is_retried_then_raised():
    client, calls = client_for(lambda req, n: httpx.Response(200, json={"status": "SandboxError", "message": "x"}))
    with pytest.raises(SandboxInfraError) as err:
        await client.run_code("print(1)")
    assert err.value.kind == "sandbox_error" and len(calls) == 3


async def test_transient_5xx_then_success():
    client, calls = client_for(lambda req, n: httpx.Response(502, text="bad gateway") if n < 3
                               else httpx.Response(200, json={**FAILED, "status": "Success"}))
    assert (await client.run_code("print(1)"))["status"] == "Success" and len(calls) == 3


async def test_overloaded_and_unreachable_kinds():
    client, _ = client_for(lambda req, n: httpx.Response(503, headers={"Retry-After": "0"}, json={"detail": "busy"}))
    with pytest.raises(SandboxInfraError) as err:
        await client.run_code("1")
    assert err.value.kind == "overloaded"

    def refuse(req, n):
        raise httpx.ConnectError("connection refused", request=req)

    client, calls = client_for(refuse)
    with pytest.raises(SandboxInfraError) as err:
        await client.run_code("1")
    assert err.value.kind == "unreachable" and len(calls) == 3


async def test_bad_request_and_missing_session():
    client, _ = client_for(lambda req, n: httpx.Response(400, json={"detail": "files: '../x' must be relative"}))
    with pytest.raises(SandboxRequestError) as err:
        await client.run_code("1", files={"../x": ""})
    assert err.value.status_code == 400 and "files" in str(err.value)
    client, calls = client_for(lambda req, n: httpx.Response(404, json={"detail": "no session 'abc'"}))
    with pytest.raises(SessionNotFoundError):
        await client.run_cell("abc", "1")
    await client.delete_session("abc")  # already gone: fine


async def test_cell_is_not_resent_after_a_server_error():
    client, calls = client_for(lambda req, n: httpx.Response(500, text="boom"))
    with pytest.raises(SandboxInfraError) as err:
        await client.run_cell("sid", "x += 1")
    assert err.value.kind == "server_error" and len(calls) == 1  # a cell may have changed state: never retried


async def test_session_calls_go_to_the_replica_that_created_them():
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        if request.url.path == "/sessions":
            return httpx.Response(200, json={"session_id": f"s-{request.url.host}"})
        return httpx.Response(200, json={"status": "ok", "stdout": "1\n", "stderr": "", "error": None,
                                         "execution_count": 1, "restarted": False})

    client = SandboxClient(["http://a", "http://b"], transport=httpx.MockTransport(handler))
    sid_a, sid_b = await client.create_session(), await client.create_session()
    await client.run_cell(sid_b, "1")
    await client.run_cell(sid_a, "1")
    assert seen[2] == "http://b/sessions/s-b/run" and seen[3] == "http://a/sessions/s-a/run"


def test_cell_to_text():
    assert cell_to_text({"status": "ok", "stdout": "42\n", "stderr": ""}) == "42"
    text = cell_to_text({"status": "timeout", "stdout": "", "stderr": "", "restarted": True,
                         "error": {"name": "TimeoutError", "value": "t", "traceback": "KeyboardInterrupt"}})
    assert "restarted" in text and "KeyboardInterrupt" in text
    assert cell_to_text({"status": "ok", "stdout": "", "stderr": ""}) == "(no output)"


def test_client_argument_checks():
    with pytest.raises(ValueError, match="base_url"):
        SandboxClient([])
    with pytest.raises(ValueError, match="retries"):
        SandboxClient("http://x", retries=-1)
