"""A reward with variance for a random tiny model: the parity of the first sampled token (tests only)."""

from __future__ import annotations


def first_token_parity(task, episode, config) -> float:
    return float(episode.response_ids[0] % 2) if episode.response_ids else 0.0
