"""Services on loopback, from both ends.

Running one as a child: pick a port, start a process in its own process group, wait until its health URL
answers, and always stop the whole group (on success, errors and Ctrl-C alike). Used by the quickstart,
`agentrl eval --serve-tools`, the benchmarks and the integration tests.

Being one (`agentrl tools serve`, `agentrl engine serve`, `agentrl sandbox serve`): `bind_port` takes the port
first, so a taken port is one line before anything slow starts; `serve_asgi` runs the app on that socket and
prints the "ready" line only once the app has started and the socket accepts connections.

Ray, the cluster the trainer ranks and engine replicas run on: `start_ray` starts a local one unless one is up.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any, Awaitable, Callable, Iterator

from agentrl.errors import UserError


class ServiceStartError(RuntimeError):
    """A child service exited or stayed silent during start-up; the message carries the tail of its output."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


class PortInUseError(UserError):
    """The port a service should listen on is taken (or the address is not this machine's)."""


def bind_port(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port (port 0: a free one), ready for `serve_asgi`. A taken port raises
    PortInUseError naming it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: restarts need no TIME_WAIT wait
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise PortInUseError(f"port {port} on {host} is already in use: pass --port with a free port, or "
                                 f"--port 0 to pick one") from None
        raise PortInUseError(f"cannot listen on {host}:{port} ({e.strerror or e}): pass --host with an address "
                             f"of this machine (e.g. 127.0.0.1) and --port with a free port") from None
    return sock


def serve_asgi(app: Any, sock: socket.socket, ready: Callable[[str], str], *,
               before_start: Callable[[], Awaitable[None]] | None = None, **uvicorn_options: Any) -> None:
    """Serve `app` with uvicorn on the bound `sock` (from `bind_port`; the caller closes it) until SIGINT/SIGTERM.

    `ready(url)` returns the line printed on stderr once the app's start-up (lifespan) has finished and the
    socket accepts connections, e.g. "tool service ready on http://127.0.0.1:8000"; a client that waits for
    that line can connect at once. `before_start()` is awaited first, in the server's event loop: what it
    raises (e.g. a UserError) leaves this function as is, where a lifespan error would be a logged traceback.
    `uvicorn_options` go to `uvicorn.Config` (log_level, http, ...).
    """
    import uvicorn

    host, port = sock.getsockname()[:2]
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}"

    class ReadyServer(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            if before_start is not None:
                await before_start()
            await super().startup(sockets=sockets)
            if self.started:  # lifespan done and the socket listening (uvicorn exits itself if start-up failed)
                print(ready(url), file=sys.stderr, flush=True)

    ReadyServer(uvicorn.Config(app, **uvicorn_options)).run(sockets=[sock])


def agentrl_command(*args: str) -> list[str]:
    """argv that runs `agentrl ARGS...` with this interpreter (works without the console script on PATH)."""
    return [sys.executable, "-m", "agentrl.cli", *args]


def _exists(send, target: int) -> bool:
    """Signal 0 through `send` (os.kill or os.killpg): does the process (group) exist?"""
    try:
        send(target, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _group_alive(pgid: int) -> bool:
    return _exists(os.killpg, pgid)


def stop_process_group(proc: subprocess.Popen, timeout_s: float = 10.0) -> None:
    """SIGTERM the process group (the child started it with start_new_session), wait for the child and for
    every other member (grandchildren outlive their parent by a moment), SIGKILL whatever is left after
    `timeout_s`."""
    pgid = proc.pid
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        pass
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.02)
    if proc.poll() is None or _group_alive(pgid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        proc.wait(timeout=timeout_s)


def _tail(log: IO[bytes], limit: int = 3000) -> str:
    log.flush()
    log.seek(0)
    return log.read().decode(errors="replace")[-limit:]


def wait_healthy(url: str, proc: subprocess.Popen, *, name: str, timeout_s: float, log: IO[bytes] | None) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            output = _tail(log) if log is not None else ""
            raise ServiceStartError(f"{name} exited with code {proc.returncode} during start-up:\n{output}")
        try:
            if httpx.get(url, timeout=2.0, trust_env=False).status_code < 300:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            output = _tail(log) if log is not None else ""
            raise ServiceStartError(f"{name} did not answer {url} within {timeout_s:.0f}s:\n{output}")
        time.sleep(0.1)


@contextlib.contextmanager
def run_service(cmd: list[str], health_url: str, *, name: str = "service", log_path: str | Path | None = None,
                env: dict | None = None, cwd: str | Path | None = None,
                timeout_s: float = 60.0) -> Iterator[subprocess.Popen]:
    """Start `cmd`, wait for `health_url` to answer 2xx, yield the process, stop its group on exit.

    Output goes to `log_path` (kept) or to a temporary file whose tail is shown when start-up fails.
    """
    if log_path is not None:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        log = open(log_path, "w+b")
    else:
        log = tempfile.TemporaryFile()
    try:
        # EXIT_WITH_PARENT: an `agentrl ...` child also exits when this process dies without cleaning up (SIGKILL)
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=cwd, start_new_session=True,
                                env={**os.environ, EXIT_WITH_PARENT: str(os.getpid()), **(env or {})})
        try:
            wait_healthy(health_url, proc, name=name, timeout_s=timeout_s, log=log)
            yield proc
        finally:
            stop_process_group(proc)
    finally:
        log.close()


EXIT_WITH_PARENT = "AGENTRL_EXIT_WITH_PARENT"  # pid of the process whose death should stop this one


def exit_with_parent() -> None:
    """Called first by every `agentrl` command: when `EXIT_WITH_PARENT` names our parent (`run_service` sets
    it), ask Linux to SIGTERM us when the parent dies (PR_SET_PDEATHSIG), so a service never outlives a
    quickstart that was SIGKILLed; the child's own SIGTERM handling then stops its children. If the parent is
    already gone, exit now. No-op elsewhere (not Linux, variable unset, started by something else)."""
    wanted = os.environ.get(EXIT_WITH_PARENT)
    if not wanted or not sys.platform.startswith("linux"):
        return
    os.environ.pop(EXIT_WITH_PARENT)  # not inherited by what this process starts
    if wanted != str(os.getppid()):
        if not _pid_alive(int(wanted)):
            raise SystemExit(f"agentrl: parent process {wanted} is gone; exiting")
        return  # started through a wrapper (e.g. a shell): the parent is not the one to watch
    import ctypes

    PR_SET_PDEATHSIG = 1
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if str(os.getppid()) != wanted:  # the parent died before prctl took effect
        raise SystemExit(f"agentrl: parent process {wanted} is gone; exiting")


def _pid_alive(pid: int) -> bool:
    return _exists(os.kill, pid)


def sigterm_as_interrupt() -> None:
    """Make SIGTERM (e.g. `kill`, a job scheduler) raise KeyboardInterrupt in the main thread, so the same
    `finally`/context-manager clean-up that handles Ctrl-C stops every child service."""

    def _raise(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _raise)


def start_ray(address: str | None = None, num_cpus: int | None = None, *, log_to_driver: bool = True) -> bool:
    """`ray.init` unless Ray is already up; returns True when this call started it (the caller shuts it down).

    Ray's INFO start-up lines are off, and so is the warning a local start prints that token authentication is
    on (Ray's default, unchanged here; `RAY_AUTH_MODE` decides as usual).

    `address` None starts a new local Ray (`ray.init(address="local")`), whatever else runs on the host: left to
    itself `ray.init()` joins the newest Ray started on the machine (RAY_ADDRESS, /tmp/ray/ray_current_cluster),
    another user's or another job's included. "auto" or an address joins a cluster.

    The workers of a Ray started here run at the driver's priority: Ray's default niceness for workers (15) starves
    the trainer ranks and engine replicas, which do the heavy compute, whenever anything else wants the CPU (a
    code-suite smoke run took 292 s instead of 23 s beside two other jobs). `RAY_worker_niceness` set by the user
    wins."""
    import logging

    import ray

    if ray.is_initialized():
        return False
    if address is None:
        os.environ.setdefault("RAY_worker_niceness", "0")
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
    ray.init(address=address or "local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=log_to_driver,
             logging_level=logging.WARNING)
    return True
