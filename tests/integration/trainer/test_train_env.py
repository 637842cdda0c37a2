"""`agentrl train configs/guess_tiny_cpu.yaml`, as a user runs it, on guess games: two REINFORCE++ steps on
episodes an environment answered and rewarded turn by turn; an environment name no config registers stops the
run before it starts, in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.trainer.metrics import read_metrics

pytestmark = pytest.mark.slow
REPO_ROOT = Path(__file__).resolve().parents[3]


def agentrl_train(*overrides: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, "-m", "agentrl.cli", "train", "configs/guess_tiny_cpu.yaml", *overrides],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)


def guess_tasks(path: Path, n: int, split: str = "train") -> Path:
    from agentrl.data.suites import write_suite

    return write_suite("guess", split, n, path, seed=0)[0]


def test_two_reinforce_pp_steps_on_guess_games(guessing_model_dir, tmp_path):
    run = tmp_path / "run"
    done = agentrl_train(
        f"model.path={guessing_model_dir}", f"data.train_files=[{guess_tasks(tmp_path / 'train.jsonl', 8)}]",
        f"data.val_files=[{guess_tasks(tmp_path / 'heldout.jsonl', 4, 'heldout')}]", "data.train_batch_size=2",
        "actor.ppo_mini_batch_size=1", "rollout.n=4", "trainer.total_steps=2", "trainer.test_freq=2",
        "trainer.save_freq=0", "trainer.ray_num_cpus=2", "trainer.loggers=[jsonl]", "trainer.save_hf_model=false",
        "actor.lr=1e-3", "actor.warmup_steps=0", f"trainer.run_dir={run}")
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [r for r in read_metrics(run) if "actor/pg_loss" in r]
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert row["data/infra_failed"] == 0 and row["actor/grad_norm"] > 0
    assert "val/reward/mean" in read_metrics(run)[-1]
    episodes = [json.loads(line) for line in (run / "episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == 16 and any(e["turn_rewards"] for e in episodes)
    for e in episodes:  # the reward is the whole return: the sum of the game's turn rewards
        assert e["reward"] == pytest.approx(sum(e["turn_rewards"]))
        assert e["replay"]["env"]["name"] == "guess_number"


def test_an_unregistered_environment_stops_before_the_run_starts(guessing_model_dir, tmp_path):
    tasks = tmp_path / "train.jsonl"
    tasks.write_text(json.dumps({"env": {"name": "chess", "kwargs": {}}}) + "\n")
    done = agentrl_train(f"model.path={guessing_model_dir}", f"data.train_files=[{tasks}]", "data.val_files=[]",
                         f"trainer.run_dir={tmp_path / 'run'}")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"{tasks}:row 1: environment 'chess' is not registered" in done.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
