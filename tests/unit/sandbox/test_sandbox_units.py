"""Pure parts of the sandbox: output capture, request checks, status mapping, admission, config, seccomp."""

from __future__ import annotations

import asyncio
import os
import struct

import pytest

from sandbox import seccomp
from sandbox.admission import Admission, Overloaded
from sandbox.api import check_files
from sandbox.app import to_response
from sandbox.backends.base import ExecResult
from sandbox.backends.session_proc import _Stream
from sandbox.config import SandboxConfig
from sandbox.output import HeadTail


def test_head_tail_keeps_both_ends_and_counts():
    buf = HeadTail(10)
    for chunk in [b"HEAD", b"x" * 1000, b"TAIL!"]:
        buf.feed(chunk)
    assert buf.total == 1009 and buf.truncated
    text = buf.text()
    assert text.startswith("HEADx") and text.endswith("TAIL!") and "[999 bytes truncated]" in text
    small = HeadTail(100)
    small.feed(b"ok \xff")
    assert not small.truncated and small.text() == "ok \ufffd"


def test_session_stream_cuts_at_marker_across_reads():
    stream = _Stream(1000)
    buf = stream.expect("abc")
    marker = b"\x00agentrl-cell-end:abc\x00"
    stream.feed(b"hello " + marker[:7])
    assert not stream.seen.is_set()
    stream.feed(marker[7:] + b"next")
    assert stream.seen.is_set() and buf.text() == "hello "
    assert stream.expect("def").text() == "next"  # output after the marker counts toward the next cell


@pytest.mark.parametrize("files,fetch,field", [
    ({"../x": None}, [], "files"), ({"/abs": None}, [], "files"), ({"a/../../x": None}, [], "files"),
    ({"": None}, [], "files"), ({"ok": "not base64!"}, [], "files"), ({}, ["../../etc/passwd"], "fetch_files"),
    ({}, ["/etc/passwd"], "fetch_files"),
])
def test_bad_paths_name_the_field(files, fetch, field):
    with pytest.raises(ValueError, match=field):
        check_files(files, fetch)


def test_good_paths_pass():
    check_files({"dir/a.txt": "aGk=", "b": None}, ["dir/a.txt", "./c"])


def test_status_mapping():
    ok = to_response(ExecResult(status="Finished", return_code=0, exit_reason="exit", stdout="1\n"))
    assert ok.status == "Success" and ok.run_result.status == "Finished" and ok.message == ""
    tle = to_response(ExecResult(status="TimeLimitExceeded", return_code=None, exit_reason="timeout"))
    assert tle.status == "Failed" and tle.run_result.status == "TimeLimitExceeded"
    oom = to_response(ExecResult(status="Finished", return_code=137, exit_reason="oom", signal="SIGKILL"))
    assert oom.status == "Failed" and "memory" in oom.message and oom.signal == "SIGKILL"
    infra = to_response(ExecResult(status="Error", return_code=None, exit_reason="exit", infra_error="bwrap died"))
    assert infra.status == "SandboxError" and infra.run_result is None and "bwrap died" in infra.message


async def test_admission_queue_limit_and_timeout():
    adm = Admission(max_concurrency=1, max_queue=1, queue_timeout_s=0.05)
    release = asyncio.Event()

    async def hold():
        async with adm.slot():
            await release.wait()

    holder = asyncio.create_task(hold())
    await asyncio.sleep(0)
    with pytest.raises(Overloaded) as timed_out:  # queue has room, but no slot frees up within the timeout
        async with adm.slot():
            pass
    assert "within" in str(timed_out.value) and timed_out.value.retry_after_s >= 1
    adm.queue_timeout_s = 5
    waiter = asyncio.create_task(hold())
    await asyncio.sleep(0.01)
    assert adm.waiting == 1
    with pytest.raises(Overloaded, match="max_queue"):  # one running, one queued: the next is refused at once
        async with adm.slot():
            pass
    release.set()
    await holder
    await waiter
    assert adm.running == 0 and adm.waiting == 0 and adm.rejected == 2


def test_config_validation():
    cfg = SandboxConfig()
    assert cfg.max_concurrency >= 2 and cfg.warm_pool == 2 * cfg.max_concurrency + 4
    with pytest.raises(ValueError, match="pids_limit"):
        SandboxConfig(pids_limit=0)
    with pytest.raises(ValueError, match="output_kill_bytes"):
        SandboxConfig(max_output_bytes=100, output_kill_bytes=10)
    with pytest.raises(ValueError, match="default_run_timeout_s"):
        SandboxConfig(default_run_timeout_s=500)


def _run_bpf(prog: bytes, arch: int, nr: int, arg0: int = 0) -> int:
    """Evaluate a classic-BPF seccomp program on one seccomp_data (the opcodes build_filter uses)."""
    data = struct.pack("=iIQ6Q", nr, arch, 0, arg0, 0, 0, 0, 0, 0)
    insns = [struct.unpack("=HBBI", prog[i:i + 8]) for i in range(0, len(prog), 8)]
    pc, acc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        if code == 0x20:  # LD W ABS
            acc = struct.unpack_from("=I", data, k)[0]
            pc += 1
        elif code == 0x06:  # RET K
            return k
        elif code in (0x15, 0x35, 0x45):  # JEQ, JGE, JSET (K)
            taken = acc == k if code == 0x15 else acc >= k if code == 0x35 else bool(acc & k)
            pc += 1 + (jt if taken else jf)
        else:
            raise AssertionError(f"unexpected opcode {code:#x}")


@pytest.mark.skipif(not seccomp.supported(), reason="the seccomp table covers x86_64 only")
def test_seccomp_filter_decisions():
    prog = seccomp.build_filter()
    allow, eperm, enosys = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38
    x86_64 = seccomp.AUDIT_ARCH_X86_64
    for name, nr in seccomp.DENIED_X86_64.items():
        assert _run_bpf(prog, x86_64, nr) == eperm, name
    for nr in (0, 1, 2, 57, 59, 60, 231):  # read, write, open, fork, execve, exit, exit_group
        assert _run_bpf(prog, x86_64, nr) == allow, nr
    fork_flags = 0x01200011  # CLONE_CHILD_SETTID | CLONE_CHILD_CLEARTID | SIGCHLD, as glibc's fork
    thread_flags = 0x003D0F00  # CLONE_VM | FS | FILES | SIGHAND | THREAD | SYSVSEM | SETTLS | PARENT_SETTID ...
    assert _run_bpf(prog, x86_64, seccomp.CLONE, fork_flags) == allow
    assert _run_bpf(prog, x86_64, seccomp.CLONE, thread_flags) == allow
    for flag in (0x10000000, 0x20000000, 0x40000000, 0x00020000, 0x08000000, 0x04000000, 0x02000000):
        assert _run_bpf(prog, x86_64, seccomp.CLONE, fork_flags | flag) == eperm, hex(flag)
    assert _run_bpf(prog, x86_64, seccomp.CLONE3) == enosys  # libc falls back to clone
    assert _run_bpf(prog, 0x40000003, 1) == enosys  # i386 ABI
    assert _run_bpf(prog, x86_64, seccomp.X32_SYSCALL_BIT | 1) == enosys  # x32 ABI


def test_compile_failure_mapping():
    comp = {"status": "Finished", "execution_time": 0.1, "return_code": 1, "stdout": "", "stderr": "error"}
    failed = to_response(ExecResult(status="Finished", return_code=0, exit_reason="exit", compile=comp, ran=False))
    assert failed.status == "Failed" and failed.run_result is None and failed.compile_result.return_code == 1
    tle = dict(comp, status="TimeLimitExceeded", return_code=None)
    slow = to_response(ExecResult(status="Finished", return_code=0, exit_reason="timeout", compile=tle, ran=False))
    assert slow.status == "Failed" and slow.message == "compile time limit exceeded" and slow.run_result is None
    compiled = dict(comp, return_code=0)
    ok = to_response(ExecResult(status="Finished", return_code=0, exit_reason="exit", compile=compiled))
    assert ok.status == "Success" and ok.compile_result.status == "Finished" and ok.run_result.return_code == 0


def test_script_name_avoids_request_files():
    from sandbox.backends.base import script_name

    assert script_name(".py", {}) == "main.py"
    assert script_name(".py", {"./main.py": "", "main_1.py": ""}) == "main_2.py"


def test_zygote_helper_builds_once_and_names_the_fix_without_a_compiler(tmp_path, monkeypatch):
    import shutil

    from sandbox.backends import nsutil
    from sandbox.backends.base import BackendError

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    if shutil.which("cc") or shutil.which("gcc"):
        path = nsutil.build()
        assert path.startswith(str(tmp_path)) and os.path.exists(path)
        assert nsutil.build() == path  # cached: built once per source and interpreter
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "empty"))
    monkeypatch.setattr(nsutil.shutil, "which", lambda name: None)
    with pytest.raises(BackendError, match="make setup"):
        nsutil.build()


def test_python_argv_runs_the_program_as_the_c_text_without_keeping_its_parse():
    """The bootstrap runs the program as `-c <program>` would (sys.argv, __main__), but the parse of the program
    (CPython keeps the -c text's AST arena until it returns) is freed before it runs: traced memory while it runs
    is megabytes lower for a large program."""
    import subprocess
    import sys

    from sandbox.backends.base import python_argv

    src = "\n".join(f"def f{i}(a, b):\n    return [a + b * {i} for _ in range(3)]" for i in range(1200))
    src += "\nimport sys, tracemalloc\nprint(sys.argv, __name__, tracemalloc.get_traced_memory()[0])\n"
    runs = {}
    for how, argv in (("direct", [sys.executable, "-I", "-S", "-c", src, "x", "y"]),
                      ("bootstrap", python_argv(sys.executable, src, "x", "y"))):
        argv[1:1] = ["-X", "tracemalloc"]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout.split()
        runs[how] = out
    assert runs["bootstrap"][:4] == runs["direct"][:4] == ["['-c',", "'x',", "'y']", "__main__"]
    assert int(runs["direct"][4]) - int(runs["bootstrap"][4]) > 1_000_000
