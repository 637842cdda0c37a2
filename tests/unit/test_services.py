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
