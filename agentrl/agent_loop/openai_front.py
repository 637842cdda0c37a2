"""An OpenAI-compatible front over a rollout engine that records every call token for token.

Any agent program written against the OpenAI chat API (the `openai` SDK, the OpenAI Agents SDK, verifiers) runs
unmodified with its `base_url` pointed here: `POST /v1/chat/completions` (messages, tools, tool_choice, n,
temperature, top_p, max_tokens / max_completion_tokens, stop, seed, logprobs) and `GET /v1/models`. Tool calls
are parsed from the model's text with the agent loop's parser (`agent.tool_parser`, Hermes `<tool_call>` blocks)
and returned as OpenAI `tool_calls` (finish_reason "tool_calls"); streaming is not supported.

Episode ids. The trainer gives each agent program a `base_url` of the form `{front}/episodes/{episode_id}/v1`; a
client may instead send the header `X-Agentrl-Episode` or the OpenAI `user` field. Every call is recorded
(`CallRecord`) under its episode id: the prompt ids the engine saw, the sampled ids, their logprobs and weight
versions. `GET /v1/episodes/{id}` returns an episode's records; the trainer takes them with `PolicyFront.take`.
The HTTP routes are in `openai_server`.

Prompt ids. The prompt is rendered with the chat template ToolAgentLoop uses (`chat.ChatTemplate`). When the
request's messages continue an earlier call of the same episode (that call's messages, then the assistant message
this front returned, then new messages), the prompt is that call's prompt ids + its sampled ids + the template's
ids for the new messages (`ChatTemplate.delta_ids`): what the model sampled is never re-tokenized. Otherwise
(the first call, or an agent that edited its history) the whole conversation is rendered; the trainer then splits
the episode there (`agent_loop.calls`).

Sampling. With `sampling` set (the trainer's rollout.temperature / top_p / top_k), the request's temperature and
top_p are ignored so the trainer's logprobs match the rollout's; `tool_choice` is accepted but only "none" changes
anything (the model's text is then not parsed for calls): the engine cannot force a call.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field

from agentrl.agent_loop.chat import ChatTemplate, canonical_tools
from agentrl.agent_loop.parsers import make_parser
from agentrl.agent_loop.tool_agent import generation_eos_ids
from agentrl.agent_loop.versions import sampled_versions
from agentrl.inference.base import EngineError, PromptTooLongError
from agentrl.types import SamplingParams

EPISODE_HEADER = "X-Agentrl-Episode"
_MESSAGE_KEYS = ("role", "content", "tool_calls", "tool_call_id", "name")


class RequestError(ValueError):
    """A request the front refuses (HTTP 400), with a message naming the field."""


@dataclass
class CallRecord:
    """One sampled completion (one choice of one request), token for token."""

    episode_id: str
    prompt_ids: list[int]
    completion_ids: list[int]  # as sampled, the stop token included
    logprobs: list[float]
    weight_versions: list[int]  # one per completion id; [] when the engine does not report versions
    finish_reason: str  # the engine's: "stop" | "length" | "abort"
    messages: list[dict]  # the request's messages as rendered (normalized)
    message: dict  # the assistant message returned to the agent (normalized form)
    rendered: str  # "continued": prompt = an earlier call's ids + new messages; "full": rendered from scratch
    ended_turn: bool  # the completion ended with the template's end-of-turn token
    index: int = 0  # order of the call within its episode
    created: float = field(default_factory=time.time)

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def _text(content, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") not in ("text", "input_text", "output_text"):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise RequestError(f"{where}: content part of type {kind!r} is not supported (text only)")
            parts.append(str(part.get("text", "")))
        return "".join(parts)
    raise RequestError(f"{where}: content must be a string, a list of text parts or null")


def _arguments(value):
    if isinstance(value, str):
        try:
            return json.loads(value) if value.strip() else {}
        except json.JSONDecodeError:
            return value  # kept as the agent sent it; the template renders the string
    return value


def normalize_messages(messages) -> list[dict]:
    """OpenAI chat messages in the form the chat template renders and ToolAgentLoop's transcripts use: content as
    a string (null -> ""), tool-call arguments as objects (JSON strings parsed), "developer" as "system", and only
    the keys the template reads."""
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise RequestError(f"messages[{i}] must be an object with a role")
        msg = {k: m[k] for k in _MESSAGE_KEYS if m.get(k) is not None}
        msg["role"] = "system" if m["role"] == "developer" else m["role"]
        msg["content"] = _text(m.get("content"), f"messages[{i}]")
        if m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                fn = c.get("function") or {}
                calls.append({"id": c.get("id", ""), "type": "function",
                              "function": {"name": fn.get("name", ""),
                                           "arguments": _arguments(fn.get("arguments"))}})
            msg["tool_calls"] = calls
        out.append(msg)
    return out


def _tools_key(tools: list[dict] | None) -> str:
    """Tool lists that render alike (same tools in any order, keys in any order) share a key."""
    return json.dumps(canonical_tools(tools), sort_keys=True)


@dataclass
class _Turn:
    """Where an episode can continue: the messages up to and including a returned assistant message, and the ids
    the model had seen and sampled through that message's end-of-turn token."""

    tools_key: str
    messages: list[dict]
    ids: list[int]


class PolicyFront:
    """Serves chat completions from `engine` and records them per episode. `sampling`: when set, its temperature,
    top_p and top_k replace the request's (training); `max_new_tokens`: cap on one completion."""

    MAX_EPISODES = 10_000  # episodes kept for `GET /v1/episodes/{id}` when nobody takes them (a standalone server)

    def __init__(self, engine, tokenizer, *, model_name: str = "agentrl-policy", tool_parser: str = "hermes",
                 sampling: SamplingParams | None = None, max_new_tokens: int = 1024,
                 max_model_len: int | None = None):
        self.engine = engine
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.parser = make_parser(tool_parser)
        self.sampling = sampling
        self.max_new_tokens = max_new_tokens
        self.max_model_len = max_model_len or getattr(engine, "max_model_len", None)
        self._templates: dict[str, ChatTemplate] = {}
        probe = self.template(None)
        self.end_of_turn_id = probe.end_of_turn_id
        eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
        self.stop_token_ids = list(dict.fromkeys([self.end_of_turn_id, *eos, *generation_eos_ids(tokenizer)]))
        self._calls: OrderedDict[str, list[CallRecord]] = OrderedDict()
        self._turns: dict[str, list[_Turn]] = {}
        self.errors: dict[str, str] = {}  # episode id -> the engine fault that answered one of its calls
        self._sampling: dict[str, SamplingParams] = {}  # per-episode sampling set by `open_episode`
        self._turn_limits: dict[str, int] = {}  # episode id -> requests it may make (`open_episode`'s max_turns)
        self._requests: dict[str, int] = {}  # episode id -> requests it made (n > 1 in one request is one turn)
        self.capped: set[str] = set()  # episodes refused a request past their turn limit

    def template(self, tools: list[dict] | None) -> ChatTemplate:
        key = _tools_key(tools)
        if key not in self._templates:
            self._templates[key] = ChatTemplate(self.tokenizer, tools)
        return self._templates[key]

    # --- records ---

    def calls(self, episode_id: str) -> list[CallRecord]:
        return list(self._calls.get(episode_id, []))

    def open_episode(self, episode_id: str, sampling: SamplingParams, max_turns: int | None = None) -> None:
        """Sample `episode_id`'s calls with `sampling`'s temperature, top_p and top_k whatever the requests ask;
        its seed (if any) gives call k the seed the agent loop gives turn k. `max_turns`: requests past that many
        are refused (a 400 naming the limit) and the episode is marked in `capped`."""
        self._sampling[episode_id] = sampling
        if max_turns is not None:
            self._turn_limits[episode_id] = max_turns

    def take(self, episode_id: str) -> tuple[list[CallRecord], str | None]:
        """Remove and return an episode's records and the engine fault that hit it (None: none)."""
        for per_episode in (self._turns, self._sampling, self._turn_limits, self._requests):
            per_episode.pop(episode_id, None)
        self.capped.discard(episode_id)
        return self._calls.pop(episode_id, []), self.errors.pop(episode_id, None)

    def _record(self, record: CallRecord) -> None:
        calls = self._calls.setdefault(record.episode_id, [])
        record.index = len(calls)
        calls.append(record)
        self._calls.move_to_end(record.episode_id)
        while len(self._calls) > self.MAX_EPISODES:
            old, _ = self._calls.popitem(last=False)
            self._turns.pop(old, None)

    # --- prompt ---

    def prompt_ids(self, episode_id: str, messages: list[dict], tools: list[dict] | None) -> tuple[list[int], str]:
        """(prompt ids, "continued" | "full"): continue the longest earlier turn the messages extend."""
        template = self.template(tools)
        key = _tools_key(tools)
        best = None
        for turn in self._turns.get(episode_id, []):
            n = len(turn.messages)
            if turn.tools_key == key and len(messages) > n and messages[:n] == turn.messages:
                if best is None or n > len(best.messages):
                    best = turn
        if best is not None:
            delta = template.delta_ids(best.messages, messages[len(best.messages):])
            return best.ids + delta.ids, "continued"
        return template.prompt_ids(messages), "full"

    # --- one request ---

    async def complete(self, body: dict, episode_id: str) -> dict:
        if body.get("stream"):
            raise RequestError("stream=true is not supported by agentrl's policy front; send stream=false")
        messages = normalize_messages(body.get("messages"))
        tools = body.get("tools") or None
        if tools is not None and not isinstance(tools, list):
            raise RequestError("tools must be a list of function tools")
        n = body.get("n") or 1
        if not isinstance(n, int) or n < 1:
            raise RequestError(f"n must be a positive integer, got {n!r}")
        limit = self._turn_limits.get(episode_id)
        if limit is not None and self._requests.get(episode_id, 0) >= limit:
            self.capped.add(episode_id)
            raise RequestError(f"episode {episode_id} has made its {limit} policy calls (agent.max_assistant_turns); "
                               "the episode ends here")
        self._requests[episode_id] = self._requests.get(episode_id, 0) + 1
        prompt, rendered = self.prompt_ids(episode_id, messages, tools)
        params = self._params(body, len(prompt), episode_id)
        parse_calls = body.get("tool_choice") != "none" and tools is not None
        gens = await asyncio.gather(*(self._generate(prompt, params, episode_id, i) for i in range(n)))
        choices = []
        for i, gen in enumerate(gens):
            choice, record = self._choice(i, gen, params, parse_calls, body.get("logprobs"))
            record.update(episode_id=episode_id, prompt_ids=prompt, messages=messages, rendered=rendered)
            call = CallRecord(**record)
            self._record(call)
            if call.ended_turn:
                self._turns.setdefault(episode_id, []).append(_Turn(
                    _tools_key(tools), [*messages, call.message], prompt + call.completion_ids))
            choices.append(choice)
        completion_tokens = sum(len(g.token_ids) for g in gens)
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                "model": self.model_name, "choices": choices,
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": completion_tokens,
                          "total_tokens": len(prompt) + completion_tokens}}

    def _params(self, body: dict, prompt_len: int, episode_id: str) -> SamplingParams:
        limit = body.get("max_completion_tokens") or body.get("max_tokens") or self.max_new_tokens
        if not isinstance(limit, int) or limit < 1:
            raise RequestError(f"max_tokens must be a positive integer, got {limit!r}")
        limit = min(limit, self.max_new_tokens)
        if self.max_model_len is not None:
            room = self.max_model_len - prompt_len
            if room < 1:
                raise PromptTooLongError(f"the prompt has {prompt_len} tokens but the context window is "
                                         f"{self.max_model_len}")
            limit = min(limit, room)
        stop = body.get("stop") or []
        stop = [stop] if isinstance(stop, str) else stop
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise RequestError("stop must be a string or a list of strings")
        seed = body.get("seed")
        s = self._sampling.get(episode_id, self.sampling)
        if s is not None:
            if episode_id in self._sampling and s.seed is not None:
                seed = (s.seed * 1_000_003 + len(self._calls.get(episode_id, []))) % 2**31
            return SamplingParams(max_new_tokens=limit, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                                  stop_token_ids=self.stop_token_ids, stop=stop,
                                  seed=s.seed if seed is None else seed)
        temperature = body.get("temperature")
        top_p = body.get("top_p")
        try:
            return SamplingParams(max_new_tokens=limit, temperature=1.0 if temperature is None else temperature,
                                  top_p=1.0 if top_p is None else top_p, stop_token_ids=self.stop_token_ids,
                                  stop=stop, seed=seed)
        except ValueError as e:
            raise RequestError(str(e).replace("SamplingParams.", "")) from None

    async def _generate(self, prompt: list[int], params: SamplingParams, episode_id: str, i: int):
        if params.seed is not None and i:  # the n choices of one request draw from different seeds
            params = SamplingParams(**{**params.__dict__, "seed": (params.seed * 1_000_003 + i) % 2**31})
        try:
            gen = await self.engine.generate(prompt, params, session_id=episode_id)
        except PromptTooLongError:
            raise
        except EngineError as e:
            self.errors[episode_id] = str(e)
            raise
        if gen.finish_reason == "abort" or not gen.token_ids or len(gen.logprobs) != len(gen.token_ids):
            self.errors[episode_id] = f"engine answered finish_reason {gen.finish_reason!r} with " \
                                      f"{len(gen.token_ids)} ids and {len(gen.logprobs)} logprobs"
            raise EngineError(self.errors[episode_id])
        return gen

    def _choice(self, index: int, gen, params: SamplingParams, parse_calls: bool, logprobs: bool) -> tuple[dict, dict]:
        ids = gen.token_ids
        last = ids[-1]
        stopped = last in self.stop_token_ids
        text = self.tokenizer.decode(ids[:-1] if stopped else ids, skip_special_tokens=False)
        for s in params.stop:  # an OpenAI answer leaves the stop string out
            if s in text:
                text = text[:text.find(s)]
        parsed = self.parser.parse(text) if parse_calls else None
        calls = [c for c in parsed.calls if c.error is None] if parsed is not None else []
        content = parsed.content if calls else text
        tool_calls = [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                       "function": {"name": c.name, "arguments": c.arguments}} for c in calls]
        message = {"role": "assistant", "content": content}
        if tool_calls:
            message["tool_calls"] = tool_calls
        finish = "length" if gen.finish_reason == "length" else ("tool_calls" if tool_calls else "stop")
        wire = {"role": "assistant", "content": content if content or not tool_calls else None}
        if tool_calls:
            wire["tool_calls"] = [{**c, "function": {"name": c["function"]["name"],
                                                     "arguments": json.dumps(c["function"]["arguments"])}}
                                  for c in tool_calls]
        choice = {"index": index, "message": wire, "finish_reason": finish, "logprobs": None}
        if logprobs:
            choice["logprobs"] = {"content": [
                {"token": self.tokenizer.decode([t], skip_special_tokens=False), "logprob": float(lp),
                 "bytes": None, "top_logprobs": []} for t, lp in zip(ids, gen.logprobs)]}
        versions = sampled_versions(gen) or []
        record = dict(completion_ids=list(ids), logprobs=[float(x) for x in gen.logprobs], weight_versions=versions,
                      finish_reason=gen.finish_reason, message=message, ended_turn=last == self.end_of_turn_id)
        return choice, record


__all__ = ["CallRecord", "EPISODE_HEADER", "PolicyFront", "RequestError", "normalize_messages"]
