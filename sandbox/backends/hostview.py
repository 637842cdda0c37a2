"""What a bwrap sandbox run as an unprivileged host uid needs from root: a private mount namespace holding the
interpreter's prefix and the device nodes, bound read-only on a path that uid can walk.

bwrap, run as the sandbox's own host uid (never root: see bwrap.py), cannot bind what that uid cannot reach (a
prefix under a 0700 /root), and the device nodes its `--dev` binds are the host's inodes, writable binds: a
`touch /dev/null` would change the host's node, and bwrap's own `--remount-ro` adds nodev, which breaks them.
So the service makes, once, a mount namespace of its own (held by a sleeping process, never the host's):

    VIEW (an empty host dir, 0711)   a tmpfs in the held namespace
    VIEW/prefix                      the interpreter's prefix, bound read-only
    VIEW/dev/{null,zero,...}         the host's nodes, bound read-only (no nodev: they still work)

and every bwrap sandbox is started inside it (`nsenter --mount`), where bwrap binds these read-only mounts into
the sandbox (`--ro-bind VIEW/prefix PREFIX`, `--dev-bind VIEW/dev/null /dev/null`: a bind keeps the read-only
flag of its source, and in bwrap's user namespace that flag is locked). The host's mount table is never touched.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
from pathlib import Path

from sandbox.backends.base import BackendError

DEV_NODES = ("null", "zero", "full", "random", "urandom", "tty")  # what bwrap's --dev binds from the host


class HostView:
    def __init__(self, prefix: str):
        self.prefix = prefix
        self.dir: str | None = None
        self.proc: subprocess.Popen | None = None
        self.nodes = tuple(name for name in DEV_NODES if os.path.exists(f"/dev/{name}"))  # bound read-only in it

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        self.close()
        _remove_stale()
        self.dir = tempfile.mkdtemp(prefix=f"agentrl-sandbox-view-{os.getpid()}-")
        os.chmod(self.dir, 0o711)
        steps = ['mount -t tmpfs -o mode=0711,size=1m agentrl-view "$V"', 'mkdir "$V/prefix" "$V/dev"',
                 'mount --bind -o ro "$P" "$V/prefix"']
        for name in self.nodes:
            steps += [f'touch "$V/dev/{name}"', f'mount --bind /dev/{name} "$V/dev/{name}"',
                      f'mount -o remount,bind,ro,nosuid "$V/dev/{name}"']
        script = " && ".join(steps) + ' && echo ready && exec sleep infinity'
        self.proc = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", script],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "V": self.dir, "P": self.prefix}, start_new_session=True)
        line = self.proc.stdout.readline()
        if line.strip() != b"ready":
            err = self.proc.stderr.read(2000) if self.proc.poll() is not None else b""
            self.close()
            raise BackendError("cannot prepare the read-only mounts for bwrap sandboxes (unshare/mount as root): "
                               + err.decode(errors="replace").strip())

    def ensure(self) -> None:
        if not self.alive:
            self.start()

    def enter(self) -> list[str]:
        """The argv prefix that runs a command inside the held namespace."""
        return ["nsenter", f"--mount=/proc/{self.proc.pid}/ns/mnt", "--"]

    def close(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            self.proc.wait()
            for stream in (self.proc.stdout, self.proc.stderr):
                stream.close()
            self.proc = None
        if self.dir is not None:
            with contextlib.suppress(OSError):
                os.rmdir(self.dir)  # empty on the host: the tmpfs was only ever mounted in the held namespace
            self.dir = None


def _remove_stale() -> None:
    """Empty view dirs of services that were killed (their pid is gone)."""
    for path in Path(tempfile.gettempdir()).glob("agentrl-sandbox-view-*-*"):
        pid = path.name.split("-")[3]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            with contextlib.suppress(OSError):
                path.rmdir()
