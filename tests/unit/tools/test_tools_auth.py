"""The tool service behind a token (every route but /health), and the registry's `token_file` per service."""

from __future__ import annotations

import httpx
import pytest

from agentrl.auth import ServiceAuthError
from agentrl.config import ConfigError
from agentrl.tools import ToolRegistry, ToolsConfig
from agentrl.tools.builtin.calculator import calculator
from agentrl.tools.config import ServiceConfig
from agentrl.tools.service import create_app, serve_in_thread

TOKEN = "tool-service-secret-42"
CALL = {"arguments": {"expression": "6*7"}}
ANSWER = '{"value": "42"}'


@pytest.fixture
def client():
    app = create_app([calculator], token=TOKEN)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://tools")


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer not-it"}])
async def test_every_route_but_health_needs_the_token(client, headers):
    for method, path, body in [("GET", "/tools", None), ("POST", "/tools/calculator", CALL),
                               ("POST", "/sessions", {}), ("DELETE", "/sessions/x", None)]:
        r = await client.request(method, path, json=body, headers=headers)
        assert r.status_code == 401, (method, path)
        assert ("missing" if not headers else "wrong bearer token") in r.json()["detail"]
    assert (await client.get("/health", headers=headers)).json()["tools"] == ["calculator"]


async def test_the_right_token_calls_the_tool(client):
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert (await client.get("/tools", headers=auth)).json()[0]["function"]["name"] == "calculator"
    r = await client.post("/tools/calculator", json=CALL, headers=auth)
    assert r.status_code == 200 and r.json()["content"] == ANSWER


async def test_without_a_token_the_service_is_open_as_before():
    app = create_app([calculator])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://tools") as open_client:
        assert (await open_client.post("/tools/calculator", json=CALL)).json()["content"] == ANSWER


def test_the_python_api_refuses_beyond_loopback_without_a_token():
    with pytest.raises(ServiceAuthError, match="serve_in_thread on host 0.0.0.0 .* pass token="):
        with serve_in_thread([calculator], host="0.0.0.0"):
            pass


def test_service_token_file_becomes_the_authorization_header(tmp_path):
    path = tmp_path / "tools.token"
    path.write_text(f"{TOKEN}\n")
    path.chmod(0o600)
    cfg = ServiceConfig(url="http://127.0.0.1:8000", token_file=str(path), headers={"X-Team": "rl"})
    assert cfg.request_headers("tools.services[0]") == {"X-Team": "rl", "authorization": f"Bearer {TOKEN}"}
    assert ServiceConfig(url="http://127.0.0.1:8000").request_headers("services[0]") == {}
    with pytest.raises(ConfigError, match="either token_file or an Authorization header"):
        ServiceConfig(url="http://127.0.0.1:8000", token_file=str(path), headers={"authorization": "Bearer x"})


def test_a_missing_token_file_is_named_by_its_key(tmp_path):
    cfg = ToolsConfig(services=[ServiceConfig(url="http://127.0.0.1:8000", token_file=str(tmp_path / "gone"))])
    with pytest.raises(ServiceAuthError, match=r"^tools\.services\[0\]\.token_file: token file .*gone does not exist"):
        ToolRegistry.from_tools_config(cfg)
