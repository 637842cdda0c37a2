"""`agentrl bench weight-sync` at its smallest (tiny model, one server, one measured round): both sides run, every
round's weights reach the server (the bench checks its version label and fails otherwise), one row per side and
the ratio. The figures are measurements, never asserted."""

from __future__ import annotations

import pytest

from agentrl.cli import main

pytestmark = pytest.mark.slow


def test_bench_weight_sync_prints_both_sides_and_their_ratio(capsys):
    assert main(["bench", "weight-sync", "--size", "tiny", "--servers", "1", "--rounds", "1", "--bucket-mb",
                 "0.25"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("side"))
    rows = lines[header + 1:header + 3]
    assert [r.split()[0] for r in rows] == ["disk", "broadcast"], lines
    assert "buckets " in rows[1] and float(rows[1].split("buckets ")[1]) > 1, lines  # 0.25 MB buckets: several
    assert lines[header + 3].startswith("broadcast / disk: ") and lines[header + 3].endswith("x the time"), lines
