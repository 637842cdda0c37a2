"""Prefill for the local engine: several admitted prompts in one forward pass, each after its cached prefix.

Prompts of different lengths are grouped by length and right-padded to the longest of their group. Right
padding needs no attention mask: with causal attention a real token never sees the pad tokens after it, and
positions are 0..n-1 as for a prompt run alone, so each row's K/V and next-token logits are those of a
one-row prefill (up to float rounding of the larger matrix products). The padded columns' K/V are never kept:
each row contributes only its first n columns to the decode batch (`kv_batch.PaddedKVBatch.add`).

Grouping trades padding against passes: every forward pass has a fixed cost (Python, kernel launches, one read
of the weights) worth roughly `pass_cost_tokens` prompt tokens, so near-equal lengths share a pass and very
different ones do not. `plan_groups` picks the cheapest split of the length-sorted prompts exactly (dynamic
programming over contiguous runs), with at most `max_tokens` padded tokens per pass to bound activation memory.

The last decoder layer's output is needed only where logits are read (`LastLayerTrim`).
"""

from __future__ import annotations

import logging
import threading
from contextlib import contextmanager

import torch
from transformers import DynamicCache

from agentrl.inference.kv_batch import RowKV, check_full_attention

log = logging.getLogger(__name__)

PASS_COST_TOKENS = 32


class LastLayerTrim:
    """Run the last decoder layer's output projection and MLP only at each row's last prompt position.

    In a prefill the last layer's keys and values are needed at every position (they go to the KV cache), but its
    output only where logits are read: skipping the rest saves 1/num_layers of the projection and MLP work (a
    sixth on the 6-layer small model, half on the 2-layer tiny one). Forward pre-hooks on that layer's
    `self_attn.o_proj` and `mlp` keep one position per row; the residual add then broadcasts, so the layer's other
    positions hold values nothing reads. The hooks exist only inside `at(...)` and act only on the thread that
    entered it (a trainer sharing the model on another thread is untouched). `verify` compares a trimmed prefill
    with a plain one and switches the trim off for models whose layers do not follow this pattern.
    """

    def __init__(self, model):
        decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
        layers = getattr(decoder, "layers", None)
        last = layers[-1] if layers is not None and len(layers) else None
        targets = (getattr(getattr(last, "self_attn", None), "o_proj", None), getattr(last, "mlp", None))
        self.targets = [m for m in targets if isinstance(m, torch.nn.Module)]
        self.enabled = len(self.targets) == 2

    @contextmanager
    def at(self, last_B: torch.Tensor):
        """Within the block, this thread's forward passes keep position last_B[b] of row b in the last layer."""
        if not self.enabled:
            yield
            return
        owner = threading.get_ident()
        rows_B = torch.arange(len(last_B), device=last_B.device)

        def keep_last(module, args):
            if threading.get_ident() != owner or not args or args[0].dim() != 3:
                return None
            return (args[0][rows_B, last_B].unsqueeze(1), *args[1:])

        handles = [m.register_forward_pre_hook(keep_last) for m in self.targets]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def verify(self, model, cache_kw: str, device) -> bool:
        """Turn the trim off unless a trimmed two-row prefill gives the plain one's logits and K/V."""
        if not self.enabled:
            return False
        vocab = int(model.config.vocab_size)
        prompts = [[(7 * i + 3) % vocab for i in range(9)], [(5 * i + 1) % vocab for i in range(4)]]
        with torch.inference_mode():
            plain_rows, plain = prefill_padded(model, prompts, cache_kw, device)
            rows, trimmed = prefill_padded(model, prompts, cache_kw, device, trim=self)
        same_kv = all(torch.equal(k, k2) and torch.equal(v, v2)
                      for row, row2 in zip(rows, plain_rows) for (k, v), (k2, v2) in zip(row, row2))
        if not (same_kv and torch.allclose(trimmed, plain, rtol=1e-4, atol=1e-5)):
            log.warning("prefill: this model's last layer does not fit LastLayerTrim; prefilling every position")
            self.enabled = False
        return self.enabled


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


def prefill_padded(model, prompts: list[list[int]], cache_kw: str, device,
                   trim: LastLayerTrim | None = None) -> tuple[list[RowKV], torch.Tensor]:
    """Run `prompts` as one right-padded batch. Returns (per row: per layer K/V [kv_heads, n, head_dim] views
    of its n prompt tokens, next-token logits [rows, vocab] in fp32)."""
    width = max(len(p) for p in prompts)
    ids_B_L = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, p in enumerate(prompts):
        ids_B_L[row, :len(p)] = torch.tensor(p, dtype=torch.long)
    last_B_1 = torch.tensor([[len(p) - 1] for p in prompts], dtype=torch.long, device=device)
    cache = DynamicCache(config=model.config)
    with trim.at(last_B_1[:, 0]) if trim is not None else _nothing():
        out = model(input_ids=ids_B_L.to(device), use_cache=True, logits_to_keep=last_B_1, **{cache_kw: cache})
    check_full_attention(cache)
    rows = [[(layer.keys[row, :, :len(p)], layer.values[row, :, :len(p)]) for layer in cache.layers]
            for row, p in enumerate(prompts)]
    return rows, _next_token_logits(out.logits, last_B_1)


def prefill_after_prefixes(model, prompts: list[list[int]], prefixes: list[tuple[int, list] | None], cache_kw: str,
                           device, trim: LastLayerTrim | None = None) -> tuple[list[RowKV], torch.Tensor]:
    """Run several prompts in one forward pass, each after the cached K/V of its first m tokens.

    `prefixes[i]` is None or (m, per layer K/V [1, kv_heads, m, head_dim] of prompts[i][:m]). Layout: the
    cached prefixes right-aligned in M = max(m) columns (zeros before a shorter one, masked out), the new tokens
    right-padded in S = max(n - m) columns at positions m, m + 1, ...; a 2D padding mask over the M + S key
    columns lets the model build its causal mask as for any cached batch. Each row's K/V and next-token logits
    are those of the row's whole prompt run alone, up to float rounding. Returns (per row: per layer K/V
    [kv_heads, n, head_dim] views of its whole prompt, next-token logits [rows, vocab] in fp32).
    """
    starts = [0 if p is None else p[0] for p in prefixes]
    if not any(starts):
        return prefill_padded(model, prompts, cache_kw, device, trim=trim)
    width_M, rows = max(starts), len(prompts)
    suffix_lengths = [len(p) - m for p, m in zip(prompts, starts)]
    width_S = max(suffix_lengths)
    ids_R_S = torch.zeros((rows, width_S), dtype=torch.long)
    for row, (p, m) in enumerate(zip(prompts, starts)):
        ids_R_S[row, :len(p) - m] = torch.tensor(p[m:], dtype=torch.long)
    like = next(p[1] for p in prefixes if p is not None)
    cache = DynamicCache(config=model.config)
    for li, (k_like, v_like) in enumerate(like):
        keys = k_like.new_zeros(rows, k_like.shape[1], width_M, k_like.shape[3])
        values = v_like.new_zeros(rows, v_like.shape[1], width_M, v_like.shape[3])
        for row, prefix in enumerate(prefixes):
            if prefix is not None:
                m, kv = prefix
                keys[row, :, width_M - m:] = kv[li][0][0]
                values[row, :, width_M - m:] = kv[li][1][0]
        cache.update(keys.to(device), values.to(device), li)
    starts_R = torch.tensor(starts, dtype=torch.long)
    cols_M = torch.arange(width_M, dtype=torch.long)
    mask_R_C = torch.cat([(cols_M.unsqueeze(0) >= (width_M - starts_R).unsqueeze(1)).long(),
                          torch.ones((rows, width_S), dtype=torch.long)], dim=1)
    positions_R_S = starts_R.unsqueeze(1) + torch.arange(width_S, dtype=torch.long).unsqueeze(0)
    last_R_1 = torch.tensor([[n - 1] for n in suffix_lengths], dtype=torch.long, device=device)
    with trim.at(last_R_1[:, 0]) if trim is not None else _nothing():
        out = model(input_ids=ids_R_S.to(device), attention_mask=mask_R_C.to(device),
                    position_ids=positions_R_S.to(device), use_cache=True, logits_to_keep=last_R_1,
                    **{cache_kw: cache})
    check_full_attention(cache)
    kv_rows = [[(layer.keys[row, :, width_M - m:width_M + n], layer.values[row, :, width_M - m:width_M + n])
                for layer in cache.layers] for row, (m, n) in enumerate(zip(starts, suffix_lengths))]
    return kv_rows, _next_token_logits(out.logits, last_R_1)


def _next_token_logits(logits: torch.Tensor, last_B_1: torch.Tensor) -> torch.Tensor:
    """[rows, vocab] fp32 logits at each row's last position, from a forward given `logits_to_keep=last_B_1`."""
    if logits.shape[1] != 1:  # a model whose forward ignores logits_to_keep returns every position
        logits = logits[torch.arange(len(last_B_1), device=logits.device), last_B_1[:, 0]].unsqueeze(1)
    return logits[:, -1, :].float().cpu()


@contextmanager
def _nothing():
    yield


__all__ = ["PASS_COST_TOKENS", "LastLayerTrim", "plan_groups", "prefill_after_prefixes", "prefill_padded"]
