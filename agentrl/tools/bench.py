"""Tool registry throughput: N calls to a tool with fixed latency at bounded concurrency, against the ideal.

Starts a real tool service (`agentrl tools serve agentrl.tools.bench:delay`) in a subprocess on loopback, sends
`--calls` calls through a `ToolRegistry` limited to `--concurrency` in flight, and prints achieved calls/s
against the ideal concurrency / latency, plus the per-call overhead (registry + HTTP + service) above the
tool's own latency. The in-process registry runs the same load as a reference in the same run.

Before the loads the bench freezes its start-up heap (`gc.collect(); gc.freeze()`, as the tool service does
after start-up): a full collection walks every object the process holds (tens of thousands from the CLI's
imports) and would stall every call in flight, which says more about the calling process than
about the registry. Long-running callers (a trainer) should freeze after loading too. `--no-gc-freeze`
measures without it, and every line reports the collector's full collections and longest pause during the load.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import time

from agentrl.stats import percentile, process_cpu_s
from agentrl.tools.base import tool


@tool
async def delay(ms: float = 50.0) -> str:
    """Wait `ms` milliseconds, then answer "ok" (a stand-in for a tool with fixed latency).

    Args:
        ms: How long to wait, in milliseconds.
    """
    await asyncio.sleep(ms / 1000)
    return "ok"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--url", default=None, help="use a running service that serves `delay` instead of starting one")
    parser.add_argument("--port", type=int, default=0, help="port for the service this bench starts (0: any free)")
    parser.add_argument("--no-gc-freeze", action="store_true",
                        help="leave the start-up heap to the collector (full collections may land in the load)")


class _GCWatch:
    """While active: how many full (generation 2) collections ran in this process and the longest pause."""

    def __init__(self) -> None:
        self.full = 0
        self.longest_s = 0.0
        self._start = 0.0

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
            return
        self.longest_s = max(self.longest_s, time.perf_counter() - self._start)
        self.full += info["generation"] == 2

    def __enter__(self) -> _GCWatch:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)


async def _load(registry, calls: int, latency_ms: float, concurrency: int,
                server_pid: int | None = None) -> tuple[float, list[float], int, dict, _GCWatch]:
    await registry.start()
    await asyncio.gather(*(registry.call("delay", {"ms": latency_ms}) for _ in range(min(calls, 64))))  # warm up
    remaining = calls
    results = []

    async def worker() -> None:  # closed loop: each worker keeps one call in flight, so latency has no queueing
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            results.append(await registry.call("delay", {"ms": latency_ms}))

    server_cpu0, cpu0 = process_cpu_s(server_pid), time.process_time()
    start = time.perf_counter()
    with _GCWatch() as collector:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - start
    cpu = {"client": (time.process_time() - cpu0) / calls}
    server_cpu1 = process_cpu_s(server_pid)
    if server_cpu0 is not None and server_cpu1 is not None:
        cpu["service"] = (server_cpu1 - server_cpu0) / calls
    errors = sum(r.is_error for r in results)
    return wall, [r.latency_s - latency_ms / 1000 for r in results], errors, cpu, collector


def _report(label: str, wall: float, overheads: list[float], errors: int, cpu: dict, collector: _GCWatch,
            calls: int, ideal: float) -> tuple[float, float]:
    rate = calls / wall
    cpu_text = "  ".join(f"{k} {1000 * v:.2f}" for k, v in cpu.items())
    p50, p99 = percentile(overheads, 0.5), percentile(overheads, 0.99)
    print(f"{label:<11} {rate:6.0f} calls/s  ideal {ideal:5.0f}  ratio {rate / ideal:4.2f}  "
          f"overhead p50 {1000 * p50:6.2f} ms  p99 {1000 * p99:6.2f} ms"
          f"  errors {errors}  cpu ms/call: {cpu_text}  gc: {collector.full} full, longest pause "
          f"{1000 * collector.longest_s:.1f} ms")
    return rate / ideal, p99


def run(args: argparse.Namespace) -> int:
    from agentrl.services import agentrl_command, free_port, run_service
    from agentrl.tools.client import ToolRegistry

    ideal = args.concurrency / (args.latency_ms / 1000)

    url = args.url
    with contextlib.ExitStack() as stack:
        proc = None
        if url is None:
            port = args.port or free_port()
            url = f"http://127.0.0.1:{port}"
            proc = stack.enter_context(run_service(
                agentrl_command("tools", "serve", "agentrl.tools.bench:delay", "--port", str(port)),
                f"{url}/health", name="the bench tool service"))

        async def main() -> tuple[float, float]:
            remote = ToolRegistry.from_config({"max_concurrency": args.concurrency,
                                               "services": [{"url": url, "max_concurrency": args.concurrency,
                                                             "tools": ["delay"]}]})
            local = ToolRegistry.from_functions([delay], max_concurrency=args.concurrency)
            print(f"{args.calls} calls, {args.latency_ms:g} ms tool latency, concurrency {args.concurrency}, "
                  f"start-up heap {'left to the collector' if args.no_gc_freeze else 'frozen'}")
            if not args.no_gc_freeze:
                gc.collect()
                gc.freeze()
            try:
                measured = _report("http", *await _load(remote, args.calls, args.latency_ms, args.concurrency,
                                                        proc.pid if proc else None), args.calls, ideal)
                _report("in-process", *await _load(local, args.calls, args.latency_ms, args.concurrency),
                        args.calls, ideal)
            finally:
                if not args.no_gc_freeze:
                    gc.unfreeze()  # a caller's process (a test run) gets its collector back
                await remote.aclose()
                await local.aclose()
            return measured

        ratio, p99 = asyncio.run(main())
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"http: {ratio:.2f}x the ideal rate, p99 overhead {1000 * p99:.2f} ms over the tool's own latency (host: "
          f"{os.cpu_count()} CPUs, 1-min load average {load:.1f}; the http path needs the cpu ms/call above times "
          f"the ideal rate in CPU time)")
    return 0
