"""`guess_number`: a multi-turn text game with no tools. The model guesses a secret integer; the game answers
"Higher" or "Lower" with the interval still open ("Higher: from 9 to 12. 3 left.") until the guess is right or
the guesses run out.

Task row: {"env": {"name": "guess_number", "kwargs": {"secret": 5, "low": 1, "high": 8, "max_guesses": 4}},
"prompt": [...]} (`agentrl data make guess`); without a prompt, reset() writes the rules as the user message.

Rewards per turn (`Episode.turn_rewards`): 1.0 for the right guess (the episode ends); `inconsistent_penalty`
(default -0.1) for a guess the earlier answers already ruled out, or a message without a number; 0.0 for any
other wrong guess. The guess is the last integer in the message (`<answer>5</answer>`, "5" and "I guess 5" all
read 5). Running out of guesses ends the episode with reward 0.0 for that turn.
"""

from __future__ import annotations

import re

from agentrl.envs.base import StepResult
from agentrl.types import Task

_NUMBER = re.compile(r"-?\d+")


def rules(low: int, high: int, max_guesses: int) -> str:
    """The user message that opens a game (also what `agentrl data make guess` writes as the prompt)."""
    return (f"I picked a whole number from {low} to {high}. Guess it: answer with one number, like "
            f"<answer>{(low + high) // 2}</answer>. I will say Higher or Lower. You have {max_guesses} guesses.")


class GuessNumberEnv:
    """One game per instance; the interval still possible narrows with every answer."""

    def __init__(self, secret: int, low: int = 1, high: int = 8, max_guesses: int = 4,
                 inconsistent_penalty: float = -0.1):
        if not low <= secret <= high:
            raise ValueError(f"guess_number: secret {secret} is outside [{low}, {high}]")
        if max_guesses < 1:
            raise ValueError(f"guess_number: max_guesses must be >= 1, got {max_guesses}")
        self.secret, self.low, self.high, self.max_guesses = secret, low, high, max_guesses
        self.inconsistent_penalty = inconsistent_penalty
        self.possible = (low, high)  # the interval the answers so far leave open
        self.guesses: list[int | None] = []

    async def reset(self, task: Task) -> list[dict]:
        if task.prompt:
            return [dict(m) for m in task.prompt]
        return [{"role": "user", "content": rules(self.low, self.high, self.max_guesses)}]

    async def step(self, message: dict) -> StepResult:
        numbers = _NUMBER.findall(message.get("content") or "")
        guess = int(numbers[-1]) if numbers else None
        self.guesses.append(guess)
        info = {"guess": guess, "possible": list(self.possible)}
        if guess == self.secret:
            return StepResult([], 1.0, True, {**info, "solved": True})
        lo, hi = self.possible
        reward = 0.0 if guess is not None and lo <= guess <= hi else self.inconsistent_penalty
        if guess is not None:
            self.possible = (max(lo, guess + 1), hi) if guess < self.secret else (lo, min(hi, guess - 1))
        left = self.max_guesses - len(self.guesses)
        if left <= 0:
            return StepResult([{"role": "user", "content": f"Out of guesses. It was {self.secret}."}], reward, True,
                              {**info, "solved": False})
        lo, hi = self.possible
        if guess is None:
            text = f"Answer with one number from {lo} to {hi}."
        else:
            text = f"{'Higher' if guess < self.secret else 'Lower'}: from {lo} to {hi}."
        return StepResult([{"role": "user", "content": f"{text} {left} left."}], reward, False, info)

    async def close(self) -> None:
        return None


__all__ = ["GuessNumberEnv", "rules"]
