"""`agentrl bench async --quick` end to end: real sync and async train runs against the bench's slow tool
service; checks the table has a row per side (its figures are measurements, not asserted)."""

from __future__ import annotations

import json

import pytest

from agentrl.cli import main

pytestmark = pytest.mark.slow


def test_bench_async_quick_prints_sync_and_every_staleness(tmp_path, capsys):
    out_json = tmp_path / "bench.json"
    assert main(["bench", "async", "--quick", "--json", str(out_json)]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("mode"))
    rows = [line.split()[:2] for line in lines[header + 1:header + 6]]
    assert rows == [["sync", "-"], ["async", "0"], ["async", "1"], ["async", "2"], ["async", "4"]]
    assert lines[header + 1].split()[5] == "1.00x"
    saved = json.loads(out_json.read_text())["rows"]
    sides = [("sync", None, 3)] + [("async", k, 3) for k in (0, 1, 2, 4)]
    assert [(r["mode"], r["k"], r["steps"]) for r in saved] == sides
