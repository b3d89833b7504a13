"""LamixerCache: what a LamixerModel carries from one forward to the next.

Per layer: the lamixer.LayerState of a mixer layer (its recurrent states, convolution windows and
token counts), or the keys and values [B, kv_heads, L, head_dim] of a softmax-attention layer. Per
batch row: which of the L positions seen so far held real tokens (the attention mask of the keys)
and how many did (where the attention layers' rotary positions continue).
"""
from __future__ import annotations

import torch
from transformers.cache_utils import Cache

from ..errors import ArgumentError
from ..layer import LayerState
from .packing import select_rows

Entry = LayerState | tuple[torch.Tensor, torch.Tensor] | None


class LamixerCache(Cache):
    """The decoding state of a LamixerModel: `generate()` creates and threads it, or pass one as `cache=`.

        cache = LamixerCache(model.config)
        out = model(prompt_ids, attention_mask=mask, cache=cache, use_cache=True)
        out = model(next_ids, cache=out.cache, use_cache=True)      # continues every row
    """

    # A recurrent state cannot be rolled back to an earlier token, and its tensors are replaced, not updated in place.
    is_compileable = False
    is_croppable = False

    def __init__(self, config=None, num_layers: int | None = None):
        # Cache's own constructor differs between transformers versions and sets up per-layer key/value
        # containers this cache has no use for: everything a Cache method needs is set here instead.
        if num_layers is None:
            if config is None:
                raise ArgumentError("config", "LamixerCache needs the model's config (or num_layers)")
            num_layers = config.num_layers
        self.entries: list[Entry] = [None] * num_layers
        self.mask: torch.Tensor | None = None  # [B, L] bool: the positions seen so far that held real tokens
        self.seen: torch.Tensor | None = None  # [B] int64: how many real tokens each row has seen
        self.layers: list = []  # no per-layer Cache objects: the base class's loops over them find nothing to do
        self.layer_class_to_replicate = None
        self.offloading = False

    def __repr__(self) -> str:
        kinds = ["-" if e is None else ("attention" if isinstance(e, tuple) else e.spec.split(":")[0]) for e in self.entries]
        return f"LamixerCache(batch={self.batch_size}, seen={self.get_seq_length()}, layers=[{', '.join(kinds)}])"

    def __len__(self) -> int:
        return len(self.entries)

    # -- what the model reads and writes --
    def entry(self, layer_idx: int) -> Entry:
        return self.entries[layer_idx]

    def set_entry(self, layer_idx: int, entry: Entry) -> None:
        self.entries[layer_idx] = entry

    def advance(self, new_mask: torch.Tensor) -> None:
        """Record the positions of one forward, new_mask [B, T] bool (True at real tokens)."""
        self.mask = new_mask if self.mask is None else torch.cat([self.mask, new_mask], dim=1)
        counts = new_mask.sum(dim=1)
        self.seen = counts if self.seen is None else self.seen + counts

    # -- the Cache interface generate() uses --
    def get_seq_length(self, layer_idx: int | None = 0) -> int:
        """Positions seen so far, padding included (the length of the attention mask generate() keeps)."""
        return 0 if self.mask is None else self.mask.shape[1]

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return -1

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    @property
    def batch_size(self) -> int:
        return -1 if self.seen is None else self.seen.shape[0]

    @property
    def is_initialized(self) -> bool:
        return self.mask is not None

    @property
    def is_linear(self) -> list[bool]:
        # False: this cache knows how many positions it has seen, so generate() may pass it only the new tokens
        return [False] * len(self.entries)

    @property
    def is_sliding(self) -> list[bool]:
        return [False] * len(self.entries)

    @property
    def is_dummy(self) -> list[bool]:
        return [False] * len(self.entries)

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        raise NotImplementedError("LamixerCache is filled by LamixerModel's layers, not through Cache.update")

    def reset(self) -> None:
        self.entries = [None] * len(self.entries)
        self.mask = self.seen = None

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("a recurrent state cannot be cropped back to an earlier token")

    def activate_past_recording(self) -> None:
        raise NotImplementedError("a recurrent state cannot be rolled back (assisted and speculative decoding need that)")

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._index(beam_idx)

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.seen is not None:
            self._index(torch.arange(self.batch_size, device=self.seen.device).repeat_interleave(repeats))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._index(torch.nonzero(indices).flatten() if indices.dtype == torch.bool else indices)

    def _index(self, index: torch.Tensor) -> None:
        """Keep (and repeat) the batch rows `index`, in that order, in every layer."""
        if self.seen is None:
            return
        index = index.to(self.seen.device)
        self.mask, self.seen = self.mask.index_select(0, index), self.seen.index_select(0, index)
        for i, e in enumerate(self.entries):
            if isinstance(e, tuple):
                self.entries[i] = tuple(t.index_select(0, index.to(t.device)) for t in e)
            elif e is not None:
                self.entries[i] = select_rows(e, index.to(e.position.device))
