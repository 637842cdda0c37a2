"""`agentrl bench sandbox --snapshot`: what workspace snapshots cost a session's cells, and a snapshot itself.

    agentrl bench sandbox --snapshot [--cells 200] [--files 0,100,1000]

For each work dir size (that many 1 KiB files), in one warm session: the latency of a cell that changes nothing
(`pass`, p50 over --cells), the part of it the interpreter spends on the work dir's change stamp after the cell
(the same function, timed inside the sandbox over as many calls), then a snapshot (`GET /sessions/{id}/snapshot`,
p50 over 10) and a restore of its files into a fresh session (`POST /sessions/{id}/restore`, p50 over 10). A
`pass` cell that reports a change, or a snapshot or restored work dir whose digest is not the first snapshot's,
counts as a wrong result.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from agentrl.stats import percentile

STAMP_SRC = (Path(__file__).resolve().parent / "backends" / "workspace_src.py").read_text()
ROUNDS = 10


async def bench_snapshot(url: str, args: argparse.Namespace) -> int:
    """Prints one row per work dir size; returns 1 on any wrong result or failed request."""
    import httpx

    failures = 0
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        async def new_session() -> str:
            resp = await client.post("/sessions", json={"language": "python"})
            resp.raise_for_status()
            return resp.json()["session_id"]

        async def cell(sid: str, code: str) -> dict:
            resp = await client.post(f"/sessions/{sid}/run", json={"code": code, "timeout": 60,
                                                                   "track_workspace": True})
            resp.raise_for_status()
            return resp.json()

        async def timed(request) -> tuple[float, dict]:
            started = time.perf_counter()
            resp = await request
            resp.raise_for_status()
            return time.perf_counter() - started, resp.json()

        print(f"{'files':>5} | {'cell p50 ms':>11} | {'stamp ms':>8} | {'share':>5} | {'snapshot p50 ms':>15} | "
              f"{'restore p50 ms':>14} | {'tar KiB':>7}")
        for files in args.files:
            sid = await new_session()
            made = await cell(sid, f"import os\nos.makedirs('w', exist_ok=True)\nfor i in range({files}):\n"
                                   "    open(f'w/f{i}', 'wb').write(os.urandom(1024))")
            failures += made["status"] != "ok"
            cells = []
            for _ in range(args.cells):
                started = time.perf_counter()
                failures += (await cell(sid, "pass"))["workspace_changed"] is not False
                cells.append(time.perf_counter() - started)
            stamp = await cell(sid, f"{STAMP_SRC}\nimport time as _t\n_s = _t.perf_counter()\n"
                                    f"for _ in range({args.cells}):\n"
                                    "    _workspace_stamp(os.getcwd(), 1 << 40, 1 << 40)\n"
                                    f"print((_t.perf_counter() - _s) / {args.cells})")
            stamp_s = float(stamp["stdout"])
            snaps = [await timed(client.get(f"/sessions/{sid}/snapshot")) for _ in range(ROUNDS)]
            digest = snaps[0][1]["digest"]
            failures += sum(body["digest"] != digest for _, body in snaps)
            restores = []
            for _ in range(ROUNDS):
                target = await new_session()
                took, _ = await timed(client.post(f"/sessions/{target}/restore",
                                                  json={"workspace": snaps[0][1]["workspace"]}))
                restores.append(took)
                failures += (await timed(client.get(f"/sessions/{target}/snapshot")))[1]["digest"] != digest
                await client.delete(f"/sessions/{target}")
            await client.delete(f"/sessions/{sid}")
            p50 = percentile(cells, .5)
            tar_kib = len(snaps[0][1]["workspace"]) * 3 / 4 / 1024
            print(f"{files:>5} | {p50 * 1e3:>11.2f} | {stamp_s * 1e3:>8.3f} | {stamp_s / p50:>5.1%} | "
                  f"{percentile([s for s, _ in snaps], .5) * 1e3:>15.1f} | {percentile(restores, .5) * 1e3:>14.1f} | "
                  f"{tar_kib:>7.0f}")
    print(f"wrong results: {failures}")
    return 1 if failures else 0
