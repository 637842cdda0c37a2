"""Child-service helper: start, health wait, failure messages, group shutdown, SIGTERM as Ctrl-C."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from agentrl.services import ServiceStartError, free_port, port_is_free, run_service


def test_port_helpers_see_a_listening_socket():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        assert not port_is_free(s.getsockname()[1])
    assert port_is_free(free_port())


def test_a_service_that_dies_reports_its_output(tmp_path):
    cmd = [sys.executable, "-c", "import sys; print('boom: bad flag'); sys.exit(3)"]
    with pytest.raises(ServiceStartError, match=r"(?s)exited with code 3.*boom: bad flag"):
        with run_service(cmd, f"http://127.0.0.1:{free_port()}/", name="demo", timeout_s=20):
            pass


def test_healthy_service_is_yielded_and_its_whole_group_stopped(tmp_path):
    port = free_port()
    # a shell that starts the HTTP server as a grandchild: stopping must reach the whole process group
    cmd = ["bash", "-c", f"{sys.executable} -m http.server {port} --bind 127.0.0.1 & wait"]
    with run_service(cmd, f"http://127.0.0.1:{port}/", name="http.server", cwd=tmp_path, timeout_s=30) as proc:
        assert not port_is_free(port)
        pgid = os.getpgid(proc.pid)
    assert proc.returncode is not None
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)


def test_sigterm_becomes_keyboard_interrupt():
    code = ("import os, signal\nfrom agentrl.services import sigterm_as_interrupt\nsigterm_as_interrupt()\n"
            "try:\n    os.kill(os.getpid(), signal.SIGTERM)\n    import time; time.sleep(5)\n"
            "except KeyboardInterrupt:\n    print('cleaned up')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "cleaned up"


def test_a_service_exits_when_its_parent_is_killed():
    """SIGKILL leaves the parent no chance to clean up: the `agentrl` child sees it die (PR_SET_PDEATHSIG, set
    because run_service names the parent in AGENTRL_EXIT_WITH_PARENT) and exits by itself."""
    import signal
    import time

    port = free_port()
    code = ("import sys, time\nfrom agentrl.services import agentrl_command, run_service\n"
            f"cmd = agentrl_command('tools', 'serve', 'agentrl.tools.builtin.calculator:calculator', '--host', "
            f"'127.0.0.1', '--port', '{port}')\n"
            f"with run_service(cmd, 'http://127.0.0.1:{port}/health', name='tools', timeout_s=60) as proc:\n"
            "    print(proc.pid, flush=True)\n    time.sleep(120)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        assert not port_is_free(port)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.kill(child, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            os.kill(child, signal.SIGKILL)
            pytest.fail("the service outlived its SIGKILLed parent")
    finally:
        if parent.poll() is None:
            parent.kill()


def test_exit_with_parent_is_a_no_op_without_the_variable(monkeypatch):
    from agentrl.services import EXIT_WITH_PARENT, exit_with_parent

    monkeypatch.delenv(EXIT_WITH_PARENT, raising=False)
    exit_with_parent()  # nothing to watch: returns
    monkeypatch.setenv(EXIT_WITH_PARENT, "999999999")  # a parent that does not exist
    with pytest.raises(SystemExit, match="is gone"):
        exit_with_parent()
