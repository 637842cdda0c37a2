"""PooledTransport against scripted loopback servers: keep-alive reuse, servers closing connections, framing,
timeouts, cancellation, errors, and the httpx client on top of it."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time

import httpx
import pytest

from agentrl.tools import transport as transport_module
from agentrl.tools.transport import Origin, PooledTransport, make_client, request_head, with_body

OK = b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 12\r\n\r\n{"ok": true}'


@contextlib.asynccontextmanager
async def scripted_server(handler):
    """An asyncio server on a free loopback port; `handler(reader, writer, state)` serves one connection.
    Yields (origin, state) where state["connections"] counts accepted connections."""
    state = {"connections": 0}

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        state["connections"] += 1
        try:
            await handler(reader, writer, state)
        finally:
            writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield Origin("http", "127.0.0.1", port), state
    finally:
        server.close()


async def read_request(reader: asyncio.StreamReader) -> bytes | None:
    """One request (head + Content-Length body), or None at EOF."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head + await reader.readexactly(length)


async def keep_answering(reader, writer, state) -> None:
    while (request := await read_request(reader)) is not None:
        state.setdefault("requests", []).append(request)
        writer.write(OK)
        await writer.drain()


def post(origin: Origin, body: bytes = b'{"a": 1}') -> bytes:
    return with_body(request_head("POST", "/tools/x", origin, {"content-type": "application/json"}), body)


async def test_keep_alive_connection_is_reused_and_request_bytes_are_exact():
    async with scripted_server(keep_answering) as (origin, state):
        pool = PooledTransport()
        for _ in range(3):
            response = await pool.roundtrip(origin, post(origin), connect_timeout=1, read_timeout=1)
            assert (response.status_code, response.content) == (200, b'{"ok": true}')
            assert response.header("Content-Type") == "application/json"
        assert state["connections"] == 1
        assert state["requests"][0] == (f"POST /tools/x HTTP/1.1\r\nhost: 127.0.0.1:{origin.port}\r\n"
                                        f"content-type: application/json\r\ncontent-length: 8\r\n\r\n"
                                        f'{{"a": 1}}').encode()
        await pool.aclose()


async def test_connection_idle_past_the_keepalive_expiry_is_replaced():
    async with scripted_server(keep_answering) as (origin, state):
        pool = PooledTransport(keepalive_expiry_s=0.05)
        for pause in (0.0, 0.1):
            await asyncio.sleep(pause)
            assert (await pool.roundtrip(origin, post(origin), connect_timeout=1, read_timeout=1)).status_code == 200
        assert state["connections"] == 2
        await pool.aclose()


async def test_concurrent_requests_get_their_own_connections_then_share_the_pool():
    async def slow(reader, writer, state):
        while await read_request(reader) is not None:
            await asyncio.sleep(0.05)
            writer.write(OK)

    async with scripted_server(slow) as (origin, state):
        pool = PooledTransport(max_keepalive=3)
        for _ in range(2):
            results = await asyncio.gather(*(pool.roundtrip(origin, post(origin), connect_timeout=1,
                                                            read_timeout=2) for _ in range(5)))
            assert all(r.status_code == 200 for r in results)
        # 5 connections for the first wave; 3 kept alive and reused, 2 new ones for the second wave.
        assert state["connections"] == 7
        await pool.aclose()


async def test_server_closing_an_idle_connection_is_not_an_error():
    async def one_then_close(reader, writer, state):
        await read_request(reader)
        writer.write(OK)
        await writer.drain()  # then close: an idle keep-alive timeout on the server

    async with scripted_server(one_then_close) as (origin, state):
        pool = PooledTransport()
        assert (await pool.roundtrip(origin, post(origin), connect_timeout=1, read_timeout=1)).status_code == 200
        await asyncio.sleep(0.05)  # the EOF reaches the loop: the connection leaves the pool
        assert (await pool.roundtrip(origin, post(origin), connect_timeout=1, read_timeout=1)).status_code == 200
        assert state["connections"] == 2
        await pool.aclose()


async def test_connection_closed_while_the_loop_was_busy_is_detected_before_reuse(monkeypatch):
    # A blocking server thread closes the connection while this event loop is blocked, so the EOF sits unread
    # in the socket when the idle connection is picked again: the stale check must find it.
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    accepted = []

    def serve() -> None:
        for _ in range(2):
            conn, _ = listener.accept()
            accepted.append(conn)
            conn.recv(65536)
            conn.sendall(OK)
            if len(accepted) == 1:
                conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    monkeypatch.setattr(transport_module, "STALE_CHECK_S", 0.0)
    origin = Origin("http", "127.0.0.1", port)
    pool = PooledTransport()
    try:
        assert (await pool.roundtrip(origin, post(origin), connect_timeout=1, read_timeout=1)).status_code == 200
        time.sleep(0.2)  # noqa: ASYNC251 - block the loop: the FIN arrives but connection_lost cannot run yet
        assert (await pool.roundtrip(origin, post(origin), connect_timeout=1, read_timeout=2)).status_code == 200
        assert len(accepted) == 2
    finally:
        await pool.aclose()
        thread.join(timeout=2)
        listener.close()
        for conn in accepted:
            conn.close()


async def test_connection_close_header_chunked_and_eof_delimited_bodies():
    replies = [b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
               b"HTTP/1.1 201 Created\r\ncontent-length: 2\r\nconnection: close\r\n\r\nhi",
               b"HTTP/1.1 200 OK\r\n\r\nuntil the end"]

    async def scripted(reader, writer, state):
        await read_request(reader)
        reply = replies[state["connections"] - 1]
        writer.write(reply)
        await writer.drain()
        if b"chunked" in reply:  # keep-alive: serve the next request on this connection too
            await read_request(reader)
            writer.write(replies[1])
            await writer.drain()

    async with scripted_server(scripted) as (origin, state):
        pool = PooledTransport()
        chunked = await pool.roundtrip(origin, post(origin), connect_timeout=1, read_timeout=1)
        assert (chunked.content, chunked.keep_alive) == (b"abcde", True)
        closing = await pool.roundtrip(origin, post(origin), connect_timeout=1, read_timeout=1)
        assert (closing.status_code, closing.reason, closing.content, closing.keep_alive) == (201, b"Created", b"hi",
                                                                                             False)
        state["connections"] = 2  # the next connection gets the EOF-delimited reply
        until_eof = await pool.roundtrip(origin, post(origin), connect_timeout=1, read_timeout=1)
        assert (until_eof.content, until_eof.keep_alive) == (b"until the end", False)
        await pool.aclose()


async def test_read_timeout_bounds_the_whole_response_even_when_bytes_trickle():
    async def trickle(reader, writer, state):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n")
        for _ in range(50):
            writer.write(b"x")
            await writer.drain()
            await asyncio.sleep(0.05)

    async with scripted_server(trickle) as (origin, _):
        pool = PooledTransport()
        start = time.monotonic()
        with pytest.raises(httpx.ReadTimeout, match="within 0.3s"):
            await pool.roundtrip(origin, post(origin), connect_timeout=1, read_timeout=0.3)
        assert time.monotonic() - start < 1.0
        assert not pool._idle.get(origin), "a timed-out connection must never be reused"
        await pool.aclose()


async def test_cancelled_request_closes_its_connection_and_the_next_one_works():
    async def slow_first(reader, writer, state):
        while await read_request(reader) is not None:
            if state["connections"] == 1:
                await asyncio.sleep(1)
            writer.write(OK)

    async with scripted_server(slow_first) as (origin, state):
        pool = PooledTransport()
        task = asyncio.create_task(pool.roundtrip(origin, post(origin), connect_timeout=1, read_timeout=5))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert (await pool.roundtrip(origin, post(origin), connect_timeout=1, read_timeout=1)).status_code == 200
        assert state["connections"] == 2
        await pool.aclose()


async def test_refused_and_malformed_and_lost_connections_raise_httpx_errors():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = Origin("http", "127.0.0.1", s.getsockname()[1])
    pool = PooledTransport()
    with pytest.raises(httpx.ConnectError, match="could not connect to 127.0.0.1"):
        await pool.roundtrip(dead, post(dead), connect_timeout=1, read_timeout=1)

    async def garbage(reader, writer, state):
        await read_request(reader)
        writer.write(b"NOT HTTP AT ALL\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.5)

    async with scripted_server(garbage) as (origin, _):
        with pytest.raises(httpx.RemoteProtocolError, match="malformed HTTP response"):
            await pool.roundtrip(origin, post(origin), connect_timeout=1, read_timeout=1)

    async def hang_up(reader, writer, state):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 50\r\n\r\npartial")
        await writer.drain()

    async with scripted_server(hang_up) as (origin, _):
        with pytest.raises(httpx.RemoteProtocolError, match="without a complete response"):
            await pool.roundtrip(origin, post(origin), connect_timeout=1, read_timeout=1)
    await pool.aclose()


async def test_httpx_client_on_the_pooled_transport():
    async def echo(reader, writer, state):
        while (request := await read_request(reader)) is not None:
            head, _, body = request.partition(b"\r\n\r\n")
            line = head.split(b"\r\n")[0]
            reply = line + b" | " + body
            extra = b"" if line.startswith(b"HEAD") else reply
            writer.write(b"HTTP/1.1 200 OK\r\nx-seen: yes\r\ncontent-length: %d\r\n\r\n%b" % (len(reply), extra))
            await writer.drain()

    async with scripted_server(echo) as (origin, state):
        client, _ = make_client(8)
        async with client:
            base = f"http://127.0.0.1:{origin.port}"
            got = await client.post(f"{base}/a/b?q=1%202", json={"k": "v"}, timeout=2)
            assert got.status_code == 200 and got.headers["x-seen"] == "yes"
            assert got.text == 'POST /a/b?q=1%202 HTTP/1.1 | {"k":"v"}'
            head = await client.head(f"{base}/h", timeout=2)
            assert (head.status_code, head.content) == (200, b"")
            assert (await client.get(f"{base}/g", timeout=2)).text == "GET /g HTTP/1.1 | "
        assert state["connections"] == 2  # HEAD's connection is not reused; GET opened a fresh one


async def test_a_pool_used_from_a_second_event_loop_starts_afresh():
    # A registry can outlive one asyncio.run (scripts, tests): connections of the old loop must not be reused.
    pool = PooledTransport()
    async with scripted_server(keep_answering) as (origin, _):
        assert (await pool.roundtrip(origin, post(origin), connect_timeout=1, read_timeout=1)).status_code == 200
        stale = pool._idle[origin][0]
        pool._loop = object()  # as if this loop were another one
        assert (await pool.roundtrip(origin, post(origin), connect_timeout=1, read_timeout=1)).status_code == 200
        assert stale.closed and pool._idle[origin][0] is not stale
        await pool.aclose()
