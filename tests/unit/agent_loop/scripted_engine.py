"""A scripted Engine for agent-loop tests: fixed model turns, fake but token-specific logprobs.

Each episode (engine `session_id`) walks its own copy of the script. A turn is:
- a str: encoded with the tokenizer (no special tokens) and followed by the end-of-turn id (finish "stop");
  cut to `params.max_new_tokens` (finish "length") when longer;
- a `Generation`: returned as is;
- an exception instance: raised;
- a callable(input_ids, params) -> one of the above.
`fake_logprob(token_id, position)` is what every returned logprob is, so tests can check that logprobs line up
with the tokens they belong to.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

from agentrl.tools import ToolError, ToolInfraError
from agentrl.types import Generation, SamplingParams


def fake_logprob(token_id: int, position: int) -> float:
    return -((token_id * 31 + position * 7) % 997 + 1) / 1000.0


@dataclass
class Call:
    input_ids: list[int]
    params: SamplingParams
    session_id: str | None
    output: Generation | None = None  # set when the call returned


@dataclass
class ScriptedEngine:
    tokenizer: object
    script: list
    end_of_turn: str = "<|im_end|>"
    delay_s: float = 0.0
    calls: list[Call] = field(default_factory=list)
    _cursor: dict = field(default_factory=dict)

    @property
    def end_of_turn_id(self) -> int:
        return self.tokenizer.convert_tokens_to_ids(self.end_of_turn)

    async def generate(self, input_ids: list[int], params: SamplingParams, *,
                       session_id: str | None = None) -> Generation:
        call = Call(list(input_ids), params, session_id)
        self.calls.append(call)
        call.output = await self._respond(input_ids, params, session_id)
        return call.output

    async def _respond(self, input_ids: list[int], params: SamplingParams, session_id: str | None) -> Generation:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        k = self._cursor.get(session_id, 0)
        self._cursor[session_id] = k + 1
        if k >= len(self.script):
            raise AssertionError(f"scripted engine ran out of turns (session {session_id}, turn {k})")
        turn = self.script[k]
        if callable(turn) and not isinstance(turn, (str, Generation, BaseException)):
            turn = turn(input_ids, params)
        if isinstance(turn, BaseException):
            raise turn
        if isinstance(turn, Generation):
            return turn
        ids = list(self.tokenizer.encode(turn, add_special_tokens=False)) + [self.end_of_turn_id]
        reason = "stop"
        if len(ids) > params.max_new_tokens:
            ids, reason = ids[:params.max_new_tokens], "length"
        start = len(input_ids)
        return Generation(token_ids=ids, logprobs=[fake_logprob(t, start + i) for i, t in enumerate(ids)],
                          finish_reason=reason)

    async def update_weights(self, weights, *, version: int | None = None) -> None:
        return None


# --- canonical model turns and test tools ---

def tool_call(name: str, arguments: dict) -> str:
    """One call block as the Qwen2.5 template renders it (the canonical form a trained model emits)."""
    return "\n<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + "\n</tool_call>"


def model_turn(content: str, calls: list[tuple[str, dict]] = ()) -> str:
    """A model turn in template-canonical form: content, then the call blocks (no leading "\\n" if no content)."""
    text = content + "".join(tool_call(n, a) for n, a in calls)
    return text[1:] if not content and calls else text


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b


def echo(text: str) -> str:
    """Return the text unchanged.

    Args:
        text: Any text.
    """
    return text


def repeat(text: str, times: int) -> str:
    """Repeat a text.

    Args:
        text: The text.
        times: How many times.
    """
    return " ".join(f"{i}:{text}" for i in range(times))


def lookup(entity: str) -> str:
    """Look up an entity.

    Args:
        entity: The entity name.
    """
    raise ToolError(f"no entity named {entity!r}")


def broken_service(query: str) -> str:
    """A tool whose backing service is down.

    Args:
        query: Anything.
    """
    raise ToolInfraError("database unreachable", kind="unreachable")


async def slow(seconds: float) -> str:
    """Sleep, then answer.

    Args:
        seconds: How long to sleep.
    """
    await asyncio.sleep(seconds)
    return "done"


class Rendezvous:
    """A tool that answers only once `parties` calls are in flight at the same time (proves concurrency)."""

    def __init__(self, parties: int):
        self.parties = parties
        self.arrived = 0
        self.event = asyncio.Event()

    def make(self):
        async def meet(tag: str) -> str:
            """Wait for the other calls of the turn.

            Args:
                tag: A label.
            """
            self.arrived += 1
            if self.arrived >= self.parties:
                self.event.set()
            try:
                await asyncio.wait_for(self.event.wait(), timeout=5.0)
            except TimeoutError:
                return f"{tag}: alone"
            return f"{tag}: met"

        return meet
