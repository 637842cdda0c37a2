"""`agentrl bench train --critic` and `--shared-prompt` on a few short sequences: each times both sides and reports
their ratio."""

from __future__ import annotations

import argparse
import re

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
    assert re.search(r"critic / policy update time: \d+\.\d\dx \(critic \d+\.\d\d s against the policy's "
                     r"\d+\.\d\d s\)", out), out


def test_bench_train_shared_prompt_times_both_sides(tiny_model_dir, capsys):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(["--shared-prompt", "12", "--group-size", "3", "--model", str(tiny_model_dir),
                              "--sequences", "6", "--min-len", "4", "--max-len", "9", "--repeats", "1"])
    assert bench.run(args) == 0
    out = capsys.readouterr().out
    assert "6 sequences in groups of 3 sharing a 12-token prompt" in out
    assert "(48 of them prompt tokens a shared forward skips)" in out  # 2 groups x 2 rows x 12 tokens
    for row in ("whole rows", "shared prompt", "logprob: shared prompt ", "update: shared prompt "):
        assert row in out
