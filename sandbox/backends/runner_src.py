"""Runs INSIDE a sandbox (passed as `python -I -S -c <this file's text> RESULT_FD`); stdlib only, no repo imports.

Started ahead of time as part of a warm sandbox, it forks the program's process at once (so no fork is on the
request's path) and reports `ready`. The program process waits for one request frame on stdin (4-byte big-endian
length + JSON; the bytes after it are the program's stdin), writes the request's files into the work dir, tells
this supervisor what to collect afterwards, and runs the code: Python in the already started interpreter (which
is why a warm sandbox answers faster than a fresh `python3 -c`), other languages by exec. The supervisor waits
for it, writes an end marker on stdout/stderr, reads `fetch_files` without following symlinks, and writes one
result frame to RESULT_FD. The host enforces time and memory from outside; the program only gets the second
layer of rlimits here.
"""

import os
import sys
# _add_site_packages, _frame and _read_exact come from prelude_src.py, which the backend prepends.


def _open_beneath(path, flags, mode=0o644, create_dirs=False):
    """Open a relative `path` under the cwd with O_NOFOLLOW on every component (no symlink, no '..')."""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if not parts or path.startswith("/") or ".." in parts:
        raise PermissionError(f"{path!r} is not a relative path inside the work dir")
    dir_fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts[:-1]:
            if create_dirs:
                try:
                    os.mkdir(part, 0o755, dir_fd=dir_fd)
                except FileExistsError:
                    pass
            try:
                next_fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
            except NotADirectoryError:
                import errno
                import stat

                if stat.S_ISLNK(os.lstat(part, dir_fd=dir_fd).st_mode):
                    raise OSError(errno.ELOOP, "symlink in path", path) from None
                raise
            os.close(dir_fd)
            dir_fd = next_fd
        return os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)


def _write_files(files):
    import base64

    for path, b64 in files.items():
        fd = _open_beneath(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, create_dirs=True)
        data = base64.b64decode(b64)
        try:
            while data:
                data = data[os.write(fd, data):]
        finally:
            os.close(fd)


def _fetch_files(paths, limit):
    import base64
    import errno

    files, errors, total = {}, {}, 0
    for path in paths:
        try:
            fd = _open_beneath(path, os.O_RDONLY)
        except OSError as e:
            errors[path] = "symlink" if e.errno == errno.ELOOP else (
                "missing" if e.errno == errno.ENOENT else f"{type(e).__name__}: {e.strerror or e}")
            continue
        try:
            import stat

            if not stat.S_ISREG(os.fstat(fd).st_mode):
                errors[path] = "not_a_file"
                continue
            chunks = []
            while True:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    break
                total += len(chunk)
                if total > limit:
                    errors[path] = "too_large"
                    chunks = None
                    break
                chunks.append(chunk)
            if chunks is not None:
                files[path] = base64.b64encode(b"".join(chunks)).decode()
        finally:
            os.close(fd)
    return files, errors


def _run_python(code):
    """Run `code` like `python -c` would, in this (forked) interpreter; returns the exit status."""
    import builtins
    import types

    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main
    sys.path.insert(0, "")
    try:
        exec(compile(code, "<string>", "exec"), main.__dict__)
    except SystemExit as e:
        if e.code is None:
            return 0
        if isinstance(e.code, int):
            return e.code & 0xFF
        print(e.code, file=sys.stderr)
        return 1
    except BaseException as e:
        import traceback

        traceback.print_exception(type(e), e, e.__traceback__.tb_next)
        return 1
    return 0


def _child(req):
    import resource

    limits = req["rlimits"]
    for name, value in (("RLIMIT_FSIZE", limits["fsize"]), ("RLIMIT_NOFILE", limits["nofile"]),
                        ("RLIMIT_CPU", limits["cpu"]), ("RLIMIT_CORE", 0)):
        resource.setrlimit(getattr(resource, name), (value, value))
    sys.argv = ["-c", *req.get("argv", [])]
    if req["language"] == "python":
        status = _run_python(req["code"])
        # What `python -c` does at exit that a program can observe: non-daemon threads are joined, atexit
        # handlers run, buffers are flushed. The rest of interpreter finalisation is skipped: in a forked child
        # it touches every inherited page (copy-on-write), milliseconds per run for nothing.
        try:
            if "threading" in sys.modules:
                sys.modules["threading"]._shutdown()
            import atexit

            atexit._run_exitfuncs()
        except BaseException as e:  # noqa: BLE001 - the program's own exit-time failure, reported like Python does
            print(f"Exception ignored at exit: {e!r}", file=sys.stderr)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:  # noqa: BLE001 - a closed or broken stream must not change the exit status
                pass
        os._exit(status)
    interpreter = req["interpreter"]
    script = os.path.join(req["script_dir"], f".main{req['suffix']}")
    with open(script, "w") as f:
        f.write(req["code"])
    os.execv(interpreter[0], [*interpreter, script, *req.get("argv", [])])


def main():
    import time

    _add_site_packages()
    import base64  # noqa: F401  (imported before `ready`, so not on the request's path)
    import json  # noqa: F401
    import resource  # noqa: F401
    import types  # noqa: F401

    target = sys.argv[1]
    if target.startswith("file:"):  # docker backend: no extra fd crosses `docker exec`, frames go to a file
        result_fd = os.open(target[5:], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    else:
        result_fd = int(target)
        os.set_inheritable(result_fd, False)
    import gc

    gc.freeze()  # the runner's objects move to a permanent generation: the child's GC never touches their pages
    # The program's process is forked now, before any request, and waits for it on stdin: no fork on the
    # request's path. It tells this supervisor what to do afterwards (fetch_files, ...) through `meta`.
    meta_r, meta_w = os.pipe()
    # Copies of the output pipes, kept to write the end marker once the program has exited: the host then
    # knows the output is complete without waiting for every other holder of the pipes to die.
    out_copy, err_copy = os.dup(1), os.dup(2)
    pid = os.fork()
    if pid == 0:
        for fd in (out_copy, err_copy, meta_r, result_fd):
            os.close(fd)
        _program(meta_w)
    os.close(meta_w)
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    _frame(result_fd, {"ready": True})
    chunks = []
    while True:
        chunk = os.read(meta_r, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    meta = json.loads(b"".join(chunks) or b"{}")
    _, status, usage = os.wait4(pid, 0)
    end = time.monotonic()
    marker = ("\x00agentrl-run-end:%s\x00" % meta.get("nonce", "")).encode()
    for fd in (out_copy, err_copy):
        try:
            os.write(fd, marker)
        except OSError:
            pass
        os.close(fd)
    if "setup_error" in meta:
        _frame(result_fd, {"setup_error": meta["setup_error"]})
        os._exit(0)
    if "start" not in meta:
        os._exit(3)  # no valid request arrived
    files, errors = _fetch_files(meta.get("fetch_files") or [], meta.get("fetch_limit", 0))
    exit_info = {"code": os.WEXITSTATUS(status)} if os.WIFEXITED(status) else {"signal": os.WTERMSIG(status)}
    _frame(result_fd, {"exit": exit_info, "elapsed": end - meta["start"], "cpu": usage.ru_utime + usage.ru_stime,
                       "maxrss_kb": usage.ru_maxrss, "files": files, "file_errors": errors})
    os._exit(0)


def _program(meta_w):
    """The forked program process: read the request, report what the supervisor needs, then run the code."""
    import json
    import time

    try:
        size = int.from_bytes(_read_exact(0, 4), "big")
        req = json.loads(_read_exact(0, size))
    except (EOFError, ValueError):
        os._exit(3)
    meta = {"start": time.monotonic(), "nonce": req.get("nonce", ""), "fetch_files": req.get("fetch_files") or [],
            "fetch_limit": req["fetch_limit"]}
    try:
        _write_files(req.get("files") or {})
    except (OSError, ValueError) as e:
        meta["setup_error"] = f"could not write files: {e}"
    data = json.dumps(meta).encode()
    while data:
        data = data[os.write(meta_w, data):]
    os.close(meta_w)
    if "setup_error" in meta:
        os._exit(0)
    try:
        _child(req)
    except BaseException as e:  # noqa: BLE001 - a runner failure before the program started
        print(f"sandbox runner: {type(e).__name__}: {e}", file=sys.stderr)
        os._exit(126)


if __name__ == "__main__":
    main()
