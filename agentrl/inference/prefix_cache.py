"""Per-session KV reuse for multi-turn episodes in the local engine.

An agent turn's prompt is the previous turn's prompt + its output + the tool observation, so the KV cache of
the previous turn covers almost all of it. When a request with a `session_id` finishes, its row's KV (prompt +
output except the last sampled token) is kept here; the session's next request prefills only the new suffix.
Bounded by `max_tokens` cached tokens (least recently used sessions go first); cleared on weight updates so a
new request never starts from KV computed with old weights.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [1, kv_heads, n, head_dim]


@dataclass
class _Entry:
    ids: list[int]
    kv: KV


class SessionPrefixCache:
    def __init__(self, max_tokens: int, min_reuse_tokens: int = 8):
        self.max_tokens = max_tokens
        self.min_reuse_tokens = min_reuse_tokens
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self.tokens = 0
        self.hits = 0
        self.reused_tokens = 0

    def put(self, session_id: str, ids: list[int], kv: KV) -> None:
        """Remember the KV of `ids` for `session_id` (replacing an older entry of the session)."""
        self._drop(session_id)
        if not ids or len(ids) > self.max_tokens:
            return
        self._entries[session_id] = _Entry(ids, kv)
        self.tokens += len(ids)
        while self.tokens > self.max_tokens:
            self._drop(next(iter(self._entries)))

    def take(self, session_id: str, prompt: list[int]) -> tuple[int, KV] | None:
        """Remove the session's entry; return (m, KV of prompt[:m]) for the longest usable shared prefix.

        m < len(prompt) always (the last prompt token must be run to get the next token's logits).
        """
        entry = self._entries.get(session_id)
        if entry is None:
            return None
        self._drop(session_id)
        limit = min(len(entry.ids), len(prompt) - 1)
        if entry.ids[:limit] == prompt[:limit]:
            m = limit
        else:
            m = next(i for i in range(limit) if entry.ids[i] != prompt[i])
        if m < self.min_reuse_tokens:
            return None
        self.hits += 1
        self.reused_tokens += m
        return m, [(k[:, :, :m], v[:, :, :m]) for k, v in entry.kv]

    def clear(self) -> None:
        self._entries.clear()
        self.tokens = 0

    def _drop(self, session_id: str) -> None:
        entry = self._entries.pop(session_id, None)
        if entry is not None:
            self.tokens -= len(entry.ids)

    def __len__(self) -> int:
        return len(self._entries)


__all__ = ["SessionPrefixCache"]
