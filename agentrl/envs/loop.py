"""`EnvAgentLoop`: one episode against an environment (`agentrl.envs.base.Env`), token in / token out.

The turns, their budgets and the token bookkeeping are the tool agent's (`agentrl.agent_loop.turns`): model
turns keep their sampled ids, logprobs and weight versions with mask 1; the environment's observation messages
are rendered by the chat template and appended with mask 0. Per episode:

    env = make_env(task.env)           prompt = chat template of await env.reset(task)
    loop: sample a model turn -> await env.step({"role": "assistant", "content": text})
          -> turn_rewards += [reward]; done -> stop; else observation tokens (mask 0) -> next turn

Stop conditions (`Episode.finish_reason` / `metrics["stop_detail"]`): "stop"/"env_done" when the environment
says done; "max_turns" when `agent.max_assistant_turns` turns were sampled (the last turn is still stepped, so
its reward counts; its observation is not appended); the tool agent's "length", "timeout", "stop"/"eos" and
engine faults otherwise. A turn that did not end with the end-of-turn token (cut by a length, another eos) is
not stepped. Anything the environment raises or returns malformed, in its constructor, reset or step, ends the
episode as "infra_error"/"env_error" (`metrics["infra_detail"]` names the call): an environment's fault is not
the policy's, so the episode is dropped from training rather than scored 0. `close()` always runs; its failure
is logged and counted (`metrics["env_close_errors"]`), the episode stands.
"""

from __future__ import annotations

import json
import logging
import math
import time
import uuid
from dataclasses import asdict
from typing import Any

from agentrl.agent_loop.chat import ChatTemplate
from agentrl.agent_loop.config import AgentLoopConfig
from agentrl.agent_loop.turns import EpisodeState, PolicyTurns
from agentrl.envs.base import OBSERVATION_ROLES, PROMPT_ROLES, StepResult, check_messages, make_env
from agentrl.errors import one_line
from agentrl.types import Episode, SamplingParams, Task

log = logging.getLogger(__name__)


class EnvError(Exception):
    """An environment raised or answered something unusable; the message names the call."""


class EnvAgentLoop:
    """Runs episodes of one policy (engine + tokenizer) against the environments tasks name."""

    def __init__(self, engine, tokenizer, config: AgentLoopConfig):
        self.engine = engine
        self.tokenizer = tokenizer
        self.config = config
        self.policy = PolicyTurns(engine, tokenizer, config)
        self.template = ChatTemplate(tokenizer, None)

    async def run(self, task: Task, *, sampling: SamplingParams | None = None, uid: str = "",
                  session_id: str | None = None) -> Episode:
        """Roll out `task` (which has `task.env`) once; the arguments are `ToolAgentLoop.run`'s."""
        if task.env is None:
            raise ValueError(f"task {task.task_id!r} has no env; ToolAgentLoop runs tool tasks")
        sampling = self.policy.seeded(sampling)
        session_id = session_id or uuid.uuid4().hex
        state = EpisodeState(prompt_ids=[], messages=[])
        state.metrics.update(engine_s=0.0, env_s=0.0)
        env, prompt_messages = None, 0

        async def body() -> None:
            nonlocal env, prompt_messages
            try:
                env = await self._env_call(state, "constructor", self._make, task)
                prompt = _messages(await self._env_call(state, "reset", env.reset, task), "reset", PROMPT_ROLES)
                state.messages, prompt_messages = [dict(m) for m in prompt], len(prompt)
                state.prompt_ids = self.template.prompt_ids(state.messages)
                await self._loop(env, state, sampling, session_id)
            except EnvError as e:
                state.metrics["infra_detail"] = f"env {task.env['name']}: {e}"
                state.finish("infra_error", "env_error", infra=True)

        try:
            await self.policy.run_timed(state, body)
        finally:
            if env is not None:
                await self._close(env, state)
        replay = {"engine": self.policy.engine_record(state), "sampling": asdict(sampling), "env": task.env,
                  "prompt_messages": prompt_messages, "agent": self.config.model_dump()}
        return self.policy.episode(state, task, uid=uid, episode_id=session_id, replay=replay)

    def _make(self, task: Task):
        return make_env(task.env, self.config.envs)

    async def _loop(self, env, state: EpisodeState, sampling: SamplingParams, session_id: str) -> None:
        while True:
            turn = await self.policy.next_turn(state, sampling, session_id)
            if turn is None:
                return  # finished by PolicyTurns: budget, engine fault, or a turn the transcript cannot follow
            message = {"role": "assistant", "content": turn.text}
            state.messages.append(message)
            result = await self._env_call(state, "step", env.step, dict(message))
            if not isinstance(result, StepResult):
                raise EnvError(f"step returned {type(result).__name__}, not a StepResult")
            reward = result.reward
            if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
                raise EnvError(f"step returned reward {reward!r} (must be a finite number)")
            reward = float(reward)
            done = bool(result.done)
            observation = [] if done else _messages(result.observation, "step", OBSERVATION_ROLES)
            state.turn_rewards.append(reward)
            state.turns[-1]["env"] = {"reward": reward, "done": done, "info": _json_values(result.info)}
            if done:
                state.finish("stop", "env_done")
                return
            if state.num_turns >= self.config.max_assistant_turns:
                state.finish("max_turns", "max_assistant_turns")
                return
            delta = self.template.delta_ids(state.messages, observation)
            state.count(f"template_{delta.mode}")
            if not self.policy.fits(state, len(delta.ids)):
                state.finish("length", "observation_overflow")
                return
            state.messages.extend(dict(m) for m in observation)
            state.add_glue(delta.ids)

    async def _env_call(self, state: EpisodeState, what: str, fn, *args) -> Any:
        """fn(*args), awaited when it returns an awaitable; EnvError on whatever it raises."""
        t0 = time.monotonic()
        state.phase = "env"
        try:
            value = fn(*args)
            if hasattr(value, "__await__"):
                value = await value
            return value
        except Exception as e:  # noqa: BLE001 -- boundary: the environment's own code, whatever it raises
            raise EnvError(f"{what} raised {type(e).__name__}: {one_line(str(e))[:300]}") from e
        finally:
            state.metrics["env_s"] += time.monotonic() - t0

    async def _close(self, env, state: EpisodeState) -> None:
        try:
            await env.close()
        except Exception as e:  # noqa: BLE001 -- boundary: the episode is complete; a failed close only counts
            log.warning("environment close() raised %s: %s", type(e).__name__, e)
            state.count("env_close_errors")


def _messages(value: Any, what: str, roles: tuple[str, ...]) -> list[dict]:
    """`value` if it is a non-empty list of messages with `roles`; EnvError naming `what` otherwise."""
    try:
        return check_messages(value, what, roles=roles, allow_empty=False)
    except ValueError as e:
        raise EnvError(str(e)) from None


def _json_values(info: Any) -> Any:
    """`info` as JSON values (what episodes.jsonl can hold): anything else becomes its str()."""
    return json.loads(json.dumps(info, default=str))


__all__ = ["EnvAgentLoop", "EnvError"]
