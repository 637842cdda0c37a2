"""The KV cache of the running decode batch: per-layer slot buffers, plugged into transformers as a `DynamicCache`.

Layout: every layer owns K and V buffers [row_capacity, kv_heads, column_capacity, head_dim]. The B running
rows are rows 0..B-1; all rows end at the same column `end` (right-aligned), row i holding its `lengths[i]`
tokens in columns [end - lengths[i], end). The model sees the window [end - width, end) with width =
max(lengths); columns of the window before a row's tokens are zeros, masked out by the attention mask (zeros,
never uninitialised memory, so a NaN cannot leak into real rows through 0 * NaN).

Why this layout: a decode step writes one column for every row in place (one slice copy per layer, no per-step
concatenation, which is what `DynamicLayer` does and what dominates decode time on CPU); a finished row leaves by
moving the last row into its slot (one row copy, not a rebuild of the batch); when the longest row leaves, the
window just starts later. A joining row is copied into a free slot, and only when the window must widen are the
newly exposed columns zeroed. Buffers are reallocated only when rows or columns run out (capacity grows by half),
so their size stays within `max_rows x max_width` token slots: the KV memory bound of the engine. They are kept
while the batch is empty, so the next requests reuse them instead of faulting in fresh pages; `release()` frees them.
"""

from __future__ import annotations

import inspect

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

RowKV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: K, V of one row [kv_heads, n, head_dim]


class _SlotLayer(DynamicLayer):
    """One layer's view of the batch: `keys`/`values` are the window of its buffers; `update` writes new columns."""

    def __init__(self, batch: PaddedKVBatch, index: int):
        super().__init__()
        self.batch, self.index = batch, index
        self.is_initialized = True
        self.device = batch.k[index].device

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        return self.batch._write(self.index, key_states, value_states)


def cache_kwarg(model) -> str:
    """The forward's name for the KV cache argument (`cache` in transformers >= 5.x, else `past_key_values`)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def check_full_attention(cache: DynamicCache) -> None:
    """Raise TypeError unless every layer of `cache` is a plain full-attention `DynamicLayer`."""
    for layer in cache.layers:
        if not isinstance(layer, DynamicLayer) or getattr(layer, "is_sliding", False):
            raise TypeError(f"the local engine supports full-attention KV layers only; this model uses "
                            f"{type(layer).__name__} (sliding-window or indexed attention): serve it with SGLang")


class PaddedKVBatch:
    """The KV cache of the running decode batch plus each row's valid length."""

    def __init__(self, max_width: int, max_rows: int, headroom: int = 64):
        self.max_width = max_width  # max_model_len: no row is ever longer
        self.max_rows = max_rows  # max_batch_size
        self.headroom = headroom  # least spare columns (and growth step) when buffers are reallocated
        self.k: list[torch.Tensor] = []  # per layer [row_capacity, kv_heads, column_capacity, head_dim]
        self.v: list[torch.Tensor] = []
        self.lengths: list[int] = []
        self.width = 0  # max(lengths): columns in the window
        self.end = 0  # one past the window's last column
        self.cache: DynamicCache | None = None

    def __len__(self) -> int:
        return len(self.lengths)

    # ------------------------------------------------------------------ rows join and leave

    def add(self, rows: list[RowKV], lengths: list[int]) -> None:
        """Append rows (per layer K/V [kv_heads, n, head_dim] of their n = lengths[j] prompt tokens)."""
        if not rows:
            return
        old_rows = len(self.lengths)
        if old_rows + len(rows) > self.max_rows:
            raise ValueError(f"{old_rows + len(rows)} rows exceed the batch's {self.max_rows} slots")
        width = max(self.width, *lengths)
        if not self.k:
            self._allocate(rows[0], len(rows), width)
        elif not old_rows and len(rows) <= self.k[0].shape[0] and width + 1 <= self.k[0].shape[2]:
            self.end = width  # idle buffers big enough: reuse them (no rows to move, no fresh pages to fault in)
        else:
            self._reserve(old_rows + len(rows), width, 1)
        end = self.end
        if old_rows and width > self.width:  # the window widens: zero the exposed columns of the old rows
            for buf in (*self.k, *self.v):
                buf[:old_rows, :, end - width:end - self.width].zero_()
        for j, (kv, n) in enumerate(zip(rows, lengths)):
            r = old_rows + j
            for li, (k, v) in enumerate(kv):
                for buf, src in ((self.k[li], k), (self.v[li], v)):
                    buf[r, :, end - n:end] = src
                    buf[r, :, end - width:end - n].zero_()
        self.lengths = [*self.lengths, *lengths]
        self.width = width
        self._refresh()

    def drop(self, rows: list[int]) -> list[int]:
        """Remove `rows`; returns `order`: order[i] is the old index of the row now at index i.

        Each hole below the new row count is filled by moving a surviving row from above it (one row copy per
        layer), so callers must reorder their per-row lists the same way: `items = [items[i] for i in order]`.
        """
        if not rows:
            return list(range(len(self.lengths)))
        dead = set(rows)
        n_keep = len(self.lengths) - len(dead)
        holes = [i for i in sorted(dead) if i < n_keep]
        movers = [i for i in range(n_keep, len(self.lengths)) if i not in dead]
        order = list(range(n_keep))
        if holes:
            start = self.end - self.width
            dst = torch.tensor(holes, dtype=torch.long, device=self.k[0].device)
            src = torch.tensor(movers, dtype=torch.long, device=self.k[0].device)
            for buf in (*self.k, *self.v):
                window = buf[:, :, start:self.end]
                window.index_copy_(0, dst, window.index_select(0, src))
            for h, m in zip(holes, movers):
                order[h] = m
        self.lengths = [self.lengths[i] for i in order]
        self.width = max(self.lengths, default=0)
        if not self.lengths:
            self.end = 0
        self._refresh()
        return order

    def release(self) -> None:
        """Free the buffers (they are kept while the batch is empty, for the next requests); rows must be gone."""
        if self.lengths:
            raise RuntimeError(f"release() with {len(self.lengths)} rows still in the batch")
        self.k, self.v, self.cache, self.width, self.end = [], [], None, 0, 0

    # ------------------------------------------------------------------ decode steps

    def step_inputs(self, mask_4d: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """(attention mask, position_ids [B, 1]) for decoding one new token per row.

        The mask covers the window plus the new column: a 4D bool mask [B, 1, 1, width + 1] (True = attend) that
        transformers passes to SDPA as is, or, with `mask_4d=False`, a 2D 0/1 mask [B, width + 1] for the
        model's own mask construction (eager and other attention implementations).
        """
        device = self.k[0].device
        lengths_B = torch.tensor(self.lengths, dtype=torch.long, device=device)
        cols_L = torch.arange(self.width + 1, dtype=torch.long, device=device)
        mask_B_L = cols_L.unsqueeze(0) >= (self.width - lengths_B).unsqueeze(1)
        mask = mask_B_L[:, None, None, :] if mask_4d else mask_B_L.long()
        return mask, lengths_B.unsqueeze(1)

    def reserve_step(self) -> None:
        """Make room for one more column (call before the decode step's forward)."""
        self._reserve(len(self.lengths), self.width, 1)

    def _write(self, li: int, key_states: torch.Tensor, value_states: torch.Tensor):
        q = key_states.shape[-2]
        rows, end = len(self.lengths), self.end
        self.k[li][:rows, :, end:end + q] = key_states
        self.v[li][:rows, :, end:end + q] = value_states
        start = end - self.width
        return self.k[li][:rows, :, start:end + q], self.v[li][:rows, :, start:end + q]

    def advance(self) -> None:
        """Every row gained one column (the decoded token's key/value, written by the forward pass)."""
        self.lengths = [n + 1 for n in self.lengths]
        self.width += 1
        self.end += 1
        self._refresh()

    # ------------------------------------------------------------------ reading

    def row_kv(self, row: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """A compact copy of one row's valid K/V per layer: [1, kv_heads, lengths[row], head_dim]."""
        n, end = self.lengths[row], self.end
        return [(k[row:row + 1, :, end - n:end].clone(), v[row:row + 1, :, end - n:end].clone())
                for k, v in zip(self.k, self.v)]

    def token_slots(self) -> int:
        """KV token slots allocated now (row capacity x column capacity)."""
        return self.k[0].shape[0] * self.k[0].shape[2] if self.k else 0

    # ------------------------------------------------------------------ buffers

    def _allocate(self, like: RowKV, rows: int, width: int) -> None:
        row_cap = self._row_capacity(rows, 0)
        col_cap = self._column_capacity(width + 1)
        self.k = [k.new_empty(row_cap, k.shape[0], col_cap, k.shape[2]) for k, _ in like]
        self.v = [v.new_empty(row_cap, v.shape[0], col_cap, v.shape[2]) for _, v in like]
        self.end = width
        self.cache = DynamicCache()
        self.cache.layers = [_SlotLayer(self, li) for li in range(len(like))]

    def _reserve(self, rows: int, left: int, right: int) -> None:
        """Ensure row capacity >= rows and columns [end - left, end + right) inside the buffers."""
        row_cap, col_cap = self.k[0].shape[0], self.k[0].shape[2]
        if rows <= row_cap and left <= self.end and self.end + right <= col_cap:
            return
        if left + right > self.max_width:
            raise RuntimeError(f"KV cache width {left + right} exceeds max_model_len {self.max_width}")
        new_rows = self._row_capacity(rows, row_cap)
        new_cols = max(col_cap, self._column_capacity(left + right)) if left + right > col_cap else col_cap
        old_rows, start, end = len(self.lengths), self.end - self.width, self.end
        for bufs in (self.k, self.v):
            for li, buf in enumerate(bufs):
                out = buf.new_empty(new_rows, buf.shape[1], new_cols, buf.shape[3])
                # the window moves to end at column `left`; columns outside it are never read unzeroed
                out[:old_rows, :, left - self.width:left] = buf[:old_rows, :, start:end]
                bufs[li] = out
        self.end = left

    def _row_capacity(self, rows: int, current: int) -> int:
        return min(self.max_rows, max(rows, 2 * current, 4))

    def _column_capacity(self, needed: int) -> int:
        return min(self.max_width, needed + max(self.headroom, needed // 2))

    def _refresh(self) -> None:
        rows, start, end = len(self.lengths), self.end - self.width, self.end
        for layer, k, v in zip(self.cache.layers, self.k, self.v):
            layer.keys, layer.values = k[:rows, :, start:end], v[:rows, :, start:end]


__all__ = ["PaddedKVBatch", "check_full_attention"]
