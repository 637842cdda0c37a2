"""`agentrl bench sandbox --fork`: n sessions in a prepared state, by forking one vs by running the setup n times.

    agentrl bench sandbox --fork [--forks 8] [--state-mb 100]

The setup is what a task would prepare once per group: `import numpy` (and what it pulls in), a `--state-mb`
float64 array and a dict of a million small strings (a Python-object heap), about 1 s in one session here. Both
ways are measured in the same run on the same service, one after the other: "setup x n" creates n sessions and
runs the setup in each (concurrency 1 and `--concurrency-setup`), "fork" prepares one fork source and forks it
n times in one request. Every session then proves it holds the state (the array's sum, the dict's size); a
mismatch counts as a wrong result. The ratio printed is the time to n prepared sessions, setup x n over
fork (with and without the source's one setup).
"""

from __future__ import annotations

import argparse
import os
import time

from agentrl.stats import percentile


def setup_code(state_mb: int) -> str:
    return ("import numpy\n"
            f"state = numpy.random.default_rng(0).random({state_mb * 2**20 // 8})\n"
            "names = {i: str(i) for i in range(1_000_000)}\n"
            "expected = f'{float(state.sum()):.6f} {len(names)}'")


CHECK = "print(f'{float(state.sum()):.6f} {len(names)}' == expected)"


async def bench_fork(url: str, args: argparse.Namespace, service_cpu_s) -> int:
    """Prints the two ways side by side and their ratio; returns 1 on any wrong result or failed request."""
    import httpx

    n, memory_mb = args.forks, max(512, 4 * args.state_mb + 256)
    setup = setup_code(args.state_mb)
    failures = 0
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        health = (await client.get("/health")).json()
        cpu = service_cpu_s(health) is not None

        async def new_session(**fields) -> str:
            resp = await client.post("/sessions", json={"language": "python", "memory_limit_MB": memory_mb,
                                                        "idle_ttl_s": 600, **fields})
            resp.raise_for_status()
            return resp.json()["session_id"]

        async def cell(sid: str, code: str) -> dict:
            resp = await client.post(f"/sessions/{sid}/run", json={"code": code, "timeout": 120})
            resp.raise_for_status()
            return resp.json()

        async def holds_state(ids: list[str]) -> int:
            wrong = 0
            for sid in ids:
                out = await cell(sid, CHECK)
                wrong += out["stdout"] != "True\n"
                await client.delete(f"/sessions/{sid}")
            return wrong

        print(f"sandbox fork bench: backend={health['backend']} isolation={health['isolation']} "
              f"cores={os.cpu_count()} load={os.getloadavg()[0]:.2f}; setup = import numpy + {args.state_mb} MB "
              f"array + 1M-entry dict; n = {n}; memory_limit_MB {memory_mb}")
        # setup x n, one session after the other
        cpu0, started, setups = service_cpu_s(health) if cpu else 0.0, time.perf_counter(), []
        ids = []
        for _ in range(n):
            sid = await new_session()
            t0 = time.perf_counter()
            out = await cell(sid, setup)
            setups.append(time.perf_counter() - t0)
            failures += out["status"] != "ok"
            ids.append(sid)
        setup_wall = time.perf_counter() - started
        setup_cpu = service_cpu_s(health) - cpu0 if cpu else None
        failures += await holds_state(ids)
        # one source, its setup once, then n forks in one request
        cpu0, started = service_cpu_s(health) if cpu else 0.0, time.perf_counter()
        source = await new_session(forkable=True)
        failures += (await cell(source, setup))["status"] != "ok"
        prepared, cpu1 = time.perf_counter(), service_cpu_s(health) if cpu else 0.0
        resp = await client.post(f"/sessions/{source}/fork", params={"n": n})
        forked = time.perf_counter()
        fork_cpu = service_cpu_s(health) - cpu0 if cpu else None
        fork_only_cpu = service_cpu_s(health) - cpu1 if cpu else None
        if resp.status_code != 200:
            print(f"error: the fork failed (HTTP {resp.status_code}): {resp.text[:300]}")
            return 1
        children = resp.json()["session_ids"]
        failures += len(children) != n
        failures += await holds_state(children)
        await client.delete(f"/sessions/{source}")
        fork_wall, fork_only = forked - started, forked - prepared

    def row(name: str, wall: float, cpu_s: float | None) -> str:
        cpu_col = f"{cpu_s:>9.2f}" if cpu_s is not None else f"{'-':>9}"
        return f"{name:<26} | {n:>8} | {wall:>7.2f} | {wall / n * 1e3:>13.1f} | {cpu_col}"

    print(f"one setup in a session: p50 {percentile(setups, .5):.2f} s (min {min(setups):.2f}, "
          f"max {max(setups):.2f})")
    print(f"{'way to n prepared sessions':<26} | {'sessions':>8} | {'wall s':>7} | {'per session ms':>13} | "
          f"{'CPU s':>9}")
    print(row("setup x n", setup_wall, setup_cpu))
    print(row("1 setup + fork n", fork_wall, fork_cpu))
    print(row("fork n (source prepared)", fork_only, fork_only_cpu))
    cpu_ratio = f"; CPU {setup_cpu / max(fork_only_cpu, 1e-9):.1f}x" if cpu else ""
    print(f"ratio setup x n / (1 setup + fork n): {setup_wall / fork_wall:.1f}x; "
          f"setup x n / fork n: {setup_wall / fork_only:.1f}x{cpu_ratio} (per prepared session)")
    print(f"wrong results: {failures}")
    return 1 if failures else 0
