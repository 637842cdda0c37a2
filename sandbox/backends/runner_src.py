"""Runs INSIDE a sandbox (passed as `python -I -S -c <this file's text> RESULT_FD`); stdlib only, no repo imports.

Started ahead of time as part of a warm sandbox, it forks the program's process at once (so no fork is on the
request's path) and reports `ready`. The program process waits for one request frame on stdin (4-byte big-endian
length + marshal, written by the host; the bytes after it are the program's stdin), writes the request's files and
the program's source (`main.py`, `main.cpp`, ... in the work dir, as SandboxFusion runs a script file), tells this
supervisor what to collect afterwards (length-prefixed marshal frames on the `meta` pipe, closed before any of the
request's code runs: the supervisor parses nothing the program could have written), and runs the code: Python as a
script in the already started interpreter, as `python main.py` runs it, ending through CPython's own SystemExit
handling and shutdown (which is why a warm sandbox answers faster than a fresh `python3`, with the same semantics),
C and C++ by compiling then exec, other languages by exec. The supervisor waits for it, writes an end marker on
stdout/stderr (its nonce is made by the supervisor after the fork and reaches the host in the `ready` frame, so the
program never holds it), reads `fetch_files` without following symlinks, and writes the result frames (JSON) to
RESULT_FD (`compile` after a compile step, then the final one). The host enforces time and memory from outside; the
program only gets the second layer of rlimits.
"""

import os
import sys

# The backend prepends these definitions to this text (bwrap.py, zygote.py); declared here for readers and
# linters, never imported: `__name__` is "__main__" wherever this runs.
if __name__ == "<prelude>":
    from sandbox.backends.prelude_src import _add_site_packages, _frame, _mframe, _read_exact, _site_builtins


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
    import binascii  # base64's C core: `import base64` costs milliseconds per sandbox

    for path, b64 in files.items():
        fd = _open_beneath(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, create_dirs=True)
        data = binascii.a2b_base64(b64)
        try:
            while data:
                data = data[os.write(fd, data):]
        finally:
            os.close(fd)


def _fetch_files(paths, limit):
    import binascii
    import errno

    files, errors, total = {}, {}, 0
    for path in paths:
        try:
            fd = _open_beneath(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO the program left must not block
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
                files[path] = binascii.b2a_base64(b"".join(chunks), newline=False).decode()
        finally:
            os.close(fd)
    return files, errors


def _run_python(path, argv, sigint_w):
    """Run the script at `path` as `python path` does (CPython's _PyRun_SimpleFileObject, step by step) in this
    already started, forked interpreter, then end as CPython ends: SystemExit propagates to the top of this
    process, where CPython itself reports it and shuts the interpreter down (threads joined, atexit handlers,
    open files flushed by their finalisers, stdio flushed), with no runner frame left active. Never returns."""
    import builtins
    import types

    main = types.ModuleType("__main__")
    main.__dict__.update({"__annotations__": {}, "__builtins__": builtins})
    sys.modules["__main__"] = main
    sys.argv = [path, *argv]
    sys.orig_argv = [sys.orig_argv[0] if sys.orig_argv else sys.executable, path, *argv]
    sys.path.insert(0, os.path.dirname(path))  # the script's directory, as for `python path`
    d = main.__dict__
    d["__file__"], d["__cached__"] = path, None
    d["__loader__"] = sys.modules["_frozen_importlib_external"].SourceFileLoader("__main__", path)
    try:
        with open(path, "rb") as f:
            source = f.read()
        if b"\0" in source:  # only the file tokenizer words this error as a script run shows it
            _run_file_parser(path, d)
        else:  # the file's bytes, so the parser decodes them as it decodes a script (PEP 263 cookie, BOM)
            code = compile(source, path, "exec", dont_inherit=True)
            _set_aside_runner_modules()
            exec(code, d)
    except SystemExit:
        _flush_io()
        raise  # reported by CPython at the top, as `python path` reports it (__file__ stays set, as there)
    except BaseException as e:  # noqa: BLE001 - the program's uncaught exception, printed as CPython prints it
        _flush_io()
        tb = e.__traceback__  # drop the runner's frames at its head: the user's frames only, as CPython shows them
        while tb is not None and tb.tb_frame.f_code in (_run_python.__code__, _run_file_parser.__code__):
            tb = tb.tb_next
        e.__traceback__ = tb  # what the hook prints (the chained exceptions' tracebacks never held this frame)
        sys.last_type, sys.last_value, sys.last_traceback = type(e), e, tb
        try:
            sys.excepthook(type(e), e, tb)
        except BaseException as hook_error:  # noqa: BLE001
            print("Error in sys.excepthook:", file=sys.stderr)
            sys.__excepthook__(type(hook_error), hook_error, hook_error.__traceback__)
            print("\nOriginal exception was:", file=sys.stderr)
            sys.__excepthook__(type(e), e, tb)
        del e, tb
        status = 1
        if sys.last_type is KeyboardInterrupt:
            # CPython then ends by SIGINT after its shutdown; no Python runs after that, so the supervisor is
            # told to report this exit (code 130) as death by SIGINT, as the shell would see it. The pipe carries
            # one flag, never parsed: a program that writes to it can only make its own exit 130 read as SIGINT.
            try:
                os.write(sigint_w, b"!")
            except OSError:
                pass
            status = 130
        _forget_file(d)
        raise SystemExit(status) from None
    _flush_io()
    _forget_file(d)
    raise SystemExit(0)


def _set_aside_runner_modules():
    """Just before the program runs, the modules the runner (and the zygote) imported beyond `site`'s leave
    sys.modules, as in a fresh `python main.py`; a program that imports one gets it anew. They stay referenced
    from the runner's namespace, which outlives shutdown: CPython's shutdown clears every module in sys.modules,
    and tearing down these (ctypes above all) would cost every request about a millisecond of CPU."""
    global _RUNNER_MODULES
    _RUNNER_MODULES = {name: sys.modules.pop(name) for name in list(sys.modules) if name not in _SITE_MODULES}


def _run_file_parser(path, d):
    """Parse and run `path` with CPython's own file entry point, PyRun_FileExFlags (ctypes, imported only here:
    it costs milliseconds); an exception it raises comes back as a Python exception."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.fopen.restype = ctypes.c_void_p
    libc.fopen.argtypes = (ctypes.c_char_p, ctypes.c_char_p)
    run_file = ctypes.pythonapi.PyRun_FileExFlags
    run_file.argtypes = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.py_object, ctypes.py_object,
                         ctypes.c_int, ctypes.c_void_p)
    run_file.restype = ctypes.py_object
    fp = libc.fopen(os.fsencode(path), b"rb")
    if not fp:
        raise OSError(ctypes.get_errno(), "cannot open the script", path)
    _set_aside_runner_modules()
    run_file(fp, os.fsencode(path), 257, d, d, 1, None)  # 257: Py_file_input; closeit=1: the parser closes fp


def _flush_io():
    for stream in (sys.stderr, sys.stdout):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001 - as CPython's flush_io: a broken stream is not the runner's error
            pass


def _forget_file(d):
    """After a script that did not call sys.exit, CPython removes the __file__ and __cached__ it had set."""
    for key in ("__file__", "__cached__"):
        d.pop(key, None)


def _capped(data, limit):
    """Decoded head + tail of a compiler's output, at most `limit` bytes kept."""
    half = max(1, limit // 2)
    if len(data) <= 2 * half:
        return data.decode("utf-8", errors="replace"), False
    dropped = len(data) - 2 * half
    return (data[:half].decode("utf-8", errors="replace") + f"\n...[{dropped} bytes truncated]...\n"
            + data[-half:].decode("utf-8", errors="replace")), True


def _compile(spec, src, run_cpu):
    """Run the compiler (stdin /dev/null, its own session, CPU rlimit, killed at spec["timeout"]) and return
    SandboxFusion's compile_result fields; the compiler shares the sandbox, its cgroup and its rlimits.
    posix_spawn and poll, not `subprocess`: importing that costs ~10 ms of CPU in every sandbox."""
    import resource
    import select
    import time

    argv = [arg.replace("{src}", src) for arg in spec["argv"]]
    # Inherited by the compiler; the program lowers it to its own limit before it runs.
    resource.setrlimit(resource.RLIMIT_CPU, (spec["cpu"], max(spec["cpu"], run_cpu)))
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    null = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
    started = time.monotonic()
    try:
        pid = os.posix_spawn(argv[0], argv, dict(os.environ), setsid=True, file_actions=[
            (os.POSIX_SPAWN_DUP2, null, 0), (os.POSIX_SPAWN_DUP2, out_w, 1), (os.POSIX_SPAWN_DUP2, err_w, 2)])
    except OSError as e:
        for fd in (out_r, out_w, err_r, err_w, null):
            os.close(fd)
        return {"status": "Error", "execution_time": None, "return_code": None, "stdout": "",
                "stderr": f"cannot start the compiler {argv[0]}: {e}"}
    for fd in (out_w, err_w, null):
        os.close(fd)
    chunks = {out_r: [], err_r: []}
    poller = select.poll()
    for fd in chunks:
        poller.register(fd, select.POLLIN)
    live, status = set(chunks), "Finished"
    deadline = started + spec["timeout"]
    while live:
        left = deadline - time.monotonic()
        if left <= 0:
            status = "TimeLimitExceeded"
            try:
                os.killpg(pid, 9)  # the whole session: driver, cc1plus, as, ld
            except OSError:
                pass
            deadline = float("inf")  # now read what is left until every writer is gone
            continue
        for fd, _ in poller.poll(min(left, 3600) * 1000):
            data = os.read(fd, 1 << 16)
            if data:
                chunks[fd].append(data)
            else:
                poller.unregister(fd)
                live.discard(fd)
    _, wait_status = os.waitpid(pid, 0)
    elapsed = time.monotonic() - started
    for fd in chunks:
        os.close(fd)
    code = os.waitstatus_to_exitcode(wait_status)
    stdout, cut_out = _capped(b"".join(chunks[out_r]), spec["output_limit"])
    stderr, cut_err = _capped(b"".join(chunks[err_r]), spec["output_limit"])
    return {"status": status, "execution_time": elapsed,
            "return_code": (code if code >= 0 else 128 - code) if status == "Finished" else None,
            "stdout": stdout, "stderr": stderr, "truncated": cut_out or cut_err}


def _set_rlimits(limits, cpu=True):
    """The program's rlimits; `cpu=False` leaves RLIMIT_CPU for later (the compiler gets its own first)."""
    import resource

    for name, value in (("RLIMIT_FSIZE", limits["fsize"]), ("RLIMIT_NOFILE", limits["nofile"]),
                        ("RLIMIT_CORE", 0), *((("RLIMIT_CPU", limits["cpu"]),) if cpu else ())):
        resource.setrlimit(getattr(resource, name), (value, value))


def _child(req, path, meta_w, sigint_w):
    """The program: compile first when the language needs it, then exec it, or run Python in place. The meta pipe
    is closed before the request's code runs (exec closes it: it is close-on-exec; Python closes it by hand)."""
    import time

    limits = req["rlimits"]
    spec = req.get("compile")
    if spec:
        _set_rlimits(limits, cpu=False)  # the compiler gets its own CPU limit (spec["cpu"])
        result = _compile(spec, path, limits["cpu"])
        ok = result["status"] == "Finished" and result["return_code"] == 0
        _mframe(meta_w, {"compile": result, "start": time.monotonic(), "run": ok})
        if not ok:
            os._exit(0)
        _set_rlimits(limits)
        os.execv(req["run"][0], [*req["run"], *req.get("argv", [])])
    _set_rlimits(limits)
    if req["language"] == "python":
        os.close(meta_w)
        _run_python(path, req.get("argv", []), sigint_w)
    interpreter = req["interpreter"]
    os.execv(interpreter[0], [*interpreter, path, *req.get("argv", [])])


def _read_meta(fd):
    """One frame the program process sent on the meta pipe (before any of the request's code ran: the pipe is
    closed before it runs); None if it ended (or died) first, or sent anything else."""
    import marshal

    try:
        size = int.from_bytes(_read_exact(fd, 4), "big")
        if size > 1 << 24:
            return None
        frame = marshal.loads(_read_exact(fd, size))
    except Exception:  # noqa: BLE001 - whatever arrives, the supervisor goes on
        return None
    return frame if isinstance(frame, dict) else None


def _flag_set(fd):
    """Whether anything was written to the flag pipe, read without blocking (a daemonised child of the program
    may still hold it open); what was written is never looked at."""
    try:
        os.set_blocking(fd, False)
        return bool(os.read(fd, 1))
    except OSError:
        return False


def _prepare():
    """Everything the runner needs before a request, once per interpreter (the zygote's: once per service)."""
    global _SITE_MODULES
    _add_site_packages()
    _site_builtins()
    _SITE_MODULES = frozenset(sys.modules)  # what a fresh `python main.py` has too (site and what it imports)
    # Imported before `ready`, so not on the request's path. What the interpreter holds is freed again at each
    # program's shutdown (copy-on-write faults), so it stays small: no json, base64 or ctypes (`re` above all).
    import binascii  # noqa: F401
    import errno  # noqa: F401
    import marshal  # noqa: F401
    import resource  # noqa: F401
    import time  # noqa: F401
    import types  # noqa: F401


def main():
    _prepare()
    target = sys.argv[1]
    if target.startswith("file:"):  # docker backend: no extra fd crosses `docker exec`, frames go to a file
        result_fd = os.open(target[5:], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    else:
        result_fd = int(target)
    _supervise(result_fd)


def _supervise(result_fd, child_setup=None):
    """Fork the program's process (it waits for the request on stdin), report `ready`, wait for it, report the
    result on `result_fd`; `child_setup` runs first in the program's process. Never returns."""
    import gc

    os.set_inheritable(result_fd, False)

    gc.freeze()  # the runner's objects move to a permanent generation: the child's GC never touches their pages
    # The program's process is forked now, before any request, and waits for it on stdin: no fork on the
    # request's path. It tells this supervisor what to do afterwards (fetch_files, ...) through `meta`, before the
    # request's code runs; `sigint` is a one-byte flag it may raise at its end (see _run_python).
    meta_r, meta_w = os.pipe()
    sigint_r, sigint_w = os.pipe()
    # Copies of the output pipes, kept to write the end marker once the program has exited: the host then
    # knows the output is complete without waiting for every other holder of the pipes to die.
    out_copy, err_copy = os.dup(1), os.dup(2)
    pid = os.fork()
    if pid == 0:
        for fd in (out_copy, err_copy, meta_r, sigint_r, result_fd):
            os.close(fd)
        if child_setup is not None:
            child_setup()
        _program(meta_w, sigint_w)
    os.close(meta_w)
    os.close(sigint_w)
    if child_setup is None:
        _undumpable()
    # Made after the fork, so the program's memory never held it; the supervisor is not dumpable, so the program
    # cannot read it from here either: the program cannot write the end of its own output.
    nonce = os.urandom(16).hex()
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    _frame(result_fd, {"ready": True, "nonce": nonce})
    known = {}
    try:
        _report(result_fd, pid, meta_r, sigint_r, out_copy, err_copy, nonce, known)
    except Exception as e:  # noqa: BLE001 - what is left to fail here works on what the program left (its
        # files, its exit): a fault is reported as the program's failure (exit_reason runner_fault), never as
        # the service's, so no program can turn its wrong answer into an infrastructure error
        _frame(result_fd, {"exit": known.get("exit", {"code": 1}), "ran": True, "elapsed": known.get("elapsed", 0.0),
                           "cpu": 0.0, "maxrss_kb": 0, "files": {}, "file_errors": {},
                           "runner_fault": "%s: %s" % (type(e).__name__, e)})
    os._exit(0)


def _undumpable():
    """PR_SET_DUMPABLE 0 for this supervisor (a zygote sandbox's supervisor, its pid 1, already is): the
    program's process, same uid, can then neither read its memory nor open its fds through /proc. ctypes,
    loaded only here, after the program's process was forked from this one."""
    import ctypes

    if ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


def _report(result_fd, pid, meta_r, sigint_r, out_copy, err_copy, nonce, known):
    """Wait for the program's process, mark the end of its output, report what it did (`known`: its exit and
    run time once they are, for the report of a fault after them)."""
    import time

    meta = _read_meta(meta_r) or {}
    start = meta.get("start")
    ran = "start" in meta and "setup_error" not in meta
    if meta.get("compiled"):
        step = _read_meta(meta_r)
        ran = bool(step and step.get("run"))
        if step is not None:
            _frame(result_fd, {"compile": step["compile"]})
            start = step["start"]
    _, status, usage = os.wait4(pid, 0)
    end = time.monotonic()
    sigint = _flag_set(sigint_r)
    marker = ("\x00agentrl-run-end:%s\x00" % nonce).encode()
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
    if os.WIFEXITED(status):
        code = os.WEXITSTATUS(status)
        exit_info = {"signal": 2} if sigint and code == 130 else {"code": code}
    else:
        exit_info = {"signal": os.WTERMSIG(status)}
    known.update({"exit": exit_info, "elapsed": end - start})
    files, errors = _fetch_files(meta.get("fetch_files") or [], meta.get("fetch_limit", 0))
    _frame(result_fd, {"exit": exit_info, "ran": ran, "elapsed": end - start,
                       "cpu": usage.ru_utime + usage.ru_stime, "maxrss_kb": usage.ru_maxrss, "files": files,
                       "file_errors": errors})


def _program(meta_w, sigint_w):
    """The forked program process: read the request, report what the supervisor needs, then run the code."""
    import marshal
    import time

    try:
        size = int.from_bytes(_read_exact(0, 4), "big")
        req = marshal.loads(_read_exact(0, size))  # written by the host (trusted), before the code ran
    except (EOFError, ValueError, TypeError):
        os._exit(3)
    meta = {"start": time.monotonic(), "fetch_files": req.get("fetch_files") or [],
            "fetch_limit": req["fetch_limit"], "compiled": bool(req.get("compile"))}
    path = os.path.join(os.getcwd(), req["script"])
    try:
        _write_files(req.get("files") or {})
        fd = _open_beneath(req["script"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            data = req["code"].encode("utf-8", errors="surrogatepass")
            while data:
                data = data[os.write(fd, data):]
        finally:
            os.close(fd)
    except (OSError, ValueError) as e:
        meta["setup_error"] = f"could not write files: {e}"
    _mframe(meta_w, meta)
    if "setup_error" in meta:
        os._exit(0)
    try:
        _child(req, path, meta_w, sigint_w)  # Python ends with SystemExit, which goes up to CPython's own handling
    except Exception as e:  # noqa: BLE001 - a runner failure before the program started
        print(f"sandbox runner: {type(e).__name__}: {e}", file=sys.stderr)
        sys.stderr.flush()
        os._exit(126)


if __name__ == "__main__":
    main()
