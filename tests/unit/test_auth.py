"""agentrl.auth: token files, the loopback rule, the bearer check, and the three `serve` commands refusing to listen
beyond loopback without a token (before they bind a port or load anything)."""

from __future__ import annotations

import logging

import httpx
import pytest
from fastapi import FastAPI

from agentrl import auth
from agentrl.auth import TOKEN_ENV, BearerAuth, ServiceAuthError
from agentrl.cli import main

TOKEN = "0123456789abcdef0123456789abcdef"


@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    return path


@pytest.mark.parametrize("host, loopback", [
    ("127.0.0.1", True), ("127.8.9.10", True), ("::1", True), ("[::1]", True), ("localhost", True),
    ("LOCALHOST", True), ("0.0.0.0", False), ("::", False), ("10.0.0.5", False), ("example.org", False),
    ("", False),
])
def test_loopback_addresses(host, loopback):
    assert auth.is_loopback(host) is loopback


def test_token_file_is_read_and_checked(tmp_path, token_file, caplog):
    assert auth.read_token_file(token_file, "--token-file") == TOKEN
    with pytest.raises(ServiceAuthError, match=r"^engine\.token_file: token file .*nope does not exist"):
        auth.read_token_file(tmp_path / "nope", "engine.token_file")
    empty = tmp_path / "empty"
    empty.write_text("  \n")
    with pytest.raises(ServiceAuthError, match=r"--token-file: token file .*empty is empty"):
        auth.read_token_file(empty, "--token-file")
    spaced = tmp_path / "spaced"
    spaced.write_text("two words\n")
    with pytest.raises(ServiceAuthError, match="spaces or characters outside printable ASCII"):
        auth.read_token_file(spaced, "--token-file")
    assert not caplog.records
    token_file.chmod(0o644)  # readable by others: used, with a warning naming the fix
    with caplog.at_level(logging.WARNING, logger="agentrl.auth"):
        assert auth.read_token_file(token_file, "--token-file") == TOKEN
    assert f"chmod 600 {token_file}" in caplog.text


def test_server_token_from_the_option_then_the_environment(token_file, monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    assert auth.server_token(None) is None
    monkeypatch.setenv(TOKEN_ENV, "from-env")
    assert auth.server_token(None) == "from-env"
    assert auth.server_token(str(token_file)) == TOKEN  # the option wins
    monkeypatch.setenv(TOKEN_ENV, "")
    with pytest.raises(ServiceAuthError, match=rf"\${TOKEN_ENV} is empty"):
        auth.server_token(None)


def test_beyond_loopback_needs_a_token():
    auth.require_token("127.0.0.1", None, "agentrl tools serve")
    auth.require_token("0.0.0.0", TOKEN, "agentrl tools serve")
    with pytest.raises(ServiceAuthError) as e:
        auth.require_token("0.0.0.0", None, "agentrl tools serve")
    assert str(e.value) == (f"agentrl tools serve on host 0.0.0.0 would accept requests from other machines without "
                            f"a token: pass --token-file PATH (a file holding a shared secret) or set {TOKEN_ENV}, "
                            f"or use --host 127.0.0.1")


@pytest.fixture
def guarded():
    app = FastAPI()

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.post("/work")
    async def work():
        return {"done": True}

    app.add_middleware(BearerAuth, token=TOKEN)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test")


@pytest.mark.parametrize("headers, detail", [
    ({}, "missing Authorization header"),
    ({"Authorization": "Bearer wrong"}, "wrong bearer token"),
    ({"Authorization": f"Bearer {TOKEN}x"}, "wrong bearer token"),
    ({"Authorization": f"Basic {TOKEN}"}, "is not 'Bearer <token>'"),
    ({"Authorization": "Bearer "}, "is not 'Bearer <token>'"),
])
async def test_requests_without_the_token_get_401(guarded, headers, detail):
    r = await guarded.post("/work", headers=headers)
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert detail in r.json()["detail"] and TOKEN not in r.text


async def test_the_right_token_passes_and_health_stays_open(guarded):
    assert (await guarded.post("/work", headers={"Authorization": f"Bearer {TOKEN}"})).json() == {"done": True}
    assert (await guarded.post("/work", headers={"authorization": f"bearer {TOKEN}"})).status_code == 200
    assert (await guarded.get("/health")).json() == {"status": "ok"}


@pytest.fixture
def no_binding(monkeypatch):
    """Any attempt to open a port fails the test: the refusal must come first."""
    def refuse(*args, **kwargs):
        raise AssertionError("a port was bound before the token check")

    import agentrl.services
    import agentrl.tools.service

    monkeypatch.setattr(agentrl.services, "bind_port", refuse)
    monkeypatch.setattr(agentrl.tools.service, "bind_port", refuse)
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    monkeypatch.delenv("AGENTRL_DEBUG", raising=False)


SERVE = {
    "tools": ["tools", "serve", "agentrl.tools.builtin.calculator:calculator"],
    "sandbox": ["sandbox", "serve", "--allow-unsafe"],
    "engine": ["engine", "serve", "--model", "no-such-model-dir"],
}


@pytest.mark.parametrize("name", SERVE)
def test_serve_beyond_loopback_without_a_token_refuses_to_start(name, no_binding, capsys):
    assert main([*SERVE[name], "--host", "0.0.0.0", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: agentrl {name} serve on host 0.0.0.0 would accept requests from other machines without "
                   f"a token: pass --token-file PATH (a file holding a shared secret) or set {TOKEN_ENV}, or use "
                   f"--host 127.0.0.1\n")


@pytest.mark.parametrize("name", SERVE)
def test_serve_with_a_missing_token_file_says_so(name, no_binding, tmp_path, capsys):
    assert main([*SERVE[name], "--port", "0", "--token-file", str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err == f"error: --token-file: token file {tmp_path / 'missing'} does not exist; " \
                                      f"write the service's shared secret there or fix the path\n"


def test_engine_serve_beyond_loopback_needs_a_weights_dir(no_binding, token_file, tmp_path, capsys):
    assert main([*SERVE["engine"], "--host", "0.0.0.0", "--port", "0", "--token-file", str(token_file)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: agentrl engine serve on host 0.0.0.0 needs --weights-dir DIR")
    assert err.count("\n") == 1
    args = [*SERVE["engine"], "--port", "0", "--weights-dir", str(tmp_path / "absent")]
    assert main(args) == 2
    assert f"--weights-dir {tmp_path / 'absent'}: " in capsys.readouterr().err
