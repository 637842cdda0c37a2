"""Request and response models: SandboxFusion's `/run_code` fields and enums, plus sessions and health.

Fields and enum values match SandboxFusion exactly so verl / SkyRL clients work unchanged; what SandboxFusion
does not have (`exit_reason`, `truncated`, `signal`, `memory_peak_MB`) comes as additional fields.
"""

from __future__ import annotations

import base64
import binascii
from enum import Enum

from pydantic import BaseModel, Field


class RunStatus(str, Enum):
    Success = "Success"
    Failed = "Failed"
    SandboxError = "SandboxError"


class CommandRunStatus(str, Enum):
    Finished = "Finished"
    Error = "Error"
    TimeLimitExceeded = "TimeLimitExceeded"


class ExitReason(str, Enum):
    exit = "exit"                  # the program ended by itself (any exit code)
    oom = "oom"                    # the memory cgroup killed it
    timeout = "timeout"            # run_timeout passed; it was killed
    output_limit = "output_limit"  # it wrote more than the kill limit; it was killed
    pids_limit = "pids_limit"      # it hit the process/thread limit (fork or thread bomb)
    signal = "signal"              # it died from a signal (segfault, abort, SIGKILL it sent itself)
    runner_fault = "runner_fault"  # the sandbox's supervisor failed on what it left behind (counted as its failure)


def check_relative_path(path: str, field: str) -> str:
    """Reject absolute paths, '..' and odd names; symlinks are refused later, when the file is opened."""
    parts = path.split("/")
    if not path or path.startswith("/") or ".." in parts or "\x00" in path or len(path) > 1024:
        raise ValueError(f"{field}: {path!r} must be a relative path inside the work dir (no leading '/', no '..')")
    return path


def check_files(files: dict[str, str | None], fetch_files: list[str]) -> None:
    """Validate `files` (paths + base64 content) and `fetch_files` paths; ValueError names the field."""
    for path, content in files.items():
        check_relative_path(path, "files")
        if content is not None:
            try:
                base64.b64decode(content, validate=True)
            except (binascii.Error, ValueError) as e:
                raise ValueError(f"files: content of {path!r} is not valid base64 ({e})") from e
    for path in fetch_files:
        check_relative_path(path, "fetch_files")


class RunCodeRequest(BaseModel):
    code: str
    language: str  # required, as in SandboxFusion: a request without it is a 422 naming the field
    compile_timeout: float = 10
    run_timeout: float = 10
    memory_limit_MB: int = -1
    stdin: str | None = None
    files: dict[str, str | None] = Field(default_factory=dict)
    fetch_files: list[str] = Field(default_factory=list)


class CommandRunResult(BaseModel):
    status: CommandRunStatus
    execution_time: float | None = None
    return_code: int | None = None
    stdout: str | None = None
    stderr: str | None = None


class RunCodeResponse(BaseModel):
    status: RunStatus
    message: str = ""
    compile_result: CommandRunResult | None = None
    run_result: CommandRunResult | None = None
    executor_pod_name: str | None = None
    files: dict[str, str] = Field(default_factory=dict)
    # additions (SandboxFusion clients ignore them)
    exit_reason: ExitReason | None = None
    truncated: bool = False
    signal: str | None = None
    memory_peak_MB: float | None = None


class RestoreRequest(BaseModel):
    """A snapshot to restore (`POST /sessions/{id}/restore`, or `snapshot` of `POST /sessions`): the cells are
    replayed first, then the work dir is made to hold exactly the tar's files. What `GET /sessions/{id}/snapshot`
    answered can be sent as is (its other fields are ignored)."""

    workspace: str | None = None  # base64 of an uncompressed tar: directories and regular files only
    cells: list[str] = Field(default_factory=list)
    replayable: bool = True  # the snapshot's: false when its cells cannot rebuild the state (then send none)
    timeout: float = 10  # per replayed cell


class RestoreResponse(BaseModel):
    replayed_cells: int
    diverged: bool | None = None  # the replay wrote other files than the snapshot's (None: no workspace given)
    digest: str | None = None  # the restored work dir's (SnapshotResponse.digest)
    files: int = 0


class SnapshotResponse(BaseModel):
    workspace: str  # base64 of a tar of the work dir: its directories and regular files
    digest: str  # sha256 of the files' paths, kinds, modes and contents (not their times)
    files: int
    bytes: int  # the files' bytes in all
    skipped: list[str] = Field(default_factory=list)  # symlinks, fifos, sockets, devices: not in a snapshot
    cells: list[str] = Field(default_factory=list)  # the cells that built the interpreter's state, oldest first
    replayable: bool = True  # false when they cannot rebuild it (a cell timed out, or past snapshot_log_bytes)


class CreateSessionRequest(BaseModel):
    language: str = "python"
    memory_limit_MB: int = -1
    idle_ttl_s: float = -1
    forkable: bool = False  # a fork source (`POST /sessions/{id}/fork`); see docs/sandbox.md on its filter
    snapshot: RestoreRequest | None = None  # start from a snapshot (replayed, then its files laid down)


class CreateSessionResponse(BaseModel):
    session_id: str
    restore: RestoreResponse | None = None


class ForkSessionResponse(BaseModel):
    session_ids: list[str]


class RunCellRequest(BaseModel):
    code: str
    timeout: float = 10
    track_workspace: bool = False  # answer workspace_changed (the interpreter stats the work dir after the cell)


class CellError(BaseModel):
    name: str
    value: str
    traceback: str = ""


class RunCellResponse(BaseModel):
    status: str                    # ok | error | timeout
    stdout: str = ""
    stderr: str = ""
    error: CellError | None = None
    execution_count: int
    restarted: bool = False
    exit_reason: ExitReason = ExitReason.exit
    truncated: bool = False
    execution_time: float = 0.0
    # the work dir changed since the last cell that tracked it (None: not tracked, or past the snapshot limits)
    workspace_changed: bool | None = None
