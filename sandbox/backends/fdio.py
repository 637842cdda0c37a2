"""Non-blocking reading and writing of pipe fds the sandbox backend owns (a sandbox's stdio and result pipes)."""

from __future__ import annotations

import asyncio
import os


class FdReader:
    """Feeds an asyncio.StreamReader from a pipe fd we own, and closes that fd exactly once.

    Reading pauses while more than `high_water` bytes wait unread in the StreamReader and resumes when its reader
    has taken them: whatever a sandbox writes, and however long nobody reads it, the service holds at most that
    much of it (the writer blocks on the full pipe instead). (loop.connect_read_pipe is avoided on purpose: under
    uvloop the fd can end up closed twice, and a second close can hit an fd number already reused by another
    sandbox's pipe.)"""

    def __init__(self, fd: int, high_water: int = 1 << 20):
        self.fd = fd
        # StreamReader pauses its transport (this object) past 2 * limit buffered bytes, resumes at <= limit
        self.reader = asyncio.StreamReader(limit=max(1, high_water // 2))
        self.reader.set_transport(self)
        self._loop = asyncio.get_running_loop()
        self._reading = True
        os.set_blocking(fd, False)
        self._loop.add_reader(fd, self._on_readable)

    def pause_reading(self) -> None:
        if self._reading and self.fd >= 0:
            self._loop.remove_reader(self.fd)
        self._reading = False

    def resume_reading(self) -> None:
        if not self._reading and self.fd >= 0:
            self._loop.add_reader(self.fd, self._on_readable)
        self._reading = True

    def _on_readable(self) -> None:
        try:
            data = os.read(self.fd, 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            self.reader.feed_data(data)
        else:
            self.reader.feed_eof()
            self.close()

    def close(self) -> None:
        if self.fd >= 0:
            if self._reading:
                self._loop.remove_reader(self.fd)
            os.close(self.fd)
            self.fd = -1
            if not self.reader.at_eof():
                self.reader.feed_eof()


class FdWriter:
    """Writes to a pipe fd we own without blocking the event loop; closes it exactly once."""

    def __init__(self, fd: int):
        self.fd = fd
        os.set_blocking(fd, False)

    async def write_all(self, data: bytes) -> None:
        loop = asyncio.get_running_loop()
        view = memoryview(data)
        while view and self.fd >= 0:
            try:
                view = view[os.write(self.fd, view[:1 << 16]):]
            except BlockingIOError:
                ready = loop.create_future()
                loop.add_writer(self.fd, ready.set_result, None)
                try:
                    await ready
                finally:
                    if self.fd >= 0:
                        loop.remove_writer(self.fd)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


__all__ = ["FdReader", "FdWriter"]
