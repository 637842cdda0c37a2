"""The engine-bound episodes `agentrl bench replicas` runs (with and without `--kill`): random prompts, a fixed
observation after each turn, the model's vocabulary size."""

from __future__ import annotations

import json
import random
from pathlib import Path

OBSERVATION_TOKENS = 8  # tokens appended to an episode's context after each turn


def random_prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(10, vocab) for _ in range(length)] for _ in range(n)]


def observation(episode: int, turn: int, vocab: int) -> list[int]:
    """The `OBSERVATION_TOKENS` ids episode `episode` sees after turn `turn` (the same on every side)."""
    return [(episode * 7 + turn * 13 + k) % vocab for k in range(OBSERVATION_TOKENS)]


def vocab_size(path: Path) -> int:
    return int(json.loads((Path(path) / "config.json").read_text())["vocab_size"])


__all__ = ["OBSERVATION_TOKENS", "observation", "random_prompts", "vocab_size"]
