"""The OpenAI-compatible policy front over a scripted engine, driven by the real `openai` SDK: tool calls come
back in OpenAI form, every call is recorded token for token, and a conversation continued through the front gives
exactly the ids ToolAgentLoop builds for the same turns."""

from __future__ import annotations

import json

import httpx
import pytest
from scripted_engine import ScriptedEngine, add, model_turn

from agentrl.agent_loop.calls import episodes_from_calls
from agentrl.agent_loop.config import AgentLoopConfig
from agentrl.agent_loop.openai_front import PolicyFront
from agentrl.agent_loop.openai_server import create_app, serve_in_loop
from agentrl.agent_loop.tool_agent import ToolAgentLoop
from agentrl.tools import ToolRegistry
from agentrl.types import SamplingParams, Task

openai = pytest.importorskip("openai", reason="pip install -e '.[agents]'")

SCRIPT = [model_turn("", [("add", {"a": 1, "b": 2})]), "The answer is 3."]
QUESTION = [{"role": "user", "content": "What is 1 + 2?"}]


async def test_tool_call_round_trip_matches_the_agent_loop(tiny_tokenizer):
    registry = ToolRegistry.from_functions([add])
    schemas = registry.schemas(["add"])
    engine = ScriptedEngine(tiny_tokenizer, SCRIPT)
    front = PolicyFront(engine, tiny_tokenizer, max_new_tokens=64)
    async with serve_in_loop(create_app(front)) as url:
        client = openai.AsyncOpenAI(base_url=f"{url}/episodes/ep-1/v1", api_key="unused")
        first = await client.chat.completions.create(model="policy", messages=QUESTION, tools=schemas)
        choice = first.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        (tc,) = choice.message.tool_calls
        assert (tc.function.name, json.loads(tc.function.arguments)) == ("add", {"a": 1, "b": 2})
        history = [*QUESTION, choice.message.model_dump(exclude_none=True),
                   {"role": "tool", "tool_call_id": tc.id, "content": "3"}]
        second = await client.chat.completions.create(model="policy", messages=history, tools=schemas)
        assert second.choices[0].message.content == "The answer is 3."
        assert second.choices[0].finish_reason == "stop"
        assert second.usage.prompt_tokens == len(engine.calls[1].input_ids)
        models = (await client.models.list()).data
        assert [m.id for m in models] == ["agentrl-policy"]

    calls, error = front.take("ep-1")
    assert error is None and [c.rendered for c in calls] == ["full", "continued"]
    for record, sent in zip(calls, engine.calls):  # recorded = what the engine saw and sampled
        assert record.prompt_ids == sent.input_ids
        assert record.completion_ids == sent.output.token_ids and record.logprobs == sent.output.logprobs
    (ep,) = episodes_from_calls(calls, uid="g", episode_id="ep-1", messages=history)

    loop = ToolAgentLoop(ScriptedEngine(tiny_tokenizer, SCRIPT), tiny_tokenizer, registry, AgentLoopConfig())
    ref = await loop.run(Task(prompt=QUESTION, tools=["add"]), sampling=SamplingParams(max_new_tokens=1, seed=1))
    assert ep.prompt_ids == ref.prompt_ids
    assert ep.response_ids == ref.response_ids and ep.response_mask == ref.response_mask
    assert ep.response_logprobs == ref.response_logprobs


async def test_edited_history_is_rendered_fresh_and_split(tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer, ["First.", "Second."])
    front = PolicyFront(engine, tiny_tokenizer, max_new_tokens=64)
    async with serve_in_loop(create_app(front)) as url:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused")
        await client.chat.completions.create(model="p", messages=QUESTION, user="ep-2")
        # The agent replaces its history with a summary: not an extension of the first call.
        await client.chat.completions.create(model="p", messages=[{"role": "user", "content": "Summary: 3."}],
                                             extra_headers={"X-Agentrl-Episode": "ep-2"})
    calls, _ = front.take("ep-2")
    assert [c.rendered for c in calls] == ["full", "full"]
    episodes = episodes_from_calls(calls, uid="g", episode_id="ep-2", messages=[])
    assert [e.metrics["agent_splits"] for e in episodes] == [1, 1]


async def test_refusals_are_one_clear_error(tiny_tokenizer):
    front = PolicyFront(ScriptedEngine(tiny_tokenizer, ["x"]), tiny_tokenizer, max_new_tokens=8)
    transport = httpx.ASGITransport(app=create_app(front))
    async with httpx.AsyncClient(transport=transport, base_url="http://front") as client:
        r = await client.post("/v1/chat/completions", json={"messages": QUESTION})
        assert r.status_code == 400 and "no episode id" in r.json()["error"]["message"]
        r = await client.post("/episodes/e/v1/chat/completions", json={"messages": QUESTION, "stream": True})
        assert r.status_code == 400 and "stream" in r.json()["error"]["message"]
        r = await client.post("/episodes/e/v1/chat/completions", json={"messages": []})
        assert r.status_code == 400 and "messages" in r.json()["error"]["message"]
    assert front.calls("e") == []


async def test_training_sampling_overrides_the_request(tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer, ["ok"])
    front = PolicyFront(engine, tiny_tokenizer, max_new_tokens=8,
                        sampling=SamplingParams(max_new_tokens=1, temperature=0.7, top_p=0.9, seed=5))
    await front.complete({"messages": QUESTION, "temperature": 0.0, "max_tokens": 100}, "e")
    params = engine.calls[0].params
    assert (params.temperature, params.top_p, params.seed, params.max_new_tokens) == (0.7, 0.9, 5, 8)
    assert front.end_of_turn_id in params.stop_token_ids
