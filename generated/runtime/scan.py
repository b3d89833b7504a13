"""Chunkwise scans, block attention and whole-input statistics: the non-local parts of a mixer.

Each state is one chunked scan of S_t = D_t S_{t-1} + a_t (b_t + S'^T c_t)^T with the decay D_t
along the key dim (scalar decay is its one-column case) or along the value dim. Within a chunk,
with B_t the cumulative log decay:
  additive  U = b
  delta     (I - tril(M, -1)) U = b + (c e^B) S_0,  M_ij = sum_k c_ik a_jk e^(B_ik - B_jk)
  reads     o_i = (q_i e^(Bq_i)) S_0 + sum_j sum_k q_ik a_jk e^(Bq_ik - B_jk) U_j   (j <= i, or j < i)
  state     S_C = e^(B_C) S_0 + (a e^(B_C - B))^T U
Every exponent is a sum of log decays over a segment of ordered positions, summed directly (never
as a difference of prefix sums), so it never overflows for decays <= 1 and its gradient does not
cancel under strong decay. Differentiable by autograd.

Packed sequences (cu_seqlens: B = 1, sequence n at tokens cu[n]:cu[n + 1]) share the per-token work;
the functions here are the ones that see their boundaries.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import math
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F

from . import ops, recompute


def _pad_chunks(x: torch.Tensor, C: int) -> torch.Tensor:
    """[B, H, T, D] -> [B, H, N, C, D], zero-padded at the end (a zero token leaves a state unchanged)."""
    T = x.shape[2]
    N = -(-T // C)
    x = F.pad(x, (0, 0, 0, N * C - T))
    return x.reshape(*x.shape[:2], N, C, x.shape[-1])


def _segsum(g: torch.Tensor) -> torch.Tensor:
    """seg[.., i, j, :] = sum of g over j < s <= i (for j <= i), built without differences of prefix sums.

    A difference of cumulative sums would cancel: under strong decay the gradient of a small
    segment would be the rounding noise of two large ones.
    """
    C = g.shape[-2]
    after_j = torch.ones(C, C, dtype=torch.bool, device=g.device).triu(1)  # [j, s]: s > j
    x = torch.where(after_j.unsqueeze(-1), g.unsqueeze(-3), torch.zeros((), dtype=g.dtype, device=g.device))
    return x.cumsum(-2).transpose(-2, -3)  # [.., i, j, :]


def _decay_exp(x: torch.Tensor) -> torch.Tensor:
    """exp of a (non-positive) log decay, flushed to 0 below the smallest normal number.

    Learned gates forget hard; their decays would otherwise be subnormal floats, which CPUs multiply
    tens of times slower (a GLA layer trained 6x slower) for a contribution below 1e-38.
    """
    floor = math.log(torch.finfo(x.dtype).tiny)
    return torch.exp(torch.where(x < floor, torch.full_like(x, float("-inf")), x))


def _suffix(g: torch.Tensor) -> torch.Tensor:
    """sum of g over s > j within the chunk, as [.., C, D]."""
    return F.pad(g[..., 1:, :], (0, 0, 0, 1)).flip(-2).cumsum(-2).flip(-2)


def _decay_weights(seg: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """exp of the segment sums where mask (over [i, j]) holds, else 0."""
    mask = mask.unsqueeze(-1)
    return _decay_exp(torch.where(mask, seg, torch.full_like(seg, float("-inf"))))


def _pair(x: torch.Tensor, a: torch.Tensor, w: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """sum_k x_ik a_jk w_ijk over [.., C, C] where mask (over [i, j]) holds, else 0; w has one column (scalar decay) or
    K. Selected, not multiplied by a zero weight: a later token's NaN or inf key would make 0 * inf = NaN of it."""
    if w.shape[-1] == 1:
        pairs = (x @ a.transpose(-1, -2)) * w.squeeze(-1)
    else:
        pairs = torch.einsum("...ik,...jk,...ijk->...ij", x, a, w)
    return torch.where(mask, pairs, 0.0)


def _causal(contract, U: torch.Tensor, strict: bool) -> torch.Tensor:
    """contract(U) for a contraction over a chunk's tokens j of weights that are 0 for j > i (j >= i when strict), made
    causal for non-finite values: a matrix product would multiply a later token's inf or NaN by its zero weight and
    give earlier outputs NaN. So the contraction sees the finite values only, and an output (per value column) at or
    after a non-finite one is NaN, as the token by token recurrence makes it. Finite inputs: the same values and
    gradients."""
    out = contract(torch.nan_to_num(U, 0.0, 0.0, 0.0))
    bad = (~torch.isfinite(U)).to(U.dtype)
    seen = bad.cumsum(-2)  # how many non-finite values at tokens <= i (exact: a chunk is far below 2^24)
    return torch.where((seen - bad if strict else seen) > 0, float("nan"), out)


def chunk_scan(a, b, c, gk, gv, reads, h0, C, c_before=None):
    """One state's scan over [B, H, T, *] tensors; returns ([o per read, [B, H, T, V]], final state [B, H, K, V]).

    a, c: [B, H, T, K] write and erase keys (c None: additive); b: [B, H, T, V]; c_before: [B, H, T, 1] bool, True
    where the erase reads the state before its token's decay (the generalized delta rule), else it reads it after;
    gk: [B, H, T, 1 or K] log decay on the key side, or gv: [B, H, T, V] on the value side;
    reads: [(q [B, H, T, K], decayed, written)]; h0: [B, H, K, V].
    """
    T = a.shape[2]
    dev, dt = a.device, a.dtype
    ar = torch.arange(C, device=dev)
    incl, strict = ar[:, None] >= ar[None, :], ar[:, None] > ar[None, :]
    a, b = _pad_chunks(a, C), _pad_chunks(b, C)
    qs = [(_pad_chunks(q, C), dec, wr) for q, dec, wr in reads]
    g = _pad_chunks(gk if gv is None else gv, C)
    Bc = g.cumsum(-2)  # decay from the chunk start through token i: [B, H, N, C, D]
    # ... up to token i, exclusive: summed itself, not Bc - g, whose gradient at a chunk's first token is the difference of
    # two O(1) terms (its read of the entering state, undecayed) when the true value is as small as the decays after it
    Bx = F.pad(g[..., :-1, :], (0, 0, 1, 0)).cumsum(-2)
    seg = _segsum(g)  # decay between a write at j and a read at i: [B, H, N, C, C, D]
    seg_x = F.pad(seg[..., :-1, :, :], (0, 0, 0, 0, 1, 0))  # the same, excluding token i itself
    last = Bc[..., -1:, :]  # the whole chunk's decay: [B, H, N, 1, D]
    to_end = _decay_exp(_suffix(g))  # decay from a write at j to the chunk's end
    read_parts = []
    for q, dec, wr in qs:
        mask = incl if wr else strict
        read_parts.append((q, _decay_exp(Bc if dec else Bx), _decay_weights(seg if dec else seg_x, mask), mask, not wr))
    decay_all = _decay_exp(last)  # [B, H, N, 1, D]
    if gv is None:
        a_end = a * to_end
        if c is None:
            U = b
            delta_S = a_end.transpose(-1, -2) @ U  # each chunk's contribution to the state: [B, H, N, K, V]
            S, starts = h0, []
            for n in range(a.shape[2]):  # the only sequential part: one fused multiply-add per chunk
                starts.append(S)
                S = torch.addcmul(delta_S[:, :, n], decay_all[:, :, n].transpose(-1, -2), S)
        else:
            c = _pad_chunks(c, C)
            seg_c, Bc_c = seg, Bc
            if c_before is not None:  # the erase at i then sees the decays through token i - 1 only
                m = _pad_chunks(c_before.to(dt), C) > 0  # [B, H, N, C, 1]
                seg_c, Bc_c = torch.where(m.unsqueeze(-2), seg_x, seg), torch.where(m, Bx, Bc)
            L = torch.eye(C, dtype=dt, device=dev) - _pair(c, a, _decay_weights(seg_c, strict), strict)
            rhs = torch.cat([b, c * _decay_exp(Bc_c)], -1)
            sol = torch.linalg.solve_triangular(L, rhs, upper=False, unitriangular=True)
            U0, W = sol[..., : b.shape[-1]], sol[..., b.shape[-1] :]  # U = U0 + W S_0
            S, starts, Us = h0, [], []
            for n in range(a.shape[2]):
                starts.append(S)
                Us.append(torch.baddbmm(U0[:, :, n].flatten(0, 1), W[:, :, n].flatten(0, 1), S.flatten(0, 1)).view_as(U0[:, :, n]))
                S = decay_all[:, :, n].transpose(-1, -2) * S + a_end[:, :, n].transpose(-1, -2) @ Us[-1]
            U = torch.stack(Us, 2)
        S0 = torch.stack(starts, 2)  # the state entering each chunk: [B, H, N, K, V]
        outs = [(q * eq) @ S0 + _causal(_pair(q, a, w, mask).matmul, U, before) for q, eq, w, mask, before in read_parts]
    else:
        delta_S = a.transpose(-1, -2) @ (b * to_end)
        S, starts = h0, []
        for n in range(a.shape[2]):
            starts.append(S)
            S = torch.addcmul(delta_S[:, :, n], decay_all[:, :, n], S)
        S0 = torch.stack(starts, 2)
        outs = [(q @ S0) * eq + _causal(functools.partial(torch.einsum, "...ij,...ijv,...jv->...iv", torch.where(mask, q @ a.transpose(-1, -2), 0.0), w),
                                        b, before) for q, eq, w, mask, before in read_parts]  # fmt: skip
    return [o.flatten(2, 3)[:, :, :T] for o in outs], S




def _block_attention(q, k, v, size: int, scale: float) -> torch.Tensor:
    """Causal softmax attention (scores times `scale`) within blocks of `size` tokens of one sequence: [B, T, H, D] ->
    [B, T, H, Dv]. Each block is one batch row of torch's scaled_dot_product_attention (a fused kernel on a GPU: no
    scores kept)."""
    B, T, H, _ = q.shape
    size = min(size, T)  # blocks start at the first token: a block longer than the sequence is the sequence
    nb = -(-T // size)

    def blocks(x):  # [B * nb, H, size, D], a view where no padding is needed
        x = F.pad(x, (0, 0, 0, 0, 0, nb * size - T)) if nb * size != T else x
        return x.reshape(B * nb, size, H, x.shape[-1]).transpose(1, 2)

    # a later token's NaN or inf key or value would reach earlier rows through their masked scores (0 * inf): the
    # attention sees finite keys and values only, and a row at or after a non-finite one is NaN, as it is token by token
    k, v = blocks(k), blocks(v)
    bad_k, bad_v = ~torch.isfinite(k).all(-1, keepdim=True), ~torch.isfinite(v)
    k, v = torch.where(bad_k, 0.0, k), torch.where(bad_v, 0.0, v)
    out = F.scaled_dot_product_attention(blocks(q), k, v, is_causal=True, scale=scale)  # [B * nb, H, size, Dv]
    bad = bad_k | bad_v  # [B * nb, H, size, Dv]
    # each column's first non-finite row, as a row index (size where none): the rows from it on are NaN (a float32
    # cumulative count of the bad rows would hold two float32 tensors of the output's shape, this one byte tensor)
    first = torch.where(bad.any(-2, keepdim=True), bad.to(torch.uint8).argmax(-2, keepdim=True), bad.shape[-2])
    seen = torch.arange(bad.shape[-2], device=bad.device).unsqueeze(-1) >= first
    out = torch.where(seen, float("nan"), out)
    return out.transpose(1, 2).reshape(B, nb * size, H, -1)[:, :T]


# True where a scan may write each final state over its initial state: the recurrent kernel does, so a caller's own
# float32, contiguous state is updated in place (Layer.decoder's CUDA graph holds its state so, with no copy back per
# step). Each program of the kernel reads its block of the state before it writes it.
STATES_IN_PLACE = contextvars.ContextVar("lamixer_states_in_place", default=False)


@contextlib.contextmanager
def states_in_place(on: bool = True):
    """Within it, STATES_IN_PLACE is `on`."""
    token = STATES_IN_PLACE.set(on)
    try:
        yield
    finally:
        STATES_IN_PLACE.reset(token)


@dataclass(frozen=True)
class KeyForm:
    """What a kernel does to a key-side operand it reads from the caller's input x before using it (the recurrent
    kernel's, which holds whole key rows): factor_h * token_t * (l2norm(x) if norm else x)."""

    norm: bool = False  # x / max(||x||, 1e-12) over the key dim
    token: torch.Tensor | None = None  # a per-token scalar [B, T, H] (any strides)
    factor: torch.Tensor | None = None  # a per-head factor [H]

    def finish(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, T, H, K] as the kernel uses it, made in torch."""
        if self.norm:
            x = ops.normalize("l2norm", x)
        if self.token is not None:
            x = x * self.token.to(x.dtype).unsqueeze(-1)
        return x if self.factor is None else x * self.factor.to(x.dtype).view(-1, 1)


# a read's position in the token's update (the kernel plan names them): (sees the decay, sees the write)
POSITIONS = {"before": (False, False), "mid": (True, False), "after": (True, True)}


@dataclass
class ScanOperands:
    """One state's scan, every per-token operand as [B, T, H, D] (D = 1 for a scalar)."""

    a: torch.Tensor | None  # write key [.., K]; None where `strength` gives it
    b: torch.Tensor  # write value [.., V]
    c: torch.Tensor | None  # erase key [.., K] (delta rule), None for additive
    g: torch.Tensor | None  # log decay [.., 1] (scalar), [.., K] (key) or [.., V] (value); None without a decay
    decay: str  # the kernel plan's decay kind: "none" | "scalar" | "key" | "value"
    reads: list[tuple[torch.Tensor, str]]  # (query [.., K], position: POSITIONS)
    query_factors: list[torch.Tensor | None]  # per-head factors [H] the kernel applies to direct queries
    h0: torch.Tensor  # [N, H, K, V]
    cu_seqlens: torch.Tensor | None
    chunk: int
    # KeyForms of a ("a"), c ("c") and the queries ("q0", ..: norm only; their factors are query_factors), when the
    # scan's implementation finishes them (the recurrent kernel's; no others are given any)
    forms: dict[str, KeyForm] = field(default_factory=dict)
    # a normaliser's initial state [N, H, K]: a vector state written with the same keys, decay and queries, which the
    # implementation carries itself (the chunk kernels' `ones`); it then returns (reads, final state, the normaliser's
    # reads, its final state)
    z0: torch.Tensor | None = None
    # [B, T, H, 1] bool: where the erase reads the state before its token's decay (lamixer.runtime.substeps). The torch
    # scan reads it per token; the kernels take it as one flag for the scan (every erase reads before its token's
    # decay), which the kernel plan makes exact for the scans it gives them (kernel_plan._erase_flag)
    c_before: torch.Tensor | None = None
    # a hint (lamixer.runtime.substeps): each token is this many sub-tokens of the scan, and read i is used at each
    # token's sub-token read_steps[i] only; an implementation may compute those rows alone and leave the other rows of
    # that read's output unwritten (the delta rule's output kernel does), or compute every row
    sub_steps: int = 1
    read_steps: tuple[int, ...] = ()
    # the reads' queries one row per token, each for its token's sub_steps rows (lamixer.runtime.substeps), rather than
    # one per row: an implementation takes them so (the delta rule's chunk kernels) or calls per_row() first
    reads_per_token: bool = False
    # [.., 1]: the write key is -strength * c (the kernel plan's ScanGroup.strengths), a is None: an implementation takes
    # it so (the delta rule's chunk kernels, which scale their products by -strength) or calls per_row() first
    strength: torch.Tensor | None = None
    # the sub-step of each token whose decay g is (lamixer.runtime.substeps), g then a row per token and every other
    # sub-step's log decay 0; None: g a row per row. An implementation takes it so (the delta rule's chunk kernels under
    # a per-key decay, the one whose rows are wide) or calls per_row() / sub_token_decays() first
    decay_step: int | None = None
    # with z0: the reads returned divided by (the normaliser's reads + divide) (the kernel plan's ScanGroup.divide),
    # the normaliser's reads as they are; None: the reads as they are
    divide: float | None = None

    @property
    def positions(self) -> str:
        """The reads' positions joined by "_" (as the recurrent template takes them)."""
        return "_".join(p for _, p in self.reads)

    def per_row(self) -> ScanOperands:
        """These operands with every one a row per row of the scan: the queries, the log decays and the write keys
        made where they come in a compact form (what an implementation that takes none of those forms calls first)."""
        return self.sub_token_reads().sub_token_decays().with_write_keys()

    def sub_token_decays(self) -> ScanOperands:
        """These operands with a log decay row per sub-token: the token's at its decay_step, 0 at the others."""
        if self.decay_step is None:
            return self
        zero = torch.zeros_like(self.g)
        g = torch.stack([self.g if j == self.decay_step else zero for j in range(self.sub_steps)], 2)
        return replace(self, g=g.reshape(g.shape[0], -1, *g.shape[3:]), decay_step=None)

    def with_write_keys(self) -> ScanOperands:
        """These operands with the write keys a = -strength c made, where a strength gives them."""
        if self.strength is None:
            return self
        made = self.with_erase_keys()  # the write keys are made from the erase keys as the scan uses them
        return replace(made, a=-made.strength * made.c, strength=None)

    def with_erase_keys(self) -> ScanOperands:
        """These operands with the erase keys finished in torch where they have a form (runtime.scan.KeyForm)."""
        if "c" not in self.forms:
            return self
        forms = {k: f for k, f in self.forms.items() if k != "c"}
        return replace(self, c=self.forms["c"].finish(self.c), forms=forms)

    def sub_token_reads(self) -> ScanOperands:
        """These operands with a query row per sub-token: each token's copied to its sub_steps rows."""
        if not self.reads_per_token:
            return self
        return replace(self, reads=[(sub_token_rows(q, self.sub_steps), p) for q, p in self.reads], reads_per_token=False)


def sub_token_rows(x: torch.Tensor, n: int) -> torch.Tensor:
    """[B, T, ..] -> [B, T * n, ..]: each token's row copied to its n sub-tokens' rows, contiguous (a reshape of an
    expand would be a view with stride 0 along the rows where T = 1)."""
    return x.repeat_interleave(n, dim=1)


def torch_scan(ops: ScanOperands) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The chunked scan in PyTorch, one sequence at a time when packed: ([o per read], final state)."""
    ops = ops.per_row()
    a = ops.a
    g = ops.g if ops.g is not None else a.new_zeros(*a.shape[:3], 1)
    modes = [POSITIONS[p] for _, p in ops.reads]

    def one(h0, a, b, c, g, before, *qs):
        t = [x.transpose(1, 2) for x in (a, b, c, g, before, *qs)]  # -> [B, H, T, D]
        reads = [(q, dec, wr) for q, (dec, wr) in zip(t[5:], modes)]
        gk, gv = (None, t[3]) if ops.decay == "value" else (t[3], None)
        return chunk_scan(t[0], t[1], t[2] if ops.c is not None else None, gk, gv, reads, h0, ops.chunk,
                          t[4] if ops.c_before is not None else None)  # fmt: skip

    c = ops.c if ops.c is not None else a
    before = ops.c_before if ops.c_before is not None else a
    qs = [q for q, _ in ops.reads]
    if ops.cu_seqlens is None:
        results = [one(ops.h0, a, ops.b, c, g, before, *qs)]
    else:
        cu = ops.cu_seqlens.tolist()
        results = [one(ops.h0[i : i + 1], *(x[:, s:e] for x in (a, ops.b, c, g, before, *qs))) for i, (s, e) in enumerate(zip(cu[:-1], cu[1:]))]
    outs = [torch.cat([r[0][i] for r in results], 2).transpose(1, 2) for i in range(len(qs))]
    return outs, torch.cat([r[1] for r in results], 0)


def _operand(x, B: int, T: int, H: int, width: int | None = None):
    """A scan operand as [B, T, H, width] (width None: its own last axis; a scalar is one column), as it is when it already is."""
    if x is None:
        return None
    shape = x.shape
    if len(shape) == 3:
        x = x.unsqueeze(-1)
        shape = x.shape
    if shape[0] == B and shape[1] == T and shape[2] == H and (width is None or shape[3] == width):
        return x
    return x.expand(B, T, H, shape[3] if width is None else width)


def scan_group(scan, shape, key, values, erase, log_decay, decay, reads, h0, cu_seqlens, chunk, query_factors=None, forms=None,
               normaliser=False, strength=None, divide=None):  # fmt: skip
    """Run one state's scan, or one scan for several states that share key, decay and queries (their values side by side).

    shape is (B, T, H); every operand has three leading axes that broadcast to it, then its dims (none for a scalar,
    which counts as one column): key and erase [.., K]; values [.., V] per state (None for a vector state, written
    with b = 1); log_decay [.., 1 or K] on the key side, [.., V] on the value side, or None; decay its kind (the kernel
    plan's: "none", "scalar", "key" or "value"); reads [(query [.., K], position)]; h0 the initial states, [N, H, K, V]
    (or [N, H, K] for a vector state). `scan` runs the ScanOperands (torch_scan, or generated kernels); query_factors
    are per-head factors [H] it applies to the queries (None: none), forms the KeyForms it applies
    (ScanOperands.forms); normaliser: `scan` carries the group's one vector state itself (ScanOperands.z0), else it is
    one more value column of ones; strength: the write key is -strength * erase (a scalar with three leading axes;
    key is then None: ScanOperands.strength); divide: the one matrix state's reads are returned divided by (the vector
    state's reads + divide) (the kernel plan's ScanGroup.divide), by `scan` where it carries the normaliser, else
    here. Returns each state's read outputs ([B, T, H, V], or [B, T, H]) and final states ([N, H, K, V], or [N, H, K]).
    """
    B, T, H = shape
    K = h0[0].shape[2]
    a = _operand(key, B, T, H, K)
    c = _operand(erase, B, T, H, K)
    like = a if a is not None else c
    # a vector state beside matrix states rides along as the scan's normaliser when the implementation takes one
    vectors = [i for i, v in enumerate(values) if v is None]
    normaliser = vectors[0] if normaliser and len(vectors) == 1 and len(values) > 1 else None
    divided = divide is not None and normaliser is not None  # by `scan`
    order = [i for i in range(len(values)) if i != normaliser]  # side by side, in this order
    if len(order) == 1:  # the common case: one state, nothing to concatenate
        (i,) = order
        b = like.new_ones(B, T, H, 1) if values[i] is None else _operand(values[i], B, T, H, h0[i].shape[3])
        h = h0[i].unsqueeze(-1) if values[i] is None else h0[i]
    else:
        b = torch.cat([like.new_ones(B, T, H, 1) if values[i] is None else _operand(values[i], B, T, H, h0[i].shape[3]) for i in order], -1)
        h = torch.cat([h0[i].unsqueeze(-1) if values[i] is None else h0[i] for i in order], -1)
    operands = ScanOperands(
        a, b, c, _operand(log_decay, B, T, H), decay,
        [(_operand(q, B, T, H, K), position) for q, position in reads],
        query_factors or [None] * len(reads), h, cu_seqlens, chunk, forms or {},
        z0=h0[normaliser] if normaliser is not None else None, strength=_operand(strength, B, T, H, 1),
        divide=divide if divided else None,
    )  # fmt: skip
    outs, S, *z = scan(operands)
    read_parts, finals = [None] * len(values), [None] * len(values)
    if normaliser is not None:
        read_parts[normaliser], finals[normaliser] = z
    if len(order) == 1:  # the common case, without slicing
        (i,) = order
        read_parts[i], finals[i] = ([o.squeeze(-1) for o in outs], S.squeeze(-1)) if values[i] is None else (outs, S)
    else:
        lo = 0
        for i in order:
            width = 1 if values[i] is None else h0[i].shape[3]
            parts = [o[..., lo : lo + width] for o in outs] + [S[..., lo : lo + width]]
            parts = [p.squeeze(-1) for p in parts] if values[i] is None else parts
            read_parts[i] = parts[:-1]
            finals[i] = parts[-1]
            lo += width
    if divide is not None and not divided:
        (z,) = vectors
        (i,) = (j for j in range(len(values)) if j != z)
        read_parts[i] = divided_reads(read_parts[i], read_parts[z], divide)
    return read_parts, finals


def divided_reads(reads: list[torch.Tensor], normaliser: list[torch.Tensor], eps: float) -> list[torch.Tensor]:
    """Each read [B, T, H, V] divided by its normaliser's read [B, T, H] plus eps (ScanOperands.divide)."""
    return [o / (oz.unsqueeze(-1).to(o.dtype) + eps) for o, oz in zip(reads, normaliser)]


def per_sequence(fn, cu_seqlens, *xs: torch.Tensor) -> list:
    """fn applied to each packed sequence's slice of xs [B, T, ...] (to the whole when cu_seqlens is None)."""
    if cu_seqlens is None:
        return [fn(*xs)]
    cu = cu_seqlens.tolist()
    return [fn(*(x[:, s:e] for x in xs)) for s, e in zip(cu[:-1], cu[1:])]


def attention_dtype(call) -> torch.dtype | None:
    """The dtype block attention runs in: on a GPU with half-precision inputs, that half type (its flash kernels
    accumulate in float32), as the scans' dots read their operands in it; else None (the compute dtype)."""
    half = call.out_dtype in (torch.bfloat16, torch.float16)
    return call.out_dtype if half and call.device.type == "cuda" else None


def block_attention(q, k, v, scale, size: int, cu_seqlens=None, dtype: torch.dtype | None = None, kernel=None,
                    residual: torch.Tensor | None = None, weight: float = 1.0) -> torch.Tensor:  # fmt: skip
    """weight * (causal softmax attention within blocks of `size` tokens of every sequence + residual): [B, T, H, D]
    -> [B, T, H, Dv], computed in `dtype` when given, returned in q's (the residual's, promoted, off a kernel). A
    number `scale` goes to the attention kernel itself; a tensor one (an expression of the call) multiplies q first.
    On `kernel`, a backend's own (q, k, v, scale, size, cu_seqlens, residual, weight) -> o that keeps nothing but
    its operands and adds and scales in its store (the plan's epilogue, passes/epilogue.py), else on torch's SDPA,
    recomputed in the backward (runtime/recompute.py): kept, its masked keys and values, output and masks are
    several times q's size."""
    if kernel is not None:
        return _attend_blocks(size, cu_seqlens, dtype, kernel, q, k, v, scale, residual, weight)
    o = recompute.recomputed(functools.partial(_attend_blocks, size, cu_seqlens, dtype, None), q, k, v, scale)
    return epilogue(o, residual, weight)


def epilogue(o: torch.Tensor, residual: torch.Tensor | None, weight: float) -> torch.Tensor:
    """weight * (o + residual), as the plan folded them into a block attention (passes/epilogue.py)."""
    if residual is not None:
        o = o + residual
    return o if weight == 1.0 else o * weight


def scaled_queries(q: torch.Tensor, scale) -> tuple[torch.Tensor, float]:
    """(q, the number the attention kernel scales its scores by): a number as it is; a tensor (an expression of the
    call: one value, or one per token and head [B|1, T|1, H|1]) multiplied into q, and 1."""
    if not isinstance(scale, torch.Tensor):
        return q, float(scale)
    s = scale.to(q.dtype)
    return q * (s if s.dim() == 0 else s.unsqueeze(-1)), 1.0


def _attend_blocks(size: int, cu_seqlens, dtype: torch.dtype | None, kernel, q, k, v, scale, residual=None, weight=1.0) -> torch.Tensor:
    out = q.dtype
    q, scale = scaled_queries(q, scale)
    if dtype is not None:
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    if kernel is not None:
        r = None if residual is None else residual.to(q.dtype).expand(*q.shape[:3], v.shape[-1])
        return kernel(q, k, v, float(scale), size, cu_seqlens, r, weight).to(out)
    return torch.cat(per_sequence(lambda *x: _block_attention(*x, size, float(scale)), cu_seqlens, q, k, v), 1).to(out)


def stat(fn: str, x: torch.Tensor, groups: tuple[str, ...], cu_seqlens=None) -> torch.Tensor:
    """A whole-input statistic of x [B, T, H, *dims] (stop-gradient) as [B|1, 1, H|1]; grouped by batch with packed
    sequences, [1, T, H|1]: every token sees its own sequence's value (each packed sequence is a batch row)."""
    if cu_seqlens is not None and "batch" in groups:
        vals = per_sequence(lambda xs: ops.stat(fn, xs, groups).unsqueeze(1).expand(-1, xs.shape[1], -1), cu_seqlens, x)
        return torch.cat(vals, 1)
    return ops.stat(fn, x, groups).unsqueeze(1)
