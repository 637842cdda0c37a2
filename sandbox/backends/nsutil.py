"""Build the zygote's C helper (nsutil.c) with the host's compiler, once per source and interpreter version."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from sandbox.backends.base import BackendError

SOURCE = Path(__file__).resolve().parent / "nsutil.c"


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "agentrl" / "sandbox"


def build() -> str:
    """Path of the compiled module (built now if missing). Raises BackendError, naming the fix, if it cannot."""
    source = SOURCE.read_bytes()
    key = hashlib.sha256(source + sys.version.encode() + sys.executable.encode()).hexdigest()[:16]
    target = cache_dir() / f"_agentrl_nsutil-{key}{sysconfig.get_config_var('EXT_SUFFIX') or '.so'}"
    if target.exists():
        return str(target)
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    include = sysconfig.get_paths()["include"]
    if compiler is None or not os.path.exists(os.path.join(include, "Python.h")):
        raise BackendError("the sandbox zygote needs a C compiler and Python's headers to build its helper "
                           f"(found compiler {compiler}, headers in {include}): `make setup` installs gcc; "
                           "without them every sandbox starts bwrap")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".so.tmp")
    os.close(fd)
    try:
        out = subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-Wall", f"-I{include}", str(SOURCE), "-o", tmp],
                             capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            raise BackendError(f"cannot build the sandbox zygote's helper: {out.stderr.strip()[-1000:]}")
        os.replace(tmp, target)  # atomic: concurrent services build the same file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return str(target)
