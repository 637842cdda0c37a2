"""The tool service's ASGI app in-process: the raw `POST /tools/{name}` route and the FastAPI routes beside it."""

from __future__ import annotations

import asyncio

import httpx

from agentrl.tools import tool
from agentrl.tools.service import create_app
from agentrl.tools.toolset import ToolSet


@tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: First.
        b: Second.
    """
    return a + b


class Counter:
    def __init__(self, start: int = 0):
        self.value = start


@tool(session_factory=Counter)
def bump(*, session: Counter) -> int:
    """Increase the session's counter and return it."""
    session.value += 1
    return session.value


@tool
async def wait(ms: float) -> str:
    """Wait.

    Args:
        ms: Milliseconds.
    """
    await asyncio.sleep(ms / 1000)
    return "waited"


def client_for(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://tools")


async def test_tool_route_results_and_error_bodies():
    async with client_for(create_app([add, bump])) as c:
        ok = await c.post("/tools/add", json={"arguments": {"a": 2, "b": 3}})
        assert ok.status_code == 200 and ok.headers["content-type"] == "application/json"
        assert ok.json() == {"content": "5", "is_error": False}
        bad = (await c.post("/tools/add", json={"arguments": {"a": "two"}})).json()
        assert bad["error_kind"] == "bad_arguments" and bad["is_error"] and "'a'" in bad["content"]

        unknown = await c.post("/tools/mul", json={"arguments": {}})
        assert unknown.status_code == 404
        assert unknown.json()["error_kind"] == "unknown_tool" and unknown.json()["tools"] == ["add", "bump"]
        not_json = await c.post("/tools/add", content=b"{oops")
        assert not_json.status_code == 400 and "not JSON" in not_json.json()["detail"]
        not_object = await c.post("/tools/add", json=[1, 2])
        assert not_object.status_code == 400 and "arguments" in not_object.json()["detail"]
        lost = await c.post("/tools/bump", json={"arguments": {}, "session_id": "gone"})
        assert lost.status_code == 404 and lost.json()["error_kind"] == "unknown_session"

        assert (await c.get("/tools")).json()[0]["function"]["name"] == "add"
        health = (await c.get("/health")).json()
        assert health["calls"] == 3 and health["in_flight"] == 0 and health["stateful_tools"] == ["bump"]


async def test_a_call_body_without_arguments_is_a_400_that_says_so():
    shape = 'body must be {"arguments": {...}, "session_id": ...}'
    async with client_for(create_app([add, bump])) as c:
        cases = [
            ({"a": 2, "b": 3}, f'{shape}: missing "arguments"'),  # the arguments sent bare
            ([{"arguments": {}}], f"{shape}: got a JSON array, not an object"),
            ("add", f"{shape}: got a JSON string, not an object"),
            ({"arguments": {}, "session": "s1"}, f'{shape}: unknown field(s) "session"'),
            ({"arguments": {}, "session_id": 7}, '"session_id" must be a string from POST /sessions, or null'),
        ]
        for body, detail in cases:
            r = await c.post("/tools/add", json=body)
            assert r.status_code == 400 and r.json()["detail"].startswith(detail), (body, r.json())
        for raw, detail in [(b"", f"{shape}: the body is empty"), (b"{oops", f"{shape}: it is not JSON")]:
            r = await c.post("/tools/add", content=raw)
            assert r.status_code == 400 and r.json()["detail"].startswith(detail), (raw, r.json())
        # arguments the model got wrong (not an object) are the model's fault: a 200 with a policy error kind
        wrong = (await c.post("/tools/add", json={"arguments": [2, 3]})).json()
        assert wrong["error_kind"] == "bad_arguments" and "must be a JSON object" in wrong["content"]
        ok = await c.post("/tools/add", json={"arguments": {"a": 1, "b": 1}, "session_id": None})
        assert ok.json() == {"content": "2", "is_error": False}
        assert (await c.get("/health")).json()["calls"] == 2  # refused bodies never reached a tool


async def test_sessions_through_fastapi_routes_and_tool_route():
    toolset = ToolSet([bump])
    async with client_for(create_app(toolset)) as c:
        sid = (await c.post("/sessions", json={"tools_kwargs": {"bump": {"start": 40}}})).json()["session_id"]
        for expected in ("41", "42"):
            r = await c.post("/tools/bump", json={"arguments": {}, "session_id": sid})
            assert r.json()["content"] == expected
        assert (await c.delete(f"/sessions/{sid}")).json() == {"closed": True}
        assert not toolset.sessions


async def test_calls_over_the_limit_get_503_with_retry_after():
    async with client_for(create_app([wait], max_concurrency=2, retry_after_s=0.5)) as c:
        replies = await asyncio.gather(*(c.post("/tools/wait", json={"arguments": {"ms": 100}}) for _ in range(5)))
    statuses = sorted(r.status_code for r in replies)
    assert statuses == [200, 200, 503, 503, 503]
    shed = next(r for r in replies if r.status_code == 503)
    assert shed.headers["retry-after"] == "0.5" and "busy" in shed.json()["detail"]


class RecordingTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str) -> str:
        return f"info:{name}"


async def test_response_head_and_body_leave_in_one_write():
    from agentrl.tools.service import _CoalescedWrites, http_protocol

    raw = RecordingTransport()
    proxy = _CoalescedWrites(raw)
    proxy.write(b"HTTP/1.1 200 OK\r\n\r\n")
    proxy.write(b"body")
    assert raw.writes == []
    await asyncio.sleep(0)
    assert raw.writes == [b"HTTP/1.1 200 OK\r\n\r\nbody"]
    proxy.write(b"last")
    proxy.close()  # a connection closed right after its response still sends it first
    assert raw.writes[-1] == b"last" and raw.closed
    assert proxy.get_extra_info("peername") == "info:peername"

    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    assert issubclass(http_protocol(), HttpToolsProtocol)
