"""Prefill for the local engine: several admitted prompts in one forward pass.

Prompts of different lengths are grouped by length and right-padded to the longest of their group. Right
padding needs no attention mask: with causal attention a real token never sees the pad tokens after it, and
positions are 0..n-1 as for a prompt run alone, so each row's K/V and next-token logits are those of a
one-row prefill (up to float rounding of the larger matrix products). The padded columns' K/V are never kept:
each row contributes only its first n columns to the decode batch (`kv_batch.PaddedKVBatch.add`).

Grouping trades padding against passes: every forward pass has a fixed cost (Python, kernel launches, one read
of the weights) worth roughly `pass_cost_tokens` prompt tokens, so near-equal lengths share a pass and very
different ones do not. `plan_groups` picks the cheapest split of the length-sorted prompts exactly (dynamic
programming over contiguous runs), with at most `max_tokens` padded tokens per pass to bound activation memory.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from agentrl.inference.kv_batch import RowKV, check_full_attention

PASS_COST_TOKENS = 32


def plan_groups(lengths: list[int], max_tokens: int, pass_cost_tokens: int = PASS_COST_TOKENS) -> list[list[int]]:
    """Split prompts into prefill passes; returns lists of indices into `lengths`, longest prompts first.

    Cost of a pass = len(group) * max(length in group) + `pass_cost_tokens`; the total cost is minimal over
    all splits of the length-sorted prompts into contiguous groups of at most `max_tokens` padded tokens (a
    prompt longer than `max_tokens` gets a pass of its own).
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i], reverse=True)
    n = len(order)
    best = [0] + [None] * n  # best[j]: cheapest cost of prefilling order[:j]
    cut = [0] * (n + 1)  # cut[j]: where the last group of that split starts
    for j in range(1, n + 1):
        for i in range(j - 1, -1, -1):  # last group order[i:j]; its longest prompt is order[i]
            padded = (j - i) * lengths[order[i]]
            if padded > max_tokens and j - i > 1:
                break  # groups starting further left are longer still
            cost = best[i] + padded + pass_cost_tokens
            if best[j] is None or cost < best[j]:
                best[j], cut[j] = cost, i
    groups: list[list[int]] = []
    j = n
    while j > 0:
        groups.append(order[cut[j]:j])
        j = cut[j]
    return groups[::-1]


def prefill_padded(model, prompts: list[list[int]], cache_kw: str, device) -> tuple[list[RowKV], torch.Tensor]:
    """Run `prompts` as one right-padded batch. Returns (per row: per layer K/V [kv_heads, n, head_dim] views
    of its n prompt tokens, next-token logits [rows, vocab] in fp32)."""
    width = max(len(p) for p in prompts)
    ids_B_L = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, p in enumerate(prompts):
        ids_B_L[row, :len(p)] = torch.tensor(p, dtype=torch.long)
    last_B_1 = torch.tensor([[len(p) - 1] for p in prompts], dtype=torch.long, device=device)
    cache = DynamicCache(config=model.config)
    out = model(input_ids=ids_B_L.to(device), use_cache=True, logits_to_keep=last_B_1, **{cache_kw: cache})
    check_full_attention(cache)
    rows = [[(layer.keys[row, :, :len(p)], layer.values[row, :, :len(p)]) for layer in cache.layers]
            for row, p in enumerate(prompts)]
    logits = out.logits
    if logits.shape[1] != 1:  # a model whose forward ignores logits_to_keep returns every position
        logits = logits[torch.arange(len(prompts), device=logits.device), last_B_1[:, 0]].unsqueeze(1)
    return rows, logits[:, -1, :].float().cpu()


def prefill_with_prefix(model, prompt: list[int], prefix: tuple[int, list[tuple[torch.Tensor, torch.Tensor]]] | None, cache_kw: str,
                        device) -> tuple[RowKV, torch.Tensor]:
    """Run one prompt after the K/V of its first m tokens (`prefix` = (m, per layer K/V [1, kv_heads, m,
    head_dim])). Returns (per layer K/V [kv_heads, n, head_dim] of the whole prompt, logits [1, vocab] fp32)."""
    cache = DynamicCache(config=model.config)
    start = 0
    if prefix is not None:
        start, kv = prefix
        for li, (k, v) in enumerate(kv):
            cache.update(k, v, li)
    ids = torch.tensor([prompt[start:]], dtype=torch.long, device=device)
    out = model(input_ids=ids, use_cache=True, logits_to_keep=1, **{cache_kw: cache})
    check_full_attention(cache)
    row = [(layer.keys[0], layer.values[0]) for layer in cache.layers]
    return row, out.logits[:, -1, :].float().cpu()


__all__ = ["PASS_COST_TOKENS", "plan_groups", "prefill_padded", "prefill_with_prefix"]
