"""A verifiers environment as an agent program (`rollout.agent_program: agentrl.envs.verifiers_env:verifiers_agent`).

verifiers (pip `verifiers`, its `verifiers.v1` stack) splits an environment into a taskset (the tasks and their
`@reward` functions), an Env (how one task becomes one episode) and a harness (the agent program whose model calls
go through verifiers' interception server to an OpenAI-compatible endpoint). Here the endpoint is the trainer's
policy front, so every call is recorded token for token under the episode; the reward is the one verifiers'
rubric gave the trace (`Trace.reward`: the weighted sum of the task's `@reward` functions).

The task row names the taskset and the task in its `extra`: `{"verifiers": {"taskset": <taskset id>, "idx":
<position in load()>}}` (`task.extra["verifiers"]`). The taskset id is what verifiers loads: an installed package (or
module) exporting one `Taskset` subclass in `__all__`. The agent is `ChatHarness`, a chat loop run in this
process: verifiers' shipped harnesses install their programs with `uv` (network) and stream, neither of which
the trainer offers. It sends the task's prompt and returns the model's answer; an Env that continues the exchange
(a simulated user) relaunches it on the whole conversation, as verifiers does for any stateless chat program.
Tools (a taskset's MCP toolsets) are not offered to the model. A verifiers episode that failed (an error in the
taskset, the rubric or the model call) raises, so the trainer drops it as an infrastructure failure.
"""

from __future__ import annotations

import functools
import importlib.util
import itertools

from agentrl.types import Task

INSTALL_HINT = "the verifiers adapter needs the verifiers package: pip install -e '.[agents]'"
if importlib.util.find_spec("verifiers") is None:  # so `rollout.agent_program` fails at config load, in one line
    raise ImportError(INSTALL_HINT)
_tasks: dict[tuple[str, int], object] = {}  # (taskset id, idx) -> its verifiers Task, shared by its episodes


def _vf():
    try:
        import verifiers.v1 as vf
    except ImportError as e:
        raise ImportError(INSTALL_HINT) from e
    return vf


@functools.cache
def _classes():
    """ChatHarness and the Env that seats it, built on first use (verifiers is an optional extra)."""
    vf = _vf()
    from verifiers.v1.runtimes import ProgramResult

    class ChatHarness(vf.Harness):
        """One chat completion per launch, through verifiers' interception endpoint; no tools, no code."""

        APPENDS_SYSTEM_PROMPT = True
        SUPPORTS_RESUME = True
        EXECUTES_CODE = False
        NEEDS_CONTAINER = False

        async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, **_):
            import openai

            system, prompt = self.resolve_prompt(data)
            messages = [{"role": "system", "content": system}] if system else []
            if isinstance(prompt, str):
                messages.append({"role": "user", "content": prompt})
            else:
                messages += [m.model_dump(mode="json", exclude_none=True) for m in prompt or []]
            client = openai.AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0)
            try:
                await client.chat.completions.create(model=ctx.model, messages=messages)
            finally:
                await client.close()
            return ProgramResult(exit_code=0, stdout="", stderr="")

    class ChatEnv(vf.SingleAgentEnv):
        """verifiers' single-agent Env with its seat played by ChatHarness."""

        async def setup(self, agents) -> None:
            agents.agent.harness = ChatHarness(agents.agent.harness.config)

    return ChatHarness, ChatEnv


def load_env(taskset: str):
    """A fresh Env for a taskset id (verifiers' own loader; the agent run in this process). One per episode: an
    Env's serving resources (its interception server) belong to one `serving()` at a time."""
    vf = _vf()
    _, chat_env = _classes()
    config = vf.SingleAgentEnvConfig(taskset=vf.TasksetConfig(id=taskset),
                                     agent=vf.AgentConfig(runtime=vf.SubprocessConfig()))
    return chat_env(config)


async def verifiers_agent(task: Task, base_url: str, episode_id: str) -> float:
    """One verifiers episode of the task `task.extra["verifiers"]` names, its model calls sent to `base_url`;
    returns verifiers' reward for it."""
    spec = task.extra.get("verifiers")
    if not isinstance(spec, dict) or not isinstance(spec.get("taskset"), str) or not isinstance(spec.get("idx"), int):
        raise ValueError(f"task {task.task_id!r} has no extra.verifiers: {{taskset: <id>, idx: <int>}}")
    vf = _vf()
    env = load_env(spec["taskset"])
    key = (spec["taskset"], spec["idx"])
    if key not in _tasks:  # verifiers runs one Task object for all rollouts of a task, too
        chosen = next(itertools.islice(iter(env.taskset), spec["idx"], None), None)
        if chosen is None:
            raise ValueError(f"verifiers taskset {spec['taskset']!r} has no task at idx {spec['idx']}")
        _tasks[key] = chosen
    ctx = vf.ModelContext(model="policy", client=vf.EvalClientConfig(base_url=base_url,
                                                                     api_key_var="AGENTRL_POLICY_KEY"))
    async with env.serving():
        episode = await env.run_episode(_tasks[key], ctx)
    errors = [*episode.errors, *(e for t in episode.traces for e in getattr(t, "errors", []) or [])]
    if not episode.ok or not episode.traces:
        detail = f"{errors[0].type}: {errors[0].message}" if errors else "not ok"
        raise RuntimeError(f"verifiers episode failed: {detail}")
    return float(sum(t.reward for t in episode.traces))


__all__ = ["INSTALL_HINT", "load_env", "verifiers_agent"]
