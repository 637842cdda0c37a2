"""Hostile code against the bwrap backend: each case asserts the exact outcome, then that the service still works."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sandbox_testlib import SECRET, assert_benign, check, run

import sandbox

pytestmark = pytest.mark.slow


def test_fork_bomb_hits_pids_limit(http):
    body = run(http, "import os\nwhile True:\n    os.fork()", run_timeout=2)
    assert body["status"] == "Failed" and body["exit_reason"] == "pids_limit", body
    assert_benign(http)


def test_bash_fork_bomb_hits_pids_limit(http):
    # The classic bomb returns at once; the shell then waits, as a script that does more work would.
    body = run(http, ":(){ :|:& };:\nsleep 5", language="bash", run_timeout=2)
    assert body["status"] == "Failed" and body["exit_reason"] == "pids_limit", body
    assert_benign(http)


@pytest.mark.skipif(os.geteuid() != 0, reason="the point is made as root: RLIMIT_NPROC is ignored for root")
def test_rlimit_nproc_alone_does_not_stop_forks_as_root():
    # Why the pids cgroup is needed: as root, fork() ignores RLIMIT_NPROC (nproc=2 here, 10 forks succeed).
    code = ("import os, resource, time\nresource.setrlimit(resource.RLIMIT_NPROC, (2, 2))\nok = 0\n"
            "for _ in range(10):\n    pid = os.fork()\n    if pid == 0:\n        time.sleep(0.2)\n        os._exit(0)\n"
            "    ok += 1\nfor _ in range(ok):\n    os.wait()\nprint(ok)")
    out = subprocess.run(["python3", "-c", code], capture_output=True, text=True, timeout=30)
    assert out.stdout.strip() == "10", out


def test_thread_bomb_hits_pids_limit(http):
    code = ("import threading, time\nwhile True:\n"
            "    threading.Thread(target=time.sleep, args=(30,), daemon=True).start()")
    body = run(http, code, run_timeout=2)
    check(body, "Failed", "pids_limit")
    assert "can't start new thread" in body["run_result"]["stderr"]
    assert_benign(http)


def test_memory_bomb_is_oom_killed(http):
    body = run(http, "x = bytearray(512 * 1024 * 1024)\nprint('allocated')", memory_limit_MB=128, run_timeout=5)
    check(body, "Failed", "oom")
    assert body["run_result"]["return_code"] == 137 and body["signal"] == "SIGKILL"
    assert "allocated" not in body["run_result"]["stdout"]
    assert_benign(http)


def test_slow_memory_growth_is_oom_killed(http):
    code = "import time\nchunks = []\nwhile True:\n    chunks.append(bytearray(8 * 2**20))\n    time.sleep(0.002)"
    body = run(http, code, memory_limit_MB=96, run_timeout=5)
    check(body, "Failed", "oom")
    assert_benign(http)


def test_infinite_loop_times_out(http):
    started = time.monotonic()
    body = run(http, "while True: pass", run_timeout=1)
    check(body, "Failed", "timeout", "TimeLimitExceeded")
    assert body["run_result"]["return_code"] is None
    assert time.monotonic() - started < 10
    assert_benign(http)


def _processes_with(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _gone(marker: str) -> bool:
    """SIGKILL is sent before the response; the exit itself may take the kernel a moment."""
    deadline = time.monotonic() + 2
    while _processes_with(marker):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_daemonised_setsid_sleeper_is_killed(http):
    code = ("import subprocess\nsubprocess.Popen(['setsid', 'sleep', '4242.5'], start_new_session=True)\n"
            "print('spawned')")
    body = run(http, code)
    check(body, "Success", "exit")
    assert body["run_result"]["stdout"] == "spawned\n"
    assert _gone("4242.5")  # killed with the sandbox's cgroup
    assert_benign(http)


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_one_megabyte_output_is_truncated_head_and_tail(http, stream):
    code = f"import sys\nsys.{stream}.write('START' + 'x' * (1024 * 1024) + 'END')"
    body = run(http, code)
    check(body, "Success", "exit")
    text = body["run_result"][stream]
    assert body["truncated"] is True
    assert text.startswith("START") and text.endswith("END") and "bytes truncated" in text
    assert len(text) < 100_000
    assert_benign(http)


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_endless_output_is_killed(http, stream):
    body = run(http, f"import sys\nwhile True:\n    sys.{stream}.write('y' * 65536)", run_timeout=5)
    check(body, "Failed", "output_limit")
    assert body["truncated"] is True
    assert_benign(http)


@pytest.mark.parametrize("where", ["/tmp", "."])
def test_disk_fill_stops_at_tmpfs_size(http, program, where):
    code = (f"import os\ntotal = 0\ntry:\n    for i in range(10000):\n"
            f"        with open(os.path.join({where!r}, f'f{{i}}'), 'wb') as f:\n"
            "            f.write(b'0' * (4 * 2**20))\n        total += 4\nexcept OSError as e:\n"
            "    print(type(e).__name__, e.errno, total)")
    body = program(code, run_timeout=10)
    check(body, "Success", "exit")
    name, errno_, total = body["run_result"]["stdout"].split()
    assert name == "OSError" and errno_ == "28"  # ENOSPC
    assert int(total) <= 64
    assert_benign(http)


def test_single_file_size_is_capped_by_rlimit_fsize(http, program):
    code = ("try:\n    with open('big', 'wb') as f:\n        f.write(b'0' * (40 * 2**20))\n"
            "except OSError as e:\n    print(e.errno)")
    body = program(code)
    check(body, "Success", "exit")
    assert body["run_result"]["stdout"].strip() == "27"  # EFBIG at max_file_bytes (32 MiB)
    assert_benign(http)


def test_network_egress_and_dns_fail(http, program):
    code = ("import socket\nfor target in [('1.1.1.1', 53), ('127.0.0.1', 22)]:\n    try:\n"
            "        socket.create_connection(target, timeout=1)\n        print('CONNECTED', target)\n"
            "    except OSError as e:\n        print('blocked', type(e).__name__)\ntry:\n"
            "    socket.getaddrinfo('example.com', 80)\n    print('RESOLVED')\nexcept OSError as e:\n"
            "    print('dns blocked')\nimport os\nprint(sorted(os.listdir('/sys/class/net')) if os.path.exists('/sys') "
            "else 'no /sys')")
    body = program(code)
    out = body["run_result"]["stdout"]
    assert "CONNECTED" not in out and "RESOLVED" not in out and out.count("blocked") == 3, out
    assert_benign(http)


def test_host_secrets_are_unreadable(http, program):
    source = str(Path(sandbox.__file__).resolve().parent / "app.py")
    code = (
        "import os, glob\n"
        f"for path in ['/etc/shadow', '/root/.bashrc', '/root/.ssh', {source!r}, '/work/main/README.md', "
        "'/home']:\n"
        "    try:\n        open(path).read()\n        print('READ', path)\n"
        "    except OSError as e:\n        print('denied', type(e).__name__)\n"
        "try:\n    print('root has', os.listdir('/root') if os.path.isdir('/root') else [])\n"
        "except PermissionError:\n    print('root has', [])\n"
        "leak = []\nfor env in glob.glob('/proc/*/environ'):\n    try:\n"
        f"        if b{SECRET!r} in open(env, 'rb').read():\n            leak.append(env)\n"
        "    except OSError:\n        pass\nprint('environ leaks', leak)\n"
        f"print('env leak', any({SECRET!r} in v for v in os.environ.values()))")
    body = program(code)
    out = body["run_result"]["stdout"]
    assert "READ" not in out and out.count("denied") == 6, out
    visible = eval(out.split("root has ", 1)[1].splitlines()[0])
    assert all(os.path.realpath(sys.base_prefix).startswith(f"/root/{name}/") for name in visible), visible
    assert "environ leaks []" in out and "env leak False" in out
    assert_benign(http)


def test_kill_all_and_pid_one(http):
    body = run(http, "kill -9 1; echo alive-after-pid1", language="bash")
    check(body, "Success", "exit")
    assert body["run_result"]["stdout"] == "alive-after-pid1\n"
    # kill(-1) hits every process of the sandbox but the caller and init. The runner that reports the exit
    # status is the sandbox's init, so the program's own children die, the report is exact, and nothing outside
    # the sandbox is touched.
    body = run(http, "sleep 30 & kill -9 -1; wait $!; echo survived $?", language="bash")
    check(body, "Success", "exit")
    assert body["run_result"]["stdout"] == "survived 137\n", body
    assert_benign(http)


def test_symlink_escape_via_fetch_files_is_refused(http):
    for code, path in [("import os\nos.symlink('/etc/passwd', 'out.txt')", "out.txt"),
                       ("import os\nos.symlink('/etc', 'd')", "d/passwd")]:
        resp = http.post("/run_code", json={"code": code, "language": "python", "fetch_files": [path]})
        assert resp.status_code == 400, resp.text
        assert "fetch_files" in resp.json()["detail"] and path.split("/")[0] in resp.json()["detail"]
    body = run(http, "open('result.txt', 'w').write('42')", fetch_files=["result.txt"])
    assert base64.b64decode(body["files"]["result.txt"]) == b"42"
    assert_benign(http)


@pytest.mark.parametrize("field,value", [
    ("files", {"../evil.txt": "aGk="}), ("files", {"/etc/evil": "aGk="}), ("files", {"a/../../b": "aGk="}),
    ("fetch_files", ["../../etc/passwd"]), ("fetch_files", ["/etc/passwd"]), ("files", {"ok.txt": "%%%"}),
])
def test_bad_file_names_are_refused(http, field, value):
    resp = http.post("/run_code", json={"code": "print(1)", "language": "python", field: value})
    assert resp.status_code == 400, resp.text
    assert field in resp.json()["detail"]
    assert_benign(http)


def test_no_state_leaks_between_requests(http, program):
    first = program("import os\nopen('/tmp/leak', 'w').write('1')\nopen('leak', 'w').write('1')\n"
                    "import subprocess\nsubprocess.Popen(['sleep', '4343.5'])\nprint(os.getpid())")
    assert first["status"] == "Success"
    second = program("import os\n"
                     "print(os.path.exists('/tmp/leak'), os.path.exists('leak'), sorted(os.listdir('.')))\n"
                     "print([p for p in os.listdir('/proc') if p.isdigit()])")
    lines = second["run_result"]["stdout"].splitlines()
    assert lines[0] == "False False ['main.py']"  # only this request's own script
    assert len(eval(lines[1])) <= 3  # bwrap's init, the runner, the program: no sleeper from the first request
    assert _gone("4343.5")


def test_privilege_escalation_attempts_fail(http, program):
    code = r"""
import ctypes, os, subprocess
libc = ctypes.CDLL(None, use_errno=True)
results = {}
try:
    os.setuid(0); results['setuid'] = 'OK'
except OSError as e:
    results['setuid'] = e.errno
results['mount'] = libc.mount(b'none', b'/tmp', b'tmpfs', 0, None) or 'OK'
results['mount_errno'] = ctypes.get_errno()
results['unshare_user'] = libc.unshare(0x10000000) or 'OK'   # CLONE_NEWUSER
results['unshare_net'] = libc.unshare(0x40000000) or 'OK'    # CLONE_NEWNET
pid = libc.syscall(56, 0x10000000 | 17, 0, 0, 0, 0)            # raw clone(CLONE_NEWUSER | SIGCHLD)
if pid == 0:
    os._exit(0)
results['clone_newuser'] = (pid, ctypes.get_errno()) if pid < 0 else 'OK'
results['clone3'] = (libc.syscall(435, 0, 0), ctypes.get_errno())
results['fork'] = 'OK' if os.waitpid(os.fork() or os._exit(0), 0) else 'failed'
results['ptrace_pid1'] = libc.ptrace(16, 1, None, None) or 'OK'  # PTRACE_ATTACH
results['cmd_unshare'] = subprocess.run(['unshare', '-U', 'true'], capture_output=True).returncode
results['caps'] = [l for l in open('/proc/self/status') if l.startswith('CapEff')][0].split()[1]
results['nonewprivs'] = [l for l in open('/proc/self/status') if l.startswith('NoNewPrivs')][0].split()[1]
results['uid'] = os.getuid()
print(results)
"""
    body = program(code)
    check(body, "Success", "exit")
    results = eval(body["run_result"]["stdout"])
    assert results["setuid"] in (1, 22)  # EPERM, or EINVAL: uid 0 is not even mapped in the namespace
    assert results["mount"] == -1 and results["unshare_user"] == -1 and results["unshare_net"] == -1, results
    assert results["ptrace_pid1"] == -1 and results["cmd_unshare"] != 0
    assert results["clone_newuser"] == (-1, 1) and results["clone3"] == (-1, 38) and results["fork"] == "OK", results
    assert results["caps"] == "0000000000000000" and results["nonewprivs"] == "1" and results["uid"] == 65534
    assert_benign(http)


def test_segfault_reports_signal(http):
    body = run(http, "import ctypes\nctypes.string_at(0)")
    check(body, "Failed", "signal")
    assert body["signal"] == "SIGSEGV" and body["run_result"]["return_code"] == 139
    assert_benign(http)


def test_invalid_utf8_output_is_replaced(http):
    body = run(http, "import sys\nsys.stdout.buffer.write(b'ok \\xff\\xfe end')\nsys.stderr.buffer.write(b'\\xc3')")
    check(body, "Success", "exit")
    assert body["run_result"]["stdout"] == "ok \ufffd\ufffd end" and body["run_result"]["stderr"] == "\ufffd"
    assert_benign(http)


def test_unread_ten_megabyte_stdin(http):
    body = run(http, "print('ignored stdin')", stdin="z" * (10 * 1024 * 1024))
    check(body, "Success", "exit")
    assert body["run_result"]["stdout"] == "ignored stdin\n"
    body = run(http, "import sys\nprint(len(sys.stdin.read()))", stdin="z" * (1024 * 1024))
    assert body["run_result"]["stdout"] == f"{1024 * 1024}\n"
    assert_benign(http)


def test_ten_megabyte_code_body(http):
    code = "x = 6 * 7\n" + ("#" * 1000 + "\n") * 10_000 + "print(x)\n"
    body = run(http, code)
    check(body, "Success", "exit")
    assert body["run_result"]["stdout"] == "42\n"
    big = "#" * (17 * 1024 * 1024)
    resp = http.post("/run_code", json={"code": big, "language": "python"})
    assert resp.status_code == 413 and "max_body_bytes" in resp.text
    assert_benign(http)


def test_zero_sandbox_errors_so_far(http):
    health = http.get("/health").json()
    assert health["sandbox_errors"] == 0 and health["isolation"] == "bwrap+cgroups" and health["unsafe"] is False


@pytest.mark.parametrize("language,code", [
    ("bash", "echo hello from $0 | cut -c1-10; exit 4"),
    ("javascript", "console.log('hello from node'); process.exit(4)"),
    ("perl", "print \"hello from perl\\n\"; exit 4"),
])
def test_other_languages_when_installed(http, language, code):
    if language not in http.get("/health").json()["languages"]:
        pytest.skip(f"no {language} interpreter on this machine")
    body = run(http, code, language=language)
    assert body["status"] == "Failed" and body["run_result"]["return_code"] == 4, body
    assert body["run_result"]["stdout"].startswith("hello from"), body


def test_health_reports_every_layer(http):
    health = http.get("/health").json()
    assert health["status"] == "ok" and health["canary"]["ok"] is True
    assert health["backend"] == "bwrap" and health["cgroup_version"] in (1, 2)
    assert health["seccomp"] is (os.uname().machine == "x86_64")
    assert {"queue_depth", "running", "live_sessions", "max_concurrency"} <= set(health)


def test_interpreter_and_system_dirs_are_read_only(http, program):
    # The sandbox uid is mapped onto the service's uid, so read-only binds are what keeps the interpreter and
    # /usr from being poisoned for later requests (a .pth file would run in every sandbox).
    code = ("import sys, os, sysconfig\nfor d in [sysconfig.get_paths()['purelib'], sys.prefix, '/usr/lib', '/usr/bin',"
            " '/etc', '/']:\n    try:\n        open(os.path.join(d, 'evil.pth'), 'w').write('import os')\n"
            "        print('WROTE', d)\n    except OSError as e:\n        print(e.errno)")
    body = program(code)
    check(body, "Success", "exit")
    assert body["run_result"]["stdout"].split() == ["30"] * 6, body  # EROFS everywhere
    assert_benign(http)


def test_language_is_required_and_must_be_installed(http):
    resp = http.post("/run_code", json={"code": "print(1)"})
    assert resp.status_code == 422 and "language" in resp.text, resp.text
    resp = http.post("/run_code", json={"code": "print(1)", "language": "cobol"})
    assert resp.status_code == 400 and "available" in resp.json()["detail"] and "python" in resp.json()["detail"]


def test_environment_is_exactly_the_documented_one(http, program):
    from sandbox.backends.bwrap import python_runtime, sandbox_env

    code = ("import glob, os\nprint(sorted(os.environ.items()))\nenvirons = {}\n"
            "for p in glob.glob('/proc/[0-9]*/environ'):\n"
            "    try:\n        environs[p] = open(p, 'rb').read()\n"
            "    except PermissionError:\n        environs[p] = 'unreadable'\nprint(environs)")
    body = program(code)
    env_line, procs_line = body["run_result"]["stdout"].splitlines()
    expected = sandbox_env(python_runtime()[1])
    assert eval(env_line) == sorted(expected.items())
    environs = eval(procs_line)
    # pid 1, the sandbox's init, shows nothing of the service: the runner that supervises the program is not
    # dumpable (unreadable to the program's uid), bwrap's own init has an empty environment.
    assert environs.pop("/proc/1/environ") in ("unreadable", b"")
    whitelist = {f"{k}={v}".encode() for k, v in expected.items()}
    for path, data in environs.items():
        assert set(data.split(b"\0")) - {b""} == whitelist, (path, data)
    assert_benign(http)
