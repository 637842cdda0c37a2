"""bubblewrap backend: namespaces + read-only minimal root + cgroups, with a pool of warm sandboxes.

Each `/run_code` request gets a sandbox of its own that is never reused: it was made ahead of time (namespaces,
root, cgroup attach and interpreter start-up are off the request's path), it runs exactly one program, then its
whole cgroup is killed and a fresh one is made in the background. Nothing can leak from one request to the next
because nothing of a sandbox survives it. With cgroups as root the sandboxes come from the zygote (zygote.py,
zygote_src.py), which builds bwrap's layout itself for far less CPU, sessions' interpreters included; without
cgroups, or with `zygote=false`, each sandbox is a bwrap process.

Layout inside: `/usr` (+ /bin, /lib, /lib64 links), the Python prefix and a few /etc files read-only; `/workspace`
(cwd) and `/tmp` are size-limited tmpfs; `/proc` of its own pid namespace; no network, no /sys, no host files.
The code runs as uid 65534 in a user namespace with every capability dropped and no further user namespaces.
With the service as root, that namespace maps uid 65534 onto an unprivileged host uid of the sandbox's own (one
per cgroup, see cgroups.py), never onto root: bwrap itself runs as that uid (setpriv), the zygote's sandboxes
switch to it before they make their user namespace.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sandbox import seccomp
from sandbox.backends import nsutil
from sandbox.backends.base import (
    BackendError,
    ExecRequest,
    ExecResult,
    ForkSourceGone,
    encode_request,
    python_argv,
    read_frame,
    runner_payload,
)
from sandbox.backends.fdio import FdReader, FdWriter
from sandbox.backends.hostview import HostView
from sandbox.backends.session_proc import SessionProc
from sandbox.backends.zygote import Zygote, layout
from sandbox.cgroups import Cgroup, CgroupError, CgroupPool, detect_version
from sandbox.config import SandboxConfig, host_uids
from sandbox.output import HeadTail, drain

_HERE = Path(__file__).resolve().parent
# Each in-sandbox program = the shared prelude (framing, site-packages) + its own text; see prelude_src.py.
_PRELUDE_SRC = (_HERE / "prelude_src.py").read_text()
RUNNER_SRC = _PRELUDE_SRC + "\n\n" + (_HERE / "runner_src.py").read_text()
SESSION_SRC = "\n\n".join([_PRELUDE_SRC, (_HERE / "workspace_src.py").read_text(),
                           (_HERE / "session_src.py").read_text()])
WORKDIR = "/workspace"
SANDBOX_UID = 65534
ETC_FILES = ("/etc/alternatives", "/etc/ld.so.cache", "/etc/localtime", "/etc/nsswitch.conf")


def python_runtime() -> tuple[str, str]:
    """(real interpreter path, real prefix) of the Python running the service; the sandbox binds the prefix."""
    exe = os.path.realpath(sys.executable)
    prefix = os.path.realpath(sys.base_prefix)
    if not exe.startswith(prefix + "/"):
        raise BackendError(f"interpreter {exe} is not under its prefix {prefix}: cannot bind it into the sandbox")
    return exe, prefix


def bwrap_args(cfg: SandboxConfig, bwrap: str, prefix: str, seccomp_fd: int | None = None,
               view: HostView | None = None) -> list[str]:
    """bwrap's command line; `view`: where bwrap, run as the sandbox's host uid, finds the interpreter's prefix and
    read-only device nodes (see hostview.py)."""
    args = [bwrap, *(["--seccomp", str(seccomp_fd)] if seccomp_fd is not None else []),
            "--unshare-all", "--unshare-user", "--disable-userns", "--uid", str(SANDBOX_UID),
            "--gid", str(SANDBOX_UID), "--cap-drop", "ALL", "--die-with-parent", "--new-session",
            # the runner's supervisor is pid 1, not dumpable, as in a zygote sandbox: bwrap's own reaper would be
            # a dumpable process of the sandbox's uid whose memory the program could open through /proc/1/mem
            "--as-pid-1",
            "--hostname", "sandbox"]
    for top, link in root_tops():
        args += ["--symlink", link, top] if link is not None else ["--ro-bind", top, top]
    if not prefix.startswith("/usr/"):
        args += ["--ro-bind", f"{view.dir}/prefix" if view else prefix, prefix]
    for path in ETC_FILES:
        args += ["--ro-bind-try", path, path]
    size = str(cfg.tmpfs_mb * 1024 * 1024)
    args += ["--proc", "/proc", "--dev", "/dev", "--size", size, "--tmpfs", "/dev/shm",
             "--size", size, "--tmpfs", "/tmp", "--size", size, "--tmpfs", WORKDIR]
    if view is not None:  # --dev's nodes are writable binds of the host's inodes: read-only ones over them
        for name in view.nodes:
            args += ["--dev-bind", f"{view.dir}/dev/{name}", f"/dev/{name}"]
    args += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", WORKDIR, "--clearenv"]
    for key, value in sandbox_env(prefix).items():
        args += ["--setenv", key, value]
    return args


def root_tops() -> list[tuple[str, str | None]]:
    """The top-level system directories a sandbox gets, read-only: (path, symlink target) where the host has that
    path as a symlink (`/lib -> usr/lib`), (path, None) for a directory; /usr always."""
    tops: list[tuple[str, str | None]] = [("/usr", None)]
    for top in ("/bin", "/sbin", "/lib", "/lib64", "/lib32"):
        if os.path.islink(top):
            tops.append((top, os.readlink(top)))
        elif os.path.isdir(top):
            tops.append((top, None))
    return tops


def sandbox_env(prefix: str) -> dict[str, str]:
    """The whole environment of the code in a sandbox (docs/sandbox.md lists it; bwrap's --chdir would set PWD
    anyway, docker's working_dir does not, so it is given here for both)."""
    return {"PATH": f"/usr/local/bin:/usr/bin:/bin:{prefix}/bin", "HOME": WORKDIR, "TMPDIR": "/tmp",
            "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "MPLBACKEND": "Agg", "PWD": WORKDIR}


def _joins(cg: Cgroup, *, session: bool) -> list[str]:
    """The cgroup.procs files a sandbox joins: a session's also its freezer's (frozen between its cells)."""
    return [*cg.procs_files, cg.freezer_procs] if session and cg.freezer_procs else cg.procs_files


async def _all_set(events, timeout: float) -> bool:
    try:
        await asyncio.wait_for(asyncio.gather(*(event.wait() for event in events)), timeout)
    except asyncio.TimeoutError:
        return False
    return True


def end_marker(ready: dict) -> bytes:
    """The bytes a runner writes on stdout and stderr once its program has exited (the nonce is its own)."""
    nonce = ready.get("nonce")
    return f"\x00agentrl-run-end:{nonce}\x00".encode() if isinstance(nonce, str) and nonce else b""


class Warm:
    """One started sandbox waiting for its single request (or a session's interpreter): a bwrap process, or a
    sandbox the zygote made (no process of ours: its exit status comes as a `runner_exit` frame)."""

    def __init__(self, results: FdReader, cgroup: Cgroup | None, *, proc: asyncio.subprocess.Process | None = None,
                 workdir: str | None = None, stdio: tuple[FdWriter, FdReader, FdReader] | None = None):
        self.proc = proc
        self._results = results
        self.results = results.reader
        self.cgroup = cgroup
        self.workdir = workdir  # host temp dir, only without bwrap
        self._stdio = stdio
        if stdio is not None:
            self.stdout, self.stderr = stdio[1].reader, stdio[2].reader
        else:
            self.stdout, self.stderr = proc.stdout, proc.stderr
        self.exit_code: int | None = None  # a zygote sandbox's runner exit status, once reported
        self.reported = False  # its runner sent the final result (and is exiting)
        # The runner's end-of-output marker, from its `ready` frame: made by the supervisor after it forked the
        # program's process, so no program can read it (the supervisor is not dumpable) and forge the end.
        self.marker = b""
        self.drains: list[asyncio.Task] = []  # readers of its stdout/stderr during a request
        self.fork_sock: socket.socket | None = None  # a fork source's: its children's fds go through it

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode if self.proc is not None else self.exit_code

    @property
    def alive(self) -> bool:
        if self.proc is not None:
            return self.proc.returncode is None
        return self.exit_code is None and not self.results.at_eof()

    @property
    def idle_and_well(self) -> bool:
        """A warm sandbox that can still take its request: alive and silent since `ready` (a zygote sandbox
        that died reports it on its result pipe)."""
        return self.alive and (self.proc is not None or not self.results._buffer)  # noqa: SLF001

    async def write(self, data: bytes) -> None:
        """Write to the sandbox's stdin, keeping it open (a session's control frames)."""
        if self._stdio is not None:
            await self._stdio[0].write_all(data)
        else:
            self.proc.stdin.write(data)
            await self.proc.stdin.drain()

    async def wait_exit(self, timeout: float) -> int | None:
        """The exit status once known (a bwrap process is waited for; a zygote sandbox reports it)."""
        if self.proc is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.proc.wait(), timeout)
        return self.returncode

    async def feed(self, data: bytes) -> None:
        """Write the request frame and the program's stdin; the program may never read it (that is fine)."""
        try:
            if self._stdio is not None:
                await self._stdio[0].write_all(data)
                self._stdio[0].close()
                return
            for i in range(0, len(data), 1 << 16):
                self.proc.stdin.write(data[i:i + (1 << 16)])
                await self.proc.stdin.drain()
            self.proc.stdin.close()
        except (BrokenPipeError, ConnectionResetError):
            pass

    def signal_all(self) -> None:
        """One quick SIGKILL pass over the sandbox, inline (no thread hop): enough when nothing is forking."""
        if self.cgroup is not None:
            with contextlib.suppress(OSError):
                self.cgroup.signal_procs(self.cgroup.procs(), signal.SIGKILL)
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)

    async def kill(self) -> bool:
        """Kill everything the sandbox started (through its cgroup: daemonised children too) and reap bwrap;
        True when the cgroup is known to be empty now."""
        emptied = False
        if self.proc is None and self.cgroup is not None and self.reported:
            # A zygote sandbox that reported its end: its init is gone, so the kernel is killing the rest; the
            # result pipe closes when the last of them (the reporter) has exited. Wait for that, not by polling.
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.results.read(), 1)
        if self.cgroup is not None:
            with contextlib.suppress(CgroupError):
                await self.cgroup.kill_all_async()
                emptied = True
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.proc.wait(), 5)
        return emptied

    def close_pipes(self) -> None:
        self._results.close()
        if self.fork_sock is not None:
            self.fork_sock.close()
        if self._stdio is not None:
            for end in self._stdio:
                end.close()


class BwrapBackend:
    """Runs code under bwrap + cgroups; with `isolate=False` (only with --allow-unsafe) as plain processes."""

    def __init__(self, cfg: SandboxConfig, *, isolate: bool = True):
        self.cfg = cfg
        self.isolate = isolate
        self.name = "bwrap" if isolate else "none"
        self.python, self.prefix = python_runtime()
        self.bwrap = shutil.which("bwrap") if isolate else None
        self.seccomp = isolate and seccomp.supported()
        self.cgroup_version = detect_version()
        self.cgroups: CgroupPool | None = None
        self._ready: asyncio.Queue[Warm] = asyncio.Queue()
        self._spawning = 0
        self._wake = asyncio.Event()
        self._refill_task: asyncio.Task | None = None
        self._disposing: set[asyncio.Task] = set()
        self._closing = False
        self.spawn_failures = 0
        self.last_spawn_error = ""
        self.zygote: Zygote | None = None  # programs' sandboxes
        self.session_zygote: Zygote | None = None  # sessions' (it also holds their modules: see zygote_src.py)
        self.zygote_error = ""
        self.view: HostView | None = None  # read-only mounts for bwrap run as a host uid (hostview.py)

    @property
    def isolation(self) -> str:
        if not self.isolate:
            return "none+cgroups" if self.cgroups else "none"
        return "bwrap+cgroups" if self.cgroups else "bwrap"

    def _check_bwrap(self) -> None:
        if self.bwrap is None:
            raise BackendError("bubblewrap (bwrap) is not installed: `apt-get install bubblewrap`, use "
                               "--backend docker, or pass --allow-unsafe to run without isolation")
        fd = seccomp.filter_fd() if self.seccomp else None
        try:
            argv = [*bwrap_args(self.cfg, self.bwrap, self.prefix, fd), self.python, "-I", "-S", "-c", "pass"]
            probe = subprocess.run(argv, capture_output=True, timeout=30, pass_fds=(fd,) if fd is not None else ())
        finally:
            if fd is not None:
                os.close(fd)
        if probe.returncode != 0:
            raise BackendError(f"bwrap cannot create a sandbox here (exit {probe.returncode}): "
                               f"{probe.stderr.decode(errors='replace').strip()[:500]}")

    async def start(self) -> None:
        if self.isolate:
            await asyncio.to_thread(self._check_bwrap)
        if self.cgroup_version is not None and os.geteuid() == 0:
            try:
                self.cgroups = CgroupPool(self.cgroup_version, self.cfg.warm_pool + self.cfg.max_concurrency,
                                          uids=host_uids(self.cfg))
            except CgroupError:
                self.cgroups = None
        if self.isolate and self.cgroups is not None:  # bwrap sandboxes run as unprivileged host uids
            self.view = HostView(self.prefix)
            await asyncio.to_thread(self.view.start)
        if self.isolate and self.cgroups is None and not self.cfg.allow_unsafe:
            raise BackendError("bwrap works but cgroups are unavailable (need root and cgroup v1/v2 with memory "
                               "and pids controllers): fork and memory bombs would not be contained. "
                               "Pass --allow-unsafe to run anyway")
        if self.isolate and self.cgroups is not None and os.geteuid() == 0 and self.cfg.zygote:
            config = {**layout(self.cfg, self.prefix, WORKDIR, ETC_FILES, root_tops()), "uid": SANDBOX_UID,
                      "seccomp": seccomp.build_filter() if self.seccomp else None,
                      "seccomp_fork": seccomp.build_filter(seccomp.FORK_SOURCE_ALLOWED) if self.seccomp else None}
            try:
                config["nsutil"] = await asyncio.to_thread(nsutil.build)
                self.zygote = Zygote(self.python, sandbox_env(self.prefix), config, on_exit=self._zygote_exited)
                self.session_zygote = Zygote(self.python, sandbox_env(self.prefix), {**config, "preload": "session"})
                await self.zygote.ensure()
            except BackendError as e:  # bwrap works (checked above): isolate every sandbox with it instead
                logging.getLogger("sandbox").warning("the sandbox zygote cannot start (%s); starting bwrap for "
                                                     "every sandbox instead", e)
                self.zygote_error = str(e)[:500]
                self.zygote = self.session_zygote = None
        self._refill_task = asyncio.create_task(self._refill_loop())
        self._wake.set()

    def info(self) -> dict:
        if self.cgroups:
            self.cgroups.reap()
        return {"backend": self.name, "isolation": self.isolation,
                "cgroup_version": self.cgroup_version if self.cgroups else None,
                "cgroups_total": self.cgroups.total if self.cgroups else 0,
                "cgroups_in_use": self.cgroups.in_use if self.cgroups else 0,
                "cgroups_draining": self.cgroups.draining if self.cgroups else 0,
                "cgroup_parents": [str(p) for p in self.cgroups.parents.values()] if self.cgroups else [],
                "seccomp": self.seccomp, "zygote": self.zygote is not None,
                "zygote_starts": self.zygote.starts if self.zygote else 0,
                "zygote_pid": self.zygote.pid if self.zygote else None, "zygote_error": self.zygote_error,
                "session_zygote_pid": self.session_zygote.pid if self.session_zygote else None,
                "warm_pool": self.cfg.warm_pool,
                "warm_sandboxes": self._ready.qsize(), "spawn_failures": self.spawn_failures,
                "last_spawn_error": self.last_spawn_error, "python": self.python}

    async def _spawn(self, src: str, argv: list[str], memory_mb: int) -> Warm:
        cg = self.cgroups.acquire() if self.cgroups else None
        workdir = None
        r_res, w_res = os.pipe()
        seccomp_fd = seccomp.filter_fd() if self.seccomp else None
        host_uid = cg.host_uid if cg is not None and self.isolate else None
        passed = tuple(fd for fd in (w_res, seccomp_fd) if fd is not None)
        try:
            inner = python_argv(self.python, src, str(w_res), *argv)
            if self.isolate:
                view = self.view if host_uid is not None else None
                cmd = [*bwrap_args(self.cfg, self.bwrap, self.prefix, seccomp_fd, view), *inner]
                if view is not None:  # bwrap as the sandbox's unprivileged host uid (its namespace maps onto it),
                    # inside the view's mount namespace (read-only prefix and device nodes: hostview.py)
                    view.ensure()
                    cmd = [*view.enter(), "setpriv", f"--reuid={host_uid}", f"--regid={host_uid}",
                           "--clear-groups", "--", *cmd]
            else:
                workdir = tempfile.mkdtemp(prefix="agentrl-unsafe-")
                cmd = inner
            if cg is not None:
                cg.set_limits(memory_bytes=memory_mb << 20, pids=self.cfg.pids_limit, cpus=self.cfg.cpu_quota)
                # The shell joins the cgroup, then execs bwrap: every process of the sandbox starts inside it. It
                # drops the PWD it exports, so bwrap (pid 1 inside, /proc/1/environ) starts with an empty env.
                joins = " && ".join(f"echo 0 > {f}" for f in _joins(cg, session=src is SESSION_SRC))
                cmd = ["/bin/sh", "-c", f'unset PWD OLDPWD; {joins} && exec "$@"', "sh", *cmd]
            proc = await asyncio.create_subprocess_exec(
                *cmd, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, pass_fds=passed,
                start_new_session=True, cwd=workdir or "/",
                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "HOME": workdir or "/"}
                if not self.isolate else {}, limit=1 << 20)
        except BaseException:
            os.close(r_res)
            if cg is not None and self.cgroups is not None:
                self.cgroups.release(cg)
            raise
        finally:
            for fd in passed:
                os.close(fd)
        warm = Warm(FdReader(r_res), cg, proc=proc, workdir=workdir)
        try:
            ready = await asyncio.wait_for(read_frame(warm.results), 30)
        except asyncio.TimeoutError:
            ready = None
        if not ready or not ready.get("ready"):
            err = b""
            with contextlib.suppress(asyncio.TimeoutError, OSError):
                err = await asyncio.wait_for(proc.stderr.read(2000), 1)
            await self._dispose(warm)
            raise BackendError(f"sandbox did not start (exit {proc.returncode}): {err.decode(errors='replace')}")
        warm.marker = end_marker(ready)
        return warm

    def _zygote_exited(self) -> None:
        """The zygote died (killed, crashed): its warm sandboxes died with it. Replace them now."""
        if self._closing:
            return
        self.spawn_failures += 1
        self.last_spawn_error = "the sandbox zygote exited; restarting it"
        stale = []
        while not self._ready.empty():
            stale.append(self._ready.get_nowait())
        for warm in stale:
            task = asyncio.create_task(self._dispose(warm))
            self._disposing.add(task)
            task.add_done_callback(self._disposing.discard)
        self._wake.set()

    async def _spawn_run(self) -> Warm:
        """A warm single-use sandbox for one /run_code request: from the zygote when there is one."""
        if self.zygote is None:
            return await self._spawn(RUNNER_SRC, [], self.cfg.default_memory_mb)
        return await self._spawn_zygote({}, self.cfg.default_memory_mb)

    async def _spawn_zygote(self, request: dict, memory_mb: int) -> Warm:
        zygote = self.session_zygote if "session" in request else self.zygote
        await zygote.ensure()
        cg = self.cgroups.acquire()
        cg.set_limits(memory_bytes=memory_mb << 20, pids=self.cfg.pids_limit, cpus=self.cfg.cpu_quota)
        (in_r, in_w), (out_r, out_w), (err_r, err_w), (res_r, res_w) = (os.pipe() for _ in range(4))
        theirs = ours = None
        if request.get("session", {}).get("forkable"):  # a fork source: a socket for its children's fds
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            ours.setblocking(False)  # a source that never takes its children's fds must not block the service
        try:
            await zygote.spawn({**request, "cgroup_procs": _joins(cg, session="session" in request),
                                "host_uid": cg.host_uid},
                               (in_r, out_w, err_w, res_w, *([theirs.fileno()] if theirs else [])))
        except BaseException:
            for fd in (in_w, out_r, err_r, res_r):
                os.close(fd)
            if ours is not None:
                ours.close()
            self.cgroups.release(cg)
            raise
        finally:
            for fd in (in_r, out_w, err_w, res_w):
                os.close(fd)
            if theirs is not None:
                theirs.close()
        warm = Warm(FdReader(res_r), cg, stdio=(FdWriter(in_w), FdReader(out_r), FdReader(err_r)))
        warm.fork_sock = ours
        return await self._await_ready(warm)

    async def _await_ready(self, warm: Warm) -> Warm:
        try:
            ready = await asyncio.wait_for(read_frame(warm.results), 30)
        except asyncio.TimeoutError:
            ready = None
        if not ready or not ready.get("ready"):
            await self._dispose(warm)
            why = (ready or {}).get("setup_failed") or (ready or {}).get("runner_exit") or "no ready frame in 30 s"
            raise BackendError(f"sandbox did not start: {why}")
        warm.marker = end_marker(ready)
        return warm

    async def _dispose(self, warm: Warm) -> None:
        emptied = await warm.kill()
        for task in warm.drains:
            task.cancel()
        warm.close_pipes()
        if warm.cgroup is not None and self.cgroups is not None:
            self.cgroups.release(warm.cgroup, emptied=emptied)
        if warm.workdir:
            shutil.rmtree(warm.workdir, ignore_errors=True)
        # asyncio.subprocess.Process has no public close(): closing its transport releases the three pipes now
        # rather than at garbage collection (the soak test counts fds).
        transport = getattr(warm.proc, "_transport", None) if warm.proc is not None else None
        if transport is not None:
            transport.close()

    async def _refill_loop(self) -> None:
        while not self._closing:
            await self._wake.wait()
            self._wake.clear()
            while not self._closing and self._ready.qsize() + self._spawning < self.cfg.warm_pool:
                self._spawning += 1
                asyncio.create_task(self._spawn_one())

    async def _spawn_one(self) -> None:
        try:
            warm = await self._spawn_run()
        except (BackendError, OSError, CgroupError) as e:
            self.spawn_failures += 1
            self.last_spawn_error = str(e)[:500]
            await asyncio.sleep(0.5)  # back off, then let the loop try again
            self._spawning -= 1
            self._wake.set()
            return
        self._spawning -= 1
        if self._closing:
            await self._dispose(warm)
            return
        self._ready.put_nowait(warm)

    async def _take(self) -> Warm:
        # The refill is triggered when the request ends (execute's finally), so starting the replacement sandbox
        # does not compete for the CPU with the request that is running; an empty pool is refilled at once.
        while not self._ready.empty():
            warm = self._ready.get_nowait()
            if self._ready.qsize() < self.cfg.warm_pool // 2:
                self._wake.set()
            if warm.idle_and_well:
                return warm
            await self._dispose(warm)
        self._wake.set()
        return await self._spawn_run()

    async def execute(self, req: ExecRequest) -> ExecResult:
        try:
            warm = await self._take()
        except (BackendError, OSError, CgroupError) as e:
            return ExecResult(status="Error", return_code=None, exit_reason="exit", infra_error=str(e))
        try:
            return await self._execute_in(warm, req)
        finally:
            # Reaping bwrap and recycling the cgroup happen off the response path.
            task = asyncio.create_task(self._dispose(warm))
            self._disposing.add(task)
            task.add_done_callback(self._disposing.discard)
            self._wake.set()

    async def _execute_in(self, warm: Warm, req: ExecRequest) -> ExecResult:
        cfg, cg = self.cfg, warm.cgroup
        if cg is not None:
            cg.set_memory(req.memory_mb << 20)
            base = cg.baseline or cg.counters()
        out, err = HeadTail(cfg.max_output_bytes), HeadTail(cfg.max_output_bytes)
        reasons: list[str] = []

        def over_limit() -> None:
            if "output_limit" not in reasons:
                reasons.append("output_limit")
                asyncio.create_task(warm.kill())

        payload = runner_payload(req, cfg)
        ends = (asyncio.Event(), asyncio.Event())
        drains = [asyncio.create_task(drain(warm.stdout, out, cfg.output_kill_bytes, over_limit, warm.marker, ends[0])),
                  asyncio.create_task(drain(warm.stderr, err, cfg.output_kill_bytes, over_limit, warm.marker, ends[1]))]
        warm.drains = drains  # what they still read after the end markers is discarded until the sandbox is gone
        feeder = asyncio.create_task(warm.feed(encode_request(payload) + req.stdin))
        started = time.monotonic()
        result = compiled = None
        try:
            if "compile" in payload:  # the compiler's own limit is enforced inside; this one is the backstop
                result = await asyncio.wait_for(self._frame(warm), req.compile_timeout + 2)
                if result is not None and "compile" in result:
                    compiled, result = result["compile"], None
                    started = time.monotonic()
                    result = await asyncio.wait_for(self._frame(warm), req.run_timeout + 0.1)
            else:
                result = await asyncio.wait_for(self._frame(warm), req.run_timeout + 0.1)
        except asyncio.TimeoutError:
            reasons.append("timeout")
            if "compile" in payload and compiled is None:
                compiled = {"status": "TimeLimitExceeded", "execution_time": time.monotonic() - started,
                            "return_code": None, "stdout": "", "stderr": ""}
        elapsed = time.monotonic() - started
        feeder.cancel()
        if result is not None:
            warm.reported = True
            if warm.proc is not None:  # a zygote sandbox's init kills the program's leftovers when it exits
                warm.signal_all()  # the program is done; its leftovers (daemons) die with the sandbox
            # The runner wrote the end marker after the program exited: normally the output is complete now.
            marked = await _all_set(ends, timeout=0.5)
        else:
            marked = False
        if not marked:  # something still holds the pipes (a fork bomb, a dead runner): kill until empty
            await warm.kill()
            await asyncio.wait(drains, timeout=2)
        counters = cg.counters().delta(base) if cg is not None else None
        if result is not None and "setup_error" in result:
            return ExecResult(status="Error", return_code=None, exit_reason="exit", infra_error=result["setup_error"])
        if compiled is not None and compiled["status"] == "Error":
            return ExecResult(status="Error", return_code=None, exit_reason="exit", infra_error=compiled["stderr"])
        if result is not None and "setup_failed" in result:
            return ExecResult(status="Error", return_code=None, exit_reason="exit", infra_error=result["setup_failed"])
        if result is None and not reasons and warm.returncode == 3:
            return ExecResult(status="Error", return_code=None, exit_reason="exit",
                              infra_error="sandbox runner rejected the request frame")
        if (result is None and not reasons and warm.proc is None and warm.returncode is None
                and not (counters and (counters.oom_kills or counters.pids_max_hits))):
            # A zygote sandbox's runner is pid 1 and not dumpable: the code cannot kill or stop it, and its
            # parent (which reports the runner's death) is outside the sandbox. Silence from both is the service's
            # fault (the zygote gone, an outside kill), never a result to train on.
            return ExecResult(status="Error", return_code=None, exit_reason="exit",
                              infra_error="the sandbox ended without a report (its zygote was restarted?)")
        # The first cause wins: a fork bomb that also exhausts memory is reported as pids_limit.
        if counters is not None and counters.oom_kills > 0:
            reasons.insert(0, "oom")
        if counters is not None and counters.pids_max_hits > 0:
            reasons.insert(0, "pids_limit")
        sig = None
        if result is not None:
            exit_info = result["exit"]
            if "signal" in exit_info:
                sig = exit_info["signal"]
                return_code: int | None = 128 + sig
            else:
                return_code = exit_info["code"]
            elapsed = result["elapsed"]
        elif "timeout" in reasons:
            return_code = None
        else:
            # The runner died before reporting (the code killed it, or the kernel OOM-killed it).
            rc = warm.returncode if warm.returncode is not None else 137
            return_code = rc if rc >= 0 else 128 - rc
            sig = return_code - 128 if return_code > 128 else None
        if sig is not None:
            reasons.append("signal")
        if result is not None and "runner_fault" in result:
            reasons.append("runner_fault")
        status = "TimeLimitExceeded" if "timeout" in reasons else "Finished"
        ran = compiled is None or (compiled["status"] == "Finished" and compiled["return_code"] == 0)
        truncated = out.truncated or err.truncated or bool(compiled and compiled.get("truncated"))
        if compiled is not None:
            if compiled["status"] == "TimeLimitExceeded" and "timeout" not in reasons:
                reasons.append("timeout")
            compiled = {k: compiled.get(k) for k in ("status", "execution_time", "return_code", "stdout", "stderr")}
            if compiled["execution_time"] is not None:
                compiled["execution_time"] = round(compiled["execution_time"], 4)
        return ExecResult(
            compile=compiled, ran=ran, status=status, return_code=return_code,
            exit_reason=reasons[0] if reasons else "exit", stdout=out.text(), stderr=err.text(), truncated=truncated,
            signal=signal.Signals(sig).name if sig and sig in signal.Signals._value2member_map_ else None,
            execution_time=round(elapsed, 4), files=result["files"] if result else {},
            file_errors=result["file_errors"] if result else {},
            memory_peak_mb=round(counters.memory_peak / 2**20, 1) if counters and counters.memory_peak else None)

    @staticmethod
    async def _frame(warm: Warm) -> dict | None:
        """The next result frame; a zygote sandbox whose runner died reports its exit status instead (None)."""
        frame = await read_frame(warm.results)
        if frame is not None and "runner_exit" in frame:
            warm.exit_code = frame["runner_exit"]
            return None
        return frame

    async def open_session(self, language: str, memory_mb: int, forkable: bool = False) -> SessionProc:
        if language != "python":
            raise ValueError(f"sessions support language 'python' only, got {language!r}")
        if forkable and self.session_zygote is None:
            raise ValueError("forkable sessions need the zygote backend (the service as root with cgroups, "
                             "zygote: true)")

        async def spawn() -> Warm:
            if self.zygote is not None:
                session = {"fsize": self.cfg.max_file_bytes, "nofile": self.cfg.nofile_limit, "forkable": forkable}
                return await self._spawn_zygote({"session": session}, memory_mb)
            return await self._spawn(SESSION_SRC, [str(self.cfg.max_file_bytes), str(self.cfg.nofile_limit)],
                                     memory_mb)

        proc = SessionProc(spawn, self._dispose, self.cfg)
        await proc.start()
        return proc

    async def fork_session(self, source: SessionProc, n: int, memory_mb: int) -> list[SessionProc]:
        """`n` sessions forked from `source`'s interpreter as it is now (fork_src.py), each with a cgroup, pipes
        and limits of its own; when one cannot start, none is kept and BackendError says why."""
        sock = source.warm.fork_sock if source.warm is not None else None
        if sock is None:
            raise ValueError("not a fork source")
        children: list[Warm] = []
        try:
            for _ in range(n):
                cg = self.cgroups.acquire()
                cg.set_limits(memory_bytes=memory_mb << 20, pids=self.cfg.pids_limit, cpus=self.cfg.cpu_quota)
                (in_r, in_w), (out_r, out_w), (err_r, err_w), (res_r, res_w) = (os.pipe() for _ in range(4))
                children.append(Warm(FdReader(res_r), cg, stdio=(FdWriter(in_w), FdReader(out_r), FdReader(err_r))))
                theirs = [in_r, out_w, err_w, res_w]
                try:
                    theirs += [os.open(path, os.O_WRONLY | os.O_CLOEXEC) for path in _joins(cg, session=True)]
                    socket.send_fds(sock, [b"child"], theirs)
                except BlockingIOError:
                    raise BackendError("the fork source does not take its children's fds") from None
                except OSError as e:  # EPIPE / ECONNRESET: the source's interpreter died (maybe not yet reaped)
                    raise ForkSourceGone(f"the fork source's interpreter is gone ({e.strerror})") from None
                finally:
                    for fd in theirs:
                        os.close(fd)
            await source.fork(n)
        except BaseException:
            for warm in children:
                await self._dispose(warm)
            raise
        started: list[SessionProc] = []
        error = None
        for warm in children:
            if error is not None:
                await self._dispose(warm)
                continue
            try:
                started.append(await self._child_session(await self._await_ready(warm), memory_mb,
                                                         source.execution_count))
            except BackendError as e:  # _await_ready disposed of it
                error = e
        if error is not None:
            for proc in started:
                await proc.close()
            raise error
        return started

    async def _child_session(self, warm: Warm, memory_mb: int, execution_count: int) -> SessionProc:
        """A forked child's SessionProc: it starts on `warm`; a restart gives it a fresh (non-forkable)
        interpreter, as any session's."""
        first = [warm]

        async def spawn() -> Warm:
            if first:
                return first.pop()
            session = {"fsize": self.cfg.max_file_bytes, "nofile": self.cfg.nofile_limit, "forkable": False}
            return await self._spawn_zygote({"session": session}, memory_mb)

        proc = SessionProc(spawn, self._dispose, self.cfg)
        await proc.start()
        proc.execution_count = execution_count
        return proc

    async def close(self) -> None:
        self._closing = True
        self._wake.set()
        if self._refill_task is not None:
            self._refill_task.cancel()
        while self._spawning:
            await asyncio.sleep(0.01)
        while not self._ready.empty():
            await self._dispose(self._ready.get_nowait())
        if self._disposing:
            await asyncio.wait(set(self._disposing), timeout=10)
        for zygote in (self.zygote, self.session_zygote):
            if zygote is not None:
                await zygote.close()
        if self.cgroups is not None:
            await asyncio.to_thread(self.cgroups.close)
        if self.view is not None:
            await asyncio.to_thread(self.view.close)
