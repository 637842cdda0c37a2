"""`agentrl bench replicas --quick` end to end: the in-process engine, 1 and 2 replicas on a local Ray, one row each
(its figures are measurements, not asserted), and every side's greedy tokens equal the in-process engine's."""

from __future__ import annotations

import pytest

from agentrl.cli import main

pytestmark = pytest.mark.slow


def test_bench_replicas_quick_prints_a_row_per_side(capsys):
    assert main(["bench", "replicas", "--quick"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("side"))
    rows = lines[header + 1:header + 4]
    assert [r.split()[0] for r in rows] == ["in-process", "1", "2"], lines
    assert rows[1].split()[-3] == "1.00x", lines  # the ratio's base
    assert all(r.endswith(" 8/8") for r in rows), lines  # same tokens as the in-process engine, every episode
    assert rows[1].split()[-2] == "16", lines  # 8 episodes x 2 turns, all on the one replica
    served = [int(n) for n in rows[2].split()[-2].split("/")]
    assert sum(served) == 16 and len(served) == 2, lines
