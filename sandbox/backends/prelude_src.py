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


def _dumps(obj):
    """JSON text of `obj` (dict, list, str, int, float, bool, None) without importing `json`, which pulls in
    `re` and compiles its patterns: milliseconds of CPU in every sandbox, each used once. Strings go through
    `_json`'s C encoder, the one `json.dumps` uses."""
    from _json import encode_basestring_ascii as enc

    if isinstance(obj, str):
        return enc(obj)
    if obj is None:
        return "null"
    if obj is True:
        return "true"
    if obj is False:
        return "false"
    if isinstance(obj, int):
        return int.__repr__(obj)
    if isinstance(obj, float):
        if obj != obj:
            return "NaN"
        if obj in (float("inf"), float("-inf")):
            return "Infinity" if obj > 0 else "-Infinity"
        return float.__repr__(obj)
    if isinstance(obj, dict):
        return "{" + ",".join(enc(str(k)) + ":" + _dumps(v) for k, v in obj.items()) + "}"
    if isinstance(obj, (list, tuple)):
        return "[" + ",".join(_dumps(v) for v in obj) + "]"
    raise TypeError(f"cannot encode {type(obj).__name__} as JSON")


def _write_all(fd, payload):
    while payload:
        payload = payload[os.write(fd, payload):]


def _frame(fd, obj):
    """A frame for the host: 4-byte big-endian length + JSON (the host parses nothing else from a sandbox)."""
    data = _dumps(obj).encode()
    _write_all(fd, len(data).to_bytes(4, "big") + data)


def _mframe(fd, obj):
    """A frame between the runner's own processes inside the sandbox: length + marshal (builtin, free)."""
    import marshal

    data = marshal.dumps(obj)
    _write_all(fd, len(data).to_bytes(4, "big") + data)


def _read_exact(fd, n):
    chunks = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise EOFError("request stream ended early")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)
