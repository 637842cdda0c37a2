"""Forked sessions (`POST /sessions/{id}/fork?n=K`): the source's state at the fork, isolation afterwards, limits
per child, errors. The shared service has max_sessions=4 (sandbox_testlib.SERVICE_SETTINGS)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
from sandbox_testlib import assert_benign, cell, fork, session

from sandbox.client import SandboxClient

pytestmark = pytest.mark.slow

SETUP = """
import os, sys, colorsys
colorsys.marker = 'set-by-the-source'          # a module object as the source left it (no re-import)
big = list(range(200_000))
counter = 41
os.makedirs('data/sub', exist_ok=True)
with open('data/sub/input.txt', 'w') as f:
    f.write('prepared')
open('/tmp/scratch.txt', 'w').write('tmp too')
os.symlink('sub/input.txt', 'data/link')
log = open('/workspace/log.txt', 'w+')
log.write('head\\n'); log.flush()
os.chdir('data')
"""


@pytest.fixture
def source(http):
    sid = session(http, forkable=True)
    assert cell(http, sid, SETUP)["status"] == "ok"
    yield sid
    http.delete(f"/sessions/{sid}")


def _delete(http, *ids):
    for sid in ids:
        http.delete(f"/sessions/{sid}")


def test_children_start_with_the_sources_globals_modules_files_and_cwd(http, source):
    children = fork(http, source, 2)
    try:
        for child in children:
            out = cell(http, child, "print(counter, len(big), colorsys.marker, os.getcwd(), "
                                    "open('sub/input.txt').read(), os.readlink('link'), "
                                    "open('/tmp/scratch.txt').read(), log.tell(), os.getpid())")
            assert out["status"] == "ok", out
            assert out["stdout"] == "41 200000 set-by-the-source /workspace/data prepared sub/input.txt tmp too 5 2\n"
            assert out["execution_count"] == 2  # the source's count goes on
        assert http.get("/health").json()["live_sessions"] == 3  # each child is a session of its own
    finally:
        _delete(http, *children)


def test_children_are_isolated_from_each_other_and_from_the_source(http, source):
    a, b = fork(http, source, 2)
    try:
        changed = ("counter += 1\nopen('sub/input.txt', 'w').write('changed by a')\nlog.write('a\\n'); log.flush()\n"
                   "import socket, subprocess\ns = socket.socket(socket.AF_UNIX)\ns.bind('\\0fork-a')\ns.listen()\n"
                   "p = subprocess.Popen(['sleep', '4243.5'])\nprint(counter)")
        assert cell(http, a, changed)["stdout"] == "42\n"
        probe = ("import socket\nc = socket.socket(socket.AF_UNIX)\ntry:\n    c.connect('\\0fork-a')\n"
                 "    print('connected')\nexcept OSError:\n    print('no socket')\n"
                 "cmds = [open(f'/proc/{p}/cmdline', 'rb').read() for p in os.listdir('/proc') if p.isdigit()]\n"
                 "print(counter, open('sub/input.txt').read(), open('/workspace/log.txt').read().split(), "
                 "any(b'4243.5' in c for c in cmds), sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))")
        for other, sees_a in ((b, False), (source, True)):
            out = cell(http, other, probe)
            assert out["stdout"].splitlines()[0] == "no socket", out
            # the source's pid namespace holds its children's (documented): it sees a's sleep, the sibling not
            assert out["stdout"].splitlines()[1].startswith(f"41 prepared ['head'] {sees_a}"), out
        # the sibling's pid namespace holds its own pid 1 and interpreter, nothing of the source or of a
        assert cell(http, b, "print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))")["stdout"] == \
            "[1, 2]\n"
        # kill -9 -1 in one child reaches only its own processes
        assert cell(http, a, "import os, signal\ntry:\n    os.kill(-1, signal.SIGKILL)\nexcept OSError:\n    pass\n"
                             "print('alive')")["status"] in ("ok", "error")
        assert cell(http, b, "print(counter)")["stdout"] == "41\n"
        assert cell(http, source, "print(counter)")["stdout"] == "41\n"
    finally:
        _delete(http, a, b)


def test_a_child_cannot_make_namespaces_mounts_or_reach_the_sources_files(http, source):
    (child,) = fork(http, source, 1)
    try:
        cell(http, source, "open('/workspace/after-the-fork.txt', 'w').write('source only')")
        code = ("import errno, os, subprocess\n"
                "print(sorted(os.listdir('/workspace')))\n"
                "r = subprocess.run(['unshare', '--user', '--map-root-user', 'true'], capture_output=True)\n"
                "print('unshare', r.returncode != 0)\n"
                "r = subprocess.run(['mount', '-t', 'tmpfs', 'x', '/tmp'], capture_output=True)\n"
                "print('mount', r.returncode != 0)\n"
                "r = subprocess.run(['umount', '/workspace'], capture_output=True)\n"
                "print('umount', r.returncode != 0)\n"
                "print(open('/proc/self/status').read().split('CapEff:')[1].split()[0])\n"
                "print(open('/proc/self/status').read().split('Seccomp:')[1].split()[0])")
        out = cell(http, child, code)
        lines = out["stdout"].splitlines()
        assert lines[0] == "['data', 'log.txt']", out
        assert lines[1:4] == ["unshare True", "mount True", "umount True"], out
        assert lines[4] == "0000000000000000" and lines[5] == "2", out  # no capability; seccomp filter mode
    finally:
        _delete(http, child)


def test_each_child_has_its_own_memory_and_pids_limits(http):
    sid = session(http, forkable=True, memory_limit_MB=128)
    children = []
    try:
        cell(http, sid, "kept = 'yes'\nblock = bytearray(40 * 2**20)")  # 40 MB shared copy-on-write
        children = fork(http, sid, 2)
        out = cell(http, children[0], "more = bytearray(150 * 2**20)")
        assert out["status"] == "error" and out["restarted"] is True and out["exit_reason"] == "oom", out
        assert cell(http, children[0], "print('kept' in globals())")["stdout"] == "False\n"  # fresh after restart
        # the sibling and the source are untouched, and 80 MB more fit in the sibling's own limit
        assert cell(http, children[1], "more = bytearray(80 * 2**20)\nprint(kept, len(block))")["stdout"] == \
            f"yes {40 * 2**20}\n"
        assert cell(http, sid, "print(kept)")["stdout"] == "yes\n"
        # pids: a thread bomb in one child stops at its own pids limit (64 here); its sibling still starts threads
        bomb = ("import threading\nstop = threading.Event()\nn = 0\ntry:\n    while True:\n"
                "        threading.Thread(target=stop.wait, daemon=True).start()\n        n += 1\n"
                "except RuntimeError:\n    pass\nstop.set()\nprint(0 < n < 64)")
        assert cell(http, children[0], bomb)["stdout"] == "True\n"
        assert cell(http, children[1], bomb.replace("while True", "for _ in range(20)"))["stdout"] == "True\n"
    finally:
        _delete(http, *children, sid)


def test_fork_errors_name_the_session(http, source):
    resp = http.post("/sessions/nope/fork", params={"n": 1})
    assert resp.status_code == 404 and "nope" in resp.json()["detail"]
    for n in (0, 5):
        resp = http.post(f"/sessions/{source}/fork", params={"n": n})
        assert resp.status_code == 400 and "n:" in resp.json()["detail"]
    resp = http.post(f"/sessions/{source}/fork", params={"n": 4})  # 1 + 4 > max_sessions=4
    assert resp.status_code == 503 and "max_sessions" in resp.json()["detail"]
    plain = session(http)
    try:
        resp = http.post(f"/sessions/{plain}/fork", params={"n": 1})
        assert resp.status_code == 409 and plain in resp.json()["detail"] and "forkable" in resp.json()["detail"]
    finally:
        _delete(http, plain)
    (child,) = fork(http, source, 1)
    try:
        resp = http.post(f"/sessions/{child}/fork", params={"n": 1})
        assert resp.status_code == 409 and child in resp.json()["detail"]
    finally:
        _delete(http, child)
    assert http.get("/health").json()["live_sessions"] == 1


def test_fork_of_a_busy_session_is_refused(http, source):
    running = threading.Thread(target=cell, args=(http, source, "import time\ntime.sleep(3)"), kwargs={"timeout": 10})
    running.start()
    try:
        deadline = time.monotonic() + 5
        while True:  # until the cell has started (a fork before it would succeed, which is fine but no test)
            resp = http.post(f"/sessions/{source}/fork", params={"n": 1})
            if resp.status_code == 409 or time.monotonic() > deadline:
                break
            _delete(http, *resp.json()["session_ids"])
        assert resp.status_code == 409 and source in resp.json()["detail"] and "running a cell" in \
            resp.json()["detail"]
    finally:
        running.join()


def _interpreter_pid(marker: str) -> int:
    """The host pid of the session interpreter holding a file named `marker` open."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if any(marker in os.readlink(fd) for fd in (entry / "fd").iterdir()):
                return int(entry.name)
        except OSError:
            continue
    raise AssertionError(f"no process holds {marker}")


def test_fork_of_a_dead_session_is_refused(http, source):
    cell(http, source, "held = open('/tmp/dead-source-marker-7f3a', 'w')")
    os.kill(_interpreter_pid("dead-source-marker-7f3a"), signal.SIGKILL)
    deadline = time.monotonic() + 10
    while True:
        resp = http.post(f"/sessions/{source}/fork", params={"n": 1})
        if resp.status_code != 200 or time.monotonic() > deadline:
            break
        _delete(http, *resp.json()["session_ids"])
        time.sleep(0.1)
    assert resp.status_code == 409 and source in resp.json()["detail"] and "dead" in resp.json()["detail"]


def test_shared_memory_mappings_are_refused(http, source):
    cell(http, source, "import mmap\nshared = mmap.mmap(-1, 4096)")  # anonymous MAP_SHARED
    resp = http.post(f"/sessions/{source}/fork", params={"n": 1})
    assert resp.status_code == 409 and "shared memory" in resp.json()["detail"]
    cell(http, source, "shared.close()")
    _delete(http, *fork(http, source, 1))


def test_a_deleted_source_is_kept_until_its_children_end(http):
    sid = session(http, forkable=True)
    cell(http, sid, "value = 'from the source'")
    a, b = fork(http, sid, 2)
    assert http.delete(f"/sessions/{sid}").status_code == 200
    assert http.post(f"/sessions/{sid}/run", json={"code": "1"}).status_code == 404
    assert cell(http, a, "print(value)")["stdout"] == "from the source\n"  # its pid namespace lives on
    assert http.get("/health").json()["live_sessions"] == 2
    _delete(http, a)
    assert cell(http, b, "print(value)")["stdout"] == "from the source\n"
    _delete(http, b)
    assert http.get("/health").json()["live_sessions"] == 0
    assert_benign(http)


async def test_client_forks(sandbox_url):
    async with SandboxClient(sandbox_url, retries=0) as client:
        sid = await client.create_session(memory_limit_MB=256, idle_ttl_s=60, forkable=True)
        try:
            await client.run_cell(sid, "x = 6 * 7")
            children = await client.fork(sid, 2)
            try:
                outs = [await client.run_cell(child, "x") for child in children]
                assert [out["stdout"] for out in outs] == ["42\n", "42\n"]
            finally:
                for child in children:
                    await client.delete_session(child)
        finally:
            await client.delete_session(sid)


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def test_forks_leave_the_services_memory_and_cgroups_flat(http):
    health = http.get("/health").json()
    sid = session(http, forkable=True)
    try:
        cell(http, sid, "state = bytearray(30 * 2**20)")  # the children's pages are never the service's

        def one_round():
            children = fork(http, sid, 3)
            for child in children:
                assert cell(http, child, "state[0] = 1\nprint(len(state))")["stdout"] == f"{30 * 2**20}\n"
            _delete(http, *children)

        one_round()
        before = _rss_kb(health["pid"])
        for _ in range(8):
            one_round()
        assert _rss_kb(health["pid"]) - before < 8 * 1024
    finally:
        _delete(http, sid)
    assert http.get("/health").json()["live_sessions"] == 0
    assert_benign(http)


def test_odd_source_state_forks(http):
    """A removed cwd, an open fifo and an open directory: the fork neither hangs nor fails."""
    sid = session(http, forkable=True)
    children = []
    try:
        odd = ("import os\nos.mkfifo('pipe')\nr = os.open('pipe', os.O_RDONLY | os.O_NONBLOCK)\n"
               "d = os.open('.', os.O_RDONLY)\nos.mkdir('gone')\nos.chdir('gone')\nos.rmdir('/workspace/gone')")
        assert cell(http, sid, odd)["status"] == "ok"
        children = fork(http, sid, 1)
        out = cell(http, children[0], "print(os.getcwd(), sorted(os.listdir(d)), os.readlink(f'/proc/self/fd/{r}'))")
        assert out["stdout"] == "/workspace ['pipe'] /dev/null\n", out
    finally:
        _delete(http, *children, sid)


def test_children_die_with_their_sources_sandbox(http):
    sid = session(http, forkable=True, memory_limit_MB=128)
    children = []
    try:
        cell(http, sid, "value = 1")
        children = fork(http, sid, 1)
        out = cell(http, sid, "boom = bytearray(400 * 2**20)")  # the source's interpreter is OOM-killed
        assert out["restarted"] is True and out["exit_reason"] == "oom", out
        after = cell(http, children[0], "print('value' in globals())")  # its pid namespace went with the source's
        assert after["restarted"] is True and after["stdout"] == "False\n", after
    finally:
        _delete(http, *children, sid)
