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
from dataclasses import dataclass, field

from agentrl.types import Generation, SamplingParams


def fake_logprob(token_id: int, position: int) -> float:
    return -((token_id * 31 + position * 7) % 997 + 1) / 1000.0


@dataclass
class Call:
    input_ids: list[int]
    params: SamplingParams
    session_id: str | None


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
        self.calls.append(Call(list(input_ids), params, session_id))
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

    async def update_weights(self, weights) -> None:
        return None
