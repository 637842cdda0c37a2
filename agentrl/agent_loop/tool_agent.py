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
import logging
import time
import uuid
from dataclasses import asdict

from agentrl.agent_loop.chat import ChatTemplate
from agentrl.agent_loop.config import AgentLoopConfig
from agentrl.agent_loop.parsers import make_parser
from agentrl.agent_loop.turns import MAX_TURN_RESTARTS, EpisodeState, PolicyTurns, generation_eos_ids
from agentrl.tools.truncate import truncate_text
from agentrl.types import Episode, SamplingParams, Task, ToolCall

log = logging.getLogger(__name__)

CALL_FORMAT_HINT = 'Write each call as <tool_call>\n{"name": "<tool name>", "arguments": {<arguments>}}\n</tool_call>.'


class ToolAgentLoop:
    """Runs episodes of one policy (engine + tokenizer) against one tool registry. The turns, their budgets and
    the token bookkeeping are `agentrl.agent_loop.turns.PolicyTurns`'; this class adds the tool calls."""

    def __init__(self, engine, tokenizer, tools, config: AgentLoopConfig):
        self.engine = engine
        self.tokenizer = tokenizer
        self.tools = tools  # a ToolRegistry, or None for tasks without tools
        self.config = config
        self.parser = make_parser(config.tool_parser)
        self.policy = PolicyTurns(engine, tokenizer, config)
        self.end_of_turn_id = self.policy.end_of_turn_id
        self.stop_token_ids = self.policy.stop_token_ids
        self._templates: dict[tuple[str, ...] | None, ChatTemplate] = {}
        problem = ChatTemplate(tokenizer, None).boundary_problem()
        if problem:
            log.warning("chat template / tokenizer boundary effect: %s", problem)

    @property
    def max_model_len(self) -> int | None:
        """The context window the turns are budgeted against (settable, e.g. by tests)."""
        return self.policy.max_model_len

    @max_model_len.setter
    def max_model_len(self, value: int | None) -> None:
        self.policy.max_model_len = value

    # --- public ---

    async def run(self, task: Task, *, sampling: SamplingParams | None = None, uid: str = "",
                  session_id: str | None = None) -> Episode:
        """Roll out `task` once. `sampling` supplies temperature/top_p/top_k/seed (max_new_tokens and stop ids
        are set per turn); `uid` is the group id; `session_id` routes every turn to one engine server."""
        sampling = self.policy.seeded(sampling)
        session_id = session_id or uuid.uuid4().hex
        if self.tools is not None:
            await self.tools.start()
        template = self._template(task.tools)
        state = EpisodeState(prompt_ids=template.prompt_ids(task.prompt), messages=[dict(m) for m in task.prompt])
        state.metrics.update(engine_s=0.0, tool_s=0.0, tool_calls=0, tool_errors=0)

        async def body() -> None:
            async with self._session(task) as tool_session:
                await self._loop(task, template, state, sampling, tool_session, session_id)

        await self.policy.run_timed(state, body)
        return self.policy.episode(state, task, uid=uid, episode_id=session_id,
                                   replay=self._replay_record(task, template, sampling, state))

    def _replay_record(self, task: Task, template: ChatTemplate, sampling: SamplingParams,
                       state: EpisodeState) -> dict:
        """Episode.replay: what re-running this episode needs besides its turns and tool responses."""
        return {"engine": self.policy.engine_record(state),
                "sampling": asdict(sampling), "tools": task.tools, "tool_schemas": template.tools,
                "tools_kwargs": task.tools_kwargs, "prompt_messages": len(task.prompt),
                "agent": self.config.model_dump()}

    # --- the loop ---

    async def _loop(self, task: Task, template: ChatTemplate, state: EpisodeState, sampling: SamplingParams,
                    tool_session: str | None, session_id: str) -> None:
        cfg = self.config
        allowed = self._allowed_names(task)
        while True:
            turn = await self.policy.next_turn(state, sampling, session_id)
            if turn is None:
                return  # finished by PolicyTurns: budget, engine fault, or a turn the transcript cannot follow
            text = turn.text
            parsed = self.parser.parse(text)
            for i, call in enumerate(parsed.calls):
                call.call_id = f"call_{turn.index}_{i}"  # unique within the episode
            state.messages.append(self._assistant_message(template, state, parsed, text, turn.token_ids[:-1]))
            if not parsed.calls:
                state.finish("stop", "final_answer")
                return
            if state.num_turns >= cfg.max_assistant_turns:
                state.finish("max_turns", "max_assistant_turns")
                return
            t0 = time.monotonic()
            state.phase = "tools"
            try:
                observations = await self._run_calls(parsed.calls, allowed, tool_session, turn.index, state)
            finally:  # also when the episode timeout cancels the calls
                state.metrics["tool_s"] += time.monotonic() - t0
            if observations is None:
                return  # infra error, recorded by _run_calls
            delta = template.delta_ids(state.messages, observations)
            state.count(f"template_{delta.mode}")
            if not self.policy.fits(state, len(delta.ids)):
                state.finish("length", "observation_overflow")
                return
            state.messages.extend(observations)
            state.add_glue(delta.ids)

    def _assistant_message(self, template: ChatTemplate, state: EpisodeState, parsed, text: str,
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

    # --- tools ---

    async def _run_calls(self, calls: list[ToolCall], allowed: list[str], tool_session: str | None, turn: int,
                         state: EpisodeState) -> list[dict] | None:
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


__all__ = ["CALL_FORMAT_HINT", "MAX_TURN_RESTARTS", "ToolAgentLoop", "generation_eos_ids"]
