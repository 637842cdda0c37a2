"""A real `agentrl tools serve --token-file` on loopback, reached by the real registry: no token, a wrong token
and the right one."""

from __future__ import annotations

import httpx
import pytest
from helpers import free_port, service

from agentrl.auth import ServiceAuthError
from agentrl.tools import ToolRegistry

pytestmark = pytest.mark.slow

TOKEN = "a3f1c2d4e5b60718293a4b5c6d7e8f90"


def secret(path, token: str) -> str:
    path.write_text(token + "\n")
    path.chmod(0o600)
    return str(path)


@pytest.fixture(scope="module")
def guarded_url(tmp_path_factory):
    token_file = secret(tmp_path_factory.mktemp("service") / "token", TOKEN)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = ["python", "-m", "agentrl.cli", "tools", "serve", "agentrl.tools.builtin.calculator:calculator",
            "--port", str(port), "--token-file", token_file]
    with service(args, f"{url}/health"):  # /health answers without the token: start-up waits on it
        yield url


def registry(url: str, token_file: str | None) -> ToolRegistry:
    entry = {"url": url, "name": "calc", **({"token_file": token_file} if token_file else {})}
    return ToolRegistry.from_config({"services": [entry]})


async def test_no_token_and_a_wrong_token_are_refused_at_discovery(guarded_url, tmp_path):
    for token_file, detail in [(None, "missing Authorization header"),
                               (secret(tmp_path / "wrong", "not-the-token"), "wrong bearer token")]:
        reg = registry(guarded_url, token_file)
        with pytest.raises(ServiceAuthError) as e:
            await reg.start()
        await reg.aclose()
        message = str(e.value)
        assert message.startswith(f"tool service 'calc' at {guarded_url} refused the request with HTTP 401 ({detail}")
        assert "set services[0].token_file to the file holding the token" in message and TOKEN not in message


async def test_the_right_token_discovers_and_calls(guarded_url, tmp_path):
    async with registry(guarded_url, secret(tmp_path / "right", TOKEN)) as reg:
        assert reg.names() == ["calculator"]
        result = await reg.call("calculator", {"expression": "6*7"})
        async with reg.episode_session() as session:
            again = await reg.call("calculator", {"expression": "1+1"}, session=session)
    assert not result.is_error and "42" in result.content and not again.is_error


def test_raw_requests(guarded_url):
    call = {"arguments": {"expression": "6*7"}}
    assert httpx.post(f"{guarded_url}/tools/calculator", json=call).status_code == 401
    wrong = httpx.post(f"{guarded_url}/tools/calculator", json=call, headers={"Authorization": "Bearer x"})
    assert wrong.status_code == 401 and TOKEN not in wrong.text
    right = httpx.post(f"{guarded_url}/tools/calculator", json=call, headers={"Authorization": f"Bearer {TOKEN}"})
    assert right.status_code == 200 and "42" in right.json()["content"]
    assert httpx.get(f"{guarded_url}/health").status_code == 200
