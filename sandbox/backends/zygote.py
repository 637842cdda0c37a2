"""Host side of the sandbox zygote (zygote_src.py): start it, hand it one command per sandbox, restart it.

The zygote is a root interpreter started once per service with the runner imported; it forks one process per
sandbox, which builds the sandbox's namespaces, root and privileges itself (see zygote_src.py). The service
gives it the sandbox's four pipe ends (stdin, stdout, stderr, result frames) and the cgroup to join over a
SOCK_SEQPACKET socket; everything else (output, frames, killing through the cgroup) is as with bwrap.
"""

from __future__ import annotations

import asyncio
import contextlib
import marshal
import os
import socket
import tempfile
from pathlib import Path

from sandbox.backends.base import BackendError, python_argv, read_frame
from sandbox.config import SandboxConfig

_HERE = Path(__file__).resolve().parent


def zygote_source() -> str:
    """prelude + runner + session (without their `__main__` calls) + workspace + nsops + fork + zygote: one
    program, run by python_argv."""
    parts = []
    for name in ("runner_src.py", "session_src.py"):
        text = (_HERE / name).read_text()
        parts.append(text[:text.rindex('if __name__ == "__main__":')])
    own = [(_HERE / name).read_text() for name in ("workspace_src.py", "nsops_src.py", "fork_src.py", "zygote_src.py")]
    return "\n\n".join([(_HERE / "prelude_src.py").read_text(), *parts, *own])


def layout(cfg: SandboxConfig, prefix: str, workdir: str, etc_files: tuple[str, ...],
           tops: list[tuple[str, str | None]]) -> dict:
    """The sandbox's file system for the zygote, the same one bwrap_args() gives bwrap (`tops`: root_tops())."""
    return {"tops": tops, "ro_dirs": [] if prefix.startswith("/usr/") else [prefix],
            "etc_files": [p for p in etc_files if os.path.exists(p)], "tmpfs_bytes": cfg.tmpfs_mb * 1024 * 1024,
            "workdir": workdir, "hostname": "sandbox"}


def _remove_stale_bases() -> None:
    for path in Path(tempfile.gettempdir()).glob("agentrl-sandbox-root-*-*"):
        pid = path.name.split("-")[3]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            with contextlib.suppress(OSError):
                path.rmdir()  # only ever empty


class Zygote:
    """One zygote process; `spawn` asks it for a sandbox. Restarted by `ensure` if it died."""

    def __init__(self, python: str, env: dict[str, str], config: dict, on_exit=None):
        self.python = python
        self.on_exit = on_exit  # called when the zygote process ends (its sandboxes die with it)
        self.env = env
        self.config = config
        self.proc: asyncio.subprocess.Process | None = None
        self.sock: socket.socket | None = None
        self.base: str | None = None
        self.starts = 0
        self._lock = asyncio.Lock()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def ensure(self) -> None:
        if self.alive:
            return
        async with self._lock:
            if not self.alive:
                await self._start()

    async def _start(self) -> None:
        await self.close()
        # An empty host directory the zygote mounts the sandboxes' template root on, in a mount namespace of its
        # own: the host's copy stays empty (and is removed at close, or by the next service if this one is killed).
        _remove_stale_bases()
        self.base = tempfile.mkdtemp(prefix=f"agentrl-sandbox-root-{os.getpid()}-")
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *python_argv(self.python, zygote_source(), str(theirs.fileno())),
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                pass_fds=(theirs.fileno(),), env=self.env, cwd="/", start_new_session=True)
        finally:
            theirs.close()
        ours.setblocking(False)
        self.sock = ours
        self.starts += 1
        data = marshal.dumps({**self.config, "base": self.base})
        self.proc.stdin.write(len(data).to_bytes(4, "big") + data)
        with contextlib.suppress(ConnectionError):
            await self.proc.stdin.drain()
        self.proc.stdin.close()
        try:
            ready = await asyncio.wait_for(read_frame(self.proc.stdout), 30)
        except asyncio.TimeoutError:
            ready = None
        if not ready or not ready.get("ready"):
            err = b""
            with contextlib.suppress(asyncio.TimeoutError, OSError):
                err = await asyncio.wait_for(self.proc.stderr.read(4000), 2)
            await self.close()
            raise BackendError(f"the sandbox zygote did not start: {err.decode(errors='replace').strip()[-2000:]}")
        # Its stderr only carries a crash report: read it in the background so it can never fill up.
        self._watch = asyncio.create_task(self._watch_exit(self.proc))

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.alive else None

    async def _watch_exit(self, proc: asyncio.subprocess.Process) -> None:
        with contextlib.suppress(Exception):
            while await proc.stderr.read(1 << 16):
                pass
        await proc.wait()
        if self.proc is proc and self.on_exit is not None:
            self.on_exit()

    async def spawn(self, request: dict, fds: tuple[int, ...]) -> None:
        """Ask for one sandbox (`request`: `cgroup_procs`, and `session` for a session's interpreter) with these
        pipe ends as its stdin, stdout, stderr and result fd, and a fork source's fork socket as a fifth (the
        caller closes its copies). Raises
        BackendError if the zygote is gone."""
        if not self.alive or self.sock is None:
            raise BackendError("the sandbox zygote is not running")
        message = [marshal.dumps(request)]
        loop = asyncio.get_running_loop()
        while True:
            try:
                socket.send_fds(self.sock, message, list(fds))
                return
            except BlockingIOError:  # its queue is full (it forks one sandbox at a time): wait, off the loop
                ready = loop.create_future()
                loop.add_writer(self.sock.fileno(), ready.set_result, None)
                try:
                    await asyncio.wait_for(ready, 10)
                except asyncio.TimeoutError:
                    raise BackendError("the sandbox zygote stopped taking requests") from None
                finally:
                    loop.remove_writer(self.sock.fileno())
            except OSError as e:
                raise BackendError(f"the sandbox zygote is gone: {e}") from e

    async def close(self) -> None:
        if self.sock is not None:
            self.sock.close()  # the zygote exits at EOF
            self.sock = None
        if self.proc is not None:
            proc, self.proc = self.proc, None
            try:
                await asyncio.wait_for(proc.wait(), 5)
            except asyncio.TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
            transport = getattr(proc, "_transport", None)
            if transport is not None:
                transport.close()
        if self.base is not None:
            with contextlib.suppress(OSError):
                os.rmdir(self.base)
            self.base = None
