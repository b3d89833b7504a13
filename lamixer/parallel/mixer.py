"""A mixer's non-local parts across ranks: scans, whole-input statistics and block attention.

Scans. Every state's scan is linear in its initial state and its writes: over a rank's slice,
S_end = A(S_0) + B, and each read o_t = o_t(0) + P_t(S_0). A rank runs its slice on the backend's
own scan from a zero state (its pieces that start a sequence from their initial states), which gives
B and the outputs' own part, then its transition A and the reads' P (below); the ranks all-gather
(A, B) (a state per rank: O(H K V), or O(H K K) for a delta transition, whatever the length), each
composes those of the ranks before it, in order, into its incoming state S_in, and adds P_t(S_in) to
its outputs and A(S_in) to its first piece's final state. What a state needs is the classification's
own, not a mixer's:

- additive, decay none, scalar or along the key dim: A = diag(e^(sum g)) on the key side, and
  P_t(S) = (q_t e^(G_t)) S, G_t the log decay summed from the slice's start through token t (through
  t - 1 for a read before the decay); along the value dim the same on the value side,
  P_t(S) = (q_t S) e^(G_t). Computed directly from the decays, no scan.
- delta: A is a [K, K] matrix, and P_t(S) = p_t S with p_t a [K] row: the backend's scan run from
  the identity state with zero values (value dim K) gives both, A as its final state and p_t as
  its reads.
- a normaliser (a vector state beside matrix ones: LLN's z) is one more value column.

Chained scans (GSA) resolve one by one: the second scan's inputs are the first's corrected reads.
Gradients are autograd's through the collectives (lamixer/parallel/collective.py).

Statistics reduce over the group: max and min directly, mean, var and std by combining each rank's
count, mean and sum of squared deviations (Chan et al.), the same on every rank.

Block attention: a block that straddles ranks starts on an earlier rank; a rank prepends the keys
and values of its first block's earlier tokens (the previous ranks' last tokens) and drops their rows.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..runtime.carry import extras as carry_extras
from ..runtime.carry import statistic as carry_statistic
from ..runtime.errors import LamixerError
from ..runtime.scan import POSITIONS, ScanOperands, divided_reads, epilogue
from ..runtime.scan import block_attention as local_block_attention
from .collective import gather_plain
from .shard import Shard


def _apply(side: str, A: torch.Tensor, S: torch.Tensor) -> torch.Tensor:
    """A slice's transition applied to the state entering it: A S (side "matrix": A [.., K, K]), else A * S (side
    "key": A [.., K or 1, 1]; side "value": A [.., 1, V])."""
    return A @ S if side == "matrix" else A * S


@dataclasses.dataclass
class _Transition:
    """A slice's effect on the state entering it (A, as _apply takes it) and on each of its reads."""

    side: str
    A: torch.Tensor  # [rows, H, ...]
    reads: list  # per read: p [B, T1, H, K] (key and matrix sides), or (q [B, T1, H, K], e^G [B, T1, H, V]) (value side)

    def contribution(self, i: int, S: torch.Tensor) -> torch.Tensor:
        """Read i's part from the incoming state S [rows, H, K, W]: [B, T1, H, W]."""
        if self.side == "value":
            q, decay = self.reads[i]
            return torch.einsum("bthk,bhkw->bthw", q, S) * decay
        return torch.einsum("bthk,bhkw->bthw", self.reads[i].to(S.dtype), S)


def _side(ops: ScanOperands) -> str:
    return "matrix" if ops.c is not None else "value" if ops.decay == "value" else "key"


def _transition_shape(ops: ScanOperands, rows: int, width: int) -> tuple[int, ...]:
    H, K = ops.h0.shape[1], ops.h0.shape[2]
    side = _side(ops)
    if side == "matrix":
        return rows, H, K, K
    if side == "value":
        return rows, H, 1, width
    return rows, H, K if ops.decay == "key" else 1, 1  # the plan's decay kind: one factor per key row, or one for all


def _first_piece(ops: ScanOperands, T1: int) -> ScanOperands:
    """The scan's operands over the first piece alone (its first T1 tokens), unpacked."""
    if ops.cu_seqlens is None:  # every row is one piece
        return ops

    def cut(x):
        return None if x is None else x[:, :T1]

    forms = {k: dataclasses.replace(f, token=cut(f.token)) for k, f in ops.forms.items()}
    return dataclasses.replace(ops, a=cut(ops.a), b=cut(ops.b), c=cut(ops.c), g=cut(ops.g), reads=[(cut(q), p) for q, p in ops.reads],
                               forms=forms, cu_seqlens=None, c_before=cut(ops.c_before))  # fmt: skip


def _query(ops: ScanOperands, i: int, dtype: torch.dtype) -> torch.Tensor:
    """Read i's query as the scan uses it (its form, a kernel's l2norm or per-token factor, and per-head factor
    applied), in `dtype`."""
    q = ops.reads[i][0].to(dtype)
    form = ops.forms.get(f"q{i}")
    if form is not None:
        q = form.finish(q)
    factor = ops.query_factors[i]
    return q if factor is None else q * factor.to(dtype).unsqueeze(-1)


def _transition(impl, ops: ScanOperands, rows: int) -> _Transition:
    """The first piece's transition and reads' parts (ops: the first piece, see _first_piece)."""
    side, dtype = _side(ops), ops.h0.dtype
    if side == "matrix":  # the scan itself, from the identity state with zero values
        K = ops.h0.shape[2]
        eye = torch.eye(K, dtype=dtype, device=ops.h0.device).expand(rows, ops.h0.shape[1], K, K)
        outs, M = impl(dataclasses.replace(ops, b=ops.b.new_zeros(*ops.b.shape[:3], K), h0=eye, z0=None))[:2]
        return _Transition(side, M, outs)
    queries = [_query(ops, i, dtype) for i in range(len(ops.reads))]
    if ops.g is None:  # no decay
        return _Transition(side, ops.h0.new_ones(rows, ops.h0.shape[1], 1, 1), queries)
    g = ops.g.to(dtype)
    total = torch.exp(g.sum(1))  # [B, H, D]
    inclusive = g.cumsum(1)
    exclusive = F.pad(g[:, :-1], (0, 0, 0, 0, 1, 0)).cumsum(1)  # summed directly, not as a difference
    reads = []
    for q, (_, position) in zip(queries, ops.reads):
        decay = torch.exp(inclusive if POSITIONS[position][0] else exclusive)
        reads.append((q, decay) if side == "value" else q * decay)
    return _Transition(side, total.unsqueeze(-2) if side == "value" else total.unsqueeze(-1), reads)


def scan(impl, shard: Shard, ops: ScanOperands):
    """impl(ops) (a scan implementation: ScanOperands -> (reads, final state[, normaliser reads, final])) over this
    rank's slice, composed with the ranks before it: the same reads and final states as one process would give
    (the final states of the whole sequences, on every rank)."""
    # its pieces are cut by rows; the reads are divided by the normaliser's once composed (ScanOperands.divide)
    divide, ops = ops.divide, dataclasses.replace(ops.per_row(), divide=None)
    result = impl(ops)
    outs, S = result[0], result[1]
    normal = len(result) > 2
    if normal:  # the normaliser rides along as one more value column
        outs = [torch.cat([o, oz.unsqueeze(-1).to(o.dtype)], -1) for o, oz in zip(outs, result[2])]
        S = torch.cat([S, result[3].unsqueeze(-1).to(S.dtype)], -1)
    side, rows, shape = _side(ops), shard.rows, _transition_shape(ops, shard.rows, S.shape[-1])
    mine = shard.continues[shard.rank]
    # the first piece's steps: its tokens, times the sub-steps of each (runtime.substeps runs n writes per token as n)
    T1 = shard.pieces[1] * (ops.a.shape[1] // shard.lengths[shard.rank])
    trans = _transition(impl, _first_piece(ops, T1), rows) if mine else None
    A = trans.A.to(S.dtype).expand(shape) if mine else S.new_zeros(shape)
    last = S if shard.cu is None else S[-1:]  # what this rank passes on from a zero state: its last piece's final state
    split = A[0].numel()
    everyone = shard.collectives.gather(torch.cat([A.reshape(rows, -1), last.reshape(rows, -1)], 1))  # [world, rows, ..]
    As = [x[:, :split].reshape(shape) for x in everyone]
    Bs = [x[:, split:].reshape(last.shape) for x in everyone]
    if mine:
        incoming = _carry(side, shard, As, Bs, shard.rank)
        outs = [torch.cat([o[:, :T1] + trans.contribution(i, incoming).to(o.dtype), o[:, T1:]], 1) for i, o in enumerate(outs)]
        first = _apply(side, A, incoming) + S[:rows]
        S = first if shard.cu is None else torch.cat([first, S[1:]], 0)
    finals = _finals(side, shard, S, As, Bs)
    if not normal:
        return outs, finals
    reads, normaliser = [o[..., :-1] for o in outs], [o[..., -1] for o in outs]
    if divide is not None:
        reads = divided_reads(reads, normaliser, divide)
    return reads, finals[..., :-1], normaliser, finals[..., -1]


def _carry(side: str, shard: Shard, As: list, Bs: list, upto: int) -> torch.Tensor:
    """The state entering rank `upto` (leaving rank upto - 1), composed from every rank's (A, B) in rank order."""
    state = torch.zeros_like(Bs[0])
    for q in range(upto):
        state = _apply(side, As[q], state) + Bs[q] if shard.passes[q] else Bs[q]
    return state


def _finals(side: str, shard: Shard, S: torch.Tensor, As: list, Bs: list) -> torch.Tensor:
    """The final states of all sequences [N, H, K, W] on every rank: unpacked, the state leaving the last rank;
    packed, each sequence's from the rank holding its last token, summed over the group (when asked for)."""
    if shard.cu is None:
        return _carry(side, shard, As, Bs, shard.world)
    if not shard.final:
        return S.new_zeros(shard.sequences_total, *S.shape[1:])  # not returned
    ends = [i for i, e in enumerate(shard.ends) if e]
    where = torch.tensor([shard.sequences[i] for i in ends], dtype=torch.int64, device=S.device)
    return shard.collectives.sum(S.new_zeros(shard.sequences_total, *S.shape[1:]).index_copy(0, where, S[ends]))


# ---- statistics ----
def _moments(x: torch.Tensor, groups: tuple[str, ...]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(count, mean, sum of squared deviations) of x [B, T, H, n] per group, each [B|1, H|1], in a wide dtype."""
    B, T, H, n = x.shape
    wide = torch.float64 if x.dtype == torch.float64 else torch.float32
    axes = (1,) + (() if "batch" in groups else (0,)) + (() if "head" in groups else (2,))
    shape = (B if "batch" in groups else 1, H if "head" in groups else 1)
    mean = x.mean(-1, dtype=wide)  # each token's
    squares = (x - mean.unsqueeze(-1)).square().sum(-1, dtype=wide)
    count = torch.full(shape, float(n * T * (1 if "batch" in groups else B) * (1 if "head" in groups else H)), dtype=wide, device=x.device)
    if T == 0:
        return count, torch.zeros(shape, dtype=wide, device=x.device), torch.zeros(shape, dtype=wide, device=x.device)
    overall = mean.mean(axes, keepdim=True)
    m2 = squares.sum(axes) + n * (mean - overall).square().sum(axes)
    return count, overall.reshape(shape), m2.reshape(shape)


def _extremes(x: torch.Tensor, fn: str, groups: tuple[str, ...]) -> torch.Tensor:
    B, T, H, _ = x.shape
    axes = (1,) + (() if "batch" in groups else (0,)) + (() if "head" in groups else (2,))
    shape = (B if "batch" in groups else 1, H if "head" in groups else 1)
    if T == 0:
        return torch.full(shape, float("-inf") if fn == "max" else float("inf"), dtype=x.dtype, device=x.device)
    part = x.amax(-1) if fn == "max" else x.amin(-1)
    return (part.amax(axes) if fn == "max" else part.amin(axes)).reshape(shape)


def _combine(parts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every rank's (count, mean, squared deviations), [world, 3, ...], combined in rank order (Chan et al.)."""
    count, mean, m2 = parts[0].unbind(0)
    for c, m, s in (p.unbind(0) for p in parts[1:]):
        total = count + c
        share = torch.where(total > 0, c / total.clamp_min(1), 0.0)
        delta = m - mean
        mean, m2, count = mean + delta * share, m2 + s + delta.square() * count * share, total
    return count, mean, m2


def statistic(call, name: str, fn: str, x: torch.Tensor, groups: tuple[str, ...]) -> torch.Tensor:
    """runtime.carry.statistic for a slice of the group's sequences: a given value as there, else the statistic over
    every rank's tokens, the same on every rank: [B|1, 1, H|1], or [1, T, H|1] per packed sequence (each token
    its own sequence's)."""
    shard: Shard = call.context_parallel
    B, T, H = x.shape[:3]
    per_sequence = call.cu_seqlens is not None and "batch" in groups
    lengths = torch.tensor([e - s for s, e in zip(shard.pieces, shard.pieces[1:])], device=x.device)
    given = None if call.stats is None else call.stats.get(name)
    if given is not None:
        if not (per_sequence and given.dim() > (1 if "head" in groups else 0)):
            return carry_statistic(call, name, fn, x, groups)
        return given.reshape(-1, given.shape[-1] if "head" in groups else 1)[shard.sequences].repeat_interleave(lengths, 0).unsqueeze(0)
    if fn not in ("max", "min", "mean", "var", "std"):
        raise LamixerError(f"statistic {name}: {fn} has no reduction across the ranks of a context-parallel group")
    x = x.detach().reshape(B, T, H, -1)
    pieces = [x[:, s:e] for s, e in zip(shard.pieces, shard.pieces[1:])] if per_sequence else [x]

    def place(values: list[torch.Tensor], fill: float) -> torch.Tensor:  # per piece -> per sequence of the group
        if not per_sequence:
            return values[0]
        out = torch.full((shard.sequences_total, *values[0].shape[1:]), fill, dtype=values[0].dtype, device=x.device)
        return out.index_copy(0, torch.tensor(shard.sequences, device=x.device), torch.cat(values, 0))

    if fn in ("max", "min"):
        everyone = gather_plain(place([_extremes(p, fn, groups) for p in pieces], float("-inf") if fn == "max" else float("inf")), shard.group)
        value = everyone.amax(0) if fn == "max" else everyone.amin(0)
    else:
        local = place([torch.stack(_moments(p, groups), 1) for p in pieces], 0.0)  # [rows, 3, H|1]
        count, mean, m2 = _combine(gather_plain(local, shard.group).transpose(1, 2))
        value = mean if fn == "mean" else m2 / (count - 1) if fn == "var" else (m2 / (count - 1)).sqrt()
        value = value.to(x.dtype)
    if not per_sequence:
        return value.unsqueeze(1)
    return value[shard.sequences].repeat_interleave(lengths, 0).unsqueeze(0)


def extras(call, windows: list, stats: list[tuple[torch.Tensor, tuple[str, ...]]]) -> list[torch.Tensor]:
    """runtime.carry.extras for a slice of the group's sequences: a statistic per packed sequence is reported for
    every sequence of the group, [N, H|1 ...] (each from the rank holding its first token), as one process would."""
    shard: Shard = call.context_parallel
    if call.cu_seqlens is None or not call.output_stats:
        return carry_extras(call, windows, stats)
    out = []
    for value, groups in stats:
        if "batch" not in groups or value.shape[1] == 1:  # one value for every sequence
            out += carry_extras(dataclasses.replace(call, output_window=False), [], [(value, groups)])
            continue
        firsts = value[0, call.cu_seqlens[:-1]]  # each piece's first token holds its sequence's value
        own = [i for i in range(len(shard.sequences)) if i > 0 or not shard.continues[shard.rank]]
        index = torch.tensor([shard.sequences[i] for i in own], dtype=torch.int64, device=value.device)
        mine = firsts.new_zeros(shard.sequences_total, *firsts.shape[1:]).index_copy(0, index, firsts[own])
        dist.all_reduce(mine, group=shard.group)
        out.append(mine if "head" in groups else mine.reshape(-1))
    return out


# ---- block attention ----
def block_attention(call, index: int, q, k, v, scale, size: int, dtype: torch.dtype | None, kernel=None,
                    residual: torch.Tensor | None = None, weight: float = 1.0) -> tuple[torch.Tensor, None]:  # fmt: skip
    """runtime.carry.block_attention for a slice of the group's sequences (which takes no window and returns none):
    (o for this rank's queries, None); the epilogue after the rows borrowed from the rank before are dropped."""
    shard: Shard = call.context_parallel
    reach = [(shard.offsets[r] - shard.starts[r]) % size if shard.continues[r] else 0 for r in range(shard.world)]
    width = max(reach)
    if width == 0:  # every rank starts a block
        return local_block_attention(q, k, v, scale, size, call.cu_seqlens, dtype, kernel, residual, weight), None
    p = reach[shard.rank]
    k = torch.cat([shard.before(k, width)[:, width - p :], k], 1)
    v = torch.cat([shard.before(v, width)[:, width - p :], v], 1)
    q = torch.cat([q.new_zeros(q.shape[0], p, *q.shape[2:]), q], 1)  # rows dropped below
    cu = None if call.cu_seqlens is None else torch.cat([call.cu_seqlens[:1], call.cu_seqlens[1:] + p])
    return epilogue(local_block_attention(q, k, v, scale, size, cu, dtype, kernel)[:, p:], residual, weight), None
