"""Agent programs the tests train through the policy front (`rollout.agent_program`): an `openai` SDK tool loop and
an OpenAI Agents SDK agent, each with a function tool, written as a user would write them."""

from __future__ import annotations

import json

ADD_TOOL = {"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}


async def openai_sdk_agent(task, base_url: str, episode_id: str):
    """A hand-written tool loop on the `openai` SDK; returns its transcript (scored by the task's reward spec)."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=base_url, api_key="unused")
    messages = list(task.prompt)
    for _ in range(3):
        reply = (await client.chat.completions.create(model="policy", messages=messages, tools=[ADD_TOOL],
                                                      max_tokens=32)).choices[0]
        messages.append(reply.message.model_dump(exclude_none=True))
        if not reply.message.tool_calls:
            break
        for call in reply.message.tool_calls:
            args = json.loads(call.function.arguments)
            result = args.get("a", 0) + args.get("b", 0) if call.function.name == "add" else "unknown tool"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": str(result)})
    await client.close()
    return messages


async def agents_sdk_agent(task, base_url: str, episode_id: str):
    """An OpenAI Agents SDK agent with a function tool; returns a reward: 1.0 for an even-length final answer
    (a reward the tiny model's random text gets about half the time, so groups have signal)."""
    from agents import Agent, OpenAIChatCompletionsModel, RunConfig, Runner, function_tool
    from agents.model_settings import ModelSettings
    from openai import AsyncOpenAI

    @function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    client = AsyncOpenAI(base_url=base_url, api_key="unused")
    agent = Agent(name="calculator", instructions="Use the add tool, then answer.", tools=[add],
                  model=OpenAIChatCompletionsModel(model="policy", openai_client=client),
                  model_settings=ModelSettings(max_tokens=64))
    result = await Runner.run(agent, input=task.prompt[-1]["content"], max_turns=4,
                              run_config=RunConfig(tracing_disabled=True))
    await client.close()
    return float(len(str(result.final_output)) % 2 == 0)
