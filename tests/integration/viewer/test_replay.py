"""`agentrl replay`: a recorded episode with tool calls, re-run on the same weights (embedded CPU engine) from its
recorded seeds and tool responses, gives the same tokens; a tampered record names the first divergence."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from agentrl.agent_loop.replay import find_episode, replay_episode
from agentrl.agent_loop.rollout import read_episodes

pytestmark = pytest.mark.slow


def _with_tools(run_dir) -> dict:
    rows = [r for r in read_episodes(run_dir / "episodes.jsonl") if any(c["ok"] for c in r["tool_calls"])]
    assert rows, "the recorded run has no episode with a tool call that ran"
    return rows[-1]


def test_replay_command_reports_identical_tokens(recorded_run):
    run_dir, model_dir = recorded_run
    row = _with_tools(run_dir)
    assert [c["response"]["content"] for c in row["tool_calls"] if c["ok"]][0] == "the value of a is 42"
    assert all(t["params"]["seed"] is not None for t in row["turns"])
    out = subprocess.run([sys.executable, "-m", "agentrl.cli", "replay", str(run_dir), "--episode",
                          row["episode_id"], "--model", str(model_dir)], capture_output=True, text=True, timeout=240)
    print(out.stdout, out.stderr)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "identical" in out.stdout


async def test_replay_names_the_first_divergence(recorded_run):
    from agentrl.inference.config import EngineConfig
    from agentrl.inference.local import LocalEngine

    run_dir, model_dir = recorded_run
    row = find_episode(run_dir, _with_tools(run_dir)["episode_id"])
    # a policy token of turn 1 recorded differently: the replay samples the real one there
    k = next(i for i, (m, t) in enumerate(zip(row["response_mask"], row["turn_ids"])) if m and t == 1)
    row = json.loads(json.dumps(row))
    row["response_ids"][k] = (row["response_ids"][k] + 1) % 1000
    max_model_len = row["replay"]["engine"]["max_model_len"]
    engine = LocalEngine.from_pretrained(model_dir, EngineConfig(max_model_len=max_model_len))
    try:
        result = await replay_episode(row, engine, engine.tokenizer)
    finally:
        await engine.close()
    print(result.report(engine.tokenizer))
    assert not result.identical
    assert result.divergence.index == k
    assert result.divergence.step == "model turn 1 (sampling)"
    assert result.divergence.got == result.replayed.response_ids[k] != result.divergence.expected
