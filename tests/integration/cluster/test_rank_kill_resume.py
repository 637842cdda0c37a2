"""A trainer rank killed in the middle of a run: `agentrl train` (tiny model, two FSDP ranks on a local Ray, a
checkpoint every step) stops with exit code 3 and one `error:` line naming the rank and its node, and the same
command run again resumes from the last checkpoint: every step's metrics, episodes and the final weights equal an
uninterrupted run's of the same config (1e-5).

The rank dies at an exact point, not after a sleep: the run's reward function (a module in the test's tmp dir)
kills rank 1's Ray actor when it scores the first episode of step 2, during that step's rollout, so the next call
that reaches the ranks finds it dead. It reaches the run's WorkerGroup through the garbage collector: the trainer
has no hook for it. Without KILL_RANK_AT_EPISODE set (the uninterrupted run and the resume) it only scores.

"Bounded time" is that the stopped run returns at all: the subprocess has a timeout, and the test pytest's."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO_ROOT

from agentrl.trainer.metrics import read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

EPISODES_PER_STEP = 4  # data.train_batch_size 2 x rollout.n 2

KILLING_REWARD = '''
import gc
import os

import ray

SCORED = 0


def parity_or_kill(task, episode, config):
    """The parity of the first sampled token; kills rank 1 when it scores episode KILL_RANK_AT_EPISODE."""
    global SCORED
    SCORED += 1
    if SCORED == int(os.environ.get("KILL_RANK_AT_EPISODE", "0")):
        from agentrl.trainer.worker import WorkerGroup

        group = next(o for o in gc.get_objects() if isinstance(o, WorkerGroup))
        ray.kill(group.workers[1])
    return float(episode.response_ids[0] % 2) if episode.response_ids else 0.0
'''


def write_tasks(path: Path, n: int) -> Path:
    rows = [{"prompt": [{"role": "user", "content": f"What is {i} + {i + 1}?"}], "tools": None,
             "reward": {"type": "killing_reward:parity_or_kill"}, "task_id": f"row{i + 1}"} for i in range(n)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def train(run_dir: Path, model_dir: Path, tasks: Path, module_dir: Path,
          kill_at: int | None = None) -> subprocess.CompletedProcess:
    """`agentrl train` of the test's config in a subprocess, as a user runs it."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(module_dir), str(REPO_ROOT)])}
    env.pop("AGENTRL_DEBUG", None)
    env.pop("KILL_RANK_AT_EPISODE", None)
    if kill_at is not None:
        env["KILL_RANK_AT_EPISODE"] = str(kill_at)
    overrides = [f"model.path={model_dir}", f"data.train_files=[{tasks}]", "data.val_files=[]",
                 "data.train_batch_size=2", "rollout.n=2", "actor.ppo_mini_batch_size=1", "actor.world_size=2",
                 "actor.lr=1e-3", "actor.warmup_steps=0", "agent.max_assistant_turns=1",
                 "agent.max_new_tokens_per_turn=12", "agent.max_response_tokens=12", "tools.builtin=[]",
                 "trainer.total_steps=2", "trainer.save_freq=1", "trainer.test_freq=0", "trainer.deterministic=true",
                 "trainer.ray_num_cpus=2", "trainer.loggers=[console,jsonl]", f"trainer.run_dir={run_dir}"]
    return subprocess.run([sys.executable, "-m", "agentrl.cli", "train", "configs/calc_tiny_cpu.yaml", *overrides],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=540)


def comparable(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith(("timing/", "perf/"))}


def episodes(run_dir: Path) -> list[dict]:
    keys = ("step", "uid", "prompt_ids", "response_ids", "response_mask", "reward", "finish_reason", "infra_error")
    rows = [json.loads(line) for line in (run_dir / "episodes.jsonl").read_text().splitlines()]
    return [{k: row[k] for k in keys} | {"logprobs": row["response_logprobs"]} for row in rows]


def test_a_killed_rank_stops_the_run_and_the_resume_equals_an_uninterrupted_run(tiny_model_dir, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    (tmp_path / "killing_reward.py").write_text(KILLING_REWARD)
    tasks = write_tasks(tmp_path / "train.jsonl", 8)
    args = (tiny_model_dir, tasks, tmp_path)

    whole = tmp_path / "uninterrupted"
    done = train(whole, *args)
    assert done.returncode == 0, done.stderr[-3000:]

    run = tmp_path / "killed"
    stopped = train(run, *args, kill_at=EPISODES_PER_STEP + 1)  # the first episode of step 2
    assert stopped.returncode == 3, stopped.stderr[-3000:]
    assert "Traceback" not in stopped.stderr and "Traceback" not in stopped.stdout
    errors = [line for line in stopped.stderr.splitlines() if line.startswith("error:")]
    assert errors == [stopped.stderr.rstrip().splitlines()[-1]], stopped.stderr[-3000:]
    assert re.fullmatch(r"error: WorkerGroup rank 1 of 2 on node [\w.:-]+ \(id [0-9a-f]{12}\) died during \w+ "
                        r"\(.+\); the other ranks were stopped: see that node's Ray logs \(ray logs\), then run the "
                        r"command again to resume from the last checkpoint", errors[0]), errors[0]
    assert [r["step"] for r in read_metrics(run)] == [1]  # step 2 was not logged: it never finished
    assert (run / "checkpoints" / "step_000001").is_dir() and not (run / "final_model").exists()

    resumed = train(run, *args)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming after step 1 from {run / 'checkpoints' / 'step_000001'}" in resumed.stdout

    want, got = read_metrics(whole), read_metrics(run)
    assert [r["step"] for r in got] == [r["step"] for r in want] == [1, 2]
    for a, b in zip(want, got):
        a, b = comparable(a), comparable(b)
        assert a.keys() == b.keys()
        for key in a:  # loss, grad_norm, rewards, ... of every step, step 2 included
            assert b[key] == pytest.approx(a[key], abs=1e-5), (b["step"], key)
    assert want[1]["actor/grad_norm"] > 0  # step 2 moved the policy: the comparison is not of two no-ops
    want_eps, got_eps = episodes(whole), episodes(run)
    assert [e["step"] for e in got_eps] == [1] * EPISODES_PER_STEP + [2] * EPISODES_PER_STEP
    for a, b in zip(want_eps, got_eps, strict=True):
        assert b["logprobs"] == pytest.approx(a.pop("logprobs"), abs=1e-5)
        assert {k: v for k, v in b.items() if k != "logprobs"} == a
    final = AutoModelForCausalLM.from_pretrained(whole / "final_model").state_dict()
    refinal = AutoModelForCausalLM.from_pretrained(run / "final_model").state_dict()
    for key in final:
        torch.testing.assert_close(refinal[key], final[key], atol=1e-5, rtol=0, msg=key)
