"""A left-padded, per-row KV cache for continuous batching, plugged into transformers as a `DynamicCache`.

Rows are right-aligned: row i owns the last `lengths[i]` of the `width` used columns of every layer's buffer
[rows, kv_heads, capacity, head_dim]; the columns before are zeros and masked out by the 2D attention mask.
Each decode step writes one column in place (no per-step concatenation of the whole cache, which is what
`DynamicLayer` does and what dominates decode time on CPU); the buffer grows by a quarter when full.
A row joins by being copied into a new buffer at the common width; finished rows leave the same way, and
columns that no remaining row uses are dropped. Pad columns are zeros (never the output of a fully masked
attention row), so they cannot leak NaNs into real rows.

Memory is bounded by `rows * capacity` <= `max_batch_size * max_model_len` token slots.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class _SlotLayer(DynamicLayer):
    """One layer's K/V for the decode batch: a preallocated buffer, `keys`/`values` are views of its used part."""

    def __init__(self, k_buf: torch.Tensor, v_buf: torch.Tensor, width: int, max_capacity: int):
        super().__init__()
        self.k_buf, self.v_buf, self.width, self.max_capacity = k_buf, v_buf, width, max_capacity
        self.device = k_buf.device
        self.is_initialized = True
        self._refresh()

    def _refresh(self) -> None:
        self.keys = self.k_buf[:, :, :self.width]
        self.values = self.v_buf[:, :, :self.width]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        q = key_states.shape[-2]
        if self.width + q > self.k_buf.shape[2]:
            cap = min(max(self.width + q, self.k_buf.shape[2] + max(32, self.k_buf.shape[2] // 4)), self.max_capacity)
            if cap < self.width + q:
                raise RuntimeError(f"KV cache width {self.width + q} exceeds max_model_len {self.max_capacity}")
            self.k_buf, self.v_buf = _grow(self.k_buf, self.width, cap), _grow(self.v_buf, self.width, cap)
        self.k_buf[:, :, self.width:self.width + q] = key_states
        self.v_buf[:, :, self.width:self.width + q] = value_states
        self.width += q
        self._refresh()
        return self.keys, self.values


def _grow(buf: torch.Tensor, width: int, capacity: int) -> torch.Tensor:
    out = buf.new_empty(buf.shape[0], buf.shape[1], capacity, buf.shape[3])  # columns >= width: written first
    out[:, :, :width] = buf[:, :, :width]
    return out


def _check_layers(cache: DynamicCache) -> list[DynamicLayer]:
    for layer in cache.layers:
        if not isinstance(layer, DynamicLayer) or getattr(layer, "is_sliding", False):
            raise TypeError(f"the local engine supports full-attention KV layers only; this model uses "
                            f"{type(layer).__name__} (sliding-window or indexed attention): serve it with SGLang")
    return cache.layers


class PaddedKVBatch:
    """The KV cache of the running decode batch plus each row's valid length."""

    def __init__(self, max_width: int, headroom: int = 64):
        self.max_width = max_width  # max_model_len: no row is ever longer
        self.headroom = headroom  # spare columns allocated when the batch is rebuilt
        self.cache: DynamicCache | None = None
        self.lengths: list[int] = []

    @property
    def width(self) -> int:
        """Columns in use per layer (the longest row)."""
        return max(self.lengths, default=0)

    def __len__(self) -> int:
        return len(self.lengths)

    def _capacity(self, width: int) -> int:
        return min(width + self.headroom, self.max_width)

    def add(self, row_caches: list[DynamicCache], row_lengths: list[int]) -> None:
        """Append rows whose caches come from single-row prefills (no padding inside them)."""
        if not row_caches:
            return
        old_rows, old_width = len(self.lengths), self.width
        lengths = [*self.lengths, *row_lengths]
        width = max(lengths)
        row_layer_lists = [_check_layers(c) for c in row_caches]
        new_layers = []
        for li, proto in enumerate(row_layer_lists[0]):
            k_buf, v_buf = self._alloc(proto.keys, len(lengths), width)
            for buf, name in ((k_buf, "k_buf"), (v_buf, "v_buf")):
                if old_rows:  # the old block keeps its zero pads; only the new left margin is zeroed
                    buf[:old_rows, :, width - old_width:width] = getattr(self.cache.layers[li], name)[:, :, :old_width]
                    buf[:old_rows, :, :width - old_width].zero_()
                for j, (layers, n) in enumerate(zip(row_layer_lists, row_lengths)):
                    row = old_rows + j
                    buf[row, :, width - n:width] = (layers[li].keys if name == "k_buf" else layers[li].values)[0]
                    buf[row, :, :width - n].zero_()
            new_layers.append(_SlotLayer(k_buf, v_buf, width, self.max_width))
        self._install(new_layers)
        self.lengths = lengths

    def keep(self, rows: list[int]) -> None:
        """Keep only `rows` (in that order) and drop columns no remaining row uses."""
        if len(rows) == len(self.lengths):
            return
        if not rows:
            self.cache, self.lengths = None, []
            return
        old_width = self.width
        lengths = [self.lengths[i] for i in rows]
        width = max(lengths)
        index = torch.tensor(rows, dtype=torch.long, device=self.cache.layers[0].k_buf.device)
        new_layers = []
        for layer in self.cache.layers:
            # rows stay right-aligned, so the last `width` old columns hold each kept row plus its zero pads
            k_buf, v_buf = self._alloc(layer.k_buf, len(rows), width)
            k_buf[:, :, :width] = layer.k_buf[:, :, old_width - width:old_width].index_select(0, index)
            v_buf[:, :, :width] = layer.v_buf[:, :, old_width - width:old_width].index_select(0, index)
            new_layers.append(_SlotLayer(k_buf, v_buf, width, self.max_width))
        self._install(new_layers)
        self.lengths = lengths

    def _alloc(self, like: torch.Tensor, rows: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Uninitialised K and V buffers with headroom; columns past `width` are written before they are read."""
        shape = (rows, like.shape[1], self._capacity(width), like.shape[3])
        return (torch.empty(shape, dtype=like.dtype, device=like.device),
                torch.empty(shape, dtype=like.dtype, device=like.device))

    def _install(self, layers: list[_SlotLayer]) -> None:
        if self.cache is None:
            self.cache = DynamicCache()
        self.cache.layers = layers

    def row_kv(self, row: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """A compact copy of one row's valid K/V per layer: [1, kv_heads, lengths[row], head_dim]."""
        n, width = self.lengths[row], self.width
        return [(l.k_buf[row:row + 1, :, width - n:width].clone(), l.v_buf[row:row + 1, :, width - n:width].clone())
                for l in self.cache.layers]

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
        """KV token slots allocated now (rows x buffer capacity)."""
        if self.cache is None or not self.lengths:
            return 0
        return len(self.lengths) * self.cache.layers[0].k_buf.shape[2]


__all__ = ["PaddedKVBatch"]
