"""Runs INSIDE a sandbox as a session's persistent interpreter (`python -I -S -c <text> RESULT_FD`); stdlib only.

Protocol: the host writes frames (4-byte big-endian length + JSON) to this process's stdin, which is moved to a
private fd at start (the cells' stdin is /dev/null). `{"op": "cell", "id", "code"}` runs a cell in one
persistent namespace; `{"op": "interrupt", "id"}` raises KeyboardInterrupt in the main thread if that cell is
still running. After a cell, its stdout/stderr are flushed and an end marker carrying the cell id is written to
both, so the host can cut the streams per cell; then a result frame goes to RESULT_FD:
`{"id", "ok", "error": {"name", "value", "traceback"} | None}`. As in Jupyter, a final expression's repr is
printed.
"""

import os
import sys

# The backend prepends these definitions to this text (bwrap.py, zygote.py); declared here for readers and
# linters, never imported: `__name__` is "__main__" wherever this runs.
if __name__ == "<prelude>":
    from sandbox.backends.prelude_src import _add_site_packages, _frame, _read_exact


class Session:
    def __init__(self, ctl_fd, result_fd):
        import builtins
        import queue
        import threading
        import types

        self.ctl_fd, self.result_fd = ctl_fd, result_fd
        self.main = types.ModuleType("__main__")
        self.main.__dict__["__builtins__"] = builtins
        sys.modules["__main__"] = self.main
        sys.path.insert(0, "")
        sys.argv = [""]
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
            if msg["op"] == "cell":
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
                error = self.run_cell(cell)
            except KeyboardInterrupt:  # an interrupt that arrived just as the cell ended
                continue
            self.finish(cell, error)

    def finish(self, cell, error):
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
                _frame(self.result_fd, {"id": cell["id"], "error": error})
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


def _serve_session(result_fd, fsize, nofile):
    """The session's interpreter: control frames on stdin, results on `result_fd`. Never returns."""
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
    Session(ctl_fd, result_fd).serve()


if __name__ == "__main__":
    main()
