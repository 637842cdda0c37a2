"""Bounded capture of a stream: keeps the head and the tail, counts everything, never blocks the writer."""

from __future__ import annotations

import asyncio


class HeadTail:
    """Keeps the first and last `limit // 2` bytes of everything fed to it."""

    def __init__(self, limit: int):
        self.half = max(1, limit // 2)
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self.half - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > 2 * self.half:  # trim rarely: amortised O(1) per byte
                del self.tail[: len(self.tail) - self.half]

    @property
    def truncated(self) -> bool:
        return self.total > len(self.head) + min(len(self.tail), self.half)

    def text(self) -> str:
        tail = bytes(self.tail[-self.half:]) if self.tail else b""
        if not self.truncated:
            return (bytes(self.head) + tail).decode("utf-8", errors="replace")
        dropped = self.total - len(self.head) - len(tail)
        marker = f"\n...[{dropped} bytes truncated]...\n"
        return bytes(self.head).decode("utf-8", errors="replace") + marker + tail.decode("utf-8", errors="replace")


async def drain(reader: asyncio.StreamReader, sink: HeadTail, kill_at: int, on_limit, marker: bytes = b"",
                ended: asyncio.Event | None = None) -> bool:
    """Read `reader` into `sink` until EOF; call `on_limit()` once when more than `kill_at` bytes were read.

    `marker` ends the writer's output: what comes before it goes to `sink`, `ended` is set, and from then on what
    other holders of the pipe (daemonised children, until they are killed) still write is read, counted toward
    `kill_at` and discarded, never kept and never left to back up. Returns True when the marker was seen."""
    total, fired, seen = 0, False, False
    pending = b""
    while True:
        chunk = await reader.read(1 << 16)
        if not chunk:
            if not seen:
                sink.feed(pending)
            return seen
        total += len(chunk)
        if not seen:
            data = pending + chunk
            pending = b""
            if marker:
                idx = data.find(marker)
                if idx >= 0:
                    sink.feed(data[:idx])
                    seen = True
                    if ended is not None:
                        ended.set()
                    data = b""
                else:
                    keep = len(marker) - 1  # a marker may straddle two reads
                    data, pending = data[:-keep], data[-keep:]
            sink.feed(data)
        if not fired and total > kill_at:
            fired = True
            on_limit()
