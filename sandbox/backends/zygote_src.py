"""The sandbox zygote: runs on the HOST as root (passed as `python -I -S -c <prelude + runner + this> CTRL_FD`).

Starting bwrap and a fresh interpreter for every request costs ~25 ms of CPU, five times what the program
itself needs. The zygote starts once per service, with the runner already imported, builds the read-only part
of every sandbox's root once (a template mount namespace: /usr, the interpreter's prefix and a few /etc files
bound read-only on a tmpfs, a minimal /dev, pivot_root'ed into, the host's tree detached), and makes each
sandbox from the kernel's primitives, as bubblewrap does:

    zygote: a copy of the template mount namespace, new pid/net/ipc/uts namespaces, fork, back into its own
        --> I (pid 1 of the new pid namespace): joins the request's cgroups, a cgroup namespace rooted there,
            its own /proc, devpts and size-limited tmpfs for /workspace, /tmp and /dev/shm, loopback up; then it
            becomes the sandbox's own unprivileged host uid (never root: one per sandbox, see cgroups.py) and,
            as that uid, makes a new user namespace mapping the sandbox uid 65534 onto it; every capability
            dropped, no-new-privs, the seccomp filter; then the runner's supervisor (runner_src.py), which forks
            the program's process (pid 2) and waits for the request (a session: the session's interpreter).

Each request gets every namespace of its own, its own cgroup and its own writable mounts; only the (read-only)
template and the interpreter's pages (copy-on-write) are shared with the zygote. The user namespace is created
last, so the program's namespace owns no other namespace: its capabilities there would not reach mounts,
network or pids even if it regained them. Made by the unprivileged uid, it is owned by that uid, so every
per-user kernel count (inotify instances, user watches, ...) is charged to the sandbox's own uid, not to root's,
and root's files, /proc entries and keyrings are as closed to the sandbox as to any other user.

The zygote reads one command per sandbox on CTRL_FD (a SOCK_SEQPACKET socket; marshal payload + four fds:
stdin, stdout, stderr, result frames) and never runs request code itself. A session's sandbox is the same, with
the session's interpreter (session_src.py) as pid 2 instead of a program. Stdlib only, no repo imports.
"""

import os
import sys

# The backend prepends these definitions to this text (bwrap.py, zygote.py); declared here for readers and
# linters, never imported: `__name__` is "__main__" wherever this runs.
if __name__ == "<prelude>":
    from sandbox.backends.fork_src import _fork_child, _fork_refusal
    from sandbox.backends.nsops_src import (
        _CLONE,
        _MNT_DETACH,
        _MS_BIND,
        _MS_NODEV,
        _MS_NOEXEC,
        _MS_NOSUID,
        _MS_PRIVATE,
        _MS_RDONLY,
        _MS_REC,
        _MS_REMOUNT,
        _PR_SET_DUMPABLE,
        _PR_SET_PDEATHSIG,
        _bind_ro,
        _loopback_up,
        _mount_proc,
        _serve_as_init,
        _write_text,
    )
    from sandbox.backends.prelude_src import _frame, _read_exact
    from sandbox.backends.runner_src import _prepare, _supervise
    from sandbox.backends.session_src import _serve_session

DEV_NODES = ("null", "zero", "full", "random", "urandom", "tty")
DEV_LINKS = (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
             ("stderr", "/proc/self/fd/2"), ("core", "/proc/kcore"), ("ptmx", "pts/ptmx"))


class _Kernel:
    """The few Linux calls Python 3.11's os module lacks, from the C helper nsutil.c (built by nsutil.py and
    loaded here once). Never ctypes: every program's process is a fork of the zygote, and a process with _ctypes
    loaded offers raw memory access without an audit event, which the unit-test harness must deny."""

    def __init__(self, helper_path, seccomp_filter):
        import _imp

        class Spec:
            name, origin = "_agentrl_nsutil", helper_path

        self.native = _imp.create_dynamic(Spec())
        _imp.exec_dynamic(self.native)
        self.seccomp_filter = seccomp_filter
        with open("/proc/sys/kernel/cap_last_cap") as f:
            self.cap_last = int(f.read())
        self.mount, self.umount2, self.unshare = self.native.mount, self.native.umount2, self.native.unshare
        self.setns, self.pivot_root, self.prctl = self.native.setns, self.native.pivot_root, self.native.prctl

    def umount(self, target):
        self.umount2(target, _MNT_DETACH)

    def drop_privileges(self):
        """Every capability gone (bounding, ambient, effective, permitted, inheritable), no-new-privs, seccomp."""
        self.native.drop_privileges(self.cap_last, self.seccomp_filter)


def _touch(path):
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))


def _build_template(kernel, cfg):
    """The read-only part of every sandbox's file system, as bwrap_args() in bwrap.py describes it, built once on
    a tmpfs at cfg["base"] in a mount namespace of its own, pivoted into, the host's tree detached. Each sandbox
    starts from a copy of this namespace and mounts its own /proc, /dev/pts and tmpfs on top (_mount_own)."""
    root = cfg["base"]
    kernel.mount("tmpfs", root, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755")
    for top, link in cfg["tops"]:
        if link is not None:
            os.symlink(link, root + top)
        else:
            os.mkdir(root + top, 0o755)
            _bind_ro(kernel, top, root + top)
    for path in cfg["ro_dirs"]:  # the interpreter's prefix (its parents exist only as the way to it)
        parts = path.strip("/").split("/")
        for i in range(1, len(parts)):
            parent = root + "/" + "/".join(parts[:i])
            if not os.path.isdir(parent):
                os.mkdir(parent, 0o711)  # a way through, not a listing
        os.mkdir(root + path, 0o755)
        _bind_ro(kernel, path, root + path)
    os.mkdir(root + "/etc", 0o755)
    for path in cfg["etc_files"]:
        target = root + path
        if os.path.isdir(path):
            os.mkdir(target, 0o755)
        else:
            _touch(target)
        _bind_ro(kernel, path, target)
    dev = root + "/dev"
    for path in ("/proc", "/dev"):
        os.mkdir(root + path, 0o755)
    kernel.mount("tmpfs", dev, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755")
    for name in DEV_NODES:
        _touch(dev + "/" + name)
        # read-only: the node's inode is the host's own (a chmod through a writable bind would change the host)
        kernel.mount("/dev/" + name, dev + "/" + name, None, _MS_BIND)
        kernel.mount(None, dev + "/" + name, None, _MS_BIND | _MS_REMOUNT | _MS_NOSUID | _MS_RDONLY)
    for name, target in DEV_LINKS:
        os.symlink(target, dev + "/" + name)
    for path in ("/dev/pts", "/dev/shm", "/tmp", cfg["workdir"]):  # mount points of each sandbox's own
        if not os.path.isdir(root + path):
            os.mkdir(root + path, 0o755)
    os.mkdir(root + "/.oldroot", 0o700)
    os.chdir(root)
    kernel.pivot_root(".", ".oldroot")
    kernel.umount("/.oldroot")  # the host's whole tree, detached: nothing of it is reachable any more
    os.rmdir("/.oldroot")
    kernel.mount(None, "/dev", None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)
    kernel.mount(None, "/", None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)
    kernel.mount(None, "/", None, _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV, "mode=0755")  # superblock


def _mount_own(kernel, cfg, uid, covers=True):
    """A sandbox's own mounts over its copy of the template: /proc of its pid namespace, a devpts instance, and
    fresh size-limited tmpfs for /dev/shm, /tmp and the work dir, owned by the sandbox's host uid."""
    _mount_proc(kernel, covers)
    kernel.mount("devpts", "/dev/pts", "devpts", _MS_NOSUID | _MS_NOEXEC, "newinstance,ptmxmode=0666,mode=620")
    size = "size=%d,mode=0755,uid=%d,gid=%d" % (cfg["tmpfs_bytes"], uid, uid)
    for path in ("/dev/shm", "/tmp", cfg["workdir"]):
        kernel.mount("tmpfs", path, "tmpfs", _MS_NOSUID | _MS_NODEV, size)


def _make_template(kernel, cfg):
    """Build the template mount namespace in a child and return an fd that keeps it (setns target)."""
    ready_r, ready_w = os.pipe()
    hold_r, hold_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(ready_r)
            os.close(hold_w)
            kernel.unshare(_CLONE["ns"])
            kernel.mount(None, "/", None, _MS_REC | _MS_PRIVATE)  # nothing propagates back to the host
            _build_template(kernel, cfg)
            os.write(ready_w, b"1")
            os.read(hold_r, 1)  # until the zygote holds the namespace
            os._exit(0)
        except BaseException as e:  # noqa: BLE001
            os.write(ready_w, ("0%s: %s" % (type(e).__name__, e)).encode())
            os._exit(1)
    os.close(ready_w)
    os.close(hold_r)
    answer = os.read(ready_r, 4096)
    os.close(ready_r)
    try:
        if answer != b"1":
            raise OSError("cannot build the sandbox root: %s" % answer[1:].decode(errors="replace"))
        return os.open("/proc/%d/ns/mnt" % pid, os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.close(hold_w)
        os.waitpid(pid, 0)


def _init(kernel, cfg, session, host_uid):
    """I: pid 1 of the sandbox's pid namespace. Mounts its own, becomes the sandbox's host uid, drops every
    privilege, runs the runner's supervisor. Returns only in the program's process, by its SystemExit going up to
    CPython's own handling."""
    import _signal

    try:
        # As pid 1 only signals with a handler reach I from inside: none must (Python's SIGINT handler would).
        _signal.signal(_signal.SIGINT, _signal.SIG_DFL)
        _signal.signal(_signal.SIGCHLD, _signal.SIG_DFL)  # the zygote's SIG_IGN would reap the program itself
        os.setgroups([])
        if host_uid is None:  # a service that is not root: the sandbox maps onto its own (unprivileged) uid
            host_uid = os.geteuid()
        forkable = session is not None and session.get("forkable")
        _mount_own(kernel, cfg, host_uid, covers=not forkable)
        import _socket

        _socket.sethostname(cfg["hostname"])
        _loopback_up()
        # Root's part is done: from here on I is the sandbox's unprivileged host uid, and the user namespace it
        # makes next is owned by that uid (a root-owned one would map the sandbox onto root, its device nodes,
        # /proc entries and per-user limits). Each credential change resets the dumpable flag and the parent-death
        # signal: /proc/self/uid_map is writable by its owner only while I is dumpable.
        os.setresgid(host_uid, host_uid, host_uid)
        os.setresuid(host_uid, host_uid, host_uid)
        kernel.unshare(_CLONE["user"])
        kernel.prctl(_PR_SET_DUMPABLE, 1)
        _write_text("/proc/self/setgroups", "deny")
        _write_text("/proc/self/uid_map", "%d %d 1" % (cfg["uid"], host_uid))
        _write_text("/proc/self/gid_map", "%d %d 1" % (cfg["uid"], host_uid))
        os.setsid()
        os.chdir(cfg["workdir"])
        if forkable:  # its children stack the full filter (fork_src.py)
            kernel.native.drop_privileges(kernel.cap_last, cfg["seccomp_fork"])
        else:
            kernel.drop_privileges()
        kernel.prctl(_PR_SET_DUMPABLE, 0)  # the program (same uid) cannot open /proc/1/mem or ptrace I
        kernel.prctl(_PR_SET_PDEATHSIG, _signal.SIGKILL)
    except BaseException as e:  # noqa: BLE001 - any setup failure is the host's infra error
        _setup_failed(e, 126)

    def program_setup():
        """The program's process starts as a fresh interpreter would: Python's SIGINT handler, dumpable."""
        _signal.signal(_signal.SIGINT, _signal.default_int_handler)
        kernel.prctl(_PR_SET_DUMPABLE, 1)

    if session is None:
        _supervise(3, program_setup)
        return
    # A session: the interpreter is pid 2 as a program is; pid 1 only waits and ends with its status. It reaps
    # every orphan on the way (the session's daemonised children are re-parented to it): zombies it left would
    # count against the sandbox's pids limit until the session could no longer fork.
    pid = os.fork()
    if pid == 0:
        program_setup()
        forker = None
        if forkable:
            def forker(fds, procs, source_fds):
                """With fds None: why the source cannot fork now, or None; else this new fork becomes a child."""
                if fds is None:
                    return _fork_refusal(cfg)
                _fork_child(kernel, cfg, fds, procs, source_fds)

        _serve_session(3, session["fsize"], session["nofile"], forker)
    _serve_as_init(pid)


def _setup_failed(error, status):
    try:
        tb = error.__traceback__
        while tb.tb_next is not None:
            tb = tb.tb_next
        _frame(3, {"setup_failed": "%s: %s (sandbox setup, line %d)" % (type(error).__name__, error, tb.tb_lineno)})
    finally:
        os._exit(status)


def _make_sandbox(kernel, cfg, host_ns, cgroup_procs):
    """In the zygote: new mount (a copy of the template), pid, network, IPC and UTS namespaces, the sandbox's
    pid 1 forked into them, and the zygote back in its own. Returns the child's pid (0 in the child) and fds of
    the sandbox's cgroup.procs files, which the child writes itself into before anything else. A zygote that
    cannot return to its own namespaces exits (the service starts a new one): it never serves half inside."""
    procs = [os.open(path, os.O_WRONLY | os.O_CLOEXEC) for path in cgroup_procs]
    pid = -1
    try:
        kernel.setns(cfg["template_fd"], _CLONE["ns"])  # into the template root (its mounts are private)...
        # ...and out of it again at once: this sandbox's mount namespace is a copy of the template's
        kernel.unshare(_CLONE["ns"] | _CLONE["pid"] | _CLONE["net"] | _CLONE["ipc"] | _CLONE["uts"])
        pid = os.fork()
    except BaseException:
        for fd in procs:
            os.close(fd)
        raise
    finally:
        if pid != 0:
            try:
                for kind, fd in host_ns:
                    kernel.setns(fd, _CLONE[kind])
            except BaseException:  # noqa: BLE001
                os._exit(70)
    return pid, procs


def _into_sandbox(kernel, cfg, fds, procs, session, host_uid):
    """The sandbox's pid 1, just forked: its stdio and result fd in place, into its cgroups, then _init."""
    import fcntl

    # out of the way of 0..3 (0..4 for a fork source: its fork socket is fd 4)
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 100) for fd in (*fds, *procs)]
    for target, fd in enumerate(high[:len(fds)]):
        os.dup2(fd, target)
    procs = high[len(fds):]
    os.closerange(len(fds), procs[0])
    os.closerange(procs[-1] + 1, 1 << 16)
    try:
        for fd in procs:  # every process of this sandbox is born inside its cgroups
            os.write(fd, b"0")
            os.close(fd)
        kernel.unshare(_CLONE["cgroup"])  # after joining: the sandbox's cgroup is its cgroup root
    except BaseException as e:  # noqa: BLE001
        _setup_failed(e, 125)
    _init(kernel, cfg, session, host_uid)


def _zygote_main():
    import _signal
    import marshal

    size = int.from_bytes(_read_exact(0, 4), "big")
    cfg = marshal.loads(_read_exact(0, size))  # written by the service at start (trusted)
    null = os.open("/dev/null", os.O_RDWR)
    os.dup2(null, 0)
    os.close(null)
    _prepare()  # first: what it imports beyond `site` is set aside before each program runs (runner_src.py)
    import _socket

    ctrl = _socket.socket(fileno=int(sys.argv[1]))
    kernel = _Kernel(cfg["nsutil"], cfg["seccomp"])
    import fcntl

    def keep(fd):  # fds the zygote holds for good, clear of those a request brings
        try:
            return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 64)
        finally:
            os.close(fd)

    cfg["template_fd"] = keep(_make_template(kernel, cfg))
    # Its own namespaces, to return to after making each sandbox's (pid: the namespace of its next children)
    host_ns = [(kind, keep(os.open("/proc/self/ns/%s" % name, os.O_RDONLY)))
               for kind, name in (("ns", "mnt"), ("net", "net"), ("ipc", "ipc"), ("uts", "uts"), ("pid", "pid"))]
    # fcntl, for _loopback_up, is loaded here once rather than in every sandbox

    if cfg.get("preload") == "session":
        # The sessions' zygote loads what their interpreter imports (json pulls in re) once. Not the programs'
        # zygote: every string a module interns is touched again by each program's shutdown (CPython clears
        # the interned strings last), ~1.3 ms of copy-on-write per request for these.
        import ast  # noqa: F401
        import json  # noqa: F401
        import linecache  # noqa: F401
        import queue  # noqa: F401
        import signal  # noqa: F401
        import threading  # noqa: F401

    _signal.signal(_signal.SIGCHLD, _signal.SIG_IGN)  # the kernel reaps each pid 1: no zombies, no bookkeeping
    import gc

    gc.freeze()
    _frame(1, {"ready": True})
    fd_size = len((0).to_bytes(4, sys.byteorder))
    while True:
        try:
            data, ancillary, _, _ = ctrl.recvmsg(1 << 16, _socket.CMSG_SPACE(5 * fd_size))
        except InterruptedError:
            continue
        if not data:
            os._exit(0)  # the service is gone
        fds = []
        for level, kind, payload in ancillary:
            if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
                fds += [int.from_bytes(payload[i:i + fd_size], sys.byteorder)
                        for i in range(0, len(payload) - len(payload) % fd_size, fd_size)]
        request = marshal.loads(data)
        procs = []
        if len(fds) == 4 or len(fds) == 5 and request.get("session", {}).get("forkable"):
            try:
                pid, procs = _make_sandbox(kernel, cfg, host_ns, request["cgroup_procs"])
            except OSError as e:  # reported on the sandbox's own result pipe; the zygote serves on
                pid = -1
                _frame(fds[3], {"setup_failed": "%s: %s (zygote)" % (type(e).__name__, e)})
            if pid == 0:
                _into_sandbox(kernel, cfg, fds, procs, request.get("session"), request.get("host_uid"))
                return  # the program's process: its SystemExit ended the program, CPython shuts down
        for fd in (*fds, *procs):
            os.close(fd)


if __name__ == "__main__":
    _zygote_main()
