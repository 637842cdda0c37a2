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


def test_shared_cache_finds_the_longest_prefix_shared_with_any_kept_prompt():
    from agentrl.inference.prefix_cache import SharedPrefixCache

    cache = SharedPrefixCache(max_tokens=1000, block=4)
    system = list(range(100, 110))
    cache.put(system + [1, 2, 3, 4, 5], _kv(15))
    cache.put(system + [7, 8], _kv(12))
    m, kv = cache.lookup(system + [1, 2, 3, 9])  # shares 13 tokens with the first prompt (past its 3 blocks)
    assert m == 13 and kv[0][0].shape[2] == 13 and kv[0][1][0, 0, -1, 0].item() == -12
    assert cache.lookup(system + [1, 2, 3, 4, 5])[0] == 14  # an identical prompt: the last token is run again
    assert cache.match(system + [7, 8, 6]) == 12 and cache.lookup(system + [6, 6, 6])[0] == 10
    assert cache.lookup([1, 2, 3, 4, 5, 6]) is None and cache.match(system[:3] + [0]) == 0  # under one block
    assert cache.hits == 3 and cache.reused_tokens == 13 + 14 + 10


def test_shared_cache_is_bounded_survives_eviction_of_a_sharer_and_ignores_hash_collisions(monkeypatch):
    from agentrl.inference import prefix_cache
    from agentrl.inference.prefix_cache import SharedPrefixCache

    cache = SharedPrefixCache(max_tokens=40, block=4)
    system = list(range(50, 58))
    cache.put(system + [1, 1, 1, 1], _kv(12))
    cache.put(system + [2, 2, 2, 2], _kv(12))  # owns the system blocks now
    assert cache.lookup(system + [1, 1, 1, 1, 0])[0] == 12  # the first prompt is used: it owns its blocks again
    cache.put(system + [3, 3, 3, 3], _kv(12))
    cache.put(system + [4, 4, 4, 4], _kv(12))  # 48 tokens > 40: the least recently used ([2, 2, ...]) goes
    assert cache.tokens <= 40 and len(cache) == 3
    assert cache.match(system + [2, 2, 2, 2, 0]) == 8  # only the system part is still kept (by the others)
    assert cache.match(system + [1, 1, 1, 1, 0]) == 12
    cache.put(list(range(60)), _kv(60))  # larger than the whole budget: not kept
    assert len(cache) == 3
    cache.clear()
    assert len(cache) == 0 and cache.tokens == 0 and cache.match(system + [1, 1, 1, 1, 0]) == 0
    # every block hashes alike: the token check turns the collision into a miss instead of wrong K/V
    monkeypatch.setattr(prefix_cache, "hash", lambda _: 7, raising=False)
    cache.put([1] * 8, _kv(8))
    assert cache.lookup([2] * 8 + [3]) is None
