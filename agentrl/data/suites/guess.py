"""`guess`: the number-guessing game (`agentrl.envs.guess_number`), a multi-turn task without tools.

A task is a range [low, high] and a secret in it; the environment answers each guess with "Higher." or
"Lower." and rewards the turns (see agentrl/envs/guess_number.py). The skill is halving the interval the
answers leave open: `max_guesses` is ceil(log2(size)) + 1, one more than binary search needs.

Splits differ in their ranges: low in 1-60 and 7-15 numbers per range for both, but a range (low, high)
belongs to exactly one split (about one range in four is held out), so held-out games ask for intervals and
midpoints never seen in training.
"""

from __future__ import annotations

import math

from agentrl.data.suites.common import heldout_only, split_rng, task_row, unique_rows
from agentrl.envs.guess_number import rules

NAME = "guess"
TOOLS: list[str] = []
SYSTEM = "You are playing a guessing game. Reply with one guess per turn as <answer>N</answer>."


def max_guesses(low: int, high: int) -> int:
    return math.ceil(math.log2(high - low + 1)) + 1


def make_tasks(split: str, n: int, seed: int = 0) -> list[dict]:
    """`n` distinct games of `split` ("train" | "heldout"), fully determined by the arguments."""
    rng = split_rng(NAME, split, seed)
    ranges = [(low, low + size - 1) for low in range(1, 61) for size in range(7, 16)
              if heldout_only(f"guess/{low}-{low + size - 1}") == (split == "heldout")]

    def one() -> dict:
        low, high = rng.choice(ranges)
        secret = rng.randint(low, high)
        guesses = max_guesses(low, high)
        row = task_row(NAME, split, system=SYSTEM, user=rules(low, high, guesses), tools=TOOLS,
                       reward={"type": "env"}, extra={"low": low, "high": high, "secret": secret})
        row["env"] = {"name": "guess_number", "kwargs": {"secret": secret, "low": low, "high": high,
                                                         "max_guesses": guesses}}
        row["task_id"] += f"-{secret}"  # one prompt per range: the secret tells its games apart
        return row

    return unique_rows(n, one, what=f"guess/{split}")


def binary_search(low: int, high: int, secret: int) -> list[int]:
    """The guesses the scripted solver makes: the midpoint (rounded down) of the interval still open."""
    guesses = []
    while True:
        guess = (low + high) // 2
        guesses.append(guess)
        if guess == secret:
            return guesses
        low, high = (guess + 1, high) if guess < secret else (low, guess - 1)


__all__ = ["NAME", "SYSTEM", "TOOLS", "binary_search", "make_tasks", "max_guesses"]
