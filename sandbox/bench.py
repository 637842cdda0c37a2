"""Sandbox throughput and latency: isolated /run_code vs bare `python3 -c`, plus warm session cells.

    agentrl bench sandbox [--requests 200] [--concurrency 1,8,32] [--cells 200] [--url http://...]

Starts its own service (bwrap + cgroups, full isolation) unless --url is given, runs the same trivial snippet
through the HTTP API and as bare processes in the same run, and prints requests/s, p50/p99 latency and the
isolated/bare throughput ratio per concurrency, then the latency of cells in one warm session.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time

SNIPPET = "print(sum(range(100)))"
EXPECTED = "4950\n"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--requests", type=int, default=200, help="requests per concurrency level and mode")
    p.add_argument("--concurrency", default="1,8,32", help="comma-separated concurrency levels")
    p.add_argument("--cells", type=int, default=200, help="cells run in one warm session")
    p.add_argument("--url", default=None, help="benchmark a running service instead of starting one")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="SandboxConfig override for the service this benchmark starts")


def _proc_cpu_s(pid: int) -> float:
    """CPU seconds of `pid` plus its reaped children (user + system), from /proc/PID/stat."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def _own_children_cpu_s() -> float:
    t = os.times()
    return t.children_user + t.children_system


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


async def _load(n: int, concurrency: int, one) -> tuple[float, list[float]]:
    sem = asyncio.Semaphore(concurrency)
    latencies: list[float] = []

    async def task() -> None:
        async with sem:
            started = time.perf_counter()
            await one()
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(task() for _ in range(n)))
    return n / (time.perf_counter() - started), latencies


async def _bench(url: str, args: argparse.Namespace) -> int:
    import httpx

    python = os.path.realpath(sys.executable)
    errors = {"isolated": 0, "bare": 0}

    def bare_with(*flags: str):
        async def bare() -> None:
            proc = await asyncio.create_subprocess_exec(python, *flags, "-c", SNIPPET, stdout=asyncio.subprocess.PIPE,
                                                        stderr=asyncio.subprocess.PIPE)
            out, _ = await proc.communicate()
            if out.decode() != EXPECTED:
                errors["bare"] += 1
        return bare

    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        health = (await client.get("/health")).json()

        async def isolated() -> None:
            resp = await client.post("/run_code", json={"code": SNIPPET, "language": "python", "run_timeout": 10})
            body = resp.json() if resp.status_code == 200 else {}
            if body.get("status") != "Success" or body["run_result"]["stdout"] != EXPECTED:
                errors["isolated"] += 1

        print(f"sandbox: backend={health['backend']} isolation={health['isolation']} "
              f"max_concurrency={health['max_concurrency']} cores={os.cpu_count()}")
        print("bare = `python3 -c` processes; bare -S = `python3 -I -S -c` (no site/.pth start-up, as the sandbox's "
              "interpreter)")
        print(f"{'conc':>4} | {'isolated req/s':>14} {'p50 ms':>7} {'p99 ms':>7} | {'bare req/s':>10} {'p50 ms':>7} "
              f"{'p99 ms':>7} | {'ratio':>5} | {'bare -S req/s':>13} {'ratio':>5}")
        await _load(min(20, args.requests), 4, isolated)  # warm-up: pool filled, connections open
        local = os.path.exists(f"/proc/{health['pid']}/stat")
        cpu = {"isolated": 0.0, "bare": 0.0, "bare -S": 0.0}
        n_total = 0
        for conc in [int(c) for c in args.concurrency.split(",")]:
            before = _proc_cpu_s(health["pid"]) if local else 0.0
            iso_rps, iso_lat = await _load(args.requests, conc, isolated)
            await asyncio.sleep(1.0)  # the warm pool refills: its start-up CPU belongs to these requests
            cpu["isolated"] += (_proc_cpu_s(health["pid"]) - before) if local else 0.0
            before = _own_children_cpu_s()
            bare_rps, bare_lat = await _load(args.requests, conc, bare_with())
            cpu["bare"] += _own_children_cpu_s() - before
            before = _own_children_cpu_s()
            bare_s_rps, _ = await _load(args.requests, conc, bare_with("-I", "-S"))
            cpu["bare -S"] += _own_children_cpu_s() - before
            n_total += args.requests
            print(f"{conc:>4} | {iso_rps:>14.1f} {_pct(iso_lat, .5) * 1e3:>7.1f} {_pct(iso_lat, .99) * 1e3:>7.1f} | "
                  f"{bare_rps:>10.1f} {_pct(bare_lat, .5) * 1e3:>7.1f} {_pct(bare_lat, .99) * 1e3:>7.1f} | "
                  f"{iso_rps / bare_rps:>5.2f} | {bare_s_rps:>13.1f} {iso_rps / bare_s_rps:>5.2f}")
        if local:
            print("CPU per request (load-independent; isolated = service + its sandboxes, HTTP included): " +
                  ", ".join(f"{k} {v / n_total * 1e3:.1f} ms" for k, v in cpu.items()) +
                  f"; CPU-bound throughput ratio isolated/bare {cpu['bare'] / max(cpu['isolated'], 1e-9):.2f}, "
                  f"isolated/bare -S {cpu['bare -S'] / max(cpu['isolated'], 1e-9):.2f}")
        resp = await client.post("/sessions", json={"language": "python", "idle_ttl_s": 120})
        sid = resp.json()["session_id"]
        await client.post(f"/sessions/{sid}/run", json={"code": "x = 0", "timeout": 10})
        cell_lat = []
        for _ in range(args.cells):
            started = time.perf_counter()
            resp = await client.post(f"/sessions/{sid}/run", json={"code": "x += 1", "timeout": 10})
            cell_lat.append(time.perf_counter() - started)
            if resp.json().get("status") != "ok":
                errors["isolated"] += 1
        final = (await client.post(f"/sessions/{sid}/run", json={"code": "x", "timeout": 10})).json()
        await client.delete(f"/sessions/{sid}")
        print(f"warm session cell (HTTP round trip, {args.cells} cells): p50 {_pct(cell_lat, .5) * 1e3:.2f} ms, "
              f"p99 {_pct(cell_lat, .99) * 1e3:.2f} ms, mean {statistics.mean(cell_lat) * 1e3:.2f} ms; "
              f"state kept: {final['stdout'].strip() == str(args.cells)}")
        health = (await client.get("/health")).json()
    print(f"wrong results: isolated {errors['isolated']}, bare {errors['bare']}; "
          f"SandboxError: {health['sandbox_errors']}")
    return 1 if errors["isolated"] or health["sandbox_errors"] else 0


def run(args: argparse.Namespace) -> int:
    from agentrl.services import ServiceStartError, free_port, run_service

    if args.url:
        return asyncio.run(_bench(args.url.rstrip("/"), args))
    port = free_port()
    cmd = [sys.executable, "-m", "sandbox", "serve", "--port", str(port)]
    for item in args.overrides:
        cmd += ["--set", item]
    url = f"http://127.0.0.1:{port}"
    try:
        with run_service(cmd, f"{url}/health", name="the sandbox service"):
            return asyncio.run(_bench(url, args))
    except ServiceStartError as e:
        print(e, file=sys.stderr)
        return 1
