"""Workspace snapshots of sessions: the tar format, the checks every snapshot passes, and restoring one.

A snapshot is a session's work dir (its directories and regular files, as a tar) plus the cells that built its
interpreter's state (`CellLog`). Restoring one into a session replays the cells first, then lays the files down:

- Replay first, files last, because replayed cells write files too, and a cell that is not deterministic (random
  numbers, clocks, appends) would overwrite or extend the restored files if they were laid down before it ran.
  Laid down last, the work dir ends exactly as the snapshot holds it, whatever the replay wrote; only the
  interpreter's state comes from the replay. Before laying the files down, the restore compares what the replay
  wrote with the snapshot (`diverged`): when they differ, the interpreter's variables may disagree with the files
  (a value drawn at random in the old session and in the replay), which the files alone cannot repair.
- A regular file the replay left is rewritten in place, so the interpreter's open file objects (a log opened by
  a replayed cell) keep pointing at it; anything the snapshot does not hold is removed.

Nothing of a snapshot is trusted. A tar a client sends is read here, on the host, from memory and never unpacked
on the host: only directories and regular files with relative, normalised paths, no '..', at most
`snapshot_max_files` members, `snapshot_max_bytes` in all and `max_file_bytes` a file; symbolic and hard links,
devices, fifos, sparse members, duplicates, a file where a directory must be, and bytes after the last member are
refused with the member's name. What passes is handed to the session's interpreter, which writes it inside its own
sandbox, under its own work dir, following no symlink (workspace_src.py). A snapshot the interpreter reports is
checked the same way before it becomes a tar.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import io
import math
import tarfile
from dataclasses import dataclass, field
from typing import NamedTuple

from sandbox.backends.base import BackendError
from sandbox.config import SandboxConfig

MAX_PATH = 1024  # characters of a relative path (workspace_src.py stops at the same length)


class SnapshotError(Exception):
    """A snapshot or restore the service refuses: `status` 400 (a bad tar or request), 409 (the session cannot),
    413 (past the snapshot limits)."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


class Entry(NamedTuple):
    path: str       # relative to the work dir, normalised
    kind: str       # "dir" | "file"
    mode: int       # permission bits only
    mtime_ns: int
    data: bytes = b""


def _normal(path: str, what: str) -> str | None:
    """`path` without a leading './' or trailing '/', None for the work dir itself; SnapshotError(400) unless it
    is relative and inside the work dir."""
    name = path
    while name.startswith("./"):
        name = name[2:]
    name = name.rstrip("/") if not name.startswith("/") else name
    if name in ("", "."):
        return None
    if (name.startswith("/") or any(part in ("", ".", "..") for part in name.split("/")) or "\x00" in name
            or len(name) > MAX_PATH):
        raise SnapshotError(f"{what}: {path[:200]!r} is not a relative path inside the work dir (no leading '/', "
                            f"no '..', '.' or empty parts, at most {MAX_PATH} characters)", 400)
    return name


def _mtime_ns(seconds: float) -> int:
    if not math.isfinite(seconds) or seconds < 0:
        return 0
    return min(int(seconds * 1e9), 2**62)


def checked(entries: list[Entry], cfg: SandboxConfig, what: str) -> list[Entry]:
    """`entries` normalised (paths, permission bits), missing parent directories added, sorted so that a directory
    comes before what it holds; SnapshotError naming the entry for anything a snapshot may not hold."""
    found: dict[str, Entry] = {}
    total = 0
    for entry in entries:
        path = _normal(entry.path, what)
        if path is None:
            continue
        if path in found:
            raise SnapshotError(f"{what}: {path!r} appears twice", 400)
        if entry.kind == "file":
            if len(entry.data) > cfg.max_file_bytes:
                raise SnapshotError(f"{what}: {path!r} holds {len(entry.data)} bytes, more than max_file_bytes "
                                    f"({cfg.max_file_bytes})", 413)
            total += len(entry.data)
            if total > cfg.snapshot_max_bytes:
                raise SnapshotError(f"{what}: its files hold more than snapshot_max_bytes ({cfg.snapshot_max_bytes}) "
                                    "bytes: delete files from the work dir, or raise the limit", 413)
        found[path] = entry._replace(path=path, mode=entry.mode & 0o777)
    dirs: set[str] = set()  # checked directories, their parents included
    for path in list(found):
        parent = path.rpartition("/")[0]
        while parent and parent not in dirs:
            have = found.get(parent)
            if have is None:
                found[parent] = Entry(parent, "dir", 0o755, found[path].mtime_ns)
            elif have.kind != "dir":
                raise SnapshotError(f"{what}: {path!r} lies below {parent!r}, which is a file", 400)
            dirs.add(parent)
            parent = parent.rpartition("/")[0]
    if len(found) > cfg.snapshot_max_files:
        raise SnapshotError(f"{what}: it holds {len(found)} files and directories, more than snapshot_max_files "
                            f"({cfg.snapshot_max_files})", 413)
    return sorted(found.values(), key=lambda e: e.path.split("/"))


def digest(entries: list[Entry]) -> str:
    """sha256 over the (sorted) entries' kinds, modes, paths and contents; times are left out (a replay writes the
    same files at other times)."""
    h = hashlib.sha256()
    for entry in entries:
        h.update(f"{entry.kind}\0{entry.mode:o}\0{entry.path}\0".encode("utf-8", "surrogateescape"))
        h.update(hashlib.sha256(entry.data).digest())
    return "sha256:" + h.hexdigest()


def to_tar(entries: list[Entry]) -> bytes:
    """A POSIX tar of `entries` (checked), built in memory; mtimes in whole seconds, as ustar headers hold them
    (a pax header per member for finer ones would double the tar of small files and the time to read it)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in entries:
            info = tarfile.TarInfo(entry.path)
            info.mode, info.mtime = entry.mode, entry.mtime_ns // 10**9
            if entry.kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(entry.data)
                tar.addfile(info, io.BytesIO(entry.data))
    return out.getvalue()


_REFUSED_TYPES = {tarfile.SYMTYPE: "a symbolic link", tarfile.LNKTYPE: "a hard link",
                  tarfile.CHRTYPE: "a character device", tarfile.BLKTYPE: "a block device", tarfile.FIFOTYPE: "a fifo",
                  tarfile.CONTTYPE: "a contiguous file", tarfile.GNUTYPE_SPARSE: "a sparse file"}


def from_tar(data: bytes, cfg: SandboxConfig) -> list[Entry]:
    """The checked entries of the uncompressed tar `data` (read from memory, nothing unpacked); SnapshotError
    naming the member for anything a snapshot may not hold."""
    if len(data) > cfg.snapshot_tar_bytes:
        raise SnapshotError(f"workspace: the tar is {len(data)} bytes, more than a snapshot can be "
                            f"({cfg.snapshot_tar_bytes}: snapshot_max_bytes plus headers)", 413)
    entries: list[Entry] = []
    total = 0
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            for member in tar:
                name = member.name[:200]
                if len(entries) >= cfg.snapshot_max_files:
                    raise SnapshotError(f"workspace: more than snapshot_max_files ({cfg.snapshot_max_files}) "
                                        "members", 413)
                mtime = _mtime_ns(float(member.mtime))
                if member.type == tarfile.DIRTYPE:
                    entries.append(Entry(member.name, "dir", member.mode, mtime))
                    continue
                if member.type not in (tarfile.REGTYPE, tarfile.AREGTYPE) or member.sparse is not None:
                    what = _REFUSED_TYPES.get(member.type, f"of tar type {member.type!r}")
                    if member.sparse is not None:
                        what = "a sparse file"
                    raise SnapshotError(f"workspace: {name!r} is {what}: a snapshot holds directories and regular "
                                        "files only", 400)
                total += member.size
                if member.size > cfg.max_file_bytes or total > cfg.snapshot_max_bytes:
                    raise SnapshotError(f"workspace: {name!r} claims {member.size} bytes: past max_file_bytes "
                                        f"({cfg.max_file_bytes}) or, with the members before it, snapshot_max_bytes "
                                        f"({cfg.snapshot_max_bytes})", 413)
                content = tar.extractfile(member).read()
                if len(content) != member.size:
                    raise SnapshotError(f"workspace: {name!r} is cut short ({len(content)} of {member.size} bytes)",
                                        400)
                entries.append(Entry(member.name, "file", member.mode, mtime, content))
            end = tar.offset
    except (tarfile.TarError, EOFError, ValueError, UnicodeError, OverflowError) as e:
        raise SnapshotError(f"workspace: not an uncompressed tar archive ({e})", 400) from None
    if data[end:].strip(b"\0"):
        raise SnapshotError(f"workspace: bytes after the last tar member at offset {end} are not a tar header", 400)
    return checked(entries, cfg, "workspace")


def from_interpreter(answer: dict, cfg: SandboxConfig, session_id: str) -> tuple[list[Entry], list[str]]:
    """The checked entries and skipped paths of a session interpreter's snapshot answer (workspace_src.py),
    which the session's own code could have forged."""
    if answer.get("error"):
        why = str(answer["error"])[:300]
        if answer.get("over") is True:
            raise SnapshotError(f"session {session_id!r}: the work dir cannot be snapshotted: {why}", 413)
        raise SnapshotError(f"session {session_id!r}: its interpreter could not snapshot the work dir: {why}", 409)
    raw, skipped = answer.get("entries"), answer.get("skipped")
    entries: list[Entry] = []
    try:
        if not isinstance(raw, list) or not isinstance(skipped, list):
            raise TypeError("no entries")
        for path, kind, mode, mtime_ns, data in raw:
            if not (isinstance(path, str) and kind in ("dir", "file") and isinstance(mode, int)
                    and isinstance(mtime_ns, int) and isinstance(data, str)):
                raise TypeError(f"entry {str(path)[:100]!r}")
            entries.append(Entry(path, kind, mode, max(0, min(mtime_ns, 2**62)), base64.b64decode(data, validate=True)))
    except (TypeError, ValueError, binascii.Error) as e:
        raise SnapshotError(f"session {session_id!r}: its interpreter answered a malformed snapshot ({e}); the "
                            "session's own code may have changed it", 409) from None
    return checked(entries, cfg, f"session {session_id!r}"), [str(p)[:MAX_PATH] for p in skipped[:100]]


def to_interpreter(entries: list[Entry]) -> list[list]:
    """Checked entries as the interpreter's lay_down takes them."""
    return [[e.path, e.kind, e.mode, e.mtime_ns, base64.b64encode(e.data).decode()] for e in entries]


@dataclass
class CellLog:
    """The cells that built an interpreter's state, oldest first, to replay in a fresh one. Past `max_bytes` of
    code, or once a cell timed out (how far it got is unknown), it can no longer rebuild the state
    (`replayable` False) and keeps no cells; an interpreter that was replaced starts it again."""

    max_bytes: int
    cells: list[str] = field(default_factory=list)
    size: int = 0
    replayable: bool = True

    def record(self, code: str, cell: dict) -> None:
        """Keep the log in step with the interpreter after `cell` (a session cell's result)."""
        if cell["restarted"]:  # a fresh interpreter: the cell ran in it unless it is what killed it or timed out
            self.cells, self.size, self.replayable = [], 0, True
            if (cell.get("error") or {}).get("name") == "SessionRestarted" or cell["status"] == "timeout":
                return
        elif cell["status"] == "timeout":
            self.cells, self.size, self.replayable = [], 0, False
            return
        size = len(code.encode("utf-8", "surrogatepass"))
        if not self.replayable or self.size + size > self.max_bytes:
            self.cells, self.size, self.replayable = [], 0, False
            return
        self.cells.append(code)
        self.size += size

    def copy(self) -> CellLog:
        return CellLog(self.max_bytes, list(self.cells), self.size, self.replayable)


async def snapshot_of(session, cfg: SandboxConfig) -> tuple[list[Entry], list[str]]:
    """The checked files of a live session's work dir and the paths it skipped (symlinks, fifos, sockets)."""
    try:
        answer = await session.proc.snapshot()
    except BackendError as e:
        if not session.proc.alive:
            raise SnapshotError(f"session {session.id!r} is dead (its interpreter died): nothing to snapshot", 409)
        raise SnapshotError(f"session {session.id!r}: {e}", 409) from None
    return from_interpreter(answer, cfg, session.id)


async def restore(session, cfg: SandboxConfig, cells: list[str], entries: list[Entry] | None, timeout: float,
                  transfers: asyncio.Semaphore) -> dict:
    """Replay `cells` in `session`, then make its work dir hold exactly `entries` (checked; None: keep what the
    replay wrote), the files moved under `transfers`. Answers `{replayed_cells, diverged, digest, files}`:
    `diverged` whether the replay wrote other files than `entries` (None without them). SnapshotError 409 when a
    cell times out or restarts the interpreter (the state cannot be rebuilt) or the files cannot be laid down,
    500 when the interpreter cannot be started again."""
    for i, code in enumerate(cells, 1):
        try:
            cell = await session.proc.run_cell(code, timeout)
        except BackendError as e:
            raise SnapshotError(f"session {session.id!r}: its interpreter could not be restarted: {e}", 500) from None
        session.log.record(code, cell)
        if cell["restarted"] or cell["status"] == "timeout":
            what = "restarted its interpreter" if cell["restarted"] else "timed out"
            raise SnapshotError(f"session {session.id!r}: replayed cell {i} of {len(cells)} {what}: the cells "
                                "cannot rebuild the state", 409)
    if entries is None:
        return {"replayed_cells": len(cells), "diverged": None, "digest": None, "files": 0}
    want = digest(entries)
    async with transfers:
        try:
            replayed, _ = await snapshot_of(session, cfg)
            diverged = digest(replayed) != want
        except SnapshotError:  # past the limits or unreadable: not what the snapshot holds
            diverged = True
        try:
            await session.proc.lay_down(to_interpreter(entries))
        except (BackendError, ValueError) as e:
            raise SnapshotError(f"session {session.id!r}: the snapshot's files could not be laid down: {e}",
                                409) from None
    return {"replayed_cells": len(cells), "diverged": diverged, "digest": want,
            "files": sum(e.kind == "file" for e in entries)}
