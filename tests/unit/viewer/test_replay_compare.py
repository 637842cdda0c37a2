"""agentrl.agent_loop.replay without a model: the scripted engine's episode replays identically from its record
(recorded tool responses, no tool service), and `compare` blames the step that produced the first difference."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from agentrl.agent_loop import AgentLoopConfig, ToolAgentLoop
from agentrl.agent_loop.replay import ReplayError, compare, find_episode, replay_episode
from agentrl.agent_loop.rollout import write_episodes
from agentrl.tools import ToolRegistry
from agentrl.types import SamplingParams, Task

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agent_loop"))
from scripted_engine import ScriptedEngine  # noqa: E402

CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@pytest.fixture
def recorded(qwen2_tokenizer_dir, tmp_path):
    import asyncio

    tokenizer = AutoTokenizer.from_pretrained(qwen2_tokenizer_dir)
    engine = ScriptedEngine(tokenizer, [CALL, "The answer is 5."])
    loop = ToolAgentLoop(engine, tokenizer, ToolRegistry.from_functions([add]), AgentLoopConfig())
    task = Task(prompt=[{"role": "user", "content": "2+3?"}], task_id="t0")
    episode = asyncio.run(loop.run(task, sampling=SamplingParams(max_new_tokens=1, seed=11), uid="u0",
                                   session_id="u0-0"))
    write_episodes(tmp_path / "episodes.jsonl", [episode], step=1, n=1)
    return tokenizer, tmp_path, episode


async def test_recorded_episode_replays_identically(recorded):
    tokenizer, run_dir, episode = recorded
    row = find_episode(run_dir, "u0-0")
    assert row["tool_calls"][0]["response"]["content"] == "5"
    assert [t["params"]["seed"] for t in row["turns"]] == [11 * 1_000_003 % 2**31, (11 * 1_000_003 + 1) % 2**31]
    result = await replay_episode(row, ScriptedEngine(tokenizer, [CALL, "The answer is 5."]), tokenizer)
    assert result.identical, result.report(tokenizer)
    assert "identical" in result.report(tokenizer)


async def test_another_tool_call_is_blamed_on_the_parser_step(recorded):
    tokenizer, run_dir, _ = recorded
    row = find_episode(run_dir, "0")
    other = CALL.replace('"b": 3', '"b": 4')
    result = await replay_episode(row, ScriptedEngine(tokenizer, [other, "The answer is 5."]), tokenizer)
    assert not result.identical
    assert result.divergence.step == "model turn 0 (sampling)"  # the sampled text itself differs first


def test_compare_blames_glue_and_stop(recorded):
    _, _, episode = recorded
    glue = episode.response_mask.index(0)
    changed = dataclasses.replace(episode, response_ids=list(episode.response_ids))
    changed.response_ids[glue + 2] += 1
    d = compare(episode, changed).divergence
    assert (d.index, d.step) == (glue + 2, "template glue after turn 0")
    d = compare(episode, changed, [{"name": "add", "arguments": {"a": 1}}]).divergence
    assert d.step == "parser"
    shorter = dataclasses.replace(episode, response_ids=episode.response_ids[:-1])
    assert compare(episode, shorter).divergence.step == "stop"
    other_prompt = dataclasses.replace(episode, prompt_ids=episode.prompt_ids[:-1] + [0])
    assert compare(episode, other_prompt).divergence.step == "prompt template"


def test_old_rows_without_replay_data_are_refused(tmp_path):
    (tmp_path / "episodes.jsonl").write_text(json.dumps({"uid": "x", "episode_id": "x-0", "messages": []}) + "\n")
    with pytest.raises(ReplayError, match="no replay record"):
        from agentrl.agent_loop.replay import replay_inputs

        replay_inputs(find_episode(tmp_path, "x-0"))
    with pytest.raises(ReplayError, match="no episode 'nope'"):
        find_episode(tmp_path, "nope")
