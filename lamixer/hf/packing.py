"""Masked batches for lamixer layers: the real tokens of each batch row packed into one sequence.

A recurrent state cannot be told to skip a token: even a zero input moves it under a gated decay
(the state shrinks) or a convolution (its window shifts), and a NaN input poisons it. So a masked
token never reaches a layer at all: the real tokens of every row are gathered into one packed row
with `cu_seqlens` (lamixer.Layer runs packed sequences as separate ones, each from its own state),
and the layer's outputs are scattered back, zeros at the masked positions. Rows without a real
token are left out of the call, and their state is kept as it was.

Only torch and lamixer here: nothing in this module needs transformers.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..layer import Layer, LayerState


@dataclass
class Packing:
    """Where the real tokens of a [B, T] batch go in one packed row: batch row `rows[n]` is packed sequence n."""

    mask: torch.Tensor  # [B, T] bool, True at real tokens
    rows: torch.Tensor  # [N] the batch rows that hold at least one real token, in order
    cu_seqlens: torch.Tensor  # [N + 1] offsets of those rows' tokens in the packed row

    @classmethod
    def of(cls, mask: torch.Tensor) -> Packing:
        lengths = mask.sum(dim=1)
        rows = torch.nonzero(lengths > 0).flatten()
        cu = torch.zeros(rows.numel() + 1, dtype=torch.int64, device=mask.device)
        cu[1:] = torch.cumsum(lengths[rows], dim=0)
        return cls(mask, rows, cu)

    @property
    def batch(self) -> int:
        return self.mask.shape[0]

    @property
    def empty(self) -> bool:
        return self.rows.numel() == 0

    @property
    def every_row(self) -> bool:
        return self.rows.numel() == self.batch

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, T, C] -> the real tokens [1, total, C], row by row in time order (what cu_seqlens describes)."""
        return x[self.mask][None]

    def unpack(self, y: torch.Tensor) -> torch.Tensor:
        """y [1, total, C] -> [B, T, C] with zeros at the masked positions."""
        out = y.new_zeros(*self.mask.shape, y.shape[-1])
        out[self.mask] = y[0]
        return out


def select_rows(state: LayerState, rows: torch.Tensor) -> LayerState:
    """The state of the sequences `rows` of `state`."""
    return LayerState(state.spec, rows.numel(), tuple(s.index_select(0, rows) for s in state.mixer),
                              {k: c.index_select(0, rows) for k, c in state.conv.items()},
                              None if state.position is None else state.position.index_select(0, rows))  # fmt: skip


def place_rows(base: LayerState | None, batch: int, rows: torch.Tensor, new: LayerState) -> LayerState:
    """A state for `batch` sequences: `new`'s sequences at `rows`, the others as in `base` (zeros when base is None)."""

    def merge(old: torch.Tensor | None, part: torch.Tensor) -> torch.Tensor:
        old = part.new_zeros(batch, *part.shape[1:]) if old is None else old.to(part.dtype)
        return old.index_copy(0, rows, part)  # out of place: the old state may still be in use (beam search, autograd)

    old_mixer = base.mixer if base is not None else (None,) * len(new.mixer)
    old_conv = base.conv if base is not None else {}
    return LayerState(new.spec, batch, tuple(merge(o, n) for o, n in zip(old_mixer, new.mixer)),
                              {k: merge(old_conv.get(k), c) for k, c in new.conv.items()},
                              merge(None if base is None else base.position, new.position))  # fmt: skip


def run_layer(layer: Layer, x: torch.Tensor, packing: Packing | None, state: LayerState | None,
              keep_state: bool) -> tuple[torch.Tensor, LayerState | None]:  # fmt: skip
    """A lamixer layer on x [B, T, hidden] whose masked tokens (packing) do not exist for it.

    Returns (y [B, T, hidden], the state after x, or None unless keep_state). A row with no real token
    keeps its state; its outputs, like those at every masked position, are zeros."""
    if packing is None:
        if not keep_state:
            return layer(x, state), None
        if x.shape[1] == 1:  # a decoding step
            y, state = layer.step(x[:, 0], state)
            return y[:, None], state
        return layer(x, state, return_state=True)
    if packing.empty:
        return x.new_zeros(x.shape), state
    if not getattr(layer, "stateful", True):
        return _row_by_row(layer, x, packing), None
    given = None if state is None else select_rows(state, packing.rows)
    if not keep_state:
        return packing.unpack(layer(packing.pack(x), given, cu_seqlens=packing.cu_seqlens)), None
    y, new = layer(packing.pack(x), given, cu_seqlens=packing.cu_seqlens, return_state=True)
    if packing.every_row:
        return packing.unpack(y), new
    return packing.unpack(y), place_rows(state, packing.batch, packing.rows, new)


def _row_by_row(layer: Layer, x: torch.Tensor, packing: Packing) -> torch.Tensor:
    """A spec with whole-input statistics (LLN) sees every packed sequence's tokens in its statistics, so each row
    runs alone on its real tokens."""
    out = x.new_zeros(x.shape)
    for b in packing.rows.tolist():
        keep = packing.mask[b]
        out[b, keep] = layer(x[b : b + 1, keep])[0]
    return out
