"""A left-padded, per-row KV cache for continuous batching on top of transformers' `DynamicCache`.

Rows are right-aligned: row i owns the last `lengths[i]` columns of every layer's key/value tensor
[rows, kv_heads, L, head_dim] with `L = max(lengths)`; the columns before are zeros and masked out by the 2D
attention mask. A row joins by being padded to the common length and concatenated along the batch axis; finished
rows leave by index selection, after which columns that no remaining row uses are trimmed. Pad columns are
zeros (never the output of a fully masked attention row), so they cannot leak NaNs into real rows.

Memory is bounded by `rows * L` <= `max_batch_size * max_model_len` token slots.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


def _layers(cache: DynamicCache) -> list[DynamicLayer]:
    layers = cache.layers
    for layer in layers:
        if type(layer) is not DynamicLayer:
            raise TypeError(f"the local engine supports full-attention KV layers only; this model uses "
                            f"{type(layer).__name__} (sliding-window or indexed attention): serve it with SGLang")
    return layers


def _pad_left(t: torch.Tensor, n: int) -> torch.Tensor:
    return F.pad(t, (0, 0, n, 0)) if n > 0 else t


class PaddedKVBatch:
    """The KV cache of the running decode batch plus each row's valid length."""

    def __init__(self) -> None:
        self.cache: DynamicCache | None = None
        self.lengths: list[int] = []

    @property
    def width(self) -> int:
        """L: columns per layer (the longest row)."""
        return max(self.lengths, default=0)

    def __len__(self) -> int:
        return len(self.lengths)

    def add(self, row_caches: list[DynamicCache], row_lengths: list[int]) -> None:
        """Append rows whose caches come from single-row prefills (no padding inside them)."""
        if not row_caches:
            return
        width = max([self.width, *row_lengths])
        parts: list[list[tuple[torch.Tensor, torch.Tensor]]] = []
        if self.cache is not None and self.lengths:
            pad = width - self.width
            parts.append([(_pad_left(l.keys, pad), _pad_left(l.values, pad)) for l in _layers(self.cache)])
        for c, n in zip(row_caches, row_lengths):
            parts.append([(_pad_left(l.keys, width - n), _pad_left(l.values, width - n)) for l in _layers(c)])
        base = row_caches[0] if self.cache is None or not self.lengths else self.cache
        for li, layer in enumerate(_layers(base)):
            layer.keys = torch.cat([p[li][0] for p in parts], dim=0)
            layer.values = torch.cat([p[li][1] for p in parts], dim=0)
        self.cache = base
        self.lengths = [*self.lengths, *row_lengths]

    def keep(self, rows: list[int]) -> None:
        """Keep only `rows` (in that order) and trim columns no remaining row uses."""
        if len(rows) == len(self.lengths):
            return
        if not rows:
            self.cache, self.lengths = None, []
            return
        old_width = self.width
        self.lengths = [self.lengths[i] for i in rows]
        start = old_width - self.width
        index = torch.tensor(rows, dtype=torch.long)
        for layer in _layers(self.cache):
            layer.keys = layer.keys.index_select(0, index)[:, :, start:, :].contiguous()
            layer.values = layer.values.index_select(0, index)[:, :, start:, :].contiguous()

    def step_inputs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(attention_mask [B, L+1], position_ids [B, 1]) for decoding one new token per row."""
        width = self.width
        lengths = torch.tensor(self.lengths, dtype=torch.long)
        cols = torch.arange(width + 1, dtype=torch.long)
        mask_B_L = (cols.unsqueeze(0) >= (width - lengths).unsqueeze(1)).long()
        return mask_B_L, lengths.unsqueeze(1)

    def advance(self) -> None:
        """Every row gained one column (the decoded token's key/value)."""
        self.lengths = [n + 1 for n in self.lengths]

    def token_slots(self) -> int:
        return len(self.lengths) * self.width


__all__ = ["PaddedKVBatch"]
