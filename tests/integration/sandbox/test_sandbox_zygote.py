"""Sandboxes forked from the zygote: each request is as isolated from the others as a fresh bwrap sandbox was,
and a dead zygote is replaced without a wrong result."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import httpx
from sandbox_testlib import assert_benign, check, run

HOLDER = r"""
import os, socket, subprocess
master, slave = os.openpty()
listener = socket.socket(socket.AF_UNIX)
listener.bind("\0agentrl-zygote-test")
listener.listen()
tcp = socket.socket()
tcp.bind(("127.0.0.1", 45123))
tcp.listen()
for path in ("/tmp/holder", "/dev/shm/holder", "/workspace/holder"):
    open(path, "w").write("secret")
print("holding", os.ttyname(slave), os.getpid(), flush=True)
subprocess.run(["sleep", "47.25"])
"""

PROBE = r"""
import os, socket
print("pids", sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
print("pts", sorted(os.listdir("/dev/pts")))
print("files", [p for p in ("/tmp/holder", "/dev/shm/holder", "/workspace/holder") if os.path.exists(p)])
for family, address in ((socket.AF_UNIX, "\0agentrl-zygote-test"), (socket.AF_INET, ("127.0.0.1", 45123))):
    s = socket.socket(family)
    try:
        s.connect(address)
        print("connected", address)
    except OSError as e:
        print("refused", e.errno)
print("host", socket.gethostname())
"""


def _host_pids(cmdline: bytes) -> list[int]:
    pids = []
    for entry in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if entry.read_bytes() == cmdline:
                pids.append(int(entry.parent.name))
        except OSError:
            continue
    return pids


def test_health_reports_the_zygote(http):
    health = http.get("/health").json()
    assert health["zygote"] is True and health["zygote_pid"] and health["zygote_starts"] >= 1


def test_a_running_sandbox_is_invisible_to_the_next(http):
    held = {}

    def hold() -> None:
        with httpx.Client(base_url=str(http.base_url), timeout=90) as client:
            held.update(run(client, HOLDER, run_timeout=60))

    holder = threading.Thread(target=hold)
    holder.start()
    sleeper = b"sleep\x0047.25\x00"
    deadline = time.monotonic() + 60
    while not _host_pids(sleeper):  # the holder's resources all exist once its child runs
        assert time.monotonic() < deadline and holder.is_alive(), held
        time.sleep(0.05)
    probe = run(http, PROBE)
    for pid in _host_pids(sleeper):  # end the holder now; its report then shows what it held
        os.kill(pid, signal.SIGKILL)
    holder.join(60)
    assert held["run_result"]["stdout"].startswith("holding /dev/pts/0 2\n"), held
    check(probe, "Success", "exit")
    lines = probe["run_result"]["stdout"].splitlines()
    assert lines[0] == "pids [1, 2]"  # its own supervisor and program only: no process of the holder
    assert lines[1] == "pts ['ptmx']"  # its own devpts instance: the holder's pty is not there
    assert lines[2] == "files []"
    assert lines[3].startswith("refused") and lines[4].startswith("refused")  # own network namespace
    assert lines[5] == "host sandbox"
    assert_benign(http)


def test_sandbox_processes_cannot_reach_their_supervisor(http):
    code = ("import os, signal\nfor sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGSTOP):\n"
            "    os.kill(1, sig)\n"
            "try:\n    open('/proc/1/mem', 'rb')\nexcept PermissionError:\n    print('mem refused')\n"
            "print('ppid', os.getppid())")
    body = run(http, code)
    check(body, "Success", "exit")
    assert body["run_result"]["stdout"] == "mem refused\nppid 1\n", body
    assert_benign(http)


def test_a_dead_zygote_is_replaced_without_wrong_results(http):
    before = http.get("/health").json()
    os.kill(before["zygote_pid"], signal.SIGKILL)
    deadline = time.monotonic() + 60
    while True:
        health = http.get("/health").json()
        if health["zygote_starts"] > before["zygote_starts"] and health["warm_sandboxes"] >= 1:
            break
        assert time.monotonic() < deadline, health
        time.sleep(0.05)
    for i in range(6):
        body = run(http, f"print({i} * 7)")
        check(body, "Success", "exit")
        assert body["run_result"]["stdout"] == f"{i * 7}\n"
    after = http.get("/health").json()
    assert after["zygote_pid"] != before["zygote_pid"] and after["sandbox_errors"] == before["sandbox_errors"]
