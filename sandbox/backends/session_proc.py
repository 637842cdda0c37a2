"""Host side of a session's persistent interpreter: one cell at a time, interrupt on timeout, restart if stuck.

The interpreter's stdout and stderr are drained continuously; an end marker carrying the cell id (written by
the interpreter after each cell) cuts them into per-cell outputs. A cell past its time limit gets SIGINT
(KeyboardInterrupt in the main thread), which keeps the namespace; one that does not yield within the grace
period, or an interpreter that died (OOM, os._exit, killed), is replaced and the result says `restarted: true`.
Between cells the session's cgroup is frozen (where a freezer exists): threads a cell left running use no CPU
until the next cell, which runs under admission control and its own time limit.

The session's code can write to the result pipe itself (it is the interpreter's own fd): the host believes no
length header. A frame past SESSION_FRAME_BYTES (past `snapshot_frame_bytes` while a snapshot is asked for), one
that is not a JSON object, or more frames than a cell answers (a background thread flooding) end the interpreter;
it is replaced like one that died.

Between cells the interpreter also answers a snapshot of its work dir's files and lays a snapshot's files down
(workspace_src.py); each cell's result says whether the work dir changed (`workspace_changed`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from typing import Awaitable, Callable

from sandbox.backends.base import BackendError, encode_frame, read_frame
from sandbox.config import SandboxConfig
from sandbox.output import HeadTail

MARKER_PREFIX = b"\x00agentrl-cell-end:"
SESSION_FRAME_BYTES = 1 << 20  # a cell's result: its error's name, value and traceback (each capped inside)
MAX_QUEUED_FRAMES = 4  # a cell answers with one frame: more waiting means something else writes them


def snapshot_frame_bytes(cfg: SandboxConfig) -> int:
    """The largest snapshot frame an interpreter can send within the limits: base64 of the files, and per entry a
    path of up to 1,024 characters (JSON escapes: up to 6 bytes each) and its fields, plus the skipped paths."""
    return cfg.snapshot_max_bytes * 4 // 3 + (cfg.snapshot_max_files + 100) * (6 * 1024 + 64) + 4096


class _Stream:
    """Cuts one output stream into per-cell HeadTail buffers at the end markers."""

    def __init__(self, limit: int):
        self.limit = limit
        self.buf = HeadTail(limit)
        self.pending = b""
        self.marker = b""
        self.seen = asyncio.Event()

    def expect(self, cell_id: str) -> HeadTail:
        """Start a cell: output produced since the last marker (background threads) counts toward it."""
        self.marker = MARKER_PREFIX + cell_id.encode() + b"\x00"
        self.seen.clear()
        return self.buf

    def feed(self, chunk: bytes) -> None:
        data = self.pending + chunk
        self.pending = b""
        if self.marker:
            idx = data.find(self.marker)
            if idx >= 0:
                self.buf.feed(data[:idx])
                self.buf = HeadTail(self.limit)  # what follows belongs to the next cell
                self.marker, data = b"", data[idx + len(self.marker):]
                self.seen.set()
            else:
                keep = len(self.marker) - 1  # a marker may straddle two reads
                self.pending, data = data[-keep:], data[:-keep]
        self.buf.feed(data)

    def flush(self) -> None:
        self.buf.feed(self.pending)
        self.pending = b""


class SessionProc:
    def __init__(self, spawn: Callable[[], Awaitable], dispose: Callable[[object], Awaitable[None]],
                 cfg: SandboxConfig):
        self._spawn = spawn
        self._dispose = dispose
        self.cfg = cfg
        self.warm = None
        self.lock = asyncio.Lock()
        self.execution_count = 0
        self.restarts = 0
        self._readers: list[asyncio.Task] = []
        self._streams: list[_Stream] = []
        self._over_limit = False
        self._forged = False  # the interpreter wrote something no cell answers with: it is replaced
        self._frame_cap = SESSION_FRAME_BYTES  # the largest frame accepted now (more while a snapshot is asked)
        self._limits = [cfg.snapshot_max_bytes, cfg.snapshot_max_files]

    async def start(self) -> None:
        self.warm = await self._spawn()
        self._forged = False
        self._streams = [_Stream(self.cfg.max_output_bytes), _Stream(self.cfg.max_output_bytes)]
        self._frames: asyncio.Queue = asyncio.Queue()
        self._readers = [asyncio.create_task(self._read(self.warm.stdout, self._streams[0])),
                         asyncio.create_task(self._read(self.warm.stderr, self._streams[1])),
                         asyncio.create_task(self._read_frames())]

    async def _read_frames(self) -> None:
        # One reader owns the result pipe, so a timed-out wait can never cut a frame in half.
        warm = self.warm
        while True:
            frame = await read_frame(warm.results, lambda: self._frame_cap)
            if frame is not None and "runner_exit" in frame:  # a zygote sandbox reports its interpreter's end
                if isinstance(frame["runner_exit"], int):
                    warm.exit_code = frame["runner_exit"]
                continue
            if frame is None and not warm.results.at_eof() or self._frames.qsize() >= MAX_QUEUED_FRAMES:
                # oversized, malformed or flooding: the session's own code wrote it. End the interpreter now
                # (the next cell starts a fresh one) and answer the waiting cell as if it had died.
                self._forged = True
                await warm.kill()
                frame = None
            self._frames.put_nowait(frame)
            if frame is None:
                return

    async def _read(self, reader: asyncio.StreamReader, stream: _Stream) -> None:
        while True:
            chunk = await reader.read(1 << 16)
            if not chunk:
                stream.flush()
                return
            stream.feed(chunk)
            if stream.buf.total > self.cfg.output_kill_bytes:
                self._over_limit = True

    @property
    def alive(self) -> bool:
        return self.warm is not None and self.warm.alive and not self._forged

    async def _stop(self) -> None:
        for task in self._readers:
            task.cancel()
        if self.warm is not None:
            await self._dispose(self.warm)
        self.warm = None

    async def _restart(self) -> None:
        await self._stop()
        self.restarts += 1
        self.execution_count = 0
        await self.start()

    async def _send(self, msg: dict) -> None:
        await self.warm.write(encode_frame(msg))

    async def _wait_result(self, cell_id: str, timeout: float) -> dict | None:
        """The result frame for `cell_id`, None if the interpreter died or wrote a frame that is not it (the
        interpreter answers each cell once, with its id: anything else was written by the session's code, and
        the interpreter is ended); raises TimeoutError."""
        frame = await asyncio.wait_for(self._frames.get(), max(0.0, timeout))
        if frame is not None and frame.get("id") != cell_id:
            self._forged = True
            await self.warm.kill()
            return None
        return frame

    async def run_cell(self, code: str, timeout: float, track_workspace: bool = False) -> dict:
        """Run one cell; with `track_workspace` the result says whether the work dir changed since the last cell
        that asked (`workspace_changed`; otherwise None): the interpreter stats the work dir after the cell."""
        async with self.lock:
            restarted = False
            if not self.alive:
                await self._restart()
                restarted = True
            self.execution_count += 1
            if self.warm.cgroup is not None:
                self.warm.cgroup.thaw()
            cell_id = uuid.uuid4().hex
            bufs = [s.expect(cell_id) for s in self._streams]
            self._over_limit = False
            cg = self.warm.cgroup
            base = cg.counters() if cg is not None else None
            started = time.monotonic()
            status, reason, frame = "ok", "exit", None
            try:
                msg = {"op": "cell", "id": cell_id, "code": code, "n": self.execution_count}
                await self._send({**msg, "ws": self._limits} if track_workspace else msg)
                frame = await self._wait_limited(cell_id, timeout)
            except (BrokenPipeError, ConnectionResetError):
                frame = None
            except asyncio.TimeoutError:
                status, reason = "timeout", "output_limit" if self._over_limit else "timeout"
                frame = await self._interrupt(cell_id)
            elapsed = time.monotonic() - started
            error, changed = None, track_workspace or None  # a replaced interpreter has a fresh work dir
            if frame is not None:
                changed = frame.get("changed")
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(asyncio.gather(*(s.seen.wait() for s in self._streams)), 2)
                error = frame.get("error")
                if status == "ok" and error:
                    status = "error"
                if status == "timeout":
                    error = {"name": "TimeoutError",
                             "value": f"cell exceeded its {timeout:g} s time limit and was interrupted"
                             if reason == "timeout" else "cell output exceeded the output limit and was interrupted",
                             "traceback": (error or {}).get("traceback", "")}
            else:
                counters = cg.counters().delta(base) if cg is not None else None
                if self._forged:
                    status, reason = "error", "runner_fault"
                elif status != "timeout":
                    status = "error"
                    rc = await self.warm.wait_exit(1)
                    reason = ("oom" if counters and counters.oom_kills else
                              "pids_limit" if counters and counters.pids_max_hits else
                              "signal" if rc is None or rc < 0 or rc > 128 else "exit")
                for s in self._streams:
                    s.flush()
                what = {"oom": "ran out of memory", "pids_limit": "hit the process limit",
                        "signal": "was killed", "exit": "exited", "timeout": "could not be interrupted",
                        "output_limit": "could not be interrupted",
                        "runner_fault": "wrote an oversized or malformed result frame"}[reason]
                error = {"name": "SessionRestarted" if status != "timeout" else "TimeoutError",
                         "value": f"the interpreter {what}; it was restarted and earlier state is lost",
                         "traceback": ""}
                await self._restart()
                restarted = True
            if self.alive and self.warm.cgroup is not None:
                self.warm.cgroup.freeze()
            return {"status": status, "stdout": bufs[0].text(), "stderr": bufs[1].text(), "error": error,
                    "execution_count": self.execution_count, "restarted": restarted, "exit_reason": reason,
                    "truncated": bufs[0].truncated or bufs[1].truncated, "execution_time": round(elapsed, 4),
                    "workspace_changed": changed if changed in (True, False) else None}

    async def _request(self, msg: dict, timeout: float, frame_cap: int = SESSION_FRAME_BYTES) -> dict:
        """Send the interpreter `msg` between cells and return its answer; BackendError if it is dead or does not
        answer within `timeout`. The cgroup is thawed meanwhile, and the answer may be up to `frame_cap` bytes."""
        async with self.lock:
            if not self.alive:
                raise BackendError("its interpreter is not running (it died or was restarted)")
            cg = self.warm.cgroup
            if cg is not None:
                cg.thaw()
            msg = {**msg, "id": uuid.uuid4().hex}
            self._frame_cap = frame_cap
            try:
                await self._send(msg)
                frame = await self._wait_result(msg["id"], timeout)
            except (BrokenPipeError, ConnectionResetError, asyncio.TimeoutError):
                frame = None
            finally:
                self._frame_cap = SESSION_FRAME_BYTES
                if self.alive and cg is not None:
                    cg.freeze()
            if frame is None:
                # An interpreter that just died (a closed control pipe) is reported by its pid 1 a moment later:
                # wait for that report, so that `alive` tells a death from a timeout.
                await asyncio.wait(self._readers[2:], timeout=2)
                raise BackendError(f"its interpreter did not answer the {msg['op']} (it died or timed out)")
            return frame

    async def fork(self, n: int, timeout: float = 60.0) -> None:
        """Have the interpreter fork `n` times, between cells (the children's fds are already on its fork
        socket); BackendError if it is dead or does not answer, ValueError with its reason if it refused."""
        frame = await self._request({"op": "fork", "n": n}, timeout)
        if frame.get("error"):
            raise ValueError(str(frame["error"]))

    async def snapshot(self, timeout: float = 60.0) -> dict:
        """The work dir's files as the interpreter reports them (`{"entries", "skipped"}` or `{"error"}` past the
        limits), unchecked: sandbox/snapshot.py checks them."""
        return await self._request({"op": "snapshot", "ws": self._limits}, timeout, snapshot_frame_bytes(self.cfg))

    async def lay_down(self, entries: list[list], timeout: float = 60.0) -> None:
        """Make the work dir hold exactly `entries` (checked); ValueError with the interpreter's reason if it
        could not."""
        frame = await self._request({"op": "lay_down", "entries": entries, "ws": self._limits}, timeout)
        if frame.get("error"):
            raise ValueError(str(frame["error"]))

    async def _wait_limited(self, cell_id: str, timeout: float) -> dict | None:
        """Wait for the result, giving up early (as a timeout) when the cell floods its output."""
        end = time.monotonic() + timeout
        while True:
            step = min(0.25, end - time.monotonic())
            if step <= 0 or self._over_limit:
                raise asyncio.TimeoutError
            try:
                return await self._wait_result(cell_id, step)
            except asyncio.TimeoutError:
                continue

    async def _interrupt(self, cell_id: str) -> dict | None:
        """SIGINT the cell; None if it did not stop within the grace period (the caller restarts)."""
        try:
            await self._send({"op": "interrupt", "id": cell_id})
            return await self._wait_result(cell_id, self.cfg.session_interrupt_grace_s)
        except (asyncio.TimeoutError, BrokenPipeError, ConnectionResetError):
            return None

    async def close(self) -> None:
        await self._stop()
