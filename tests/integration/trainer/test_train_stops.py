"""`agentrl train` stops on its own, loudly, and a rerun picks up cleanly:

- a reward function (a real module in the test's tmp dir, importable through PYTHONPATH) that raises stops the run
  at its first episode: exit code 2, one `error:` line naming the reward, the exception, the task and its row,
  and the traceback in run_dir/train.log;
- a real tool service (`agentrl tools serve`) that dies mid-run stops the run at the first step whose episodes
  all failed: exit code 3, one `error:` line naming the service, its URL and what failed, no traceback on the
  console; once the service is back the same command resumes after the last completed step, and metrics.jsonl
  and episodes.jsonl hold every step exactly once.

The service dies at an exact point of the run rather than after a sleep: its tool kills its own process on the
call after `DIE_AFTER_CALLS` (the tiny model is taught to call it once per episode, sampled greedily).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO_ROOT, free_port, service

from agentrl.trainer.metrics import read_metrics

pytestmark = pytest.mark.slow

QUESTION = "Check the service."

FAILING_REWARDS = '''
def score(task, episode, config):
    expected = {"result": 1}
    return float(expected["answer"])
'''

DYING_TOOL = '''
import os
import signal

CALLS = 0


def ping() -> str:
    """Ping the service."""
    global CALLS
    CALLS += 1
    if CALLS > int(os.environ.get("DIE_AFTER_CALLS", "1000000")):
        os.kill(os.getpid(), signal.SIGKILL)  # the service dies mid-run, as a crashed or killed one would
    return "ok"
'''


def write_tasks(path: Path, n: int, reward: dict, tools: list[str] | None) -> Path:
    rows = [{"prompt": [{"role": "user", "content": QUESTION if tools else f"What is {i} + {i}?"}],
             "tools": tools, "reward": reward, "task_id": f"row{i + 1}"} for i in range(n)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def train(config_overrides: list[str], pythonpath: Path) -> subprocess.CompletedProcess:
    """`agentrl train configs/calc_tiny_cpu.yaml OVERRIDES` in a subprocess, as a user runs it."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(pythonpath), str(REPO_ROOT)])}
    env.pop("AGENTRL_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "agentrl.cli", "train", "configs/calc_tiny_cpu.yaml",
                           *config_overrides], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)


def common(model_dir: Path, tasks: Path, run_dir: Path) -> list[str]:
    return [f"model.path={model_dir}", f"data.train_files=[{tasks}]", "data.val_files=[]",
            "data.train_batch_size=1", "rollout.n=2", "actor.ppo_mini_batch_size=1", "trainer.test_freq=0",
            "trainer.ray_num_cpus=2", "agent.max_new_tokens_per_turn=32", "agent.max_response_tokens=160",
            "trainer.loggers=[console,jsonl]", "trainer.save_hf_model=false", f"trainer.run_dir={run_dir}"]


def test_a_raising_reward_function_stops_the_run_with_one_line(tiny_model_dir, tmp_path):
    (tmp_path / "failing_rewards.py").write_text(FAILING_REWARDS)
    tasks = write_tasks(tmp_path / "train.jsonl", 16, {"type": "failing_rewards:score"}, tools=None)
    run = tmp_path / "run"
    done = train([*common(tiny_model_dir, tasks, run), "data.train_batch_size=4", "rollout.n=4",
                  "trainer.total_steps=1"], tmp_path)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "Traceback" not in done.stdout
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and done.stderr.rstrip().endswith(errors[0]), done.stderr[-3000:]
    found = re.fullmatch(
        r"error: reward 'failing_rewards:score' raised KeyError: 'answer' \(failing_rewards\.py:4\) on task "
        r"'row(\d+)' \((.+):row (\d+)\); fix the reward function \(traceback in (.+)\), or set "
        r"reward\.on_error=zero \(score such episodes 0\) or reward\.on_error=drop \(leave their groups out\)",
        errors[0])
    assert found, errors[0]
    assert found[1] == found[3] and found[2] == str(tasks) and found[4] == str(run / "train.log")
    log = (run / "train.log").read_text()
    assert "Traceback (most recent call last)" in log and 'return float(expected["answer"])' in log
    assert not any(row["step"] >= 1 for row in read_metrics(run))  # nothing was trained on garbage


@pytest.fixture(scope="module")
def taught_model(tiny_model_dir, tmp_path_factory) -> Path:
    """The tiny model taught to call `ping` once per turn, saved as a model dir `agentrl train` can load."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentrl.agent_loop.bench import teach_tool_calls
    from agentrl.tools import ToolRegistry

    out = tmp_path_factory.mktemp("taught-model")
    tools = tmp_path_factory.mktemp("tool")
    (tools / "dying_tool.py").write_text(DYING_TOOL)
    sys.path.insert(0, str(tools))
    try:
        from dying_tool import ping
    finally:
        sys.path.remove(str(tools))
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a shared 2-core machine: OpenMP spin-waits make more threads slower
    try:
        loss = teach_tool_calls(model, tokenizer, ToolRegistry.from_functions([ping]).schemas(), questions=[QUESTION],
                                turns=2, steps=100, tool_name="ping", turn_text="Checking.")
    finally:
        torch.set_num_threads(threads)
    assert loss < 0.5, f"the tiny model did not learn the tool call (loss {loss:.3f})"
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def test_a_dead_tool_service_stops_the_run_and_the_rerun_resumes(taught_model, tmp_path):
    (tmp_path / "dying_tool.py").write_text(DYING_TOOL)
    tasks = write_tasks(tmp_path / "train.jsonl", 4, {"type": "exact_match", "ground_truth": "ok"}, tools=["ping"])
    run = tmp_path / "run"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    serve = ["python", "-m", "agentrl.cli", "tools", "serve", str(tmp_path / "dying_tool.py:ping"), "--port",
             str(port)]
    overrides = [*common(taught_model, tasks, run), "trainer.total_steps=4", "rollout.temperature=0",
                 "agent.max_assistant_turns=2", "tools.builtin=[]", f"tools.services=[{{url: '{url}'}}]",
                 "actor.lr=1e-9", "actor.warmup_steps=0"]

    # Steps 1 and 2 make 2 calls each (one per episode); the service dies on the first call of step 3.
    with service(serve, f"{url}/health", env={"DIE_AFTER_CALLS": "4"}) as proc:
        stopped = train(overrides, tmp_path)
        assert proc.poll() is not None  # the service really died
    assert stopped.returncode == 3, stopped.stderr[-3000:]
    assert "Traceback" not in stopped.stderr and "Traceback" not in stopped.stdout
    errors = [line for line in stopped.stderr.splitlines() if line.startswith("error:")]
    assert errors == [stopped.stderr.rstrip().splitlines()[-1]], stopped.stderr[-3000:]
    assert errors[0].startswith(
        f"error: step 3: 2 of 2 episodes failed for an infrastructure reason, more than "
        f"trainer.max_infra_failed_fraction=0.5: tool service '127.0.0.1:{port}' at {url} failed calls to tool "
        "'ping' (unreachable)"), errors[0]
    assert errors[0].endswith("; bring the service back and run the same command again: it resumes after step 2 "
                              f"(traceback in {run / 'train.log'})"), errors[0]
    steps = [line for line in stopped.stdout.splitlines() if line.startswith("step ")]
    assert [line.split(" | ")[0] for line in steps] == ["step 1/4", "step 2/4"]
    assert all(" | infra 0/2 | " in line for line in steps), steps
    assert "InfraFailureError" in (run / "train.log").read_text()
    assert [r["step"] for r in read_metrics(run)] == [1, 2]

    # The service is back (a fresh process on the same port): the same command resumes after step 2.
    with service(serve, f"{url}/health"):
        resumed = train(overrides, tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming after step 2 from {run / 'checkpoints' / 'step_000002'}; removed episodes.jsonl rows after " \
           "step 2" in resumed.stdout
    metrics = read_metrics(run)
    assert [r["step"] for r in metrics] == [1, 2, 3, 4] and all(r["data/infra_failed"] == 0 for r in metrics)
    episodes = [json.loads(line) for line in (run / "episodes.jsonl").read_text().splitlines()]
    assert [e["step"] for e in episodes] == [1, 1, 2, 2, 3, 3, 4, 4]
    assert all(not e["infra_error"] and e["tool_calls"][0]["ok"] for e in episodes)
