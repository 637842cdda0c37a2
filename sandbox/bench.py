"""Sandbox throughput and latency: isolated /run_code vs bare `python3 -I -S -c`, plus warm session cells.

    agentrl bench sandbox [--requests 200] [--concurrency 1,8,32] [--cells 200] [--url http://...]
    agentrl bench sandbox --language cpp [--requests 40] [--concurrency 1,4]
    agentrl bench sandbox --fork [--forks 8] [--state-mb 100]      (sandbox/bench_fork.py)
    agentrl bench sandbox --snapshot [--cells 200] [--files 0,100,1000]   (sandbox/bench_snapshot.py)

Starts its own service (bwrap + cgroups, full isolation) unless --url is given, runs the same trivial snippet
through the HTTP API and as bare processes in the same run, and prints requests/s, p50/p99 latency and the
isolated/bare throughput ratio per concurrency, against the same interpreter flags (`python3 -I -S -c`, the
headline) and against a plain `python3 -c` (whose site start-up loads .pth files), then the latency of cells in one
warm session. With
`--language cpp` each request compiles and runs a small C++ program; bare is `g++ <same flags> && ./test` in a
fresh temp dir, the compiler dominating both.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time

from agentrl.stats import percentile, process_cpu_s

SNIPPET = "print(sum(range(100)))"
EXPECTED = "4950\n"
CPP_SNIPPET = ("#include <iostream>\n#include <vector>\n#include <numeric>\nint main() {\n"
               "    std::vector<int> v(100);\n    std::iota(v.begin(), v.end(), 0);\n"
               "    std::cout << std::accumulate(v.begin(), v.end(), 0) << std::endl;\n    return 0;\n}\n")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--language", choices=("python", "cpp"), default="python",
                   help="python (default), or cpp: compile + run against bare g++ && ./test")
    p.add_argument("--requests", type=int, default=None,
                   help="requests per concurrency level and mode (default 200; 40 for cpp)")
    p.add_argument("--concurrency", default=None, help="comma-separated concurrency levels (default 1,8,32; "
                                                        "1,4 for cpp)")
    p.add_argument("--cells", type=int, default=200, help="cells run in one warm session")
    p.add_argument("--fork", action="store_true",
                   help="n sessions in a prepared state: fork one vs run the setup n times (bench_fork.py)")
    p.add_argument("--forks", type=int, default=8, help="with --fork: sessions to prepare (n)")
    p.add_argument("--state-mb", type=int, default=100, help="with --fork: size of the setup's numpy array")
    p.add_argument("--snapshot", action="store_true",
                   help="what workspace snapshots cost a cell, a snapshot and a restore (bench_snapshot.py)")
    p.add_argument("--files", default="0,100,1000",
                   help="with --snapshot: comma-separated work dir sizes, in 1 KiB files")
    p.add_argument("--url", default=None, help="benchmark a running service instead of starting one")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="SandboxConfig override for the service this benchmark starts")


CPUACCT_V1 = "/sys/fs/cgroup/cpuacct"
_service_cpuacct: str | None = None  # the cpuacct cgroup (v1) the bench started the service in, if any


def _service_cpu_s(health: dict) -> float | None:
    """CPU seconds of the service and every sandbox it ran. Sandboxes are killed, never reaped by bwrap, so the
    service's own cutime misses them: count them in a cgroup instead, the cpuacct cgroup this bench started the
    service in (cgroup v1) or the sandboxes' parent cgroup plus the service process (v2). None if neither."""
    if _service_cpuacct is not None:
        with open(os.path.join(_service_cpuacct, "cpuacct.usage")) as f:
            return int(f.read()) / 1e9
    if health.get("cgroup_version") == 2 and os.path.exists(f"/proc/{health['pid']}/stat"):
        with open(os.path.join(health["cgroup_parents"][0], "cpu.stat")) as f:
            usage = dict(line.split() for line in f)
        return int(usage["usage_usec"]) / 1e6 + process_cpu_s(health["pid"], children=True)
    return None


def _own_children_cpu_s() -> float:
    t = os.times()
    return t.children_user + t.children_system


def _cpu_summary(cpu: dict[str, float], n_total: int, *, decimals: int) -> str:
    """CPU per request of each column and the CPU-bound throughput ratio of isolated against every bare one."""
    per_request = ", ".join(f"{k} {v / n_total * 1e3:.{decimals}f} ms" for k, v in cpu.items())
    ratios = ", ".join(f"isolated/{k} {v / max(cpu['isolated'], 1e-9):.2f}" for k, v in cpu.items() if k != "isolated")
    return ("CPU per request (load-independent; isolated = service + its sandboxes, HTTP included): "
            f"{per_request}; CPU-bound throughput ratio {ratios}")


def _latency_columns(latencies: list[float], decimals: int) -> str:
    """The p50 and p99 columns (ms) of a results row."""
    return f"{percentile(latencies, .5) * 1e3:>7.{decimals}f} {percentile(latencies, .99) * 1e3:>7.{decimals}f}"


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

        print(f"sandbox: backend={health['backend']} isolation={health['isolation']} zygote={health.get('zygote')} "
              f"max_concurrency={health['max_concurrency']} cores={os.cpu_count()} load={os.getloadavg()[0]:.2f}")
        print("bare -I -S = `python3 -I -S -c` processes, the sandbox interpreter's own flags (the headline ratio); "
              "bare = `python3 -c` (site and .pth start-up)")
        print(f"{'conc':>4} | {'isolated req/s':>14} {'p50 ms':>7} {'p99 ms':>7} | {'bare -I -S req/s':>16} "
              f"{'p50 ms':>7} {'p99 ms':>7} | {'ratio':>5} | {'bare req/s':>10} {'ratio':>5}")
        await _load(min(20, args.requests), 4, isolated)  # warm-up: pool filled, connections open
        local = _service_cpu_s(health) is not None
        cpu = {"isolated": 0.0, "bare -I -S": 0.0, "bare": 0.0}
        n_total = 0
        for conc in [int(c) for c in args.concurrency.split(",")]:
            before = _service_cpu_s(health) if local else 0.0
            iso_rps, iso_lat = await _load(args.requests, conc, isolated)
            await asyncio.sleep(1.0)  # the warm pool refills: its start-up CPU belongs to these requests
            cpu["isolated"] += (_service_cpu_s(health) - before) if local else 0.0
            before = _own_children_cpu_s()
            bare_s_rps, bare_s_lat = await _load(args.requests, conc, bare_with("-I", "-S"))
            cpu["bare -I -S"] += _own_children_cpu_s() - before
            before = _own_children_cpu_s()
            bare_rps, _ = await _load(args.requests, conc, bare_with())
            cpu["bare"] += _own_children_cpu_s() - before
            n_total += args.requests
            print(f"{conc:>4} | {iso_rps:>14.1f} {_latency_columns(iso_lat, 1)} | "
                  f"{bare_s_rps:>16.1f} {_latency_columns(bare_s_lat, 1)} | "
                  f"{iso_rps / bare_s_rps:>5.2f} | {bare_rps:>10.1f} {iso_rps / bare_rps:>5.2f}")
        if local:
            print(_cpu_summary(cpu, n_total, decimals=1))
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
        print(f"warm session cell (HTTP round trip, {args.cells} cells): p50 {percentile(cell_lat, .5) * 1e3:.2f} ms, "
              f"p99 {percentile(cell_lat, .99) * 1e3:.2f} ms, mean {statistics.mean(cell_lat) * 1e3:.2f} ms; "
              f"state kept: {final['stdout'].strip() == str(args.cells)}")

        async def session_lifecycle() -> None:  # what an agent episode with the python tool costs the sandbox
            made = (await client.post("/sessions", json={"language": "python", "idle_ttl_s": 120})).json()
            cell = (await client.post(f"/sessions/{made['session_id']}/run",
                                      json={"code": SNIPPET, "timeout": 10})).json()
            await client.delete(f"/sessions/{made['session_id']}")
            if cell.get("stdout") != EXPECTED:
                errors["isolated"] += 1

        n_sessions = max(4, args.cells // 5)
        before = _service_cpu_s(health) if local else 0.0
        rate, lat = await _load(n_sessions, 4, session_lifecycle)
        await asyncio.sleep(1.0)
        cpu_note = (f", CPU {(_service_cpu_s(health) - before) / n_sessions * 1e3:.1f} ms each" if local else "")
        print(f"session open + one cell + close ({n_sessions}, concurrency 4): {rate:.1f}/s, p50 "
              f"{percentile(lat, .5) * 1e3:.1f} ms{cpu_note}")
        health = (await client.get("/health")).json()
    print(f"wrong results: isolated {errors['isolated']}, bare {errors['bare']}; "
          f"SandboxError: {health['sandbox_errors']}")
    return 1 if errors["isolated"] or health["sandbox_errors"] else 0


async def _bench_cpp(url: str, args: argparse.Namespace) -> int:
    import shutil
    import tempfile

    import httpx

    from sandbox.backends.base import compile_argv

    argv = compile_argv("cpp")
    errors = {"isolated": 0, "bare": 0}

    async def bare() -> None:
        tmp = tempfile.mkdtemp(prefix="agentrl-bench-cpp-")
        try:
            src = os.path.join(tmp, "main.cpp")
            with open(src, "w") as f:
                f.write(CPP_SNIPPET)
            cmd = [a.replace("{src}", src) for a in argv]
            proc = await asyncio.create_subprocess_exec(*cmd, cwd=tmp, stdin=asyncio.subprocess.DEVNULL,
                                                        stdout=asyncio.subprocess.PIPE,
                                                        stderr=asyncio.subprocess.PIPE)
            await proc.communicate()
            out = b""
            if proc.returncode == 0:
                proc = await asyncio.create_subprocess_exec("./test", cwd=tmp, stdout=asyncio.subprocess.PIPE,
                                                            stderr=asyncio.subprocess.PIPE)
                out, _ = await proc.communicate()
            if out.decode() != EXPECTED:
                errors["bare"] += 1
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as client:
        health = (await client.get("/health")).json()
        if "cpp" not in health["languages"]:
            print("this sandbox offers no cpp (no g++: make setup installs it)", file=sys.stderr)
            return 1

        async def isolated() -> None:
            resp = await client.post("/run_code", json={"code": CPP_SNIPPET, "language": "cpp", "run_timeout": 10,
                                                        "compile_timeout": 60})
            body = resp.json() if resp.status_code == 200 else {}
            if body.get("status") != "Success" or body["run_result"]["stdout"] != EXPECTED:
                errors["isolated"] += 1

        print(f"sandbox: backend={health['backend']} isolation={health['isolation']} "
              f"max_concurrency={health['max_concurrency']} cores={os.cpu_count()} load={os.getloadavg()[0]:.2f}")
        shown = " ".join(argv).replace("{src}", "main.cpp")
        print(f"language cpp: isolated = POST /run_code (compile in the sandbox, then run); bare = `{shown} && ./test`"
              " in a fresh temp dir")
        print(f"{'conc':>4} | {'isolated req/s':>14} {'p50 ms':>7} {'p99 ms':>7} | {'bare req/s':>10} {'p50 ms':>7} "
              f"{'p99 ms':>7} | {'ratio':>5}")
        await _load(4, 2, isolated)  # warm-up
        local = _service_cpu_s(health) is not None
        cpu = {"isolated": 0.0, "bare": 0.0}
        n_total = 0
        for conc in [int(c) for c in (args.concurrency or "1,4").split(",")]:
            n = args.requests or 40
            before = _service_cpu_s(health) if local else 0.0
            iso_rps, iso_lat = await _load(n, conc, isolated)
            await asyncio.sleep(1.0)  # the warm pool refills: its start-up CPU belongs to these requests
            cpu["isolated"] += (_service_cpu_s(health) - before) if local else 0.0
            before = _own_children_cpu_s()
            bare_rps, bare_lat = await _load(n, conc, bare)
            cpu["bare"] += _own_children_cpu_s() - before
            n_total += n
            print(f"{conc:>4} | {iso_rps:>14.2f} {_latency_columns(iso_lat, 0)} | "
                  f"{bare_rps:>10.2f} {_latency_columns(bare_lat, 0)} | "
                  f"{iso_rps / bare_rps:>5.2f}")
        if local:
            print(_cpu_summary(cpu, n_total, decimals=0))
        health = (await client.get("/health")).json()
    print(f"load after: {os.getloadavg()[0]:.2f}; wrong results: isolated {errors['isolated']}, bare {errors['bare']}; "
          f"SandboxError: {health['sandbox_errors']}")
    return 1 if errors["isolated"] or health["sandbox_errors"] else 0


def run(args: argparse.Namespace) -> int:
    from agentrl.services import ServiceStartError, free_port, run_service

    if args.language == "python":
        args.requests = args.requests or 200
        args.concurrency = args.concurrency or "1,8,32"
    bench = _bench_cpp if args.language == "cpp" else _bench
    if args.fork:
        from sandbox.bench_fork import bench_fork

        if args.forks < 1 or args.state_mb < 1:
            print("error: --forks and --state-mb must be at least 1", file=sys.stderr)
            return 2
        args.overrides = [f"max_sessions={2 * args.forks + 2}", *args.overrides]

        def bench(url: str, args: argparse.Namespace):
            return bench_fork(url, args, _service_cpu_s)
    if args.snapshot:
        from sandbox.bench_snapshot import bench_snapshot

        given = args.files
        try:
            args.files = [int(n) for n in given.split(",")]
        except ValueError:
            args.files = [-1]
        if args.cells < 1 or min(args.files) < 0:
            print(f"error: --files {given!r} must be comma-separated file counts >= 0, and --cells at least 1",
                  file=sys.stderr)
            return 2
        bench = bench_snapshot
    if args.url:
        return asyncio.run(bench(args.url.rstrip("/"), args))
    port = free_port()
    cmd = [sys.executable, "-m", "sandbox", "serve", "--port", str(port)]
    for item in args.overrides:
        cmd += ["--set", item]
    url = f"http://127.0.0.1:{port}"
    try:
        with run_service(_in_cpuacct(cmd), f"{url}/health", name="the sandbox service"):
            return asyncio.run(bench(url, args))
    except ServiceStartError as e:
        print(e, file=sys.stderr)
        return 1
    finally:
        _drop_cpuacct()


def _in_cpuacct(cmd: list[str]) -> list[str]:
    """Start the service in a cpuacct cgroup of its own (cgroup v1, as root), to count its sandboxes' CPU."""
    global _service_cpuacct
    if os.geteuid() != 0 or not os.path.isdir(CPUACCT_V1):
        return cmd
    path = os.path.join(CPUACCT_V1, f"agentrl-bench-{os.getpid()}")
    try:
        os.mkdir(path)
    except OSError:
        return cmd
    _service_cpuacct = path
    return ["/bin/sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', path, *cmd]


def _drop_cpuacct() -> None:
    global _service_cpuacct
    if _service_cpuacct is None:
        return
    for _ in range(50):  # the service's last processes may take a moment to leave
        try:
            os.rmdir(_service_cpuacct)
            break
        except OSError:
            time.sleep(0.1)
    _service_cpuacct = None
