"""Where one call's tokens lie over the ranks of a process group.

Each rank holds a contiguous slice of the time axis, in rank order, of any length. Unpacked, every
batch row is one sequence across all ranks. Packed (B = 1), `cu_seqlens` are the global offsets of
the whole batch, the same tensor on every rank; a rank's slice then holds pieces of sequences: the
first may continue the previous rank's last sequence (when the rank's first token is no sequence
start), the others start on the rank. A rank's local cu_seqlens are its pieces' offsets.

Before any other collective, the ranks agree on a call: each checks its own arguments, and one small
all_gather brings every rank's outcome, length and the sizes that must match, so a bad argument on one
rank raises an error on every rank instead of leaving the others waiting in a collective.
"""
from __future__ import annotations

import bisect
import itertools
import zlib
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.distributed as dist

from ..runtime.errors import ArgumentError
from .collective import Sequence, gather_plain


def check_group(group) -> None:
    """An ArgumentError unless `group` is a process group this rank belongs to."""
    if not dist.is_available() or not dist.is_initialized():
        raise ArgumentError("context_parallel", "needs torch.distributed initialised (torch.distributed.init_process_group)")
    if not isinstance(group, dist.ProcessGroup):
        raise ArgumentError("context_parallel", f"must be a torch.distributed ProcessGroup, got {type(group).__name__}")
    if dist.get_rank(group) < 0:
        raise ArgumentError("context_parallel", "this rank is not a member of the group")


def fingerprint(*values) -> int:
    """A number every rank computes alike from the same values (Python's hash() differs between processes)."""
    return zlib.crc32(repr(values).encode())


class Local(NamedTuple):
    """What one rank's check of its part of a call finds."""

    length: int  # its tokens
    batch: int
    cu: list[int] | None  # the packed sequences' global offsets, as this rank was given them
    grad: bool  # whether it takes gradients
    sizes: int  # a fingerprint of what must match on every rank (heads, dim sizes, dtypes)
    final: bool  # whether it asks for the final states
    device: torch.device  # its tensors'


def metadata_device(group) -> torch.device:
    """Where the agreement's numbers go: the GPU for NCCL, else the CPU."""
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" else torch.device("cpu")


def agree(group, check: Callable[[], Local]) -> Shard:
    """The Shard of a call whose every rank's check() passed, or, where one failed, its error there and an
    ArgumentError naming it on the others (see the module docstring)."""
    check_group(group)
    try:
        local, error = check(), None
        row = [1, local.length, int(local.grad), local.batch, local.sizes, -1 if local.cu is None else fingerprint(local.cu), int(local.final)]
    except Exception as e:  # raised below, once the other ranks know
        local, error, row = None, e, [0] * 7
    rows = gather_plain(torch.tensor(row, dtype=torch.int64, device=metadata_device(group)), group).tolist()
    if error is not None:
        raise error
    failed = [q for q, r in enumerate(rows) if not r[0]]
    if failed:
        raise ArgumentError("context_parallel", f"rank {failed[0]} of the group refused its part of the call (its error says why)")
    for column, argument, what in ((3, "context_parallel", "the batch"), (4, "context_parallel", "the heads, dim sizes or dtypes"),
                                   (5, "cu_seqlens", "the packed offsets (pass the whole batch's on every rank)"),
                                   (6, "output_final_state", "whether final states are asked for")):  # fmt: skip
        values = [r[column] for r in rows]
        if len(set(values)) > 1:
            raise ArgumentError(argument, f"must be alike on every rank of the group: {what} differs ({values} by rank)")
    lengths = [r[1] for r in rows]
    if 0 in lengths:
        raise ArgumentError("context_parallel", f"every rank needs at least one token, got {lengths} by rank")
    if local.cu is not None and local.cu[-1] != sum(lengths):
        raise ArgumentError("cu_seqlens", f"must end at the ranks' tokens together, {sum(lengths)} ({lengths} by rank), got {local.cu[-1]}")
    return Shard(group, lengths, local.batch, local.cu, any(r[2] for r in rows), local.final, local.device)


class Shard:
    """The layout of one call's tokens over the group (identical on every rank but for `rank`), and the call's
    collectives (a collective.Sequence).

    lengths: each rank's tokens; batch: B; cu: the global offsets of packed sequences (None: unpacked); grad:
    whether any rank takes gradients; final: whether the final states are asked for."""

    def __init__(self, group, lengths: list[int], batch: int, cu: list[int] | None, grad: bool, final: bool, device: torch.device):
        self.group, self.device = group, device
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        self.lengths, self.batch, self.cu, self.final = lengths, batch, cu, final
        self.offsets = list(itertools.accumulate(lengths, initial=0))  # each rank's first global token; the total last
        self.collectives = Sequence(group, grad)
        self.starts = [self._sequence_start(q) for q in range(self.world)]
        # whether rank q's first token continues a sequence of the ranks before it
        self.continues = [q > 0 and self.starts[q] < self.offsets[q] for q in range(self.world)]
        # whether the state entering rank q leaves it changed only by q's own tokens (no sequence starts inside it)
        self.passes = [self.continues[q] and not self._boundaries(q) for q in range(self.world)]
        bounds = [self.offsets[self.rank], *self._boundaries(self.rank), self.offsets[self.rank + 1]]
        start = self.offsets[self.rank]
        self.pieces = [b - start for b in bounds]  # this rank's pieces' local offsets
        self.local_cu = None if cu is None else torch.tensor(self.pieces, dtype=torch.int64, device=device)
        first = 0 if cu is None else bisect.bisect_right(cu, start) - 1
        # the global sequence of each local piece (unpacked: the batch rows)
        self.sequences = list(range(batch)) if cu is None else list(range(first, first + len(self.pieces) - 1))
        # tokens of each piece's sequence before the piece: the first may have some, the others none (unpacked, every
        # batch row is a first piece)
        self.before_piece = [start] * batch if cu is None else [start - self.starts[self.rank]] + [0] * (len(self.sequences) - 1)
        # whether each piece holds its sequence's last token
        end = self.offsets[self.rank + 1]
        last_ends = self.rank == self.world - 1 if cu is None else end in set(cu)
        self.ends = [True] * (len(self.pieces) - 2) + [last_ends] if cu is not None else [last_ends] * batch

    @property
    def sequences_total(self) -> int:
        """N: the batch rows, or the packed sequences of all ranks."""
        return self.batch if self.cu is None else len(self.cu) - 1

    @property
    def rows(self) -> int:
        """The leading size of what a rank passes on to the next: B rows unpacked, one (its last piece) packed."""
        return self.batch if self.cu is None else 1

    def _sequence_start(self, q: int) -> int:
        """The global start of the sequence holding rank q's first token."""
        if self.cu is None:
            return 0
        return self.cu[bisect.bisect_right(self.cu, self.offsets[q]) - 1]

    def _boundaries(self, q: int) -> list[int]:
        """Sequence starts strictly inside rank q's slice."""
        if self.cu is None:
            return []
        lo, hi = self.offsets[q], self.offsets[q + 1]
        return self.cu[bisect.bisect_right(self.cu, lo) : bisect.bisect_left(self.cu, hi)]

    def settle(self, x: torch.Tensor) -> torch.Tensor:
        """A call's output x, after which every rank's backward pass runs the call's collectives (collective.Sequence)."""
        return self.collectives.settle(x)

    def cache(self, x: torch.Tensor, keep: int) -> torch.Tensor:
        """A causal convolution's cache for each local piece, [N, C, keep], from x [B, T, C]: the first piece's the last
        `keep` inputs of its sequence on the ranks before (zeros before the sequence's start), the others' zeros."""
        prev = self.before(x, keep).transpose(1, 2)
        return prev if self.cu is None else torch.cat([prev, prev.new_zeros(len(self.sequences) - 1, *prev.shape[1:])], 0)

    def before(self, x: torch.Tensor, width: int) -> torch.Tensor:
        """The `width` tokens before this rank's first one that belong to its sequence, [B, width, ...] (zeros where
        there are fewer): what a causal window reaching back `width` tokens sees of the ranks before. x: this rank's
        [B, T, ...]. A collective: every rank calls it alike."""
        T = x.shape[1]
        keep = min(width, T)
        tail = torch.cat([x.new_zeros(x.shape[0], width - keep, *x.shape[2:]), x[:, T - keep :]], 1)
        tails = self.collectives.gather(tail)  # [world, B, width, ...]
        need = min(width, self.before_piece[0])
        parts, q = [], self.rank - 1
        while need > 0:  # back through the ranks before, each holding its last min(width, length) tokens in its tail
            take = min(need, self.lengths[q])
            parts.append(tails[q][:, width - take :])
            need, q = need - take, q - 1
        got = sum(p.shape[1] for p in parts)
        return torch.cat([x.new_zeros(x.shape[0], width - got, *x.shape[2:]), *reversed(parts)], 1)
