"""Namespace and mount steps shared by the zygote (zygote_src.py) and forked sessions (fork_src.py); runs INSIDE
the zygote's program (concatenated by zygote.py), stdlib only."""

import os

# The backend prepends these definitions to this text (zygote.py); declared here for readers and linters, never
# imported: `__name__` is "__main__" wherever this runs.
if __name__ == "<prelude>":
    from sandbox.backends.prelude_src import _frame

_CLONE = {"ns": 0x00020000, "cgroup": 0x02000000, "uts": 0x04000000, "ipc": 0x08000000, "user": 0x10000000,
          "pid": 0x20000000, "net": 0x40000000}
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 32, 4096, 16384, 1 << 18
_MNT_DETACH = 2
_PR_SET_PDEATHSIG, _PR_SET_DUMPABLE = 1, 4
PROC_COVERED = ("sys", "sysrq-trigger", "irq", "bus")  # bound read-only over the sandbox's /proc, as bwrap does


def _write_text(path, text):
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)
    except OSError as e:
        raise OSError(e.errno, "writing %r to %s: %s" % (text, path, e.strerror)) from None


def _bind_ro(kernel, source, target, flags=_MS_NOSUID | _MS_NODEV):
    kernel.mount(source, target, None, _MS_BIND)
    kernel.mount(None, target, None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY | flags)


def _mount_proc(kernel, covers=True):
    """/proc of the caller's pid namespace, with bwrap's read-only covers (none in a fork source: a user
    namespace may mount a new /proc only where one is fully visible, see fork_src.py)."""
    kernel.mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    for name in PROC_COVERED if covers else ():
        path = "/proc/" + name
        if os.path.exists(path):
            _bind_ro(kernel, path, path, _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)


def _loopback_up():
    """`lo` up in the sandbox's network namespace (127.0.0.1 only; no other interface exists), as bwrap does."""
    import _socket
    import fcntl

    sock = _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM)
    try:
        fcntl.ioctl(sock.fileno(), 0x8914, b"lo".ljust(16, b"\0") + (0x1 | 0x8 | 0x40).to_bytes(2, "little")
                    + bytes(22))  # SIOCSIFFLAGS: IFF_UP | IFF_LOOPBACK | IFF_RUNNING
    finally:
        sock.close()


def _serve_as_init(pid):
    """A session's pid 1 once its interpreter `pid` runs: reap until it exits, report its status, exit."""
    while True:
        try:
            done, status = os.waitpid(-1, 0)
        except InterruptedError:
            continue
        if done == pid:
            break
    try:
        _frame(3, {"runner_exit": os.waitstatus_to_exitcode(status)})
    finally:
        os._exit(0)
