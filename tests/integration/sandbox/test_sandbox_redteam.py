"""The red-team review's findings, each as the request that reproduced it, against both ways of making a sandbox
(the zygote, the default, and one bwrap process per sandbox, `zygote=false`).

Two roots were behind them: the sandbox's uid mapped onto host root (device nodes, per-user kernel limits,
root-only /proc files and directories), and the service trusting sizes and frames that sandboxed code can write
(the end-of-output marker, a session's result frames, the runner's internal pipe). Each test asserts the exact
outcome, then that the service still answers.
"""

from __future__ import annotations

import ctypes
import os
import stat
import time

import httpx
import pytest
from sandbox_testlib import assert_benign, bwrap_unavailable_reason, check, python_session, run, sandbox_service

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=["zygote", "bwrap"])
def any_http(request, sandbox_url):
    """A client of the shared (zygote) service, then of a `zygote=false` service of this module's own."""
    if request.param == "zygote":
        with httpx.Client(base_url=sandbox_url, timeout=120) as client:
            assert client.get("/health").json()["zygote"] is True
            yield client
        return
    reason = bwrap_unavailable_reason()
    if reason:
        pytest.skip(reason)
    with sandbox_service("zygote=false") as client:
        assert client.get("/health").json()["zygote"] is False
        yield client


def _session(http: httpx.Client, kind: str):
    """A python session's id, deleted afterwards: plain, or forked from a fork source (`session_kind`), which
    only the zygote makes."""
    if kind == "forked" and not http.get("/health").json()["zygote"]:
        pytest.skip("forked sessions come from the zygote only")
    return python_session(http, kind)


def _rss_kb(http: httpx.Client) -> int:
    pid = http.get("/health").json()["pid"]
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def _host_devices() -> dict[str, tuple]:
    out = {}
    for name in sorted(os.listdir("/dev")):
        try:
            st = os.lstat(f"/dev/{name}")
        except OSError:
            continue
        if stat.S_ISCHR(st.st_mode):
            out[name] = (st.st_mode, st.st_uid, st.st_gid, st.st_mtime_ns)
    return out


# 1. Critical: the sandbox owned the host's device nodes (its uid was root's) and changed them for later requests.
DEVICE_PROBE = r"""
import os, stat
results = {}
for name in sorted(os.listdir('/dev')):
    path = '/dev/' + name
    try:
        st = os.lstat(path)  # the host's nodes; ptmx is a link into the sandbox's own devpts
    except OSError:
        continue
    if not stat.S_ISCHR(st.st_mode):
        continue
    ops = {'chmod': lambda: os.chmod(path, stat.S_IMODE(st.st_mode)),   # no-op chmod: only the owner may
           'chown': lambda: os.chown(path, os.getuid(), os.getgid()),
           'utime': lambda: os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns)),
           'utime_now': lambda: os.utime(path)}
    for op, call in ops.items():
        try:
            call()
            results[name + ' ' + op] = 'OK'
        except OSError as e:
            results[name + ' ' + op] = e.errno
print(results)
"""


def test_device_nodes_are_not_the_sandboxs_to_change(any_http):
    before = _host_devices()
    body = run(any_http, DEVICE_PROBE)
    check(body, "Success", "exit")
    results = eval(body["run_result"]["stdout"])
    assert {op.split()[0] for op in results} >= {"null", "zero", "full", "random", "urandom"}, results
    assert all(outcome != "OK" for outcome in results.values()), results  # EPERM / EROFS, every one
    assert _host_devices() == before  # modes, owners and times of the host's nodes untouched
    assert_benign(any_http)


def _find_process(marker: str) -> int:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/cmdline", "rb") as f:
                        if marker.encode() in f.read():
                            return int(entry)
                except OSError:
                    continue
        time.sleep(0.05)
    raise AssertionError(f"no process {marker!r} on the host")


def test_sandbox_processes_run_as_an_unprivileged_host_uid(any_http, session_kind):
    with _session(any_http, session_kind) as sid:
        body = any_http.post(f"/sessions/{sid}/run", json={
            "code": "import os, subprocess\np = subprocess.Popen(['sleep', '4949.5'])\nprint(os.getuid())"}).json()
        assert body["status"] == "ok" and body["stdout"] == "65534\n", body  # what the code sees
        with open(f"/proc/{_find_process('4949.5')}/status") as f:
            uids = next(line.split()[1:] for line in f if line.startswith("Uid:"))
        assert len(set(uids)) == 1 and int(uids[0]) not in (0, os.geteuid()), uids  # what the host sees


# 2. High: the end-of-output nonce was in the program's reach; a forged marker stopped the draining while the
# service buffered everything after it (400 MB -> +410 MB of service memory, status Success).
FORGED_MARKER = r"""
import os, sys, gc
seen = set()
def strings(obj, depth=0):
    if isinstance(obj, str) and 8 <= len(obj) <= 64:
        seen.add(obj)
    elif isinstance(obj, dict) and depth < 3:
        for k, v in list(obj.items()):
            strings(k, depth + 1); strings(v, depth + 1)
f = sys._getframe()
while f is not None:
    strings(f.f_locals); strings(f.f_globals)
    f = f.f_back
for o in gc.get_objects():
    if isinstance(o, dict):
        strings(o, 2)
print('candidates', len(seen), flush=True)
for s in seen:
    os.write(1, ('\x00agentrl-run-end:%s\x00' % s).encode())
block = b'y' * (1 << 20)
for _ in range(64):
    os.write(1, block)
"""


def test_a_forged_end_marker_neither_ends_the_output_nor_grows_the_service(any_http):
    before = _rss_kb(any_http)
    body = run(any_http, FORGED_MARKER, run_timeout=20)
    # the kill limit (8 MiB in these tests) counts every byte, marker or not: the run is killed, not a Success
    check(body, "Failed", "output_limit")
    # no string in the program's reach ended its output: what it wrote after the markers is in the capture
    assert body["run_result"]["stdout"].endswith("y" * 1000) and body["truncated"] is True
    assert _rss_kb(any_http) - before < 32 * 1024  # 64 MiB written: the service kept a bounded part of it
    assert_benign(any_http)


# 6. Medium: the runner's internal pipe (fd 5) was open in the program; a crafted marshal frame made the
# supervisor raise SystemError, pid 1 died and a wrong answer became an infrastructure error (SandboxError).
FORGED_FRAMES = r"""
import marshal, os
def f(a): pass
frame = bytearray(marshal.dumps({'sigint': f.__code__, 'start': 0, 'compiled': True}))
i = frame.index(0xe3)
frame[i + 5:i + 9] = (5).to_bytes(4, 'little')  # posonlyargcount > argcount: SystemError when unmarshalled
data = len(frame).to_bytes(4, 'big') + bytes(frame)
fds = sorted(int(fd) for fd in os.listdir('/proc/self/fd'))
for fd in fds:
    if fd > 2:
        try:
            os.write(fd, data)
        except OSError:
            pass
print('fds', fds, flush=True)
assert 1 == 2, 'a wrong answer'
"""


def test_frames_written_to_any_fd_leave_a_wrong_answer_wrong(any_http):
    body = run(any_http, FORGED_FRAMES)
    check(body, "Failed", "exit")
    assert body["run_result"]["return_code"] == 1 and "AssertionError: a wrong answer" in body["run_result"]["stderr"]
    fds = eval(body["run_result"]["stdout"].split("fds ", 1)[1].splitlines()[0])
    assert 5 not in fds, fds  # the runner's meta pipe is closed before the code runs
    assert_benign(any_http)


# 3. High: a session's result pipe is the interpreter's own fd 3; the host believed its 4-byte length header
# (2 GiB header + 300 MB body -> +300 MB of service memory).
def test_a_session_frame_past_the_cap_restarts_the_session_only(http, session_kind):
    with _session(http, session_kind) as sid:
        assert http.post(f"/sessions/{sid}/run", json={"code": "x = 41"}).json()["status"] == "ok"
        before = _rss_kb(http)
        code = ("import os\nos.write(3, (2**31).to_bytes(4, 'big'))\nblock = b'z' * (1 << 20)\n"
                "try:\n    for _ in range(300):\n        os.write(3, block)\nexcept OSError:\n    pass")
        body = http.post(f"/sessions/{sid}/run", json={"code": code, "timeout": 20}).json()
        assert body["status"] == "error" and body["exit_reason"] == "runner_fault", body
        assert "oversized or malformed" in body["error"]["value"], body
        assert _rss_kb(http) - before < 32 * 1024
        after = http.post(f"/sessions/{sid}/run", json={"code": "print('x' in dir())"}).json()
        assert after["status"] == "ok" and after["stdout"] == "False\n", after  # a fresh interpreter
    assert_benign(http)


@pytest.mark.parametrize("what", ["not_json", "not_an_object", "flood"])
def test_malformed_or_flooding_session_frames_restart_the_session(http, what, session_kind):
    payload = {"not_json": "b'{nope'", "not_an_object": "b'[1, 2]'", "flood": "b'{\"id\": \"x\"}'"}[what]
    times = 10 if what == "flood" else 1
    code = (f"import os\ndata = {payload}\nfor _ in range({times}):\n"
            "    os.write(3, len(data).to_bytes(4, 'big') + data)")
    with _session(http, session_kind) as sid:
        body = http.post(f"/sessions/{sid}/run", json={"code": code}).json()
        assert body["status"] == "error" and body["exit_reason"] == "runner_fault", body
        again = http.post(f"/sessions/{sid}/run", json={"code": "print(6 * 7)"}).json()
        assert again["status"] == "ok" and again["stdout"] == "42\n", again


# 4. Medium-high: on cgroup v1 socket buffers were not charged to the sandbox (174 MB queued under 64 MB).
TCP_QUEUE = r"""
import socket
srv = socket.socket()
srv.bind(('127.0.0.1', 0))
srv.listen(128)
pairs, total = [], 0
for _ in range(64):
    a = socket.socket()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 24)
    a.connect(srv.getsockname())
    b, _ = srv.accept()
    b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 24)
    a.setblocking(False)
    pairs.append((a, b))
    while True:
        try:
            total += a.send(b'q' * 65536)
        except BlockingIOError:
            break
print(total)
"""


def test_loopback_tcp_buffers_count_against_the_memory_limit(any_http):
    body = run(any_http, TCP_QUEUE, memory_limit_MB=64, run_timeout=30)
    if body["exit_reason"] == "oom":
        return  # charged and over the limit: killed, as it should be
    check(body, "Success", "exit")
    assert int(body["run_result"]["stdout"]) <= 64 << 20, body["run_result"]["stdout"]
    assert_benign(any_http)


# 5. Medium: with root's uid the sandbox shared root's per-user limits and owner rights.
def _inotify_init() -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(0)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "inotify_init1")
    return fd


def test_a_session_holding_every_inotify_instance_starves_no_one_else(http, session_kind):
    with _session(http, session_kind) as sid:
        hog = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nheld = []\n"
               "while (fd := libc.inotify_init1(0)) >= 0:\n    held.append(fd)\nprint(len(held), ctypes.get_errno())")
        body = http.post(f"/sessions/{sid}/run", json={"code": hog}).json()
        held, errno_ = (int(x) for x in body["stdout"].split())
        assert held > 0 and errno_ == 24, body  # EMFILE: this sandbox's own per-user limit
        other = run(http, "import ctypes\nprint(ctypes.CDLL(None).inotify_init1(0) >= 0)")
        assert other["run_result"]["stdout"] == "True\n", other  # another sandbox: its own uid, its own count
        os.close(_inotify_init())  # and root on the host


ROOT_ONLY = r"""
import os, stat
res = {}
for path in ['/proc/kpageflags', '/proc/slabinfo', '/proc/timer_list', '/proc/kcore', '/proc/1/environ',
             '/proc/1/mem']:
    try:
        open(path, 'rb').read(1)
        res[path] = 'READ'
    except OSError as e:
        res[path] = e.errno
owners = set()
for line in open('/proc/keys'):
    owners.add(int(line.split()[5]))
res['key owners'] = sorted(owners)
listed = []
for top, dirs, _ in os.walk('/', onerror=lambda e: None):
    if top.startswith(('/proc', '/sys', '/dev')) or top.count('/') > 4:
        dirs[:] = []
        continue
    for d in dirs:
        path = os.path.join(top, d)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_mode & 0o077 == 0 and st.st_uid != os.getuid():
            try:
                os.listdir(path)
                listed.append(path)
            except OSError:
                pass
res['private dirs listed'] = listed
print(res)
"""


def test_root_only_files_keys_and_directories_are_closed(any_http):
    body = run(any_http, ROOT_ONLY)
    check(body, "Success", "exit")
    res = eval(body["run_result"]["stdout"])
    for path in ("/proc/kpageflags", "/proc/slabinfo", "/proc/timer_list", "/proc/kcore", "/proc/1/mem"):
        assert res[path] in (1, 2, 13), (path, res)  # EPERM, ENOENT or EACCES: never read
    assert res["/proc/1/environ"] != "READ" or not any_http.get("/health").json()["zygote"], res
    assert 0 not in res["key owners"] and res["private dirs listed"] == [], res
    assert_benign(any_http)


# Low: a session's pid 1 never reaped orphans (124 zombies left a session unable to fork).
def test_a_sessions_orphans_are_reaped(http, session_kind):
    with _session(http, session_kind) as sid:
        orphans = ("import os\nfor _ in range(100):\n    pid = os.fork()\n    if pid == 0:\n"
                   "        if os.fork() == 0:\n            os._exit(0)\n        os._exit(0)\n    os.waitpid(pid, 0)\n")
        for _ in range(2):  # 200 orphans against a pids limit of 64
            body = http.post(f"/sessions/{sid}/run", json={"code": orphans}).json()
            assert body["status"] == "ok", body
        check_code = ("import os, time\nfor _ in range(50):\n"
                      "    zombies = [p for p in os.listdir('/proc') if p.isdigit() "
                      "and open(f'/proc/{p}/stat').read().split(') ')[1][0] == 'Z']\n"
                      "    if not zombies:\n        break\n    time.sleep(0.1)\n"
                      "print(len(zombies), os.waitpid(os.fork() or os._exit(0), 0)[0] > 0)")
        body = http.post(f"/sessions/{sid}/run", json={"code": check_code}).json()
        assert body["status"] == "ok" and body["stdout"] == "0 True\n", body


# Low: a program that exits 0 after hitting the pids limit was reported as Success.
def test_exit_zero_after_the_pids_limit_is_not_a_success(http):
    code = ("import threading, time\ntry:\n    while True:\n"
            "        threading.Thread(target=time.sleep, args=(5,), daemon=True).start()\n"
            "except RuntimeError:\n    pass\nimport os\nos._exit(0)")
    body = run(http, code, run_timeout=10)
    check(body, "Failed", "pids_limit")
    assert body["run_result"]["return_code"] == 0
    assert_benign(http)


# Low: a session's background threads ran on between cells, outside the cell's time limit and admission control.
def test_a_session_is_frozen_between_its_cells(any_http, session_kind):
    with _session(any_http, session_kind) as sid:
        spin = ("import threading, time\nthreading.Thread(target=lambda: [None for _ in iter(int, 1)], daemon=True)"
                ".start()\ntime.sleep(0.2)\nprint(time.process_time())")
        first = any_http.post(f"/sessions/{sid}/run", json={"code": spin}).json()
        assert first["status"] == "ok", first
        time.sleep(3)  # a thread left running would use up to this much CPU before the next cell
        second = any_http.post(f"/sessions/{sid}/run", json={"code": "import time\nprint(time.process_time())"}).json()
        used = float(second["stdout"]) - float(first["stdout"])
        assert used < 0.25, (used, first, second)  # CPU of the session's process between its two cells
    assert_benign(any_http)
