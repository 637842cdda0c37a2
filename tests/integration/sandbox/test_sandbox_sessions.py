"""Stateful sessions over HTTP: state kept, interrupts, restarts, isolation between sessions, caps and reaping."""

from __future__ import annotations

import asyncio
import time

import pytest
from sandbox_testlib import assert_benign

from sandbox.client import SandboxClient, SessionNotFoundError, cell_to_text

pytestmark = pytest.mark.slow


def new_session(http, **fields) -> str:
    resp = http.post("/sessions", json={"language": "python", **fields})
    assert resp.status_code == 200, resp.text
    return resp.json()["session_id"]


def cell(http, sid: str, code: str, timeout: float = 5) -> dict:
    resp = http.post(f"/sessions/{sid}/run", json={"code": code, "timeout": timeout})
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_session_keeps_variables_imports_and_files(http):
    sid = new_session(http)
    try:
        assert cell(http, sid, "import math\nx = 41\nopen('notes.txt', 'w').write('kept')")["status"] == "ok"
        out = cell(http, sid, "print(math.sqrt(16), x + 1, open('notes.txt').read())\nx")
        assert out["status"] == "ok" and out["stdout"] == "4.0 42 kept\n41\n" and out["execution_count"] == 2
        err = cell(http, sid, "undefined_name + 1")
        assert err["status"] == "error" and err["error"]["name"] == "NameError"
        assert "undefined_name" in err["error"]["traceback"] and err["restarted"] is False
        assert cell(http, sid, "print(x)")["stdout"] == "41\n"  # an error does not lose state
    finally:
        http.delete(f"/sessions/{sid}")


def test_timed_out_cell_is_interrupted_and_session_survives(http):
    sid = new_session(http)
    try:
        cell(http, sid, "counter = 7")
        out = cell(http, sid, "while True:\n    counter += 0", timeout=1)
        assert out["status"] == "timeout" and out["exit_reason"] == "timeout" and out["restarted"] is False
        assert out["error"]["name"] == "TimeoutError" and "KeyboardInterrupt" in out["error"]["traceback"]
        out = cell(http, sid, "import time\ntime.sleep(30)", timeout=1)  # blocked in a syscall
        assert out["status"] == "timeout" and out["restarted"] is False
        assert cell(http, sid, "print(counter)")["stdout"] == "7\n"
    finally:
        http.delete(f"/sessions/{sid}")


def test_uninterruptible_cell_restarts_the_session(http):
    sid = new_session(http)
    try:
        cell(http, sid, "lost = 1")
        out = cell(http, sid, "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass",
                   timeout=1)
        assert out["status"] == "timeout" and out["restarted"] is True
        after = cell(http, sid, "print('fresh', 'lost' in globals())")
        assert after["stdout"] == "fresh False\n" and after["status"] == "ok"
    finally:
        http.delete(f"/sessions/{sid}")


def test_session_oom_restarts_with_reason(http):
    sid = new_session(http, memory_limit_MB=128)
    try:
        out = cell(http, sid, "x = bytearray(400 * 2**20)")
        assert out["status"] == "error" and out["restarted"] is True and out["exit_reason"] == "oom", out
        assert cell(http, sid, "print(1 + 1)")["stdout"] == "2\n"
    finally:
        http.delete(f"/sessions/{sid}")


def test_sessions_do_not_share_state(http):
    a, b = new_session(http), new_session(http)
    try:
        cell(http, a, "secret = 'from-a'\nopen('/tmp/a.txt', 'w').write('a')\nopen('a.txt', 'w').write('a')")
        out = cell(http, b, "import os\nprint('secret' in globals(), os.path.exists('/tmp/a.txt'), "
                            "os.path.exists('a.txt'))")
        assert out["stdout"] == "False False False\n"
    finally:
        http.delete(f"/sessions/{a}")
        http.delete(f"/sessions/{b}")


def test_session_cap_idle_reaping_and_delete(http):
    ids = [new_session(http, idle_ttl_s=1) for _ in range(4)]  # max_sessions=4 in this service
    resp = http.post("/sessions", json={"language": "python"})
    assert resp.status_code == 503 and "max_sessions" in resp.json()["detail"] and "retry-after" in resp.headers
    assert http.delete(f"/sessions/{ids[0]}").status_code == 200
    assert http.post(f"/sessions/{ids[0]}/run", json={"code": "1"}).status_code == 404
    time.sleep(2.5)  # idle_ttl_s=1 and the reaper runs every second
    assert http.get("/health").json()["live_sessions"] == 0
    assert http.post(f"/sessions/{ids[1]}/run", json={"code": "1"}).status_code == 404
    assert_benign(http)


def test_session_request_validation(http):
    resp = http.post("/sessions", json={"language": "bash"})
    assert resp.status_code == 400 and "language" in resp.json()["detail"]
    resp = http.post("/sessions", json={"language": "python", "memory_limit_MB": 10**7})
    assert resp.status_code == 400 and "memory_limit_MB" in resp.json()["detail"]
    sid = new_session(http)
    try:
        resp = http.post(f"/sessions/{sid}/run", json={"code": "1", "timeout": -1})
        assert resp.status_code == 400 and "timeout" in resp.json()["detail"]
        resp = http.post(f"/sessions/{sid}/run", json={"timeout": 1})
        assert resp.status_code == 422 and "code" in resp.text
    finally:
        http.delete(f"/sessions/{sid}")


async def test_client_runs_cells_and_classifies_faults(sandbox_url):
    async with SandboxClient(sandbox_url, retries=0) as client:
        sid = await client.create_session(memory_limit_MB=256, idle_ttl_s=60)
        first = await client.run_cell(sid, "y = [1, 2, 3]\nsum(y)")
        assert first["stdout"] == "6\n" and cell_to_text(first) == "6"
        failed = await client.run_cell(sid, "1 / 0")  # the code's fault: a normal result, not an exception
        assert failed["status"] == "error" and "ZeroDivisionError" in cell_to_text(failed)
        for _ in range(20):
            await client.run_cell(sid, "y.append(len(y))")
        assert (await client.run_cell(sid, "len(y)"))["stdout"] == "23\n"
        await client.delete_session(sid)
        with pytest.raises(SessionNotFoundError):
            await client.run_cell(sid, "1")
        await client.delete_session(sid)  # deleting twice is not an error
        result = await client.run_code("import sys; sys.exit(3)")
        assert result["status"] == "Failed" and result["run_result"]["return_code"] == 3
        many = await asyncio.gather(*(client.run_code(f"print({i} * 2)") for i in range(6)))
        assert [r["run_result"]["stdout"] for r in many] == [f"{i * 2}\n" for i in range(6)]
