"""SessionPrefixCache: longest usable shared prefix, token bound with LRU eviction."""

from __future__ import annotations

import torch

from agentrl.inference.prefix_cache import SessionPrefixCache


def _kv(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    t = torch.arange(n, dtype=torch.float32).view(1, 1, n, 1)
    return [(t, -t), (t + 1, -t - 1)]


def test_take_returns_shared_prefix_and_always_leaves_a_token_to_run():
    cache = SessionPrefixCache(max_tokens=1000, min_reuse_tokens=2)
    cache.put("s", list(range(20)), _kv(20))
    m, kv = cache.take("s", list(range(20)))  # identical prompt: the last token is run again
    assert m == 19 and kv[0][0].shape[2] == 19 and kv[1][1][0, 0, -1, 0].item() == -19
    assert cache.take("s", list(range(30))) is None  # taking removes the entry
    cache.put("s", list(range(20)), _kv(20))
    m, _ = cache.take("s", list(range(12)) + [99, 98, 97])
    assert m == 12
    cache.put("s", list(range(20)), _kv(20))
    assert cache.take("s", [5, 6, 7]) is None  # nothing shared worth reusing


def test_token_bound_evicts_least_recent_sessions():
    cache = SessionPrefixCache(max_tokens=50)
    for i in range(4):
        cache.put(f"s{i}", list(range(20)), _kv(20))
    assert cache.tokens <= 50 and len(cache) == 2
    assert cache.take("s0", list(range(40))) is None
    assert cache.take("s3", list(range(40)))[0] == 20
    cache.put("big", list(range(60)), _kv(60))  # larger than the whole budget: not kept
    assert len(cache) == 1 and cache.tokens == 20
    cache.clear()
    assert len(cache) == 0 and cache.tokens == 0
