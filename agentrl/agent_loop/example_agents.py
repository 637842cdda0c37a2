"""An agent program to start from (`rollout.agent_program: agentrl.agent_loop.example_agents:calculator_agent`):
an OpenAI Agents SDK agent with one function tool, written as it would be for the OpenAI API. Needs the `agents`
extra (`pip install -e '.[agents]'`). docs/agents.md explains the contract."""

from __future__ import annotations

from agentrl.types import Task


async def calculator_agent(task: Task, base_url: str, episode_id: str) -> None:
    """Answer the task's last user message with a `calculate` tool; returns None, so the trainer scores the
    transcript of the last policy call with the task's reward spec. Running out of turns is the policy's failure
    (scored); any exception that leaves the program makes the episode an infrastructure failure (dropped)."""
    from agents import Agent, OpenAIChatCompletionsModel, RunConfig, Runner, function_tool
    from agents.exceptions import MaxTurnsExceeded
    from agents.model_settings import ModelSettings
    from openai import AsyncOpenAI

    @function_tool
    def calculate(expression: str) -> str:
        """Evaluate an arithmetic expression of numbers, + - * / and parentheses."""
        allowed = set("0123456789.+-*/() ")
        if not expression or set(expression) - allowed or "**" in expression:  # no powers: 9**9**9 never ends
            return "error: only numbers, + - * / and parentheses"
        try:
            return str(eval(expression, {"__builtins__": {}}))  # noqa: S307 -- digits and operators only
        except (SyntaxError, ZeroDivisionError, TypeError) as e:
            return f"error: {e}"

    client = AsyncOpenAI(base_url=base_url, api_key="unused")  # the trainer's policy front, not OpenAI
    agent = Agent(name="calculator", tools=[calculate],
                  instructions="Use the calculate tool, then give the answer as <answer>NUMBER</answer>.",
                  model=OpenAIChatCompletionsModel(model="policy", openai_client=client),
                  model_settings=ModelSettings(max_tokens=256))
    try:
        await Runner.run(agent, input=task.prompt[-1]["content"], max_turns=4,
                         run_config=RunConfig(tracing_disabled=True))
    except MaxTurnsExceeded:
        pass  # the policy's doing, not a fault: its transcript is scored like any other (an exception is not)
    finally:
        await client.close()


__all__ = ["calculator_agent"]
