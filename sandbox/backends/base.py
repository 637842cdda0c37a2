"""The backend contract: what the service asks of an isolation technology (bwrap, docker, or none)."""

from __future__ import annotations

import functools
import json
import marshal
import os
import subprocess
from dataclasses import dataclass, field
from typing import Callable, Protocol

# How code runs after the request's files are written: python runs in the warm interpreter, others via argv.
LANGUAGES: dict[str, tuple[list[str], str]] = {
    # language -> (interpreter argv prefix, script suffix); resolved against PATH inside the sandbox
    "bash": (["/bin/bash"], ".sh"),
    "sh": (["/bin/sh"], ".sh"),
    "javascript": (["/usr/bin/node"], ".js"),
    "nodejs": (["/usr/bin/node"], ".js"),
    "perl": (["/usr/bin/perl"], ".pl"),
}

# Compiled languages, as SandboxFusion builds them: the compiler (argv; "{src}" is the source's absolute path)
# runs in the work dir inside the sandbox, then `./test` runs with the request's stdin.
COMPILED: dict[str, tuple[list[str], str]] = {
    "cpp": (["/usr/bin/g++", "-std=c++17", "{src}", "-o", "test"], ".cpp"),
    "c": (["/usr/bin/gcc", "-std=gnu17", "{src}", "-o", "test", "-lm"], ".c"),  # an addition: SandboxFusion has no C
}
COMPILED_RUN = ["./test"]
OPTIONAL_CPP_LIBS = ("crypto", "ssl", "pthread")  # linked into C++ programs when installed, as SandboxFusion does

# The in-sandbox programs (runner, session, zygote) are not passed as the -c text itself: CPython keeps the parse of
# the -c text (its AST arena, ~4 MB for the zygote's program) until that text returns, and each program process
# forked from the zygote would free it at its exit, a copy-on-write fault per block (~300 per request). The -c
# text is this bootstrap, which compiles the program given as its first argument (the parse freed at once) and
# runs it in the same globals; sys.argv is then what it would be with the program as the -c text. Its compile()
# also builds CPython's AST types once in the zygote, which each program's first compile() built for itself.
BOOTSTRAP = "import sys; exec(compile(sys.argv.pop(1), '<sandbox>', 'exec'))"


def python_argv(python: str, src: str, *args: str) -> list[str]:
    """`python -I -S -c <src> args...`, through BOOTSTRAP."""
    return [python, "-I", "-S", "-c", BOOTSTRAP, src, *args]


# runner_fault: the sandbox's supervisor failed on what the program left behind (a program failure, never the
# service's): the exit status is the program's, its fetched files are missing
EXIT_REASONS = ("exit", "oom", "timeout", "output_limit", "pids_limit", "signal", "runner_fault")


class BackendError(RuntimeError):
    """The backend cannot run anything (missing tool, no isolation): the service must not start."""


class ForkSourceGone(BackendError):
    """A fork source's interpreter died: its end of the fork socket is closed (its state is lost)."""


def available_languages() -> list[str]:
    langs = ["python"]
    langs += [name for name, (argv, _) in COMPILED.items() if os.path.exists(argv[0])]
    langs += [name for name, (argv, _) in LANGUAGES.items() if os.path.exists(argv[0])]
    return langs


@functools.cache
def optional_libs(compiler: str) -> tuple[str, ...]:
    """`-lNAME` flags among OPTIONAL_CPP_LIBS that `compiler` can link here (it prints an absolute path for a
    library it finds, the bare name otherwise)."""
    flags = []
    for name in OPTIONAL_CPP_LIBS:
        for ext in ("so", "a"):
            try:
                out = subprocess.run([compiler, f"-print-file-name=lib{name}.{ext}"], capture_output=True, text=True,
                                     timeout=30).stdout.strip()
            except (OSError, subprocess.TimeoutExpired):
                out = ""
            if out.startswith("/") and os.path.exists(out):
                flags.append(f"-l{name}")
                break
    return tuple(flags)


def compile_argv(language: str) -> list[str]:
    argv, _ = COMPILED[language]
    return [*argv, *(optional_libs(argv[0]) if language == "cpp" else ())]


def source_suffix(language: str) -> str:
    if language == "python":
        return ".py"
    return (COMPILED.get(language) or LANGUAGES[language])[1]


def script_name(suffix: str, files: dict) -> str:
    """The program's file name in the work dir: `main<suffix>`, or `main_N<suffix>` if a request file has it."""
    taken = {path[2:] if path.startswith("./") else path for path in files}
    name, n = f"main{suffix}", 0
    while name in taken:
        n += 1
        name = f"main_{n}{suffix}"
    return name


@dataclass
class ExecRequest:
    code: str
    language: str = "python"
    stdin: bytes = b""
    files: dict[str, str] = field(default_factory=dict)   # relative path -> base64
    fetch_files: list[str] = field(default_factory=list)
    run_timeout: float = 10.0
    compile_timeout: float = 10.0
    memory_mb: int = 512


@dataclass
class ExecResult:
    status: str                    # Finished | TimeLimitExceeded | Error (SandboxFusion run_result.status)
    return_code: int | None
    exit_reason: str               # one of EXIT_REASONS
    stdout: str = ""
    stderr: str = ""
    truncated: bool = False
    signal: str | None = None
    execution_time: float = 0.0
    files: dict[str, str] = field(default_factory=dict)
    file_errors: dict[str, str] = field(default_factory=dict)
    memory_peak_mb: float | None = None
    infra_error: str | None = None  # set only when the sandbox itself failed -> SandboxError
    compile: dict | None = None     # compiled languages: SandboxFusion's compile_result fields
    ran: bool = True                # False when a failed compile step kept the program from running


def runner_payload(req: ExecRequest, cfg) -> dict:
    """The request frame for runner_src.py; one builder, so every backend runs code the same way."""
    suffix = source_suffix(req.language)
    payload = {"language": req.language, "code": req.code, "script": script_name(suffix, req.files),
               "files": req.files, "fetch_files": req.fetch_files, "fetch_limit": cfg.max_body_bytes,
               "rlimits": {"fsize": cfg.max_file_bytes, "nofile": cfg.nofile_limit, "cpu": int(req.run_timeout) + 2}}
    if req.language in COMPILED:
        payload["compile"] = {"argv": compile_argv(req.language), "timeout": req.compile_timeout,
                              "cpu": int(req.compile_timeout) + 2, "output_limit": cfg.max_output_bytes}
        payload["run"] = COMPILED_RUN
    elif req.language != "python":
        payload["interpreter"] = LANGUAGES[req.language][0]
    return payload


class SessionProcess(Protocol):
    """A persistent interpreter in its own sandbox."""

    @property
    def alive(self) -> bool: ...

    async def run_cell(self, code: str, timeout: float, track_workspace: bool = False) -> dict: ...

    async def fork(self, n: int, timeout: float = 60.0) -> None: ...

    async def snapshot(self, timeout: float = 60.0) -> dict: ...

    async def lay_down(self, entries: list[list], timeout: float = 60.0) -> None: ...

    async def close(self) -> None: ...


class Backend(Protocol):
    name: str
    isolation: str                 # "bwrap+cgroups", "bwrap", "docker", "none"

    async def start(self) -> None: ...

    async def execute(self, req: ExecRequest) -> ExecResult: ...

    async def open_session(self, language: str, memory_mb: int, forkable: bool = False) -> SessionProcess: ...

    async def fork_session(self, source: SessionProcess, n: int, memory_mb: int) -> list[SessionProcess]: ...

    def info(self) -> dict: ...

    async def close(self) -> None: ...


def encode_frame(obj: dict) -> bytes:
    data = json.dumps(obj).encode()
    return len(data).to_bytes(4, "big") + data


def encode_request(obj: dict) -> bytes:
    """The /run_code request frame for runner_src.py: length + marshal, which the runner reads without importing
    anything (json would cost it milliseconds). Only this direction uses marshal: the host parses nothing but
    JSON from a sandbox."""
    data = marshal.dumps(obj)
    return len(data).to_bytes(4, "big") + data


MAX_FRAME_BYTES = 64 << 20  # no frame of a runner comes near it: fetched files are capped by max_body_bytes


async def read_frame(reader, max_bytes: int | Callable[[], int] = MAX_FRAME_BYTES) -> dict | None:
    """One length-prefixed JSON object from an asyncio.StreamReader; None at EOF, and for a frame that is not
    one (longer than `max_bytes`, not JSON, not an object): the length header is never trusted to size a buffer,
    so a writer in a sandbox cannot make the service hold more than `max_bytes` of it. A callable `max_bytes` is
    asked once the header has arrived (what the reader expects may change while it waits)."""
    try:
        size = int.from_bytes(await reader.readexactly(4), "big")
        if size > (max_bytes() if callable(max_bytes) else max_bytes):
            return None
        frame = json.loads(await reader.readexactly(size))
    except (EOFError, ConnectionError, ValueError):  # IncompleteReadError is an EOFError; bad JSON a ValueError
        return None
    return frame if isinstance(frame, dict) else None
