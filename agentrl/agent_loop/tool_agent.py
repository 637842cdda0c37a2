"""`ToolAgentLoop`: one multi-turn tool-using episode, token in / token out.

One growing id list per episode. Model turns are appended exactly as sampled (mask 1, the engine's logprobs,
`turn_ids` = the turn index, `response_versions` = the weight version that sampled each token); everything between
turns comes from the chat template (`chat.ChatTemplate`) with mask 0, logprob 0.0, turn id -1 and version -1.
Text the model produced is decoded only to find its tool calls and to fill the transcript (`Episode.messages`);
it is never re-tokenized.

Stop conditions (`Episode.finish_reason`, with the precise cause in `metrics["stop_detail"]`):
- "stop": a turn without tool calls (final answer), or a turn ended by an eos id other than the template's
  end-of-turn token (its calls do not run);
- "max_turns": `max_assistant_turns` turns were sampled; the last turn's calls do not run;
- "length": the turn hit `max_new_tokens_per_turn` ("turn_length", its calls do not run), the response budget
  `max_response_tokens` ("response_budget"), the context window ("context_window"), or the next observation
  would overflow either ("observation_overflow": the episode stops before appending it);
- "timeout": the episode ran past `episode_timeout_s`; `infra_error` is `timeout_is_infra_error` (default True);
- "infra_error": an engine fault (EngineError, aborted request: a turn aborted by a weight update is resampled
  from the same context instead, up to `MAX_TURN_RESTARTS` times, counted as `turn_restarts`), a prompt that
  does not fit the context window, or a tool infrastructure fault (ToolResult.infra_error: service unreachable
  after the registry's retries, timeout, 5xx, sandbox down). The episode ends at once and is dropped from training.
Policy mistakes (malformed JSON, unknown tool, bad arguments, a tool that raised, more calls than
`max_parallel_calls`) become error observations the model reads, and are counted in the metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import random
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from agentrl.agent_loop.chat import ChatTemplate
from agentrl.agent_loop.config import AgentLoopConfig
from agentrl.agent_loop.parsers import make_parser
from agentrl.agent_loop.versions import sampled_versions
from agentrl.inference.base import EngineError, PromptTooLongError
from agentrl.tools.truncate import truncate_text
from agentrl.types import Episode, Generation, SamplingParams, Task, ToolCall

log = logging.getLogger(__name__)

MAX_TURN_RESTARTS = 3  # a turn aborted by more weight updates in a row than this makes the episode an infra error
CALL_FORMAT_HINT = 'Write each call as <tool_call>\n{"name": "<tool name>", "arguments": {<arguments>}}\n</tool_call>.'


@dataclass
class _State:
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
    num_turns: int = 0
    finish_reason: str = ""
    infra_error: bool = False
    metrics: dict = field(default_factory=dict)
    phase: str = "start"  # what the episode is waiting for: "engine" or "tools" (reported on a timeout)

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


def _aborted_by_weight_update(gen: Generation) -> bool:
    return gen.finish_reason == "abort" and gen.metrics.get("aborted_by") == "weight_update"


def generation_eos_ids(tokenizer) -> list[int]:
    """eos ids from generation_config.json next to the tokenizer files (the model's own stop ids), if any."""
    path = Path(str(getattr(tokenizer, "name_or_path", "") or "")) / "generation_config.json"
    if not path.is_file():
        return []
    eos = json.loads(path.read_text()).get("eos_token_id")
    return [eos] if isinstance(eos, int) else [int(i) for i in (eos or [])]


class ToolAgentLoop:
    """Runs episodes of one policy (engine + tokenizer) against one tool registry."""

    def __init__(self, engine, tokenizer, tools, config: AgentLoopConfig):
        self.engine = engine
        self.tokenizer = tokenizer
        self.tools = tools  # a ToolRegistry, or None for tasks without tools
        self.config = config
        self.parser = make_parser(config.tool_parser)
        self.max_model_len = config.max_model_len or getattr(engine, "max_model_len", None)
        self._engine_takes_session = "session_id" in inspect.signature(engine.generate).parameters
        self._templates: dict[tuple[str, ...] | None, ChatTemplate] = {}
        probe = ChatTemplate(tokenizer, None)
        self.end_of_turn_id = probe.end_of_turn_id
        problem = probe.boundary_problem()
        if problem:
            log.warning("chat template / tokenizer boundary effect: %s", problem)
        eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
        self.stop_token_ids = list(dict.fromkeys([self.end_of_turn_id, *eos, *generation_eos_ids(tokenizer)]))

    # --- public ---

    async def run(self, task: Task, *, sampling: SamplingParams | None = None, uid: str = "",
                  session_id: str | None = None) -> Episode:
        """Roll out `task` once. `sampling` supplies temperature/top_p/top_k/seed (max_new_tokens and stop ids
        are set per turn); `uid` is the group id; `session_id` routes every turn to one engine server."""
        sampling = sampling or SamplingParams(max_new_tokens=1)
        if sampling.seed is None and sampling.temperature > 0:
            # an unseeded episode still draws from a recorded seed, so `agentrl replay` can repeat it
            sampling = SamplingParams(**{**asdict(sampling), "seed": random.SystemRandom().randrange(2**31)})
        session_id = session_id or uuid.uuid4().hex
        started = time.monotonic()
        if self.tools is not None:
            await self.tools.start()
        template = self._template(task.tools)
        state = _State(prompt_ids=template.prompt_ids(task.prompt), messages=[dict(m) for m in task.prompt])
        state.metrics.update(engine_s=0.0, tool_s=0.0, tool_calls=0, tool_errors=0)
        timeout = asyncio.timeout(self.config.episode_timeout_s)
        try:
            async with timeout:
                async with self._session(task) as tool_session:
                    await self._loop(task, template, state, sampling, tool_session, session_id)
        except TimeoutError:
            if not timeout.expired():
                raise
            state.finish("timeout", "episode_timeout", infra=self.config.timeout_is_infra_error)
            state.metrics["timeout_phase"] = state.phase
        state.metrics["wall_s"] = time.monotonic() - started
        state.metrics["response_tokens"] = len(state.response_ids)
        state.metrics["policy_tokens"] = sum(state.mask)
        return Episode(
            uid=uid, prompt_ids=state.prompt_ids, response_ids=state.response_ids, response_mask=state.mask,
            response_logprobs=state.logprobs, messages=state.messages, finish_reason=state.finish_reason,
            num_turns=state.num_turns, tool_calls=state.tool_calls, infra_error=state.infra_error,
            metrics=state.metrics, task_id=task.task_id, data_source=task.data_source, turn_ids=state.turn_ids,
            response_versions=state.response_versions(), episode_id=session_id, turns=state.turns,
            replay=self._replay_record(task, template, sampling, state),
        )

    def _replay_record(self, task: Task, template: ChatTemplate, sampling: SamplingParams, state: _State) -> dict:
        """Episode.replay: what re-running this episode needs besides its turns and tool responses."""
        model = getattr(self.engine, "model_path", None) or getattr(getattr(self.engine, "model", None),
                                                                      "name_or_path", None)
        versions = [t["weight_version"] for t in state.turns if t.get("weight_version") is not None]
        if model is not None and Path(model).exists():  # a local directory: absolute, so `agentrl replay` finds it
            model = Path(model).resolve()  # from any directory; a Hugging Face id stays as it is
        return {"engine": {"class": type(self.engine).__name__, "model": None if model is None else str(model),
                           "weight_version": versions[-1] if versions else None,
                           "max_model_len": self.max_model_len},
                "sampling": asdict(sampling), "tools": task.tools, "tool_schemas": template.tools,
                "tools_kwargs": task.tools_kwargs, "prompt_messages": len(task.prompt),
                "agent": self.config.model_dump()}

    # --- the loop ---

    async def _loop(self, task: Task, template: ChatTemplate, state: _State, sampling: SamplingParams,
                    tool_session: str | None, session_id: str) -> None:
        cfg = self.config
        allowed = self._allowed_names(task)
        while True:
            budget, cause = self._turn_budget(state)
            if budget < 1:
                if cause == "context_window" and state.num_turns == 0:  # the task's prompt alone fills the window
                    state.metrics["infra_detail"] = (f"prompt of {len(state.prompt_ids)} tokens does not fit "
                                                     f"max_model_len {self.max_model_len}")
                    state.finish("infra_error", "prompt_too_long", infra=True)
                else:
                    state.finish("length", cause)
                return
            params = SamplingParams(
                max_new_tokens=budget, temperature=sampling.temperature, top_p=sampling.top_p,
                top_k=sampling.top_k, stop_token_ids=self.stop_token_ids,
                seed=None if sampling.seed is None else (sampling.seed * 1_000_003 + state.num_turns) % 2**31)
            gen = await self._sample(state, params, session_id)
            if gen is None:
                return  # engine failure, recorded by _sample
            turn = state.num_turns
            state.add_model_turn(gen, turn)
            state.num_turns += 1
            last = gen.token_ids[-1]
            text = self.tokenizer.decode(gen.token_ids[:-1] if last in self.stop_token_ids else gen.token_ids,
                                         skip_special_tokens=False)
            if last != self.end_of_turn_id:  # no end-of-turn: the transcript cannot continue after this turn
                state.messages.append({"role": "assistant", "content": text})
                if last in self.stop_token_ids:
                    state.finish("stop", "eos")
                elif gen.finish_reason == "length":
                    state.finish("length", cause)
                else:
                    state.finish("stop", "stop_string")
                return
            parsed = self.parser.parse(text)
            for i, call in enumerate(parsed.calls):
                call.call_id = f"call_{turn}_{i}"  # unique within the episode
            state.messages.append(self._assistant_message(template, state, parsed, text, gen.token_ids[:-1]))
            if not parsed.calls:
                state.finish("stop", "final_answer")
                return
            if state.num_turns >= cfg.max_assistant_turns:
                state.finish("max_turns", "max_assistant_turns")
                return
            t0 = time.monotonic()
            state.phase = "tools"
            try:
                observations = await self._run_calls(parsed.calls, allowed, tool_session, turn, state)
            finally:  # also when the episode timeout cancels the calls
                state.metrics["tool_s"] += time.monotonic() - t0
            if observations is None:
                return  # infra error, recorded by _run_calls
            delta = template.delta_ids(state.messages, observations)
            state.count(f"template_{delta.mode}")
            if not self._fits(state, len(delta.ids)):
                state.finish("length", "observation_overflow")
                return
            state.messages.extend(observations)
            state.add_glue(delta.ids)

    def _assistant_message(self, template: ChatTemplate, state: _State, parsed, text: str,
                           sampled_ids: list[int]) -> dict:
        """The transcript message of a turn that ended with the end-of-turn token, written so that the template
        renders it back to the sampled text.

        Well-formed calls become OpenAI `tool_calls`, which the template re-renders in its own canonical form
        (e.g. Qwen2.5: `\\n<tool_call>\\n{"name": ..., "arguments": <json>}\\n</tool_call>`). When the model wrote a
        call the template would render differently (other whitespace, key order or JSON spacing), the calls still
        run, but the message keeps the turn's text verbatim as `content` without `tool_calls`, as it does for
        malformed blocks: the transcript then renders to exactly the sampled text (counted as
        `noncanonical_call_turns`). A turn whose ids are not the tokenizer's own encoding of its text cannot be
        reproduced by any transcript; it is counted as `noncanonical_token_turns`."""
        good = [c for c in parsed.calls if c.error is None]
        message: dict = {"role": "assistant", "content": parsed.content}
        if good:
            message["tool_calls"] = [{"id": c.call_id, "type": "function",
                                      "function": {"name": c.name, "arguments": c.arguments}} for c in good]
            if template.assistant_text(state.messages, message) != text:
                message = {"role": "assistant", "content": text}
                state.count("noncanonical_call_turns")
        if template.encode(text) != list(sampled_ids):
            state.count("noncanonical_token_turns")
        return message

    def _turn_budget(self, state: _State) -> tuple[int, str]:
        """(tokens the next turn may sample, the limit that binds): per-turn cap, response budget, context."""
        limits = {"turn_length": self.config.max_new_tokens_per_turn,
                  "response_budget": self.config.max_response_tokens - len(state.response_ids)}
        if self.max_model_len is not None:
            limits["context_window"] = self.max_model_len - len(state.prompt_ids) - len(state.response_ids)
        cause = min(limits, key=limits.get)
        return limits[cause], cause

    def _fits(self, state: _State, n: int) -> bool:
        """Whether `n` more tokens fit the response budget and the context window."""
        if len(state.response_ids) + n > self.config.max_response_tokens:
            return False
        return self.max_model_len is None or len(state.prompt_ids) + len(state.response_ids) + n <= self.max_model_len

    async def _sample(self, state: _State, params: SamplingParams, session_id: str):
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
        problem = self._check_generation(gen)
        if problem:
            state.metrics["infra_detail"] = f"engine: {problem}"
            state.finish("infra_error", "engine_error", infra=True)
            return None
        return gen

    async def _call_engine(self, state: _State, params: SamplingParams, session_id: str):
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
            state.metrics["engine_s"] += time.monotonic() - t0
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

    def _check_generation(self, gen) -> str | None:
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

    # --- tools ---

    async def _run_calls(self, calls: list[ToolCall], allowed: list[str], tool_session: str | None, turn: int,
                         state: _State) -> list[dict] | None:
        """Run one turn's calls; returns the tool messages in call order, or None after an infra error."""
        cfg = self.config
        records: list[dict] = []
        pending = []
        for i, call in enumerate(calls):
            record = {"turn": turn, "call_id": call.call_id, "name": call.name, "arguments": call.arguments,
                      "ok": False, "error_kind": None, "latency_s": 0.0, "truncated": False}
            if call.error is not None:
                record.update(error_kind="malformed_call", raw=call.raw[:2000],
                              content=f"Error: {call.error}. {CALL_FORMAT_HINT}")
            elif i >= cfg.max_parallel_calls:
                record.update(error_kind="too_many_calls",
                              content=f"Error: at most {cfg.max_parallel_calls} tool calls run per turn; the call "
                                      f"to '{call.name}' was not run. Call it again in your next turn.")
            elif call.name not in allowed:
                record.update(error_kind="unknown_tool",
                              content=f"Error: unknown tool '{call.name}'. Available tools: "
                                      f"{', '.join(allowed) or 'none'}.")
            else:
                pending.append((record, call))
            records.append(record)
        results = await asyncio.gather(*(self.tools.call(c.name, c.arguments, session=tool_session)
                                         for _, c in pending))
        for (record, _), result in zip(pending, results):
            record.update(ok=not result.is_error, error_kind=result.error_kind, latency_s=result.latency_s,
                          content=result.content,
                          response={"content": result.content, "is_error": result.is_error,
                                    "error_kind": result.error_kind, "metrics": result.metrics})
            if result.metrics:
                record["metrics"] = result.metrics
        state.count("tool_calls", len(records))
        for record in records:
            if record["error_kind"] is not None:
                state.count("tool_errors")
                state.count(f"tool_error_{record['error_kind']}")
        infra = next((r for (r, _), res in zip(pending, results) if res.infra_error), None)
        if infra is not None:
            state.metrics["infra_detail"] = f"tool {infra['name']}: {infra['error_kind']}: {infra['content'][:300]}"
            for record in records:
                record.pop("content")
            state.tool_calls += records
            state.finish("infra_error", "tool_infra_error", infra=True)
            return None
        messages = []
        for record in records:
            content, cut = truncate_text(record.pop("content"), max_tokens=cfg.max_tool_response_tokens,
                                         tokenizer=self.tokenizer, side=cfg.tool_truncate_side)
            record["truncated"] = cut
            if cut:
                state.count("truncated_observations")
            messages.append({"role": "tool", "tool_call_id": record["call_id"], "name": record["name"],
                             "content": content})
        state.tool_calls += records
        return messages

    def _allowed_names(self, task: Task) -> list[str]:
        if self.tools is None:
            return []
        names = self.tools.names()
        return names if task.tools is None else [n for n in task.tools if n in names]

    def _template(self, tool_names: list[str] | None) -> ChatTemplate:
        key = None if tool_names is None else tuple(tool_names)
        if key not in self._templates:
            schemas = None if self.tools is None else self.tools.schemas(tool_names)
            self._templates[key] = ChatTemplate(self.tokenizer, schemas)
        return self._templates[key]

    def _session(self, task: Task):
        if self.tools is None:
            return contextlib.nullcontext(None)
        return self.tools.episode_session(task.tools_kwargs or None)


__all__ = ["ToolAgentLoop", "generation_eos_ids", "CALL_FORMAT_HINT"]
