"""Agent programs trained through the policy front: a real OpenAI Agents SDK agent calls a function tool, and
`RolloutManager` with `rollout.agent_program` turns programs' calls into scored episodes."""

from __future__ import annotations

import asyncio

import pytest
from scripted_engine import ScriptedEngine, model_turn

from agentrl.agent_loop.agent_program import AgentProgramLoop
from agentrl.agent_loop.config import AgentLoopConfig, RewardConfig, RolloutConfig
from agentrl.agent_loop.rollout import RolloutManager, rollout_metrics
from agentrl.config import ConfigError
from agentrl.inference.base import EngineError
from agentrl.types import SamplingParams, Task

pytest.importorskip("agents", reason="pip install -e '.[agents]'")

SCRIPT = [model_turn("", [("add", {"a": 1, "b": 2})]), "The answer is 3."]
TASK = Task(prompt=[{"role": "user", "content": "What is 1 + 2?"}], reward={"type": "numeric", "ground_truth": "3"},
            task_id="t0")


async def test_agents_sdk_agent_calls_its_tool_and_the_episode_is_one_sample(tiny_tokenizer):
    import agent_programs

    engine = ScriptedEngine(tiny_tokenizer, SCRIPT)
    loop = AgentProgramLoop(engine, tiny_tokenizer, agent_programs.agents_sdk_agent, AgentLoopConfig())
    try:
        (ep,) = await loop.run(TASK, sampling=SamplingParams(max_new_tokens=1, temperature=0.8, seed=3), uid="g",
                               session_id="g-0")
    finally:
        await loop.aclose()
    assert len(engine.calls) == 2  # the tool call, then the answer after the tool's result
    assert "<tool_response>\n3\n</tool_response>" in tiny_tokenizer.decode(engine.calls[1].input_ids)
    assert ep.reward == float(len("The answer is 3.") % 2 == 0) and ep.metrics["reward_from"] == "program"
    assert ep.metrics["agent_splits"] == 0 and [t["rendered"] for t in ep.turns] == ["full", "continued"]
    # The sample is exactly what the engine saw and sampled: prompt, turn 1, glue, turn 2.
    first, second = engine.calls
    assert ep.prompt_ids == first.input_ids
    assert ep.prompt_ids + ep.response_ids == second.input_ids + second.output.token_ids
    policy = [t for t, m in zip(ep.response_ids, ep.response_mask) if m]
    assert policy == first.output.token_ids + second.output.token_ids
    assert [lp for lp, m in zip(ep.response_logprobs, ep.response_mask) if m] == \
        first.output.logprobs + second.output.logprobs
    assert [c.params.temperature for c in engine.calls] == [0.8, 0.8]  # the trainer's, not the SDK's


async def test_rollout_manager_scores_program_transcripts(tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer, SCRIPT)
    manager = RolloutManager(engine, tiny_tokenizer, None, AgentLoopConfig(),
                             RolloutConfig(n=2, agent_program="agent_programs:openai_sdk_agent"), RewardConfig())
    try:
        episodes = await manager.generate([TASK])
    finally:
        await manager.aclose()
    assert [e.reward for e in episodes] == [1.0, 1.0]  # "The answer is 3." scored by the task's numeric spec
    assert [e.metrics["sample_index"] for e in episodes] == [0, 1]
    assert all(not e.infra_error and e.num_turns == 2 for e in episodes)
    assert episodes[0].messages[-1]["content"] == "The answer is 3."
    assert rollout_metrics(episodes)["rollout/agent_splits"] == 0.0


async def failing_program(task, base_url, episode_id):
    raise RuntimeError("the agent crashed")


async def test_a_program_that_raises_is_an_infra_failure(tiny_tokenizer):
    loop = AgentProgramLoop(ScriptedEngine(tiny_tokenizer, []), tiny_tokenizer, failing_program, AgentLoopConfig())
    try:
        (ep,) = await loop.run(TASK, sampling=SamplingParams(max_new_tokens=1), uid="g", session_id="g-0")
    finally:
        await loop.aclose()
    assert ep.infra_error and ep.finish_reason == "infra_error"
    assert "agent program raised RuntimeError: the agent crashed" in ep.metrics["infra_detail"]


def not_async(task, base_url, episode_id):
    return 0.0


def test_config_checks_the_program():
    with pytest.raises(ConfigError, match="must be an async function"):
        RolloutConfig(agent_program=f"{__name__}:not_async")
    assert RolloutConfig(agent_program="agent_programs:openai_sdk_agent").agent_program


async def test_the_shipped_example_agent_is_scored_on_its_transcript(tiny_tokenizer):
    script = [model_turn("", [("calculate", {"expression": "1 + 2"})]), "<answer>3</answer>"]
    engine = ScriptedEngine(tiny_tokenizer, script)
    program = "agentrl.agent_loop.example_agents:calculator_agent"
    manager = RolloutManager(engine, tiny_tokenizer, None, AgentLoopConfig(),
                             RolloutConfig(n=1, agent_program=program), RewardConfig())
    try:
        (ep,) = await manager.generate([TASK])
    finally:
        await manager.aclose()
    assert "<tool_response>\n3\n</tool_response>" in tiny_tokenizer.decode(engine.calls[1].input_ids)
    assert (ep.reward, ep.metrics["reward_from"], ep.num_turns) == (1.0, "transcript", 2)


async def one_call_then_wait(task, base_url, episode_id):
    import openai

    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    await client.chat.completions.create(model="p", messages=task.prompt)
    await asyncio.Event().wait()  # never returns: the episode timeout ends it


async def test_a_program_past_the_episode_timeout_keeps_its_calls(tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer, ["Thinking."])
    loop = AgentProgramLoop(engine, tiny_tokenizer, one_call_then_wait, AgentLoopConfig(episode_timeout_s=0.5))
    try:
        (ep,) = await loop.run(TASK, sampling=SamplingParams(max_new_tokens=1), uid="g", session_id="g-0")
    finally:
        await loop.aclose()
    assert (ep.finish_reason, ep.infra_error, ep.num_turns) == ("timeout", True, 1)
    assert ep.response_ids == engine.calls[0].output.token_ids


async def test_an_engine_fault_is_an_infra_failure_naming_the_engine(tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer, [EngineError("server down")])
    loop = AgentProgramLoop(engine, tiny_tokenizer, one_call_then_wait, AgentLoopConfig())
    try:
        (ep,) = await loop.run(TASK, sampling=SamplingParams(max_new_tokens=1), uid="g", session_id="g-0")
    finally:
        await loop.aclose()
    assert ep.infra_error and ep.metrics["infra_detail"] == "engine: server down"


async def test_max_assistant_turns_bounds_a_program_and_ends_its_episode(tiny_tokenizer):
    """The program would call 3 times; the front refuses the third (a 400 the SDK raises), the episode keeps the
    two calls, ends with "max_turns" (not an infra failure) and is scored on its transcript."""
    import agent_programs

    engine = ScriptedEngine(tiny_tokenizer, [model_turn("", [("add", {"a": 1, "b": 2})])] * 3)
    loop = AgentProgramLoop(engine, tiny_tokenizer, agent_programs.openai_sdk_agent,
                            AgentLoopConfig(max_assistant_turns=2))
    try:
        (ep,) = await loop.run(TASK, sampling=SamplingParams(max_new_tokens=1), uid="g", session_id="g-0")
    finally:
        await loop.aclose()
    assert len(engine.calls) == 2 and ep.num_turns == 2
    assert (ep.finish_reason, ep.infra_error, ep.metrics["reward_from"]) == ("max_turns", False, "transcript")
    assert not loop.front.capped  # forgotten once the episode was taken
