"""MCP servers as tool services: discovery and calls through the registry, next to in-process tools."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from helpers import free_port, service

from agentrl.tools import ToolRegistry

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def mcp_url():
    port = free_port()
    with service(["python", str(HERE / "mcp_server.py"), str(port)], f"http://127.0.0.1:{port}/health"):
        yield f"http://127.0.0.1:{port}/mcp"


async def test_mcp_round_trip_next_to_builtin_tools(mcp_url):
    config = {"builtin": ["calculator"],
              "services": [{"url": mcp_url, "kind": "mcp", "name": "mcp-test", "timeout_s": 10}]}
    async with ToolRegistry.from_config(config) as reg:
        assert sorted(reg.names()) == ["add", "calculator", "explode", "shout"]
        shout = reg.schemas(["shout"])[0]["function"]
        assert shout["description"].startswith("Upper-case")
        assert shout["parameters"]["required"] == ["text"]
        assert reg.service_of("add") == "mcp-test" and reg.service_of("calculator") == "local"

        assert (await reg.call("add", {"a": 2, "b": 40})).content == "42"
        assert (await reg.call("shout", {"text": "hi", "times": 2})).content == "HI HI"
        assert (await reg.call("calculator", {"expression": "6*7"})).content == '{"value": "42"}'

        bad = await reg.call("add", {"a": "two", "b": 1})
        assert bad.error_kind == "bad_arguments" and "'a'" in bad.content
        failed = await reg.call("explode", {"reason": "nope"})
        assert failed.error_kind == "tool_error" and not failed.infra_error
        async with reg.episode_session() as session:  # MCP tools ignore episode sessions but accept them
            assert (await reg.call("add", {"a": 1, "b": 1}, session=session)).content == "2"


async def test_mcp_with_custom_headers(mcp_url):
    config = {"services": [{"url": mcp_url, "kind": "mcp", "name": "auth", "headers": {"Authorization": "Bearer t"}}]}
    async with ToolRegistry.from_config(config) as reg:
        assert (await reg.call("add", {"a": 5, "b": 5})).content == "10"
    health = httpx.get(mcp_url.removesuffix("/mcp") + "/health").json()
    assert health["seen_authorization"] == ["Bearer t"]


async def test_unreachable_mcp_call_is_infra_error(mcp_url):
    from agentrl.tools import ToolServiceError

    dead = f"http://127.0.0.1:{free_port()}/mcp"
    with pytest.raises(ToolServiceError,
                       match=r"^MCP server 'dead' at http://\S+/mcp is unreachable .*fix services\[0\]\.url"):
        await ToolRegistry.from_config({"services": [{"url": dead, "kind": "mcp", "name": "dead",
                                                      "connect_timeout_s": 2, "timeout_s": 2}]}).start()
