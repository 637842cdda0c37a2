"""Differential test: every program of the corpus runs bare (`python3 main.py` in a temp dir, the interpreter
the sandbox uses, the sandbox's environment) and through `/run_code`; stdout, stderr, return code, the signal
and the fetched files must be identical.

One thing is normalised, because it must differ: the directory of the script (the bare temp dir is written as
`/workspace`, the sandbox's work dir), which tracebacks, `__file__` and `HOME` show. Bare deaths by signal N are
compared as the sandbox reports them, return code 128 + N plus the signal's name. Nothing else is rewritten, so
the corpus avoids what differs by nature between two runs of CPython itself (pids, addresses, times).
"""

from __future__ import annotations

import base64
import os
import resource
import signal
import subprocess
import tempfile

import pytest
from sandbox_testlib import run

from sandbox.backends.bwrap import WORKDIR, python_runtime, sandbox_env

pytestmark = pytest.mark.slow


def P(name, code, stdin="", files=None, fetch=()):  # noqa: N802 - a corpus row
    return pytest.param(code, stdin, files or {}, list(fetch), id=name)


CORPUS = [
    # exit paths
    P("plain-print", "print('hello')"),
    P("exit-builtin", "print('a')\nexit()\nprint('b')"),
    P("quit-builtin", "quit()"),
    P("exit-3", "exit(3)"),
    P("quit-4", "quit(4)"),
    P("sys-exit-0", "import sys\nsys.exit(0)"),
    P("sys-exit-2", "import sys\nprint('x')\nsys.exit(2)"),
    P("sys-exit-message", "import sys\nsys.exit('fatal: no input')"),
    P("sys-exit-none", "import sys\nsys.exit(None)"),
    P("sys-exit-256", "import sys\nsys.exit(256)"),
    P("sys-exit-minus-1", "import sys\nsys.exit(-1)"),
    P("raise-systemexit-7", "raise SystemExit(7)"),
    P("raise-systemexit-tuple", "raise SystemExit('a', 'b')"),
    P("uncaught-valueerror", "x = 1\nraise ValueError(f'bad {x}')"),
    P("exception-chain", "try:\n    1 / 0\nexcept ZeroDivisionError as e:\n    raise KeyError('k') from e"),
    P("nested-frames", "def f(n):\n    if n == 0:\n        raise RuntimeError('deep')\n    f(n - 1)\n\nf(3)"),
    P("syntax-error", "print('ok'\nx = = 1"),
    P("indentation-error", "if True:\nprint(1)"),
    P("null-byte-in-source", "print(1)\n\x00\n"),
    P("unterminated-string", "x = \"\"\"abc\n"),
    P("coding-cookie", "# -*- coding: latin-1 -*-\nprint('é')"),
    P("bom", "\ufeffprint('bom')"),
    P("keyboard-interrupt", "print('before', flush=True)\nraise KeyboardInterrupt"),
    P("os-exit-loses-buffer", "import os\nprint('lost')\nos._exit(5)"),
    P("os-exit-after-flush", "import os\nprint('kept', flush=True)\nos._exit(0)"),
    P("exit-in-finally", "try:\n    exit(6)\nfinally:\n    print('finally ran')"),
    P("atexit-stdout", "import atexit, sys\natexit.register(print, 'at exit', file=sys.__stdout__)\nprint('main')"),
    P("atexit-lifo", "import atexit\nfor i in range(3):\n    atexit.register(print, 'handler', i)"),
    P("atexit-raises", "import atexit\nclass Bad:\n    def __repr__(self):\n        return 'Bad'\n"
                       "    def __call__(self):\n        raise OSError('in atexit')\natexit.register(Bad())\n"
                       "print('done')"),
    P("atexit-sys-exit", "import atexit, sys\natexit.register(sys.exit, 9)\nprint('x')"),
    P("atexit-sees-file-gone", "import atexit\natexit.register(lambda: print('__file__' in globals()))"),
    P("thread-outlives-main", "import threading, time\ndef work():\n    time.sleep(0.2)\n    print('thread done')\n"
                              "threading.Thread(target=work).start()\nprint('main done')"),
    P("daemon-thread", "import threading, time\ndef spin():\n    while True:\n        time.sleep(0.01)\n"
                       "threading.Thread(target=spin, daemon=True).start()\nprint('main only')"),
    P("del-at-shutdown", "import sys\nclass Noisy:\n    def __del__(self):\n"
                         "        sys.__stderr__.write('finalised\\n')\nkeep = Noisy()\nprint('end')"),
    P("custom-excepthook", "import sys\ndef hook(t, v, tb):\n    print('hooked', t.__name__, v)\n"
                           "sys.excepthook = hook\nraise TypeError('t')"),
    # buffering
    P("no-trailing-newline", "import sys\nsys.stdout.write('partial')"),
    # under the test service's 64 KiB output cap
    P("large-stdout", "import sys\nsys.stdout.write('0123456789' * 6000)"),
    P("interleaved-streams",
      "import sys\nfor i in range(5):\n    print('out', i)\n    print('err', i, file=sys.stderr)"),
    P("stdout-replaced", "import io, sys\nsys.stdout = io.StringIO()\nprint('swallowed')"),
    P("stdout-closed", "import sys\nsys.stdout.close()\nprint('after close')"),
    P("os-write-and-print", "import os\nprint('buffered')\nos.write(1, b'direct\\n')"),
    P("flush-then-sigkill", "import os, signal\nprint('flushed', flush=True)\nprint('unflushed')\n"
                            "os.kill(os.getpid(), signal.SIGKILL)"),
    P("line-buffering", "import os, sys\nsys.stdout.reconfigure(line_buffering=True)\nprint('line')\nos._exit(0)"),
    P("stderr-then-os-exit", "import os, sys\nsys.stderr.write('err line\\n')\nos._exit(1)"),
    # files
    P("unclosed-file-flushed", "f = open('out.txt', 'w')\nf.write('never closed')", fetch=["out.txt"]),
    P("subdir-file", "import os\nos.makedirs('a/b')\nopen('a/b/c.txt', 'w').write('nested')", fetch=["a/b/c.txt"]),
    P("read-given-file", "print(open('data.csv').read().upper())", files={"data.csv": b"x,y\n1,2\n"}),
    P("import-given-module", "import helper\nprint(helper.double(21))",
      files={"helper.py": b"def double(x):\n    return 2 * x\n"}),
    P("read-own-source", "src = open(__file__).read()\nprint(len(src), src.splitlines()[0])"),
    P("listdir", "import os\nprint(sorted(os.listdir('.')))", files={"in.txt": b"1"}),
    P("binary-file", "open('b.bin', 'wb').write(bytes(range(256)))", fetch=["b.bin"]),
    P("file-written-at-exit", "import atexit\natexit.register(lambda: open('late.txt', 'w').write('late'))",
      fetch=["late.txt"]),
    P("missing-fetch", "print('nothing written')", fetch=["absent.txt"]),
    P("file-name-argv", "import sys\nprint(__file__, __name__, sys.argv)"),
    P("main-globals", "print(sorted(globals()))"),
    P("main-module-attrs", "print(type(__loader__).__name__, __spec__, __package__, __doc__, __cached__)"),
    P("sys-path-head", "import sys, os\nprint(sys.path[0], os.getcwd())"),
    P("builtins-from-site", "for name in ('exit', 'quit', 'help', 'copyright', 'credits', 'license'):\n"
                            "    print(name, repr(eval(name))[:40])"),
    # unicode
    P("unicode-print", "print('héllo wörld 中文 🙂')"),
    P("invalid-utf8-bytes", "import sys\nsys.stdout.buffer.write(b'ok \\xff\\xfe end\\n')"),
    P("lone-surrogate", "print('\\udcff')"),
    P("unicode-exception", "raise ValueError('ошибка ✗')"),
    P("unicode-stdin", "print(input()[::-1])", stdin="añb€\n"),
    P("unicode-file-name", "open('é.txt', 'w').write('ü')", fetch=["é.txt"]),
    P("unicode-identifiers", "π = 3.14159\nprint(round(π * 2, 3))"),
    # signals
    P("sigterm-self", "import os, signal\nprint('x', flush=True)\nos.kill(os.getpid(), signal.SIGTERM)"),
    P("sigalrm-timer", "import signal, time\nsignal.setitimer(signal.ITIMER_REAL, 0.05)\ntime.sleep(5)"),
    P("handled-sigusr1", "import os, signal\nsignal.signal(signal.SIGUSR1, lambda s, f: print('got', s))\n"
                         "os.kill(os.getpid(), signal.SIGUSR1)\nprint('after')"),
    P("abort", "import os\nos.abort()"),
    P("segfault", "import ctypes\nctypes.string_at(0)"),
    P("sigint-self", "import os, signal\nos.kill(os.getpid(), signal.SIGINT)\nimport time\ntime.sleep(1)"),
    P("sigint-default", "import os, signal\nsignal.signal(signal.SIGINT, signal.SIG_DFL)\n"
                        "os.kill(os.getpid(), signal.SIGINT)"),
    # stdin
    P("two-inputs", "a = input()\nb = input()\nprint(int(a) + int(b))", stdin="40\n2\n"),
    P("stdin-read-all", "import sys\ndata = sys.stdin.read()\nprint(len(data), data.count('\\n'))",
      stdin="line\n" * 1000),
    P("stdin-lines", "import sys\nfor line in sys.stdin:\n    print(line.strip().upper())", stdin="a\nb\nc"),
    P("input-at-eof", "input()"),
    P("stdin-binary", "import sys\nprint(sys.stdin.buffer.read())", stdin="raw\tbytes"),
    P("stdin-unread", "print('ignored')", stdin="x" * 100000),
    P("input-prompt", "name = input('name? ')\nprint('hi', name)", stdin="ada\n"),
    P("readline-then-read", "import sys\nfirst = sys.stdin.readline()\nrest = sys.stdin.read()\n"
                            "print(repr(first), repr(rest))", stdin="1\n2\n3\n"),
    P("exit-closes-stdin", "exit_ = exit\ntry:\n    exit_(0)\nfinally:\n    import sys\n"
                           "    print(sys.stdin.closed)", stdin="unused"),
]


def _plain_process() -> None:
    """The bare run starts as from an interactive shell: no core files, and SIGINT/SIGQUIT at their defaults even
    when pytest itself was started in the background (`cmd &` ignores both, and CPython then never installs its
    KeyboardInterrupt handler); the sandboxed program sees the defaults either way."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    for sig in (signal.SIGINT, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)


def _bare(code: str, stdin: str, files: dict[str, bytes], fetch: list[str]) -> dict:
    python, prefix = python_runtime()
    with tempfile.TemporaryDirectory(prefix="agentrl-diff-") as tmp:
        tmp = os.path.realpath(tmp)
        for path, data in files.items():
            os.makedirs(os.path.dirname(os.path.join(tmp, path)), exist_ok=True)
            with open(os.path.join(tmp, path), "wb") as f:
                f.write(data)
        script = os.path.join(tmp, "main.py")
        with open(script, "w", encoding="utf-8") as f:
            f.write(code)
        env = {**sandbox_env(prefix), "HOME": tmp}
        out = subprocess.run([python, script], input=stdin.encode(), capture_output=True, cwd=tmp, env=env,
                             timeout=60, preexec_fn=_plain_process)
        fetched = {}
        for path in fetch:
            full = os.path.join(tmp, path)
            if os.path.isfile(full):
                with open(full, "rb") as f:
                    fetched[path] = f.read()
        rc = out.returncode
        return {"stdout": out.stdout.decode("utf-8", errors="replace").replace(tmp, WORKDIR),
                "stderr": out.stderr.decode("utf-8", errors="replace").replace(tmp, WORKDIR),
                "return_code": rc if rc >= 0 else 128 - rc,
                "signal": signal.Signals(-rc).name if rc < 0 else None, "files": fetched}


@pytest.mark.parametrize("code,stdin,files,fetch", CORPUS)
def test_same_as_cpython(http, code, stdin, files, fetch):
    bare = _bare(code, stdin, files, fetch)
    body = run(http, code, stdin=stdin, files={p: base64.b64encode(d).decode() for p, d in files.items()},
               fetch_files=fetch, run_timeout=20)
    result = body["run_result"]
    boxed = {"stdout": result["stdout"], "stderr": result["stderr"], "return_code": result["return_code"],
             "signal": body["signal"], "files": {p: base64.b64decode(d) for p, d in body["files"].items()}}
    assert boxed == bare
    assert result["status"] == "Finished" and body["exit_reason"] == ("signal" if bare["signal"] else "exit")


def test_corpus_size():
    assert len(CORPUS) >= 50
