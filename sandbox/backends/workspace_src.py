"""Runs INSIDE a session's sandbox (part of the session's program, see session_src.py): the work dir's change stamp,
its files for a snapshot, and laying a snapshot's files down. Stdlib only; nothing here follows a symlink.

The host trusts none of it: the files a snapshot returns are checked again on the host (sandbox/snapshot.py), and
`_lay_down` runs in the sandbox as the sandbox's uid, below the session's own work dir, on files the host checked.
"""

import os
import stat

MAX_PATH = 1024  # longest relative path in a snapshot (the host refuses longer ones too)
MAX_SKIPPED = 100  # paths of skipped entries (symlinks, fifos, sockets) named in a snapshot


class _OverLimit(Exception):
    pass


def _open_dir(name, dir_fd):
    return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)


def _walk(fd, prefix, visit, ordered=True):
    """Call `visit(path, name, lstat, dir_fd)` for everything below the directory open at `fd`, a directory before
    what it holds (names sorted if `ordered`); a directory that cannot be opened is visited, not entered."""
    with os.scandir(fd) as it:
        entries = sorted(it, key=lambda e: e.name) if ordered else list(it)
    for entry in entries:
        st = entry.stat(follow_symlinks=False)
        path = prefix + entry.name
        visit(path, entry.name, st, fd)
        if stat.S_ISDIR(st.st_mode):
            try:
                sub = _open_dir(entry.name, fd)
            except OSError:
                continue
            try:
                _walk(sub, path + "/", visit, ordered)
            finally:
                os.close(sub)


def _workspace_stamp(root, max_bytes, max_files):
    """A hash of the work dir's metadata (path, type, mode, size, inode, mtime and ctime of every entry): any change
    to a file changes it (ctime cannot be set back). None past the snapshot limits (more than `max_files` entries
    or `max_bytes` in files), where no snapshot would be taken: it stats at most `max_files` + 1 entries."""
    items = []
    total = [0]

    def visit(path, name, st, dir_fd):
        items.append((path, st.st_mode, st.st_size, st.st_ino, st.st_mtime_ns, st.st_ctime_ns))
        if stat.S_ISREG(st.st_mode):
            total[0] += st.st_size
        if len(items) > max_files or total[0] > max_bytes:
            raise _OverLimit

    fd = _open_dir(root, None)
    try:
        _walk(fd, "", visit, ordered=False)
    except _OverLimit:
        return None
    finally:
        os.close(fd)
    return hash(frozenset(items))


def _read_file(name, dir_fd, limit):
    """The bytes of the regular file `name` (at most `limit` + 1 of them); None if it is no longer one."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks, left = [], limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _workspace_entries(root, max_bytes, max_files):
    """The work dir's directories and regular files: {"entries": [[path, "dir" | "file", mode, mtime_ns, base64
    data], ...] (a directory before what it holds), "skipped": [paths of symlinks, fifos, sockets, devices]}, or
    {"error": why} past the limits."""
    import binascii

    entries, skipped = [], []
    total = [0]

    def visit(path, name, st, dir_fd):
        if len(path) > MAX_PATH:
            raise _OverLimit("the path %r... is longer than %d characters" % (path[:80], MAX_PATH))
        if stat.S_ISDIR(st.st_mode):
            entries.append([path, "dir", stat.S_IMODE(st.st_mode), st.st_mtime_ns, ""])
        elif stat.S_ISREG(st.st_mode):
            data = _read_file(name, dir_fd, max_bytes - total[0])
            if data is None:
                return
            total[0] += len(data)
            if total[0] > max_bytes:
                raise _OverLimit("its files hold more than %d bytes (snapshot_max_bytes)" % max_bytes)
            entries.append([path, "file", stat.S_IMODE(st.st_mode), st.st_mtime_ns,
                            binascii.b2a_base64(data, newline=False).decode()])
        elif len(skipped) < MAX_SKIPPED:
            skipped.append(path)
        if len(entries) > max_files:
            raise _OverLimit("it holds more than %d files and directories (snapshot_max_files)" % max_files)

    fd = _open_dir(root, None)
    try:
        _walk(fd, "", visit)
    except _OverLimit as e:
        return {"error": str(e), "over": True}
    finally:
        os.close(fd)
    return {"entries": entries, "skipped": skipped}


def _remove(name, dir_fd):
    """Remove `name` (a whole directory tree included) from the directory open at `dir_fd`, following nothing."""
    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=dir_fd)
        return
    os.chmod(name, 0o700, dir_fd=dir_fd)  # the sandbox's uid owns it: a mode 000 left by a cell cannot stop this
    sub = _open_dir(name, dir_fd)
    try:
        for child in os.listdir(sub):
            _remove(child, sub)
    finally:
        os.close(sub)
    os.rmdir(name, dir_fd=dir_fd)


def _open_path(root_fd, path):
    """A new fd of the directory `path` below `root_fd`, opened one component at a time (no symlink followed)."""
    fd = os.dup(root_fd)
    for name in path.split("/") if path else ():
        try:
            sub = _open_dir(name, fd)
        finally:
            os.close(fd)
        fd = sub
    return fd


def _settle(fd, mode, mtime_ns, data=None):
    """Write `data` (a regular file's), set the mode and mtime of what `fd` is open on, and close it."""
    try:
        view = memoryview(data) if data is not None else b""
        while view:
            view = view[os.write(fd, view):]
        os.fchmod(fd, mode & 0o777)
        os.utime(fd, ns=(mtime_ns, mtime_ns))
    finally:
        os.close(fd)


def _lay_down(root, entries):
    """Make the work dir hold exactly `entries` ([path, "dir" | "file", mode, mtime_ns, base64 data], checked by
    the host: relative normalised paths, a directory before what it holds): what else is there goes, a regular
    file already there is rewritten in place (the interpreter's open file objects keep pointing at it), modes and
    mtimes are the snapshot's."""
    import binascii

    wanted = {path: kind for path, kind, _, _, _ in entries}
    root_fd = _open_dir(root, None)
    try:
        def prune(fd, prefix):
            for name in sorted(os.listdir(fd)):
                path = prefix + name
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                kind = "dir" if stat.S_ISDIR(st.st_mode) else "file" if stat.S_ISREG(st.st_mode) else None
                if kind is None or wanted.get(path) != kind:  # symlinks, fifos, ...: never in a snapshot
                    _remove(name, fd)
                elif kind == "dir":
                    os.chmod(name, 0o700, dir_fd=fd)
                    sub = _open_dir(name, fd)
                    try:
                        prune(sub, path + "/")
                    finally:
                        os.close(sub)

        prune(root_fd, "")
        for path, kind, mode, mtime_ns, data in entries:
            parent, _, name = path.rpartition("/")
            dir_fd = _open_path(root_fd, parent)
            try:
                if kind == "dir":
                    try:
                        os.mkdir(name, 0o700, dir_fd=dir_fd)
                    except FileExistsError:  # kept by prune(): a directory
                        pass
                    continue
                flags = os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
                try:
                    os.chmod(name, 0o600, dir_fd=dir_fd)  # a regular file (prune() removed anything else)
                    fd = os.open(name, flags, dir_fd=dir_fd)
                except FileNotFoundError:
                    fd = os.open(name, flags | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=dir_fd)
                _settle(fd, mode, mtime_ns, binascii.a2b_base64(data))
            finally:
                os.close(dir_fd)
        for path, kind, mode, mtime_ns, _ in reversed(entries):  # a directory's mode and mtime after its contents
            if kind == "dir":
                _settle(_open_path(root_fd, path), mode, mtime_ns)
    finally:
        os.close(root_fd)
    try:
        os.getcwd()
    except OSError:  # the interpreter's cwd was a directory the snapshot does not have
        os.chdir(root)
