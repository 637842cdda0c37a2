"""Runs INSIDE the sandbox: the trusted harness that runs an answer's code, then its unit tests, and proves it.

Stdlib only, no repo imports: `agentrl.agent_loop.code_tests` sends a one-line program that executes this file's
text in a fresh namespace (builtins copied at that moment) and calls `main` with the answer's source. The reward on
the host trusts one thing only: a report line authenticated with HMAC-SHA256 under a per-run nonce. The nonce
reaches this process on stdin (never in the program text or a file), is read before the answer runs, and from then
on lives only in the closure of an audit hook, which no Python object refers to. The hook writes the report once,
when it is raised with a token object only the harness holds, and refuses the introspection that could reach the
token, the harness's state or raw memory (frames, gc scans, tracing, ctypes/cffi, /proc, subprocesses, signals to
other processes).

Why the rest is built the way it is:
- the answer and the tests run in a worker thread: Python signal handlers (which receive the current frame)
  can only be installed from the main thread, which here runs nothing but this harness's wait;
- the harness runs in a private namespace whose builtins were copied before the answer ran, and it binds every
  function it needs before the answer runs, so patching `builtins`, `json`, `os` or `sys.stdout` changes nothing;
- the tests (rewritten on the host so that comparisons and arithmetic go through `strict_*` below) run with that
  copy of the builtins, in a namespace the answer cannot reach, with modules imported before the answer ran;
- `SystemExit` and every other exception from the answer or a test is caught and recorded: an early exit
  cannot skip the tests, and the exit status of the process means nothing to the host.
"""

import os
import sys

REPORT_EVENT = "agentrl.harness.report"
REPORT_MARKER = "AGENTRL-HARNESS-REPORT"
MAX_DEPTH = 100
MAX_TEXT = 300

# Modules that give raw memory access or run C code by address: never importable once the answer runs.
BLOCKED_MODULE_ROOTS = ("ctypes", "_ctypes", "cffi", "_cffi_backend", "_testcapi", "_testinternalcapi",
                        "_testbuffer", "_testmultiphase", "_testimportmultiple", "_testsinglephase", "_xxtestfuzz",
                        "_xxsubinterpreters", "_xxinterpchannels", "_posixsubprocess", "_ctypes_test")
# Audit events refused outright (verified against CPython 3.11: each is raised by the call named).
BLOCKED_EVENTS = frozenset([
    "sys.addaudithook", "sys._current_frames", "sys._current_exceptions", "sys.settrace", "sys.setprofile",
    "gc.get_objects", "gc.get_referrers", "gc.get_referents", "code.__new__",
    "os.fork", "os.forkpty", "os.exec", "os.spawn", "os.posix_spawn", "os.system", "subprocess.Popen",
    "os.kill", "os.killpg", "signal.pthread_kill", "resource.prlimit", "os.chdir", "os.symlink",
])
# Attribute reads CPython 3.11 audits as "object.__getattr__" that yield a frame object.
FRAME_ATTRIBUTES = frozenset(["tb_frame", "gi_frame", "cr_frame", "ag_frame"])
BLOCKED_PATH_ROOTS = ("/proc", "/sys", "/dev/fd", "/dev/stdin", "/dev/stdout", "/dev/stderr")


# ---------------------------------------------------------------- strict values (also imported on the host)

class _Opaque:
    """A value of a type that is not a builtin one (nor derived from one): compared only with care."""

    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj

    def __repr__(self):
        return "<%s object>" % type_name(type(self.obj))


def type_name(tp):
    """A class's name without running any of its code (a metaclass may override attribute access)."""
    name = type.__dict__["__qualname__"].__get__(tp, type)
    return str.__str__(name) if isinstance(name, str) else "?"


def _normalise_items(items, depth):
    out = []
    for item in items:
        out.append(normalise(item, depth + 1))
    return out


def normalise(value, depth=0):
    """An exact-builtin copy of `value`, or `_Opaque` where a part is not builtin-derived.

    Subclasses of builtins are read with the builtin type's own methods (`str.__str__(v)`, `list.copy(v)`), so
    an overridden `__eq__`, `__iter__` or `__hash__` is never consulted and comparisons of the result run only C
    code. This is what defeats an "always equal" object and its cousins."""
    tp = type(value)
    if depth > MAX_DEPTH:
        return _Opaque(value)
    if value is None or tp is bool or tp is range:
        return value
    if issubclass(tp, int):
        return int.__int__(value)
    if issubclass(tp, float):
        return float.__float__(value)
    if issubclass(tp, complex):
        return complex.__complex__(value)
    if issubclass(tp, str):
        return str.__str__(value)
    if issubclass(tp, bytes):
        return bytes.__bytes__(value)
    if issubclass(tp, bytearray):
        return bytearray.copy(value)
    if issubclass(tp, list):
        return _normalise_items(list.copy(value), depth)
    if issubclass(tp, tuple):
        return tuple(_normalise_items(tuple.__getitem__(value, slice(None)), depth))
    if issubclass(tp, dict):
        out = {}
        for key, item in dict.items(dict.copy(value)):
            key = normalise(key, depth + 1)
            if has_opaque(key):
                return _Opaque(value)
            out[key] = normalise(item, depth + 1)
        return out
    if issubclass(tp, (set, frozenset)):
        base = set if issubclass(tp, set) else frozenset
        items = _normalise_items(base.copy(value), depth)
        if any(has_opaque(item) for item in items):
            return _Opaque(value)
        return base(items)
    return _Opaque(value)


def has_opaque(value):
    """Whether a normalised value contains an `_Opaque` anywhere."""
    tp = type(value)
    if tp is _Opaque:
        return True
    if tp is list or tp is tuple:
        return any(has_opaque(v) for v in value)
    if tp is dict:
        return any(has_opaque(v) for v in dict.values(value))
    return False


def short(value):
    """repr of a normalised value, cut to MAX_TEXT characters (runs no code of the answer)."""
    text = repr(value)
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + "..."


class StrictTypeError(TypeError):
    """A test compared or combined the answer's non-builtin object with a builtin value."""


# Classes of the modules the tests import (Fraction, Decimal, ...), bound before the answer ran; identity only
# (a metaclass's __eq__/__hash__ would run the answer's code in a set lookup).
TRUSTED_TYPES = []


def _trusted(value):
    tp = type(value.obj) if type(value) is _Opaque else None
    return tp is not None and any(t is tp for t in TRUSTED_TYPES)


def _mixed(left, right, what):
    """Both operands normalised; the pair is used natively (their own methods run) only if both sides are
    opaque objects of one type (the answer's class compared with itself) or an opaque side is of a type the
    tests imported; a builtin value never meets the answer's object. False: compare the exact copies."""
    lo, ro = has_opaque(left), has_opaque(right)
    if not lo and not ro:
        return False
    if type(left) is _Opaque and type(right) is _Opaque and type(left.obj) is type(right.obj):
        return True
    if (not lo or _trusted(left)) and (not ro or _trusted(right)):
        return True
    culprit = left if lo else right
    raise StrictTypeError("%s: a %s value cannot be compared with or combined with a builtin value (a test "
                          "expects builtin values: int, str, list, ...)" % (what, short(culprit)))


_COMPARE = {
    "==": lambda a, b: a == b, "!=": lambda a, b: a != b, "<": lambda a, b: a < b, "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b, ">=": lambda a, b: a >= b, "in": lambda a, b: a in b,
    "not in": lambda a, b: a not in b,
}
_BINARY = {
    "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b, "/": lambda a, b: a / b,
    "//": lambda a, b: a // b, "%": lambda a, b: a % b, "**": lambda a, b: a ** b, "@": lambda a, b: a @ b,
    "<<": lambda a, b: a << b, ">>": lambda a, b: a >> b, "&": lambda a, b: a & b, "|": lambda a, b: a | b,
    "^": lambda a, b: a ^ b,
}


def strict_compare(op, a, b, last=None):
    """`a op b` for the tests: exact builtin copies compared in C, never the answer's `__eq__`.

    `is`/`is not` stay identity tests. When `last` (a list) is given, a False result leaves the two sides'
    reprs in it, for the failure message."""
    if op == "is":
        return a is b
    if op == "is not":
        return a is not b
    left, right = normalise(a), normalise(b)
    if _mixed(left, right, "comparison %s" % op):
        result = _COMPARE[op](a, b)
        if type(result) is not bool:
            raise StrictTypeError("comparison %s of two %s objects did not return a bool" % (op, short(left)))
    else:
        result = _COMPARE[op](left, right)
    if last is not None and result is False:
        last[:] = [op, short(left), short(right)]
    return result


def strict_chain(first, links, last=None):
    """A chained comparison `first op1 x1 op2 x2 ...`; each `x` is a thunk, evaluated once and lazily."""
    left = first
    for op, thunk in links:
        right = thunk()
        if not strict_compare(op, left, right, last):
            return False
        left = right
    return True


def strict_binary(op, a, b):
    """`a op b` for the tests: builtin values compute on exact copies (no `__sub__` of the answer's)."""
    if op == "|" and (issubclass(type(a), type) or issubclass(type(b), type)):
        return a | b  # a union of types, e.g. isinstance(x, int | None)
    left, right = normalise(a), normalise(b)
    if _mixed(left, right, "operator %s" % op):
        return _BINARY[op](a, b)
    return _BINARY[op](left, right)


# ---------------------------------------------------------------- the run inside the sandbox

def _read_all(fd):
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _lexical_abs(path, cwd):
    """Absolute, with '.', '..' and repeated '/' resolved (lexically)."""
    if not path.startswith("/"):
        path = cwd + "/" + path
    parts = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if parts:
                parts.pop()
        else:
            parts.append(part)
    return "/" + "/".join(parts)


def _resolve(path, cwd, readlink):
    """`path` with every symlink resolved, using only functions bound before the answer ran."""
    path = _lexical_abs(path, cwd)
    for _ in range(40):
        parts = path.split("/")[1:]
        for i in range(len(parts)):
            head = "/" + "/".join(parts[:i + 1])
            try:
                target = readlink(head)
            except (OSError, ValueError):
                continue
            base = "/" + "/".join(parts[:i])
            path = _lexical_abs(target if target.startswith("/") else base + "/" + target,
                                "/") + ("/" + "/".join(parts[i + 1:]) if parts[i + 1:] else "")
            break
        else:
            return path
    return "/proc/too-many-links"


def path_allowed(path, cwd, readlink):
    """Whether the answer may open `path`: not /proc (its own memory), /sys, or fd aliases of /proc."""
    if type(path) is int:
        return True
    if type(path) is bytes:
        path = bytes.decode(path, "utf-8", "surrogateescape")
    if type(path) is not str:
        return False  # a path-like object could name one file to this check and another to open()
    real = _resolve(path, cwd, readlink)
    return not any(real == root or real.startswith(root + "/") for root in BLOCKED_PATH_ROOTS)


def _blocked_module(name):
    return type(name) is not str or name.split(".")[0] in BLOCKED_MODULE_ROOTS


def _make_hook(nonce, token, out_fd, digest, write, getcwd, readlink):
    """The audit hook: the only holder of the nonce. Writes the report once; refuses dangerous events."""
    reported = []

    def hook(event, args):
        if event == REPORT_EVENT:
            if len(args) != 2 or args[0] is not token or reported or type(args[1]) is not bytes:
                raise RuntimeError("not the harness")
            reported.append(True)
            tag = digest(nonce, args[1], "sha256")
            write(out_fd, b"\n%s %s %s\n" % (REPORT_MARKER.encode(), bytes.hex(tag).encode(),
                                             bytes.hex(args[1]).encode()))
            return
        if event == "sys._getframe":
            # ValueError is what namedtuple, typing and logging already tolerate from sys._getframe.
            raise ValueError("call stack is not available in the test sandbox")
        if event in BLOCKED_EVENTS:
            raise RuntimeError("%s is not allowed in the test sandbox" % event)
        if event == "object.__getattr__" and len(args) > 1 and args[1] in FRAME_ATTRIBUTES:
            raise RuntimeError("frame access is not allowed in the test sandbox")
        if event.startswith("ctypes."):
            raise RuntimeError("ctypes is not allowed in the test sandbox")
        if event == "import" and args and _blocked_module(args[0]):
            raise ImportError("module %r is not allowed in the test sandbox" % (args[0],))
        if event in ("open", "sqlite3.connect") and args and not path_allowed(args[0], getcwd(), readlink):
            raise PermissionError("opening %r is not allowed in the test sandbox" % (args[0],))

    return hook


def _exception_text(exc):
    """`Type: args` of an exception without running its class's code (its __str__ may lie or raise)."""
    args = BaseException.__dict__["args"].__get__(exc, type(exc))
    shown = ", ".join(a if type(a) is str and len(a) <= MAX_TEXT else short(normalise(a)) for a in args[:3])
    return "%s: %s" % (type_name(type(exc)), shown) if shown else type_name(type(exc))


def _snapshot_modules(names):
    """Copies of the modules the tests import, made before the answer runs: the answer may patch the real ones."""
    import importlib
    import types

    modules = {}
    for name in names:
        try:
            modules[name] = importlib.import_module(name)
        except BaseException:  # noqa: BLE001 - the test's own import will then fail the same way
            continue
    snaps = {}
    for name, module in modules.items():  # after every import: a submodule import adds to its parent
        copy = types.ModuleType(name)
        copy.__dict__.update(dict.copy(module.__dict__))
        snaps[name] = copy
        TRUSTED_TYPES.extend(v for v in dict.values(copy.__dict__) if issubclass(type(v), type))
    return snaps


def _run_tests(answer, tests, snaps, trusted_builtins, state):
    """Worker thread: the answer, then each test statement; every outcome is appended to `state`."""
    import builtins
    import types

    kinds, failures = state["kinds"], state["failures"]

    def record(index, kind, detail="", assert_id=None):
        kinds.append(kind)
        if kind != "ok" and len(failures) < 3:
            failures.append([index, kind, detail, assert_id])
    module = types.ModuleType("__main__")
    module.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = module
    try:
        code = compile(answer, "<answer>", "exec")
    except BaseException as exc:  # noqa: BLE001
        state["answer"] = ("compile_error", _exception_text(exc))
        return
    state["phase"] = "answer"
    try:
        exec(code, module.__dict__)
    except BaseException as exc:  # noqa: BLE001 - SystemExit included: an exit before the tests fails them
        kind = "exit_before_tests" if isinstance(exc, SystemExit) else "exception"
        state["answer"] = (kind, _exception_text(exc))
        return
    state["answer"] = ("ok", "")
    namespace = {"__builtins__": trusted_builtins, "__name__": "__agentrl_tests__"}
    for key, value in dict.items(dict.copy(module.__dict__)):
        if type(key) is str and key != "__builtins__" and key != "__name__":
            namespace[key] = value
    last, failed_asserts = [], []

    def check(value, assert_id, message=None):
        if not value:
            failed_asserts.append(assert_id)
            raise AssertionError(message()) if message is not None else AssertionError()

    def import_module(name, attr=None):
        if name not in snaps:
            raise ImportError("module %r is not available to the tests" % name)
        return snaps[name] if attr is None else getattr(snaps[name], attr)

    namespace.update({
        "__agentrl_cmp__": lambda op, a, b: strict_compare(op, a, b, last),
        "__agentrl_chain__": lambda first, links: strict_chain(first, links, last),
        "__agentrl_bin__": strict_binary, "__agentrl_check__": check, "__agentrl_import__": import_module,
    })
    for index, code in enumerate(tests):
        state["phase"] = index
        del last[:], failed_asserts[:]
        try:
            exec(code, namespace)
        except BaseException as exc:  # noqa: BLE001
            kind = "assertion" if isinstance(exc, AssertionError) or failed_asserts else "exception"
            if isinstance(exc, SystemExit):
                kind = "exit_during_tests"
            detail = _exception_text(exc)
            if last and kind == "assertion":
                detail += " (%s %s %s was False)" % (last[1], last[0], last[2])
            record(index, kind, detail, failed_asserts[0] if failed_asserts else None)
            continue
        if failed_asserts:  # the answer caught the test's AssertionError: still a failure
            record(index, "assertion", "AssertionError (caught by the answer)", failed_asserts[0])
        else:
            record(index, "ok")
    state["phase"] = "done"


def main(answer):
    """Read the run's config from stdin, arm the hook, run everything in a worker, report with the nonce."""
    import _thread
    import json
    import time

    try:
        from _hashlib import hmac_digest as digest
    except ImportError:
        import hmac

        def digest(key, msg, name, _hmac=hmac.digest):
            return _hmac(key, msg, name)

    config = json.loads(_read_all(0))
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    nonce = bytes.fromhex(config.pop("nonce"))
    tests = [compile(src, "<test %d>" % i, "exec") for i, src in enumerate(config["tests"])]
    snaps = _snapshot_modules(config.get("modules") or [])
    import builtins

    trusted_builtins = dict.copy(builtins.__dict__)
    for name in list(sys.modules):  # a runner may have imported ctypes itself; the answer must import it anew
        if _blocked_module(name):
            del sys.modules[name]
    token = object()
    out_fd = os.dup(1)
    monotonic = time.monotonic
    sys.addaudithook(_make_hook(nonce, token, out_fd, digest, os.write, os.getcwd, os.readlink))
    del nonce
    state = {"kinds": [], "failures": [], "answer": None, "phase": "start"}
    done = _thread.allocate_lock()
    done.acquire()

    def worker():
        try:
            _run_tests(answer, tests, snaps, trusted_builtins, state)
        except BaseException as exc:  # noqa: BLE001 - reported as a harness failure below
            state["harness_error"] = _exception_text(exc)
        finally:
            done.release()

    try:
        _thread.stack_size(64 << 20)
    except (ValueError, RuntimeError):
        pass
    _thread.start_new_thread(worker, ())
    deadline = monotonic() + float(config["budget_s"])
    finished = False
    while not finished:
        left = deadline - monotonic()
        if left <= 0:
            break
        try:
            finished = done.acquire(True, left)
        except BaseException:  # noqa: BLE001 - a signal in the main thread must not stop the report
            continue
    # repr of exact dicts, lists, strs and ints is C code the answer cannot patch (json.dumps reads module
    # globals it could); the host reads it back with ast.literal_eval.
    summary = {"version": 1, "total": len(tests), "kinds": list(state["kinds"]),
               "failures": list(state["failures"]), "answer": list(state["answer"]) if state["answer"] else None,
               "timeout": None if finished else state["phase"], "harness_error": state.get("harness_error")}
    sys.audit(REPORT_EVENT, token, str.encode(repr(summary)))

