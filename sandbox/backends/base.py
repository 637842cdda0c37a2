"""The backend contract: what the service asks of an isolation technology (bwrap, docker, or none)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Protocol

# How code runs after the request's files are written: python runs in the warm interpreter, others via argv.
LANGUAGES: dict[str, tuple[list[str], str]] = {
    # language -> (interpreter argv prefix, script suffix); resolved against PATH inside the sandbox
    "bash": (["/bin/bash"], ".sh"),
    "sh": (["/bin/sh"], ".sh"),
    "javascript": (["/usr/bin/node"], ".js"),
    "nodejs": (["/usr/bin/node"], ".js"),
    "perl": (["/usr/bin/perl"], ".pl"),
}

EXIT_REASONS = ("exit", "oom", "timeout", "output_limit", "pids_limit", "signal")


class BackendError(RuntimeError):
    """The backend cannot run anything (missing tool, no isolation): the service must not start."""


def available_languages() -> list[str]:
    langs = ["python"]
    langs += [name for name, (argv, _) in LANGUAGES.items() if os.path.exists(argv[0])]
    return langs


@dataclass
class ExecRequest:
    code: str
    language: str = "python"
    stdin: bytes = b""
    files: dict[str, str] = field(default_factory=dict)   # relative path -> base64
    fetch_files: list[str] = field(default_factory=list)
    run_timeout: float = 10.0
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


class SessionProcess(Protocol):
    """A persistent interpreter in its own sandbox."""

    async def run_cell(self, code: str, timeout: float) -> dict: ...

    async def close(self) -> None: ...


class Backend(Protocol):
    name: str
    isolation: str                 # "bwrap+cgroups", "bwrap", "docker", "none"

    async def start(self) -> None: ...

    async def execute(self, req: ExecRequest) -> ExecResult: ...

    async def open_session(self, language: str, memory_mb: int) -> SessionProcess: ...

    def info(self) -> dict: ...

    async def close(self) -> None: ...


def encode_frame(obj: dict) -> bytes:
    data = json.dumps(obj).encode()
    return len(data).to_bytes(4, "big") + data


async def read_frame(reader) -> dict | None:
    """One length-prefixed JSON frame from an asyncio.StreamReader; None at EOF."""
    try:
        head = await reader.readexactly(4)
        return json.loads(await reader.readexactly(int.from_bytes(head, "big")))
    except (EOFError, ConnectionError) as e:  # IncompleteReadError is an EOFError
        del e
        return None
