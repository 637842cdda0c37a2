"""Runs INSIDE a fork source's sandbox: turns a fork(2) of the session's interpreter into a session of its own.

A forkable session (`POST /sessions {"forkable": true}`) is an ordinary zygote session whose seccomp filter
also allows `unshare` and `mount` (seccomp.FORK_SOURCE_ALLOWED) and whose /proc has no read-only covers (the
kernel lets a user namespace mount a new /proc only where one is fully visible). On `{"op": "fork"}` the
interpreter forks once per child; the child C, single-threaded and holding the pipes and cgroup.procs fds the
service sent for it, runs `_fork_child`:

    C: joins the child's cgroups, refuses shared memory mappings (siblings would share their pages), makes a
       nested user namespace (uid 65534 -> 65534, the source's host uid) and new mount, pid, network, IPC, UTS
       and cgroup namespaces; mounts fresh size-limited tmpfs over the work dir, /tmp and /dev/shm and copies
       the source's files into them (the source's are left below, unreachable once the mounts cannot change),
       a devpts instance, loopback up; reopens the files the source held open in the copies (other fds: /dev/null)
    --> G (pid 1 of the new pid namespace): its own /proc with the usual covers, every capability dropped, the
        full seccomp filter stacked on the source's (filters only narrow), not dumpable; then the session's
        init as in any session: reaps orphans and reports its interpreter's exit
        --> H (pid 2): the interpreter, a copy-on-write image of the source's at the fork; it returns to the
            session loop with the new pipes.

Stdlib only; the service concatenates it into the zygote's program (zygote.py).
"""

import os

# The backend prepends these definitions to this text (zygote.py); declared here for readers and linters, never
# imported: `__name__` is "__main__" wherever this runs.
if __name__ == "<prelude>":
    from sandbox.backends.nsops_src import (
        _CLONE,
        _MS_NODEV,
        _MS_NOEXEC,
        _MS_NOSUID,
        _MS_PRIVATE,
        _MS_REC,
        _PR_SET_DUMPABLE,
        _loopback_up,
        _mount_proc,
        _serve_as_init,
        _write_text,
    )
    from sandbox.backends.prelude_src import _frame

_COPIED = ("/tmp", "/dev/shm")  # besides the work dir


def _shared_mappings(writable_roots):
    """Lines of /proc/self/maps a fork would share with its source and siblings: MAP_SHARED mappings that are
    writable, anonymous (shared memory, SysV) or of a file under `writable_roots`. A read-only shared mapping of
    a file on the read-only root (glibc's gconv cache) cannot carry anything between them."""
    found = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) < 5 or parts[1][3:4] != "s":
                continue
            path = parts[5].strip() if len(parts) > 5 else ""
            fixed = (path.startswith("/") and not path.endswith("(deleted)")
                     and not any(path == r or path.startswith(r + "/") for r in writable_roots))
            if "w" in parts[1] or not fixed:
                found.append(line.strip())
    return found


def _fork_refusal(cfg):
    """Why the calling interpreter cannot be forked now, or None (the source checks before forking; each child
    checks again, single-threaded, before it does anything)."""
    shared = _shared_mappings((cfg["workdir"], *_COPIED))
    if not shared:
        return None
    return ("the session holds %d shared memory mapping(s) (mmap MAP_SHARED, multiprocessing shared memory) that "
            "its forks would share: release them before forking (%s)" % (len(shared), shared[0][:160]))


def _copy_tree(src, dst):
    """Copy the directory open at fd `src` into the one at fd `dst`: files, directories, symlinks (as links) and
    fifos with their modes and times; nothing is followed."""
    import stat

    for entry in os.scandir(src):
        st = entry.stat(follow_symlinks=False)
        name = entry.name
        if stat.S_ISDIR(st.st_mode):
            os.mkdir(name, 0o700, dir_fd=dst)
            s = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=src)
            d = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dst)
            try:
                _copy_tree(s, d)
            finally:
                os.close(s)
                os.close(d)
        elif stat.S_ISREG(st.st_mode):
            s = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=src)
            d = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dst)
            try:
                offset = 0
                while offset < st.st_size:
                    sent = os.sendfile(d, s, offset, min(st.st_size - offset, 1 << 30))
                    if sent == 0:
                        break
                    offset += sent
            finally:
                os.close(s)
                os.close(d)
        elif stat.S_ISLNK(st.st_mode):
            os.symlink(os.readlink(name, dir_fd=src), name, dir_fd=dst)
        elif stat.S_ISFIFO(st.st_mode):
            os.mkfifo(name, 0o600, dir_fd=dst)
        else:
            continue  # sockets and device nodes belong to the source
        if not stat.S_ISLNK(st.st_mode):
            os.chmod(name, stat.S_IMODE(st.st_mode), dir_fd=dst)
        os.utime(name, ns=(st.st_atime_ns, st.st_mtime_ns), dir_fd=dst, follow_symlinks=False)


def _open_files(keep, roots):
    """(fd, path, flags, offset, inheritable) of the fds the source's code holds on files and directories under
    `roots` (to reopen in the copies), and the other fds it holds (fifos, sockets, ... to point at /dev/null):
    nothing open in the source stays shared with a child."""
    import fcntl
    import stat

    files, others = [], []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd in keep:
            continue
        try:
            path = os.readlink("/proc/self/fd/%d" % fd)
        except OSError:
            continue  # the listing's own fd, already closed
        try:
            mode = os.fstat(fd).st_mode
        except OSError:
            continue
        reopen = stat.S_ISREG(mode) or stat.S_ISDIR(mode)  # a fifo would block the reopening child
        if reopen and any(path == r or path.startswith(r + "/") for r in roots) and not path.endswith(" (deleted)"):
            flags = fcntl.fcntl(fd, fcntl.F_GETFL)
            try:
                offset = os.lseek(fd, 0, os.SEEK_CUR)
            except OSError:
                offset = 0
            files.append((fd, path, flags, offset, os.get_inheritable(fd)))
        else:
            others.append(fd)
    return files, others


def _fork_child(kernel, cfg, fds, procs, source_fds):
    """In C, just forked from the source's interpreter. Returns only in H (the child's interpreter, its stdio and
    result fd in place); C and G never return. A failure is reported on the child's result fd."""
    import fcntl

    result = fds[3]
    try:
        refusal = _fork_refusal(cfg)
        if refusal:
            raise OSError(refusal)
        for fd in procs:  # the child's cgroups, before anything it allocates
            os.write(fd, b"0")
            os.close(fd)
        roots = (cfg["workdir"], *_COPIED)
        files, others = _open_files({0, 1, 2, 3, *fds, *source_fds}, roots)
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 4) for fd in fds]
        for target, fd in enumerate(high):
            os.dup2(fd, target)
            os.close(fd)
        result = 3
        for fd in {*fds, *source_fds} - {0, 1, 2, 3}:
            os.close(fd)
        null = os.open("/dev/null", os.O_RDWR)
        for fd in others:
            os.dup2(null, fd, inheritable=False)
        uid = cfg["uid"]
        kernel.unshare(_CLONE["user"])
        _write_text("/proc/self/setgroups", "deny")
        _write_text("/proc/self/uid_map", "%d %d 1" % (uid, uid))
        _write_text("/proc/self/gid_map", "%d %d 1" % (uid, uid))
        kernel.unshare(_CLONE["ns"] | _CLONE["pid"] | _CLONE["net"] | _CLONE["ipc"] | _CLONE["uts"]
                       | _CLONE["cgroup"])
        kernel.mount(None, "/", None, _MS_REC | _MS_PRIVATE)
        try:
            cwd = os.getcwd()
        except OSError:  # the source's cwd was removed
            cwd = cfg["workdir"]
        size = "size=%d,mode=0755,uid=%d,gid=%d" % (cfg["tmpfs_bytes"], uid, uid)
        for path in roots:
            old = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
            try:
                kernel.mount("tmpfs", path, "tmpfs", _MS_NOSUID | _MS_NODEV, size)
                new = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
                try:
                    _copy_tree(old, new)
                finally:
                    os.close(new)
            finally:
                os.close(old)
        kernel.mount("devpts", "/dev/pts", "devpts", _MS_NOSUID | _MS_NOEXEC, "newinstance,ptmxmode=0666,mode=620")
        _loopback_up()
        try:
            os.chdir(cwd)
        except OSError:
            os.chdir(cfg["workdir"])
        for fd, path, flags, offset, inheritable in files:
            try:
                reopened = os.open(path, flags & ~(os.O_CREAT | os.O_EXCL | os.O_TRUNC))
                os.lseek(reopened, offset, os.SEEK_SET)
            except OSError:
                reopened = os.dup(null)
            os.dup2(reopened, fd, inheritable=inheritable)
            os.close(reopened)
        os.close(null)
        if os.fork() != 0:
            os._exit(0)  # C is done: G, pid 1 of the new pid namespace, goes on
        _mount_proc(kernel)
        os.setsid()
        kernel.drop_privileges()  # the full filter, stacked on the source's
        kernel.prctl(_PR_SET_DUMPABLE, 0)
    except BaseException as e:  # noqa: BLE001 - reported on the child's result pipe, the source serves on
        try:
            _frame(result, {"setup_failed": "%s: %s (fork)" % (type(e).__name__, e)})
        finally:
            os._exit(1)
    import _signal

    _signal.signal(_signal.SIGINT, _signal.SIG_DFL)
    _signal.signal(_signal.SIGCHLD, _signal.SIG_DFL)
    pid = os.fork()
    if pid == 0:
        _signal.signal(_signal.SIGINT, _signal.default_int_handler)
        kernel.prctl(_PR_SET_DUMPABLE, 1)
        return
    _serve_as_init(pid)
