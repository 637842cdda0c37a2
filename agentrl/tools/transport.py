"""The registry's HTTP/1.1 transport: keep-alive connections on asyncio protocols, responses parsed by httptools.

The registry keeps one shared `httpx.AsyncClient` (discovery, sessions) whose transport is a `PooledTransport`;
tool calls use the same transport's `roundtrip()` directly with request bytes built once per tool. It exists
because httpcore's pool costs several times more CPU per call at high concurrency (it polls every pooled
connection per request, parses in pure Python and writes each request twice), which on a small machine shared
with the tool service caps throughput and sets the p99 (docs/benchmarks.md, "Tool calls").
Here a request is one `transport.write`, the response is parsed in C as it arrives (`data_received`), and one
timer bounds the whole exchange.

Pool: idle keep-alive connections per origin, reused most-recent first, at most `max_keepalive` kept per origin.
A connection the server closes leaves the pool as soon as the event loop sees the EOF; one idle for longer than
`STALE_CHECK_S` is also checked with a zero-timeout `select()` before reuse (the server may have closed it a
moment ago), and one idle for longer than `keepalive_expiry_s` is closed. The pool never queues: in-flight
requests are bounded by the registry's concurrency limits, so every request gets a connection at once.

Timeouts: `connect` bounds opening a connection; `read` bounds the whole response after the request is written
(not each read, as in httpx's own transport), so a server trickling bytes cannot hold a call open. Responses are
read whole into memory (tool results are small). Errors are httpx's: ConnectError, ConnectTimeout, ReadTimeout,
ReadError, RemoteProtocolError.
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import ssl
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import httptools
import httpx

STALE_CHECK_S = 1.0  # reusing a connection idle longer than this first checks that the server has not closed it
_DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class Origin:
    scheme: str  # "http" or "https"
    host: str
    port: int

    @classmethod
    def from_url(cls, url: str) -> Origin:
        parts = urlsplit(url)
        if parts.scheme not in _DEFAULT_PORTS or not parts.hostname:
            raise ValueError(f"url {url!r} must look like http://host:port")
        return cls(parts.scheme, parts.hostname, parts.port or _DEFAULT_PORTS[parts.scheme])

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == _DEFAULT_PORTS[self.scheme] else f"{host}:{self.port}"


def request_head(method: str, target: str, origin: Origin, headers: dict[str, str]) -> bytes:
    """The request line and headers up to (not including) the Content-Length value: append
    `b"%d\\r\\n\\r\\n" % len(body) + body` per request (see `with_body`)."""
    lines = [f"{method} {target} HTTP/1.1", f"host: {origin.host_header}"]
    lines += [f"{k}: {v}" for k, v in headers.items() if k.lower() not in ("host", "content-length")]
    return ("\r\n".join(lines) + "\r\ncontent-length: ").encode("latin-1")


def with_body(head: bytes, body: bytes) -> bytes:
    return b"%b%d\r\n\r\n%b" % (head, len(body), body)


@dataclass(slots=True)
class RawResponse:
    status_code: int
    reason: bytes
    headers: list[tuple[bytes, bytes]]  # as received, names in their original case
    content: bytes
    keep_alive: bool

    def header(self, name: str) -> str | None:
        wanted = name.lower().encode("latin-1")
        for k, v in self.headers:
            if k.lower() == wanted:
                return v.decode("latin-1")
        return None


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection, one request at a time. Also the httptools parser's callback object."""

    def __init__(self, pool: PooledTransport, origin: Origin):
        self.pool = pool
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.idle_since = 0.0
        self.waiter: asyncio.Future | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.head_only = False
        self._reset()

    def _reset(self) -> None:
        self.reason = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []
        self.headers_done = False
        self.framed = False  # the response has Content-Length or chunked framing (else it ends at EOF)

    # -- asyncio.Protocol ---------------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.waiter is None or self.waiter.done():
            self.close()  # bytes nobody asked for: the connection is out of step, never reuse it
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            self._fail(httpx.RemoteProtocolError(f"malformed HTTP response from {self.origin.host_header}: {e}"))
            self.close()

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool._forget(self)
        if self.waiter is not None and not self.waiter.done():
            if self.headers_done and not self.framed and exc is None:
                self._finish(keep_alive=False)  # a response delimited by the end of the connection
            elif exc is not None:
                self._fail(httpx.ReadError(f"connection to {self.origin.host_header} failed: {exc!r}"))
            else:
                self._fail(httpx.RemoteProtocolError(f"{self.origin.host_header} closed the connection without "
                                                     f"a complete response"))
        self.parser = None  # type: ignore[assignment]  # break the protocol <-> parser cycle

    # -- httptools callbacks ------------------------------------------------------------------------------------
    def on_status(self, status: bytes) -> None:
        self.reason = status

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.headers_done = True
        for k, v in self.headers:
            key = k.lower()
            if key == b"content-length" or (key == b"transfer-encoding" and b"chunked" in v.lower()):
                self.framed = True
        if self.head_only:  # a HEAD response has no body whatever its headers say
            self._finish(keep_alive=False)

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200:  # an interim response (100 Continue): the real one follows
            self._reset()
            return
        if self.waiter is not None and not self.waiter.done():
            self._finish(keep_alive=self.parser.should_keep_alive())

    # -- one exchange -------------------------------------------------------------------------------------------
    def start(self, data: bytes, read_timeout: float | None, head_only: bool = False) -> asyncio.Future:
        """Write one request; the returned future resolves to its RawResponse or an httpx transport error."""
        loop = self.pool.loop
        self.waiter = loop.create_future()
        self.head_only = head_only
        self._reset()
        self.transport.write(data)
        if read_timeout is not None:
            self.timer = loop.call_later(read_timeout, self._timed_out, read_timeout)
        return self.waiter

    def _finish(self, keep_alive: bool) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        body = self.body[0] if len(self.body) == 1 else b"".join(self.body)
        status = self.parser.get_status_code() if self.parser is not None else 0
        self.waiter.set_result(RawResponse(status, self.reason, self.headers, body, keep_alive))

    def _fail(self, error: Exception) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(error)

    def _timed_out(self, seconds: float) -> None:
        self.timer = None
        self._fail(httpx.ReadTimeout(f"no complete response from {self.origin.host_header} within {seconds:g}s"))
        self.close()

    def is_reusable(self, now: float) -> bool:
        if self.closed or self.transport is None or self.transport.is_closing():
            return False
        idle = now - self.idle_since
        if idle > self.pool.keepalive_expiry_s:
            return False
        if idle > STALE_CHECK_S:
            sock = self.transport.get_extra_info("socket")
            # Readable while idle means EOF (or junk) arrived that the loop has not delivered yet.
            if sock is None or select.select([sock.fileno()], [], [], 0)[0]:
                return False
        return True

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.pool._forget(self)
            if self.transport is not None:
                self.transport.close()


class PooledTransport(httpx.AsyncBaseTransport):
    """Keep-alive HTTP/1.1 connections for one event loop (the registry's); see the module docstring."""

    # 4 s: under the 5 s idle limit of uvicorn (our tool services) and node, so we drop a connection before the
    # server does instead of racing its close with a request.
    def __init__(self, max_keepalive: int = 256, keepalive_expiry_s: float = 4.0):
        if max_keepalive < 1:
            raise ValueError(f"max_keepalive must be >= 1, got {max_keepalive}")
        self.max_keepalive = max_keepalive
        self.keepalive_expiry_s = keepalive_expiry_s
        self._idle: dict[Origin, list[_Connection]] = {}
        self._busy: set[_Connection] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tls: ssl.SSLContext | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop  # type: ignore[return-value]

    def _bind_loop(self) -> None:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            # Connections belong to the loop that opened them; a new loop (another asyncio.run) starts afresh.
            for conns in self._idle.values():
                for c in list(conns):
                    c.closed = True
                    with contextlib.suppress(RuntimeError):  # their loop may be closed already
                        c.transport.close()
            self._idle.clear()
            self._busy.clear()
            self._loop = loop

    async def _connect(self, origin: Origin, timeout: float | None) -> _Connection:
        conn = _Connection(self, origin)
        kwargs: dict = {}
        if origin.scheme == "https":
            if self._tls is None:
                self._tls = ssl.create_default_context()
            kwargs = {"ssl": self._tls, "server_hostname": origin.host}
        try:
            async with asyncio.timeout(timeout):
                await self.loop.create_connection(lambda: conn, origin.host, origin.port, **kwargs)
        except TimeoutError:
            conn.close()
            raise httpx.ConnectTimeout(f"could not connect to {origin.host_header} within {timeout:g}s") from None
        except OSError as e:
            raise httpx.ConnectError(f"could not connect to {origin.host_header}: {e}") from None
        return conn

    def _take_idle(self, origin: Origin) -> _Connection | None:
        idle = self._idle.get(origin)
        if not idle:
            return None
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if conn.is_reusable(now):
                return conn
            conn.close()
        return None

    def _release(self, conn: _Connection, keep_alive: bool) -> None:
        self._busy.discard(conn)
        idle = self._idle.setdefault(conn.origin, [])
        if not keep_alive or conn.closed or len(idle) >= self.max_keepalive:
            conn.close()
            return
        conn.idle_since = time.monotonic()
        idle.append(conn)

    def _forget(self, conn: _Connection) -> None:
        self._busy.discard(conn)
        idle = self._idle.get(conn.origin)
        if idle and conn in idle:
            idle.remove(conn)

    async def roundtrip(self, origin: Origin, data: bytes, *, connect_timeout: float | None,
                        read_timeout: float | None, head_only: bool = False) -> RawResponse:
        """Send `data` (a whole HTTP/1.1 request, e.g. `with_body(head, body)`) and read the whole response."""
        self._bind_loop()
        conn = self._take_idle(origin) or await self._connect(origin, connect_timeout)
        self._busy.add(conn)
        try:
            response = await conn.start(data, read_timeout, head_only)
        except BaseException:  # an error, a timeout or the caller's cancellation: the exchange is unfinished
            conn.close()
            raise
        self._release(conn, response.keep_alive)
        return response

    # -- httpx ----------------------------------------------------------------------------------------------------
    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        origin = Origin(url.scheme, url.host, url.port or _DEFAULT_PORTS.get(url.scheme, 80))
        body = await request.aread()
        skip = (b"host", b"content-length", b"transfer-encoding")
        lines = [b"%b %b HTTP/1.1" % (request.method.encode("ascii"), url.raw_path or b"/"),
                 b"host: " + origin.host_header.encode("latin-1")]
        lines += [k + b": " + v for k, v in request.headers.raw if k.lower() not in skip]
        lines.append(b"content-length: %d" % len(body))
        data = b"\r\n".join(lines) + b"\r\n\r\n" + body
        timeouts = request.extensions.get("timeout", {})
        try:
            raw = await self.roundtrip(origin, data, connect_timeout=timeouts.get("connect"),
                                       read_timeout=timeouts.get("read"), head_only=request.method == "HEAD")
        except httpx.TransportError as e:
            e.request = request
            raise
        return httpx.Response(raw.status_code, headers=raw.headers, stream=httpx.ByteStream(raw.content),
                              extensions={"http_version": b"HTTP/1.1", "reason_phrase": raw.reason})

    async def aclose(self) -> None:
        for conns in list(self._idle.values()):
            for conn in list(conns):
                conn.close()
        for conn in list(self._busy):
            conn.close()
        self._idle.clear()
        self._busy.clear()


def make_client(max_connections: int) -> tuple[httpx.AsyncClient, PooledTransport]:
    """The registry's shared HTTP client (pooled keep-alive transport, no proxies from the environment) and its
    transport, which the tool-call hot path uses directly."""
    transport = PooledTransport(max_keepalive=max_connections)
    return httpx.AsyncClient(transport=transport, trust_env=False), transport


__all__ = ["Origin", "PooledTransport", "RawResponse", "make_client", "request_head", "with_body"]
