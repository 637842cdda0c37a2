"""`agentrl bench async --quick` end to end: real sync and async (k = 2) train runs against the bench's slow tool
service; checks the table has a row per side (its figures are measurements, not asserted). One async side: each
side is a whole training run, and the other staleness levels take the same path."""

from __future__ import annotations

import json

import pytest

from agentrl.cli import main

pytestmark = pytest.mark.slow


def test_bench_async_quick_prints_sync_and_async_rows(tmp_path, capsys):
    out_json = tmp_path / "bench.json"
    assert main(["bench", "async", "--quick", "--staleness", "2", "--json", str(out_json)]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("mode"))
    rows = [line.split()[:2] for line in lines[header + 1:header + 3]]
    assert rows == [["sync", "-"], ["async", "2"]]
    assert lines[header + 1].split()[5] == "1.00x"
    saved = json.loads(out_json.read_text())["rows"]
    sides = [("sync", None, 3), ("async", 2, 3)]
    assert [(r["mode"], r["k"], r["steps"]) for r in saved] == sides
