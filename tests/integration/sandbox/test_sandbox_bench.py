"""`agentrl bench sandbox` end to end on a few requests: it starts its own service, measures every column side by
side and reports no wrong result (the figures themselves are for docs/benchmarks.md, never asserted)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from helpers import REPO_ROOT
from sandbox_testlib import bwrap_unavailable_reason

pytestmark = pytest.mark.slow


def test_bench_sandbox_small_run():

    if reason := bwrap_unavailable_reason():
        pytest.skip(reason)
    out = subprocess.run([sys.executable, "-m", "agentrl.cli", "bench", "sandbox", "--requests", "6",
                          "--concurrency", "1,3", "--cells", "3"], cwd=REPO_ROOT, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert any(line.startswith("sandbox: backend=bwrap isolation=bwrap+cgroups zygote=True") for line in lines)
    rows = [line for line in lines if line.split("|")[0].strip() in ("1", "3")]
    assert len(rows) == 2 and all(len(row.split("|")) == 5 for row in rows), out.stdout
    assert "CPU per request" in out.stdout and "isolated/bare -I -S" in out.stdout
    assert "session open + one cell + close" in out.stdout
    assert "wrong results: isolated 0, bare 0; SandboxError: 0" in out.stdout


def test_bench_sandbox_fork_smallest_run():
    if reason := bwrap_unavailable_reason():
        pytest.skip(reason)
    out = subprocess.run([sys.executable, "-m", "agentrl.cli", "bench", "sandbox", "--fork", "--forks", "2",
                          "--state-mb", "1"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    rows = [line.split("|") for line in out.stdout.splitlines() if line.count("|") == 4]
    assert [row[0].strip() for row in rows] == ["way to n prepared sessions", "setup x n", "1 setup + fork n",
                                               "fork n (source prepared)"], out.stdout
    assert all(row[1].strip() == "2" for row in rows[1:]), out.stdout
    assert "ratio setup x n / (1 setup + fork n)" in out.stdout and "wrong results: 0" in out.stdout


def test_bench_sandbox_snapshot_smallest_run():
    if reason := bwrap_unavailable_reason():
        pytest.skip(reason)
    out = subprocess.run([sys.executable, "-m", "agentrl.cli", "bench", "sandbox", "--snapshot", "--cells", "3",
                          "--files", "0,5"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    rows = [line.split("|") for line in out.stdout.splitlines() if line.count("|") == 6]
    assert [row[0].strip() for row in rows] == ["files", "0", "5"], out.stdout
    assert "wrong results: 0" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "agentrl.cli", "bench", "sandbox", "--snapshot", "--files", "a,1"],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.startswith("error: --files"), bad.stderr
