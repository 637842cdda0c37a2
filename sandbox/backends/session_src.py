"""Runs INSIDE a sandbox as a session's persistent interpreter (`python -I -S -c <text> RESULT_FD`); stdlib only.

Protocol: the host writes frames (4-byte big-endian length + JSON) to this process's stdin, which is moved to a
private fd at start (the cells' stdin is /dev/null). `{"op": "cell", "id", "code"}` runs a cell in one
persistent namespace; `{"op": "interrupt", "id"}` raises KeyboardInterrupt in the main thread if that cell is
still running. After a cell, its stdout/stderr are flushed and an end marker carrying the cell id is written to
both, so the host can cut the streams per cell; then a result frame goes to RESULT_FD:
`{"id", "ok", "error": {"name", "value", "traceback"} | None, "changed"}`. As in Jupyter, a final expression's
repr is printed. A cell that carries the snapshot limits (`"ws": [max_bytes, max_files]`) is answered with whether
the work dir changed since the last such cell (None: past those limits); between cells, `{"op": "snapshot"}` answers
with the work dir's files and `{"op": "lay_down", "entries"}` makes the work dir hold exactly those
(workspace_src.py).
"""

import os
import sys

# The backend prepends these definitions to this text (bwrap.py, zygote.py); declared here for readers and
# linters, never imported: `__name__` is "__main__" wherever this runs.
if __name__ == "<prelude>":
    from sandbox.backends.prelude_src import _add_site_packages, _frame, _read_exact
    from sandbox.backends.workspace_src import _lay_down, _workspace_entries, _workspace_stamp


class Session:
    def __init__(self, ctl_fd, result_fd, forker=None):
        import builtins
        import types

        self.main = types.ModuleType("__main__")
        self.main.__dict__["__builtins__"] = builtins
        sys.modules["__main__"] = self.main
        sys.path.insert(0, "")
        sys.argv = [""]
        self.forker = forker  # a fork source's (fork_src.py): called in each forked child
        self.root = os.getcwd()  # the work dir, which snapshots hold
        self.stamp = None  # the work dir's stamp after the last cell (None: not taken, or past the limits)
        self._connect(ctl_fd, result_fd)

    def _connect(self, ctl_fd, result_fd):
        """Serve on these fds, with fresh cell bookkeeping (a forked child's state has its source's)."""
        import queue
        import threading

        self.ctl_fd, self.result_fd = ctl_fd, result_fd
        self.cells = queue.Queue()
        self.lock = threading.Lock()
        self.current = None
        self.main_ident = threading.get_ident()

    def reader(self):
        import json
        import signal

        while True:
            try:
                msg = json.loads(_read_exact(self.ctl_fd, int.from_bytes(_read_exact(self.ctl_fd, 4), "big")))
            except (EOFError, OSError, ValueError):
                os._exit(0)  # the host is gone: end the session
            if msg["op"] in ("cell", "fork", "snapshot", "lay_down"):
                self.cells.put(msg)
            elif msg["op"] == "interrupt":
                with self.lock:
                    if self.current == msg["id"]:
                        signal.pthread_kill(self.main_ident, signal.SIGINT)

    def run_cell(self, cell):
        import ast
        import linecache

        name = f"<cell-{cell['n']}>"
        code = cell["code"]
        linecache.cache[name] = (len(code), None, code.splitlines(True), name)
        error = None
        with self.lock:
            self.current = cell["id"]
        try:
            tree = ast.parse(code, name, "exec")
            last = None
            if tree.body and isinstance(tree.body[-1], ast.Expr):
                last = ast.Expression(tree.body.pop().value)
            exec(compile(tree, name, "exec"), self.main.__dict__)
            if last is not None:
                value = eval(compile(last, name, "eval"), self.main.__dict__)
                if value is not None:
                    print(repr(value))
        except BaseException as e:  # the cell's own exception: reported, the session lives on
            import traceback

            tb = e.__traceback__.tb_next if e.__traceback__ is not None else None
            if isinstance(e, SyntaxError):
                tb = None
            error = {"name": _capped_text(type(e).__name__), "value": _capped_text(str(e)),
                     "traceback": _capped_text("".join(traceback.format_exception(type(e), e, tb)))}
        finally:
            with self.lock:
                self.current = None
        return error

    def serve(self):
        import threading

        threading.Thread(target=self.reader, daemon=True).start()
        _frame(self.result_fd, {"ready": True})
        while True:
            try:
                cell = self.cells.get()
                if cell["op"] == "fork":
                    if self.fork(cell):  # a forked child's interpreter: serve its own pipes from here on
                        return self.serve()
                    continue
                if cell["op"] in ("snapshot", "lay_down"):
                    self.workspace(cell)
                    continue
                error = self.run_cell(cell)
            except KeyboardInterrupt:  # an interrupt that arrived just as the cell ended
                continue
            self.finish(cell, error)

    def fork(self, msg):
        """Fork once per child the service announced on the fork socket (fd 4: the child's stdin, stdout,
        stderr, result fd and cgroup.procs fds). True in a child's interpreter (its fds in place), False here
        after the result frame `{"id", "error"}`."""
        import _socket

        sock = _socket.socket(fileno=os.dup(4))
        fd_size = len((0).to_bytes(4, sys.byteorder))
        error, started = None, []
        if self.forker is None:
            error = "this session is not a fork source"
        else:
            error = self.forker(None, None, None)
        for _ in range(msg["n"]):
            _data, ancillary, _, _ = sock.recvmsg(1 << 12, _socket.CMSG_SPACE(16 * fd_size))
            fds = []
            for level, kind, payload in ancillary:
                if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
                    fds += [int.from_bytes(payload[i:i + fd_size], sys.byteorder)
                            for i in range(0, len(payload) - len(payload) % fd_size, fd_size)]
            if error is None and len(fds) >= 4:
                for stream in (sys.stdout, sys.stderr):
                    try:
                        stream.flush()
                    except (OSError, ValueError):
                        pass
                pid = os.fork()
                if pid == 0:
                    source_fds = {self.ctl_fd, self.result_fd, 4, sock.detach()}  # closed by the forker
                    self.forker(fds[:4], fds[4:], source_fds)
                    ctl = os.dup(0)
                    null = os.open("/dev/null", os.O_RDONLY)
                    os.dup2(null, 0)
                    os.close(null)
                    os.set_inheritable(ctl, False)
                    os.set_inheritable(3, False)
                    self.forker = None  # a child is no fork source: its filter is the full one
                    self._connect(ctl, 3)
                    return True
                started.append(pid)
            for fd in fds:
                os.close(fd)
        sock.close()
        for pid in started:  # each C exits once G, its child's pid 1, runs (they tear down side by side)
            os.waitpid(pid, 0)
        _frame(self.result_fd, {"id": msg["id"], "error": error})
        return False

    def workspace(self, msg):
        """Answer a snapshot of the work dir's files, or lay a snapshot's files down (between cells)."""
        try:
            if msg["op"] == "snapshot":
                reply = _workspace_entries(self.root, *msg["ws"])
            else:
                _lay_down(self.root, msg["entries"])
                self.stamp = _workspace_stamp(self.root, *msg["ws"])  # what the next cell's change is counted from
                reply = {"error": None}
        except Exception as e:  # noqa: BLE001 - e.g. a directory a cell made unreadable: the host's error
            reply = {"error": "%s: %s" % (type(e).__name__, e)}
        _frame(self.result_fd, {"id": msg["id"], **reply})

    def changed(self, limits):
        """Whether the work dir changed since the last cell; None past the snapshot `limits` or without them."""
        if limits is None:
            return None
        try:
            stamp = _workspace_stamp(self.root, *limits)
        except OSError:
            stamp = None
        changed = None if stamp is None else stamp != self.stamp
        self.stamp = stamp
        return changed

    def finish(self, cell, error):
        changed = self.changed(cell.get("ws"))
        for _attempt in range(3):
            try:
                for stream in (sys.stdout, sys.stderr):
                    try:
                        stream.flush()
                    except (OSError, ValueError):
                        pass
                marker = f"\x00agentrl-cell-end:{cell['id']}\x00".encode()
                for fd in (1, 2):
                    try:
                        os.write(fd, marker)
                    except OSError:
                        pass
                _frame(self.result_fd, {"id": cell["id"], "error": error, "changed": changed})
                return
            except KeyboardInterrupt:
                continue


def _capped_text(text, limit=1 << 14):
    """Head and tail of `text`: a result frame stays far below what the host accepts (SESSION_FRAME_BYTES)."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return text[:half] + "\n...[%d characters truncated]...\n" % (len(text) - 2 * half) + text[-half:]


def main():
    _add_site_packages()
    _serve_session(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))


def _serve_session(result_fd, fsize, nofile, forker=None):
    """The session's interpreter: control frames on stdin, results on `result_fd` (a fork source: `forker`).
    Never returns."""
    import resource

    for name, value in (("RLIMIT_FSIZE", fsize), ("RLIMIT_NOFILE", nofile), ("RLIMIT_CORE", 0)):
        resource.setrlimit(getattr(resource, name), (value, value))
    ctl_fd = os.dup(0)
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for fd in (ctl_fd, result_fd):
        os.set_inheritable(fd, False)
    sys.argv = [""]
    Session(ctl_fd, result_fd, forker).serve()


if __name__ == "__main__":
    main()
