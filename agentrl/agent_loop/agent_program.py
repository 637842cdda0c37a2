"""`AgentProgramLoop`: train any agent program that talks to an OpenAI-compatible endpoint.

Config `rollout.agent_program: module:function` names an async callable

    async def run(task: Task, base_url: str, episode_id: str) -> float | list[dict] | None

that the rollout calls once per episode with `base_url` pointing at the policy front (`openai_front`) served in
the trainer's process, e.g. `AsyncOpenAI(base_url=base_url, api_key="unused")`; every call it makes there is
recorded under `episode_id` and the episode is assembled from the calls (`calls.episodes_from_calls`: one
training sample per unbroken chain of calls, split where the agent edited its history).

The reward: a number the program returns is the episode's reward; a list of messages it returns is its final
transcript, scored by the task's reward spec (`reward:` config, as ToolAgentLoop episodes are); None scores the
transcript of its last policy call (those messages and the answer). Sampling follows the trainer
(rollout.temperature, top_p, top_k, a seed per episode and call), whatever the program asks for; one completion
has at most `agent.max_new_tokens_per_turn` tokens; `agent.episode_timeout_s` bounds the program's run, and
`agent.max_assistant_turns` its policy calls (one request, whatever its `n`, is one turn): the front refuses the
next request with a 400 naming the limit, and the episode ends with finish_reason "max_turns" whatever the
program then does (raises or returns), scored like any other.

Faults: a program that raises, a call the engine failed, or an episode with no policy call is an infrastructure
failure (`infra_error`, dropped from training, `metrics["infra_detail"]` says which); a timeout keeps the calls
made so far with finish_reason "timeout" (`agent.timeout_is_infra_error`, as ToolAgentLoop).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import traceback
from collections.abc import Awaitable, Callable

from agentrl.agent_loop.calls import episodes_from_calls
from agentrl.agent_loop.config import AgentLoopConfig, load_agent_program
from agentrl.agent_loop.openai_front import PolicyFront
from agentrl.agent_loop.openai_server import create_app, serve_in_loop
from agentrl.types import Episode, SamplingParams, Task

AgentProgram = Callable[[Task, str, str], Awaitable[float | list[dict] | None]]


class AgentProgramLoop:
    """Runs an agent program per episode against a policy front it serves on loopback (started on first use)."""

    def __init__(self, engine, tokenizer, program: AgentProgram, config: AgentLoopConfig):
        self.program = program
        self.config = config
        self.front = PolicyFront(engine, tokenizer, tool_parser=config.tool_parser,
                                 max_new_tokens=config.max_new_tokens_per_turn, max_model_len=config.max_model_len)
        self._resources: contextlib.AsyncExitStack | None = None
        self._starting = asyncio.Lock()  # the first episodes of a rollout all ask for the front at once
        self.url: str | None = None

    async def start(self) -> str:
        async with self._starting:
            if self.url is None:
                self._resources = contextlib.AsyncExitStack()
                self.url = await self._resources.enter_async_context(serve_in_loop(create_app(self.front)))
        return self.url

    async def aclose(self) -> None:
        if self._resources is not None:
            await self._resources.aclose()
        self._resources, self.url = None, None

    async def run(self, task: Task, *, sampling: SamplingParams, uid: str, session_id: str) -> list[Episode]:
        """One episode of the program: its samples (several when it was split), reward set when the program
        returned a number; `metrics["reward_from"]` is "program" or "transcript" (the caller scores those)."""
        url = await self.start()
        self.front.open_episode(session_id, sampling, max_turns=self.config.max_assistant_turns)
        started = time.monotonic()
        result, finish, detail = None, None, None
        timeout = asyncio.timeout(self.config.episode_timeout_s)
        try:
            async with timeout:
                result = await self.program(task, f"{url}/episodes/{session_id}/v1", session_id)
        except TimeoutError:
            if not timeout.expired():
                raise
            finish = "timeout"
        except Exception as e:  # noqa: BLE001 -- boundary: whatever the user's program raises ends its episode
            finish, detail = "infra_error", f"agent program raised {type(e).__name__}: {e}"
            detail += f" (at {traceback.extract_tb(e.__traceback__)[-1].line})" if e.__traceback__ else ""
        if session_id in self.front.capped and finish != "timeout":  # what the program did past the refusal: ours
            finish, detail = "max_turns", None
        calls, engine_error = self.front.take(session_id)
        metrics = {"wall_s": time.monotonic() - started}
        if engine_error is not None and finish != "timeout":
            finish, detail = "infra_error", f"engine: {engine_error}"
        if not calls:
            detail = detail or "the agent program made no call to the policy at the base_url it was given"
            finish = "infra_error"
        if finish == "infra_error":
            metrics["infra_detail"] = detail
            if not calls:
                return [Episode(uid=uid, prompt_ids=[], response_ids=[], response_mask=[], response_logprobs=[],
                                messages=[], finish_reason="infra_error", infra_error=True, metrics=metrics,
                                task_id=task.task_id, data_source=task.data_source, episode_id=session_id)]
        if isinstance(result, bool) or not isinstance(result, (int, float, list, type(None))):
            finish = "infra_error"
            metrics["infra_detail"] = (f"agent program returned {type(result).__name__}; return a number (the "
                                       "reward), a list of messages (the transcript) or None")
        last = calls[-1]
        messages = result if isinstance(result, list) else [*last.messages, last.message]
        from_program = isinstance(result, (int, float)) and not isinstance(result, bool)
        metrics["reward_from"] = "program" if from_program else "transcript"
        episodes = episodes_from_calls(calls, uid=uid, episode_id=session_id, messages=messages,
                                       reward=float(result) if from_program else 0.0, task_id=task.task_id,
                                       data_source=task.data_source, metrics=metrics)
        for ep in episodes:
            if finish is not None:
                ep.finish_reason = finish
                ep.infra_error = finish == "infra_error" or (finish == "timeout" and self.config.timeout_is_infra_error)
        return episodes


__all__ = ["AgentProgram", "AgentProgramLoop", "load_agent_program"]
