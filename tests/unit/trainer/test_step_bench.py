"""`agentrl bench step`: one real (tiny) GRPO run through `agentrl train` with its phase table; the TRL side
says how to install TRL when it is missing."""

from __future__ import annotations

import argparse
import json
import sys

import pytest

from agentrl.trainer import step_bench


def bench_args(**changes) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    step_bench.add_arguments(parser)
    args = parser.parse_args([])
    for name, value in changes.items():
        setattr(args, name, value)
    return args


def test_bench_step_runs_agentrl_and_prints_its_phases(tiny_model_dir, tmp_path, capsys):
    args = bench_args(model=str(tiny_model_dir), steps=1, warmup=1, n=2, max_new_tokens=8, keep=str(tmp_path),
                      timeout=240)
    assert step_bench.run(args) == 0
    out = capsys.readouterr().out
    for phase in ("rollout_s", "old_logprob_s", "ref_logprob_s", "update_s", "sync_s", "step_s"):
        assert phase in out
    rows = [json.loads(line) for line in (tmp_path / "agentrl-r0" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all("timing/old_logprob_s" not in r for r in rows)  # pi_old came from the update itself
    assert all(r["drift/abs_max"] < 1e-4 for r in rows)
    tasks = [json.loads(line) for line in (tmp_path / "tasks.jsonl").read_text().splitlines()]
    assert tasks[0]["tools"] == ["multiply"] and "Use the multiply tool." in tasks[0]["prompt"][0]["content"]


def test_baseline_config_turns_the_speed_ups_off(tiny_model_dir, tmp_path):
    args = bench_args(set=["actor.lr=2e-5"])
    fast = step_bench.agentrl_config(tiny_model_dir, tmp_path / "t.jsonl", tmp_path / "r", args, fast=True)
    slow = step_bench.agentrl_config(tiny_model_dir, tmp_path / "t.jsonl", tmp_path / "r", args, fast=False)
    assert fast.actor.fast_logprobs and fast.actor.reuse_old_logprobs and fast.actor.num_threads_per_worker is None
    assert not slow.actor.fast_logprobs and not slow.actor.reuse_old_logprobs
    assert slow.actor.num_threads_per_worker == 1 and slow.actor.lr == fast.actor.lr == 2e-5
    assert fast.actor.use_kl_loss and fast.actor.kl_loss_coef == 0.001 and fast.rollout.n == 8


def test_vs_trl_without_trl_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "trl", None)  # import trl -> ImportError
    with pytest.raises(SystemExit, match="pip install trl"):
        step_bench.run_trl(tmp_path, tmp_path / "t.jsonl", tmp_path / "out", bench_args())


def test_multiply_tool_schema_and_result():
    schema = step_bench.multiply.schema()["function"]
    assert schema["name"] == "multiply" and set(schema["parameters"]["properties"]) == {"a", "b"}
    assert step_bench.multiply(123, 456) == "56088"
