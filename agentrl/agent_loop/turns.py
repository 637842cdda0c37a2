"""The token-exact bookkeeping every agent loop shares: model turns in, Episode out.

`EpisodeState` is one growing id list per episode with the lists aligned to it: model turns are appended
exactly as sampled (mask 1, the engine's logprobs, `turn_ids` = the turn index, `response_versions` = the weight
version that sampled each token); everything between turns (tool results, an environment's observations,
template glue) is appended with mask 0, logprob 0.0, turn id -1 and version -1. Nothing is re-tokenized.

`PolicyTurns` samples one model turn into a state: the per-turn budget (turn cap, response budget, context
window), the stop ids, the seed per turn, resampling a turn a weight update aborted (at most
`MAX_TURN_RESTARTS` times), and engine faults, which end the episode as infra errors. `ToolAgentLoop` and
`agentrl.envs.EnvAgentLoop` differ only in what they do between turns.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from agentrl.agent_loop.chat import ChatTemplate
from agentrl.agent_loop.config import AgentLoopConfig
from agentrl.agent_loop.versions import sampled_versions
from agentrl.inference.base import EngineError, PromptTooLongError
from agentrl.types import Episode, Generation, SamplingParams, Task

MAX_TURN_RESTARTS = 3  # a turn aborted by more weight updates in a row than this makes the episode an infra error


@dataclass
class EpisodeState:
    """The episode under construction. Every append keeps the token-aligned lists the same length."""

    prompt_ids: list[int]
    messages: list[dict]
    response_ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turn_ids: list[int] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    versions_known: bool = True  # False once a turn came from an engine that does not report weight versions
    tool_calls: list[dict] = field(default_factory=list)
    turns: list[dict] = field(default_factory=list)  # one record per engine call (Episode.turns)
    turn_rewards: list[float] = field(default_factory=list)  # Episode.turn_rewards: one per stepped model turn
    num_turns: int = 0
    finish_reason: str = ""
    infra_error: bool = False
    metrics: dict = field(default_factory=dict)
    phase: str = "start"  # what the episode is waiting for: "engine", "tools" or "env" (reported on a timeout)

    def add_model_turn(self, gen: Generation, turn: int) -> None:
        ids = gen.token_ids
        self.response_ids += ids
        self.mask += [1] * len(ids)
        self.logprobs += [float(x) for x in gen.logprobs]
        self.turn_ids += [turn] * len(ids)
        versions = sampled_versions(gen)
        self.versions_known = self.versions_known and versions is not None
        self.versions += versions or [-1] * len(ids)

    def add_glue(self, ids: list[int]) -> None:
        self.response_ids += ids
        self.mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.turn_ids += [-1] * len(ids)
        self.versions += [-1] * len(ids)

    def response_versions(self) -> list[int]:
        """Episode.response_versions: the versions when every turn reported them, else [] (unknown)."""
        return self.versions if self.versions_known else []

    def finish(self, reason: str, detail: str, *, infra: bool = False) -> None:
        self.finish_reason = reason
        self.infra_error = infra
        self.metrics["stop_detail"] = detail

    def count(self, key: str, n: int = 1) -> None:
        self.metrics[key] = self.metrics.get(key, 0) + n


@dataclass
class ModelTurn:
    """A sampled turn that ended with the template's end-of-turn token (the transcript can go on)."""

    index: int  # the turn's index in the episode (its `turn_ids` value)
    text: str  # decoded without the end-of-turn token
    token_ids: list[int]  # as sampled, end-of-turn included


def _aborted_by_weight_update(gen: Generation) -> bool:
    return gen.finish_reason == "abort" and gen.metrics.get("aborted_by") == "weight_update"


def generation_eos_ids(tokenizer) -> list[int]:
    """eos ids from generation_config.json next to the tokenizer files (the model's own stop ids), if any."""
    path = Path(str(getattr(tokenizer, "name_or_path", "") or "")) / "generation_config.json"
    if not path.is_file():
        return []
    eos = json.loads(path.read_text()).get("eos_token_id")
    return [eos] if isinstance(eos, int) else [int(i) for i in (eos or [])]


class PolicyTurns:
    """Samples the model turns of episodes for one policy (engine + tokenizer) under one `AgentLoopConfig`."""

    def __init__(self, engine, tokenizer, config: AgentLoopConfig):
        self.engine = engine
        self.tokenizer = tokenizer
        self.config = config
        self.max_model_len = config.max_model_len or getattr(engine, "max_model_len", None)
        self._engine_takes_session = "session_id" in inspect.signature(engine.generate).parameters
        self.end_of_turn_id = ChatTemplate(tokenizer, None).end_of_turn_id
        eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
        self.stop_token_ids = list(dict.fromkeys([self.end_of_turn_id, *eos, *generation_eos_ids(tokenizer)]))

    @staticmethod
    def seeded(sampling: SamplingParams | None) -> SamplingParams:
        """`sampling` (default: temperature 1) with a seed: an unseeded sampled episode still draws from a recorded
        seed, so `agentrl replay` can repeat it."""
        sampling = sampling or SamplingParams(max_new_tokens=1)
        if sampling.seed is None and sampling.temperature > 0:
            sampling = SamplingParams(**{**asdict(sampling), "seed": random.SystemRandom().randrange(2**31)})
        return sampling

    async def run_timed(self, state: EpisodeState, body: Callable[[], Awaitable[None]]) -> None:
        """Run `body()` under `agent.episode_timeout_s`; past it the episode finishes "timeout" and keeps what it
        had (`infra_error` = `agent.timeout_is_infra_error`, `metrics["timeout_phase"]` = what it waited for)."""
        started = time.monotonic()
        timeout = asyncio.timeout(self.config.episode_timeout_s)
        try:
            async with timeout:
                await body()
        except TimeoutError:
            if not timeout.expired():
                raise
            state.finish("timeout", "episode_timeout", infra=self.config.timeout_is_infra_error)
            state.metrics["timeout_phase"] = state.phase
        state.metrics["wall_s"] = time.monotonic() - started
        state.metrics["response_tokens"] = len(state.response_ids)
        state.metrics["policy_tokens"] = sum(state.mask)

    def episode(self, state: EpisodeState, task: Task, *, uid: str, episode_id: str, replay: dict) -> Episode:
        return Episode(
            uid=uid, prompt_ids=state.prompt_ids, response_ids=state.response_ids, response_mask=state.mask,
            response_logprobs=state.logprobs, messages=state.messages, finish_reason=state.finish_reason,
            num_turns=state.num_turns, tool_calls=state.tool_calls, infra_error=state.infra_error,
            metrics=state.metrics, task_id=task.task_id, data_source=task.data_source, turn_ids=state.turn_ids,
            response_versions=state.response_versions(), episode_id=episode_id, turns=state.turns, replay=replay,
            turn_rewards=state.turn_rewards,
        )

    def engine_record(self, state: EpisodeState) -> dict:
        """Episode.replay["engine"]: the engine class, model, last weight version and context window."""
        model = getattr(self.engine, "model_path", None) or getattr(getattr(self.engine, "model", None),
                                                                      "name_or_path", None)
        versions = [t["weight_version"] for t in state.turns if t.get("weight_version") is not None]
        if model is not None and Path(model).exists():  # a local directory: absolute, so `agentrl replay` finds it
            model = Path(model).resolve()  # from any directory; a Hugging Face id stays as it is
        return {"class": type(self.engine).__name__, "model": None if model is None else str(model),
                "weight_version": versions[-1] if versions else None, "max_model_len": self.max_model_len}

    # --- one turn ---

    async def next_turn(self, state: EpisodeState, sampling: SamplingParams, session_id: str) -> ModelTurn | None:
        """Sample the next model turn into `state`. Returns it when it ended with the end-of-turn token; otherwise
        (no budget left, an engine fault, a turn cut by a length or ended by another eos / a stop string) the
        episode is finished, the transcript gets the turn's text if there was one, and None is returned."""
        budget, cause = self.turn_budget(state)
        if budget < 1:
            if cause == "context_window" and state.num_turns == 0:  # the task's prompt alone fills the window
                state.metrics["infra_detail"] = (f"prompt of {len(state.prompt_ids)} tokens does not fit "
                                                 f"max_model_len {self.max_model_len}")
                state.finish("infra_error", "prompt_too_long", infra=True)
            else:
                state.finish("length", cause)
            return None
        params = SamplingParams(
            max_new_tokens=budget, temperature=sampling.temperature, top_p=sampling.top_p,
            top_k=sampling.top_k, stop_token_ids=self.stop_token_ids,
            seed=None if sampling.seed is None else (sampling.seed * 1_000_003 + state.num_turns) % 2**31)
        gen = await self._sample(state, params, session_id)
        if gen is None:
            return None  # engine failure, recorded by _sample
        turn = state.num_turns
        state.add_model_turn(gen, turn)
        state.num_turns += 1
        last = gen.token_ids[-1]
        text = self.tokenizer.decode(gen.token_ids[:-1] if last in self.stop_token_ids else gen.token_ids,
                                     skip_special_tokens=False)
        if last == self.end_of_turn_id:
            return ModelTurn(turn, text, list(gen.token_ids))
        state.messages.append({"role": "assistant", "content": text})  # the transcript cannot continue after it
        if last in self.stop_token_ids:
            state.finish("stop", "eos")
        elif gen.finish_reason == "length":
            state.finish("length", cause)
        else:
            state.finish("stop", "stop_string")
        return None

    def turn_budget(self, state: EpisodeState) -> tuple[int, str]:
        """(tokens the next turn may sample, the limit that binds): per-turn cap, response budget, context."""
        limits = {"turn_length": self.config.max_new_tokens_per_turn,
                  "response_budget": self.config.max_response_tokens - len(state.response_ids)}
        if self.max_model_len is not None:
            limits["context_window"] = self.max_model_len - len(state.prompt_ids) - len(state.response_ids)
        cause = min(limits, key=limits.get)
        return limits[cause], cause

    def fits(self, state: EpisodeState, n: int) -> bool:
        """Whether `n` more tokens fit the response budget and the context window."""
        if len(state.response_ids) + n > self.config.max_response_tokens:
            return False
        return self.max_model_len is None or len(state.prompt_ids) + len(state.response_ids) + n <= self.max_model_len

    async def _sample(self, state: EpisodeState, params: SamplingParams, session_id: str):
        """One model turn; None (with the episode finished) on an engine fault or a full context.

        A turn the engine aborted because new weights arrived (`rollout.on_weight_update: abort`,
        `Generation.metrics["aborted_by"] == "weight_update"`) is sampled again from the same context: its tokens
        are dropped, never appended, so every policy token of the episode comes from one complete sampling. Other
        aborts (`Engine.abort`, an episode cancelled, a server shutting down) stay engine faults."""
        for restarts in range(MAX_TURN_RESTARTS + 1):
            gen = await self._call_engine(state, params, session_id)
            if gen is None or not _aborted_by_weight_update(gen) or restarts == MAX_TURN_RESTARTS:
                break
            state.turns[-1]["restarted"] = True
            state.count("turn_restarts")
        if gen is None:
            return None
        problem = _generation_problem(gen)
        if problem:
            state.metrics["infra_detail"] = f"engine: {problem}"
            state.finish("infra_error", "engine_error", infra=True)
            return None
        return gen

    async def _call_engine(self, state: EpisodeState, params: SamplingParams, session_id: str):
        """One engine call, recorded in `state.turns`; None (with the episode finished) when it raised."""
        t0 = time.monotonic()
        state.phase = "engine"
        record = {"params": asdict(params), "input_tokens": len(state.prompt_ids) + len(state.response_ids)}
        state.turns.append(record)
        try:
            gen = await self._generate(state.prompt_ids + state.response_ids, params, session_id)
        except PromptTooLongError as e:
            if state.num_turns == 0:  # the task's prompt alone does not fit: not the policy's doing
                state.metrics["infra_detail"] = f"prompt too long: {e}"
                state.finish("infra_error", "prompt_too_long", infra=True)
            else:
                state.finish("length", "context_window")
            return None
        except EngineError as e:
            state.metrics["infra_detail"] = f"engine: {e}"
            state.finish("infra_error", "engine_error", infra=True)
            return None
        finally:
            state.metrics["engine_s"] = state.metrics.get("engine_s", 0.0) + time.monotonic() - t0
        record.update(tokens=len(gen.token_ids), finish_reason=gen.finish_reason,
                      weight_version=gen.metrics.get("weight_version"))
        server = gen.metrics.get("server", gen.metrics.get("replica"))  # SGLang server URL / replica index
        if server is not None:
            record["server"] = server
        return gen

    async def _generate(self, ids: list[int], params: SamplingParams, session_id: str):
        if self._engine_takes_session:
            return await self.engine.generate(ids, params, session_id=session_id)
        return await self.engine.generate(ids, params)


def _generation_problem(gen: Generation) -> str | None:
    if _aborted_by_weight_update(gen):
        return (f"the turn was aborted by {MAX_TURN_RESTARTS + 1} weight updates in a row "
                "(rollout.on_weight_update: abort); use `continue`, or push weights less often")
    if gen.finish_reason == "abort":
        return "the request was aborted (engine shutting down, request cancelled or generation paused)"
    if not gen.token_ids:
        return f"no tokens returned (finish_reason {gen.finish_reason!r})"
    if len(gen.token_ids) != len(gen.logprobs):
        return f"{len(gen.token_ids)} token ids but {len(gen.logprobs)} logprobs"
    if gen.weight_versions and len(gen.weight_versions) != len(gen.token_ids):
        return f"{len(gen.token_ids)} token ids but {len(gen.weight_versions)} weight versions"
    return None


__all__ = ["EpisodeState", "MAX_TURN_RESTARTS", "ModelTurn", "PolicyTurns", "generation_eos_ids"]
