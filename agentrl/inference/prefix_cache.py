"""KV reuse across requests of the local engine: per session (an episode's turns) and across prompts.

`SessionPrefixCache`: an agent turn's prompt is the previous turn's prompt + its output + the tool observation,
so the KV cache of the previous turn covers almost all of it. When a request with a `session_id` finishes, its
row's KV (prompt + output except the last sampled token) is kept here; the session's next request prefills only
the new suffix.

`SharedPrefixCache`: first-turn prompts share long prefixes: the n samples of a GRPO group are one prompt, and
every task of a suite starts with the same system prompt and tool schemas (about 200 of the quickstart's
250 prompt tokens). The KV of each prefilled prompt is kept, indexed by a hash chain over `block`-token blocks
(as vLLM's prefix caching), and a new prompt starts from the longest prefix it shares with one kept prompt.

Both are bounded by `max_tokens` cached tokens (least recently used entries go first) and cleared on weight
updates, so a request never starts from KV computed with old weights.
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

    def match(self, session_id: str | None, prompt: list[int]) -> int:
        """How many tokens of `prompt` `take` would reuse (0: none); the entry stays."""
        entry = self._entries.get(session_id) if session_id else None
        if entry is None:
            return 0
        m = _common_prefix(entry.ids, prompt, min(len(entry.ids), len(prompt) - 1))
        return m if m >= self.min_reuse_tokens else 0

    def take(self, session_id: str, prompt: list[int]) -> tuple[int, KV] | None:
        """Remove the session's entry; return (m, KV of prompt[:m]) for the longest usable shared prefix.

        m < len(prompt) always (the last prompt token must be run to get the next token's logits).
        """
        entry = self._entries.get(session_id)
        if entry is None:
            return None
        self._drop(session_id)
        m = _common_prefix(entry.ids, prompt, min(len(entry.ids), len(prompt) - 1))
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


class SharedPrefixCache:
    """KV of recently prefilled prompts; `lookup` finds the longest prefix a new prompt shares with one of them.

    Index: for every kept prompt, the hash chain h_k = hash((h_{k-1}, ids[block*(k-1):block*k])) of each full
    block maps to the prompt that last wrote it. A lookup walks the new prompt's chain to its deepest hit, checks
    the tokens (a hash collision is a miss, never wrong KV) and extends the match token by token past the block.
    """

    def __init__(self, max_tokens: int, block: int = 16):
        self.max_tokens = max_tokens
        self.block = block
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._index: dict[int, int] = {}  # block-chain hash -> entry key
        self._keys: dict[int, list[int]] = {}  # entry key -> its block-chain hashes
        self._next = 0
        self.tokens = 0
        self.hits = 0
        self.reused_tokens = 0

    def _chain(self, ids: list[int], limit: int) -> list[int]:
        hashes, h = [], 0
        for start in range(0, limit - self.block + 1, self.block):
            h = hash((h, tuple(ids[start:start + self.block])))
            hashes.append(h)
        return hashes

    def put(self, ids: list[int], kv: KV) -> None:
        """Keep the KV of prompt `ids` (per layer [1, kv_heads, len(ids), head_dim]; the caller's copy)."""
        if len(ids) < self.block or len(ids) > self.max_tokens:
            return
        key, self._next = self._next, self._next + 1
        self._entries[key] = _Entry(list(ids), kv)
        self._keys[key] = self._chain(ids, len(ids))
        for h in self._keys[key]:
            self._index[h] = key
        self.tokens += len(ids)
        while self.tokens > self.max_tokens:
            self._drop(next(iter(self._entries)))

    def match(self, prompt: list[int]) -> int:
        """How many tokens of `prompt` `lookup` would reuse (0: none); nothing changes."""
        found = self._find(prompt)
        return 0 if found is None else found[1]

    def lookup(self, prompt: list[int]) -> tuple[int, KV] | None:
        """(m, KV of prompt[:m]) for the longest prefix shared with one kept prompt, m < len(prompt); or None."""
        found = self._find(prompt)
        if found is None:
            return None
        key, m = found
        self._entries.move_to_end(key)
        for h in self._keys[key][:m // self.block]:  # the entry just used owns its blocks (it is evicted last)
            self._index[h] = key
        self.hits += 1
        self.reused_tokens += m
        return m, [(k[:, :, :m], v[:, :, :m]) for k, v in self._entries[key].kv]

    def _find(self, prompt: list[int]) -> tuple[int, int] | None:
        limit = len(prompt) - 1  # the last prompt token must be run to get the next token's logits
        found = None
        for depth, h in enumerate(self._chain(prompt, limit), start=1):
            key = self._index.get(h)
            if key is None:
                break
            found = (key, depth * self.block)
        if found is None:
            return None
        key, m = found
        entry = self._entries[key]
        if entry.ids[:m] != prompt[:m]:
            return None  # a hash collision
        return key, _common_prefix(entry.ids, prompt, min(len(entry.ids), limit), start=m)

    def clear(self) -> None:
        self._entries.clear()
        self._index.clear()
        self._keys.clear()
        self.tokens = 0

    def _drop(self, key: int) -> None:
        entry = self._entries.pop(key)
        self.tokens -= len(entry.ids)
        for h in self._keys.pop(key):
            if self._index.get(h) == key:
                del self._index[h]

    def __len__(self) -> int:
        return len(self._entries)


def _common_prefix(a: list[int], b: list[int], limit: int, start: int = 0) -> int:
    """Length of the common prefix of a and b, at most `limit`, given that the first `start` ids agree."""
    if a[start:limit] == b[start:limit]:
        return max(limit, start)
    return next(i for i in range(start, limit) if a[i] != b[i])


__all__ = ["SessionPrefixCache", "SharedPrefixCache"]
