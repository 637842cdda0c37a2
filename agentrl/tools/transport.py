"""A pooled httpx transport that stays fast at high concurrency.

httpcore's connection pool scans every pooled connection (a `poll()` syscall each) for every request it
assigns, so one pool of 64+ keep-alive connections spends most of its CPU choosing a connection: measured here,
a single `httpx.AsyncClient` at concurrency 64 managed ~70 calls/s against a 50 ms tool. Splitting the pool
into shards of a few connections keeps that scan short; requests go to the shard with the fewest in flight.
The registry still uses one shared `httpx.AsyncClient`; only its transport is sharded.
"""

from __future__ import annotations

import math
import ssl

import httpx

CONNECTIONS_PER_SHARD = 2


class ShardedTransport(httpx.AsyncBaseTransport):
    def __init__(self, max_connections: int, per_shard: int = CONNECTIONS_PER_SHARD):
        shards = max(1, math.ceil(max_connections / per_shard))
        limits = httpx.Limits(max_connections=2 * per_shard, max_keepalive_connections=per_shard)
        tls = ssl.create_default_context()  # one CA bundle load (tens of ms), shared by every shard
        self._shards = [httpx.AsyncHTTPTransport(limits=limits, verify=tls, trust_env=False) for _ in range(shards)]
        self._in_flight = [0] * shards

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        i = min(range(len(self._shards)), key=self._in_flight.__getitem__)
        self._in_flight[i] += 1
        try:
            return await self._shards[i].handle_async_request(request)
        finally:
            self._in_flight[i] -= 1

    async def aclose(self) -> None:
        for shard in self._shards:
            await shard.aclose()


def make_client(max_connections: int) -> tuple[httpx.AsyncClient, ShardedTransport]:
    """The registry's shared HTTP client (sharded keep-alive pool, no proxies from the environment) and its
    transport, which the tool-call hot path uses directly."""
    transport = ShardedTransport(max_connections)
    return httpx.AsyncClient(transport=transport, trust_env=False), transport


__all__ = ["ShardedTransport", "make_client"]
