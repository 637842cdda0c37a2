"""The sandbox behind a token, and its clients (SandboxClient, the python tool, code rewards) sending it."""

from __future__ import annotations

import httpx
import pytest

from agentrl.auth import ServiceAuthError
from agentrl.tools import ToolRegistry
from agentrl.tools.builtin.python import python
from sandbox.app import create_app
from sandbox.client import SandboxClient
from sandbox.config import SandboxConfig

TOKEN = "sandbox-secret-7"


@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "sandbox.token"
    path.write_text(TOKEN)
    path.chmod(0o600)
    return str(path)


@pytest.fixture
def app_client():
    # No backend is started: the token check answers before any route needs one.
    app = create_app(SandboxConfig(allow_unsafe=True), token=TOKEN)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://sandbox")


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}])
async def test_routes_need_the_token(app_client, headers):
    for method, path, body in [("GET", "/v1/ping", None), ("POST", "/run_code", {"code": "print(1)"}),
                               ("POST", "/sessions", {}), ("DELETE", "/sessions/abc", None)]:
        r = await app_client.request(method, path, json=body, headers=headers)
        assert r.status_code == 401, (method, path)
        assert TOKEN not in r.text


async def test_the_right_token_passes(app_client):
    r = await app_client.get("/v1/ping", headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200 and r.text == "pong"


def recording(status: int = 200):
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if status == 401:
            return httpx.Response(401, json={"detail": "wrong bearer token"})
        return httpx.Response(200, json={"session_id": "s1"})

    return httpx.MockTransport(handler), seen


async def test_client_sends_the_token_of_its_file(token_file):
    transport, seen = recording()
    async with SandboxClient("http://sandbox", token_file=token_file, transport=transport) as client:
        assert await client.create_session() == "s1"
    assert seen[0].headers["authorization"] == f"Bearer {TOKEN}"


async def test_a_401_is_one_error_naming_the_key_and_is_not_retried(token_file):
    transport, seen = recording(401)
    async with SandboxClient("http://sandbox", retries=3, transport=transport) as client:
        with pytest.raises(ServiceAuthError) as e:
            await client.run_code("print(1)")
    assert len(seen) == 1
    assert str(e.value).startswith("sandbox http://sandbox refused the request with HTTP 401 (wrong bearer token): "
                                   "set reward.sandbox_token_file to the file holding the token")


@pytest.fixture
def refusing_sandbox(monkeypatch) -> list[httpx.Request]:
    """Every SandboxClient built meanwhile talks to a sandbox that answers 401; yields the requests it got."""
    transport, seen = recording(401)
    real = SandboxClient.__init__

    def with_mock(self, *args, **kwargs):
        real(self, *args, **{**kwargs, "transport": transport})

    monkeypatch.setattr(SandboxClient, "__init__", with_mock)
    return seen


async def test_python_tool_reports_a_refused_token_as_an_infrastructure_fault(refusing_sandbox):
    registry = ToolRegistry.from_functions([python], tools_kwargs={"python": {"sandbox_url": "http://sandbox"}})
    async with registry.episode_session() as session:
        result = await registry.call("python", {"code": "print(1)"}, session=session)
    assert result.infra_error and "tools_kwargs.python.sandbox_token_file" in result.content


async def test_a_refused_token_stops_code_rewards_whatever_on_error_says(refusing_sandbox, token_file):
    from agentrl.agent_loop.config import RewardConfig
    from agentrl.agent_loop.rewards import score_episode
    from agentrl.types import Episode, Task

    task = Task(prompt=[{"role": "user", "content": "q"}], reward={"type": "unit_tests", "tests": "assert f() == 1"},
                task_id="t")
    answer = "```python\ndef f():\n    return 1\n```"
    episode = Episode(uid="u", prompt_ids=[], response_ids=[], response_mask=[], response_logprobs=[],
                      messages=[{"role": "user", "content": "q"}, {"role": "assistant", "content": answer}])
    config = RewardConfig(sandbox_url="http://sandbox", sandbox_token_file=token_file, on_error="zero",
                          reuse_verdicts=False)
    with pytest.raises(ServiceAuthError, match=r"set reward\.sandbox_token_file"):
        await score_episode(task, episode, config)
    assert refusing_sandbox[0].headers["authorization"] == f"Bearer {TOKEN}"
