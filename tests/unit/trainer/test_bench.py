"""`agentrl bench train --critic` on a few short sequences: it times both updates and reports their ratio."""

from __future__ import annotations

import argparse

from agentrl.trainer import bench


def test_bench_train_critic_reports_both_updates_and_their_ratio(tiny_model_dir, capsys):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(["--critic", "--model", str(tiny_model_dir), "--sequences", "4", "--min-len", "8",
                              "--max-len", "32", "--repeats", "1"])
    assert bench.run(args) == 0
    out = capsys.readouterr().out
    for row in ("policy (no critic)", "critic", "policy + critic"):
        assert f"\n{row} " in out, row
    assert "critic / policy update time: " in out and "(target <= 1.20x: " in out
