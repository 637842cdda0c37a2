"""Shared start of the programs that run INSIDE a sandbox (runner_src.py, session_src.py); stdlib only.

The backends prepend this text to each program before passing it to `python -I -S -c`, because a program
given with -c cannot import a sibling file from inside the sandbox (the repository is not mounted there).
"""

import os
import sys


def _add_site_packages():
    """The interpreter starts with -S (its .pth files run arbitrary code on every start-up, tens of ms here):
    put its site-packages on sys.path directly, so installed packages import as usual."""
    version = "python%d.%d" % sys.version_info[:2]
    for path in (os.path.join(sys.prefix, "lib", version, "site-packages"),
                 os.path.join("/usr/local/lib", version, "dist-packages"), "/usr/lib/python3/dist-packages"):
        if os.path.isdir(path) and path not in sys.path:
            sys.path.append(path)


def _site_builtins():
    """What `site` would have done that a program can observe, short of its .pth files: `exit`, `quit`,
    `help`, `copyright`, `credits` and `license` in builtins, the interactive hook, `site` in sys.modules.
    `import site` under -S defines its functions without running site.main()."""
    import site

    site.setquit()
    site.setcopyright()
    site.sethelper()
    site.enablerlcompleter()
    # The sandbox's environment sets PYTHONDONTWRITEBYTECODE=1, which -I (ignore PYTHON* variables) would drop.
    sys.dont_write_bytecode = True


def _frame(fd, obj):
    import json

    data = json.dumps(obj).encode()
    payload = len(data).to_bytes(4, "big") + data
    while payload:
        payload = payload[os.write(fd, payload):]


def _read_exact(fd, n):
    chunks = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise EOFError("request stream ended early")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)
