"""`agentrl bench rewards` on a small made-up run: it grades the rollouts twice on a sandbox it starts, counts the
sandbox runs each way, and fails when a reward differs from the run's record (the timings are never asserted)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import REPO_ROOT

pytestmark = pytest.mark.slow

TESTS = "assert add_one(1) == 2\nassert add_one(-1) == 0"
RIGHT = "```python\ndef add_one(x):\n    return x + 1\n```"
WRONG = "```python\ndef add_one(x):\n    return x + 2\n```"


def _run_dir(tmp_path, recorded_right: float) -> str:
    (tmp_path / "data").mkdir()
    (tmp_path / "grpo").mkdir()
    task = {"task_id": "t1", "prompt": [{"role": "user", "content": "Write add_one(x)."}],
            "reward": {"type": "unit_tests", "tests": TESTS, "entry_point": "add_one"}}
    (tmp_path / "data" / "code-rl.jsonl").write_text(json.dumps(task) + "\n")
    rows = []
    for step in (1, 2):  # a group of 4: three copies of the right program, one wrong one
        for i, (answer, reward) in enumerate([(RIGHT, recorded_right)] * 3 + [(WRONG, 0.0)]):
            rows.append({"step": step, "uid": f"step{step}-t1", "task_id": "t1", "reward": reward, "prompt_ids": [],
                         "response_ids": [], "response_mask": [], "response_logprobs": [],
                         "finish_reason": "stop", "episode_id": f"step{step}-t1-{i}",
                         "messages": [{"role": "user", "content": "Write add_one(x)."},
                                      {"role": "assistant", "content": answer}]})
    (tmp_path / "grpo" / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(tmp_path)


def _bench(run: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agentrl.cli", "bench", "rewards", "--run", run, "--steps", "2"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)


def test_bench_rewards_counts_one_run_per_distinct_program(tmp_path):
    out = _bench(_run_dir(tmp_path, recorded_right=1.0))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "total: 8 -> 4 sandbox runs (2.00x fewer)" in out.stdout, out.stdout
    assert "every episode's reward is the same in both passes" in out.stdout


def test_bench_rewards_fails_on_a_reward_unlike_the_record(tmp_path):
    out = _bench(_run_dir(tmp_path, recorded_right=0.0))
    assert out.returncode == 1 and "6 episode(s) scored differently" in out.stderr, out.stdout + out.stderr


def test_bench_rewards_names_a_run_without_rollouts(tmp_path):
    out = _bench(str(tmp_path))
    assert out.returncode == 2 and "grpo/episodes.jsonl not found" in out.stderr, out.stderr
