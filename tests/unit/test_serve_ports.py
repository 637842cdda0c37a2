"""A service asked to listen on a taken port says so in one line (exit 2) before it loads anything."""

from __future__ import annotations

import socket

import pytest

from agentrl.cli import main
from agentrl.services import PortInUseError, bind_port


@pytest.fixture
def taken_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        yield s.getsockname()[1]


@pytest.mark.parametrize("command", [
    ["tools", "serve", "agentrl.tools.builtin.calculator:calculator"],
    ["engine", "serve", "--model", "no-such-model-dir"],  # the port is taken first: no model is loaded
    ["sandbox", "serve", "--allow-unsafe"],
])
def test_serve_on_a_taken_port_is_one_line(command, taken_port, capsys, monkeypatch):
    monkeypatch.delenv("AGENTRL_DEBUG", raising=False)
    assert main([*command, "--port", str(taken_port)]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: port {taken_port} on 127.0.0.1 is already in use: pass --port with a free port, or "
                   f"--port 0 to pick one\n")


def test_bind_port_zero_picks_a_free_port_and_a_foreign_address_is_named():
    with bind_port("127.0.0.1", 0) as sock:
        assert sock.getsockname()[1] > 0
    with pytest.raises(PortInUseError, match=r"cannot listen on 192\.0\.2\.1:8000 .*--host"):
        bind_port("192.0.2.1", 8000)  # TEST-NET-1: never an address of this machine
