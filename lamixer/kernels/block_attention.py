"""Block attention on Triton: causal softmax attention within blocks of `size` tokens counted from each sequence's
start, forward and backward, as runtime/scan.py's block_attention computes it on torch's SDPA.

What it saves against SDPA there: a non-finite key or value must reach only its own and later rows of its block, and
the masked scores of earlier rows would carry it (0 * inf). SDPA needs the caller's keys and values copied with those
entries zeroed (two passes, and the copies kept for its backward) and the rows from them on made NaN after it (a third
pass). Here the forward uses each tile as loaded, and each row checks once, at the end of its pass, whether it met a
non-finite entry (its product row then holds one, or its least score is -inf); a tile where one did runs again in the
same program, after its stores, the values zeroed where not finite and the rows and columns they reach made NaN (a dot
of the causal mask against the bad entries). One launch does both; the rerun is a function of its own (noinline),
as inlined it made the whole kernel spill (sm_90, bf16, with a residual: 788 bytes, against 4 for the first pass
alone). The gradient kernels zero non-finite keys and values as they load them: a row before one takes none of it,
the rows at and after it are NaN already. The backward keeps q, k and v alone and runs the forward again for o and
each row's log-sum-exp: kept, o would be live beside the scans' gradients at a mixer's forward+backward peak (lln's:
3504 against 4126 bytes per token x head, bench/memory.py --fused), for one more forward pass of a few percent of the
mixer's time.

An epilogue the kernel plan folds in (passes/epilogue.py): o = weight * (attention + residual), stored as the mixer's
output where that sum and factor end it, so no pass adds them and the backward takes the output's gradient as it comes
(a scaled copy of it made for this op was live at lln's peak). Every gradient is linear in do: the gradient kernels
run on do as given and scale what they store; the residual's gradient is weight * do.

One program per tile of BM query rows (forward, dq) or BN key rows (dk, dv), per head and sequence; a tile may straddle
two blocks, each row masked to its own. Packed sequences (cu_seqlens) take the tiles launch.chunks lists. The torch
backend keeps SDPA (torch only); so does a call that continues a window (runtime/carry.py).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..runtime.errors import ArgumentError
from .launch import NAMESPACE, PRECISION, cdiv, chunks, pow2, run_scan_op


@triton.jit
def _sequence(tiles, cu_seqlens, i_m, i_b, T, IS_VARLEN: tl.constexpr):
    """(tile index within its sequence, the sequence's first token, its length)."""
    if IS_VARLEN:
        i_n = tl.load(tiles + i_m * 2).to(tl.int32)
        i_t = tl.load(tiles + i_m * 2 + 1).to(tl.int32)
        bos = tl.load(cu_seqlens + i_n).to(tl.int64)
        eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
    else:
        i_t = i_m
        bos = i_b.to(tl.int64) * T
        eos = bos + T
    return i_t, bos, (eos - bos).to(tl.int32)


@triton.jit
def _rows(x, first, i_h, o_r, m_r, H: tl.constexpr, D: tl.constexpr, BD: tl.constexpr):
    """Rows first + o_r of x [.., H, D] at head i_h, masked by m_r: [BR, BD] (the base offset in int64, the rest small)."""
    o_d = tl.arange(0, BD)
    return tl.load(x + (first * H + i_h) * D + o_r[:, None] * (H * D) + o_d[None, :], mask=m_r[:, None] & (o_d[None, :] < D), other=0.0)


@triton.jit
def _put_rows(x, value, first, i_h, o_r, m_r, H: tl.constexpr, D: tl.constexpr, BD: tl.constexpr):
    """Store value [BR, BD] as rows first + o_r of x [.., H, D] at head i_h, masked by m_r (_rows' addressing)."""
    o_d = tl.arange(0, BD)
    tl.store(x + (first * H + i_h) * D + o_r[:, None] * (H * D) + o_d[None, :], value.to(x.dtype.element_ty),
             mask=m_r[:, None] & (o_d[None, :] < D))  # fmt: skip


@triton.jit
def _finite(x):
    """x with its non-finite entries zeroed (x * 0 is 0 for a finite x, NaN for the rest)."""
    return tl.where(x * 0.0 == 0.0, x, 0.0).to(x.dtype)


@triton.jit
def _seen(rows, cols, L, size):
    """[rows, cols]: where a query row attends a key row (both relative to the sequence): at or before it, in its block."""
    start = (rows // size) * size
    return (cols[None, :] <= rows[:, None]) & (cols[None, :] >= start[:, None]) & (cols[None, :] < L)


@triton.jit
def _attend(b_q, k, v, bos, rows, i_h, L, size, scale, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BM: tl.constexpr,
            BN: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PRECISION: tl.constexpr, ACC: tl.constexpr,
            CAREFUL: tl.constexpr):  # fmt: skip
    """A query tile's online softmax over the keys its rows see: (o unnormalised [BM, BV], each row's max score and
    sum of exp(score - max), and whether a row met a non-finite entry). CAREFUL: values zeroed where not finite, and
    the rows and columns a non-finite key or value reaches made NaN."""
    o_n = tl.arange(0, BN)
    b_m = tl.full([BM], float("-inf"), ACC)
    b_low = tl.full([BM], float("inf"), ACC)  # each row's least score: -inf only from a non-finite key
    b_l = tl.zeros([BM], ACC)
    b_o = tl.zeros([BM, BV], ACC)
    for j in range(tl.min(rows, 0) // size * size, tl.minimum(tl.max(rows, 0) + 1, L), BN):
        cols = j + o_n  # [BN]
        b_k = _rows(k, bos + j, i_h, o_n, cols < L, H, K, BK)  # [BN, BK]
        b_v = _rows(v, bos + j, i_h, o_n, cols < L, H, V, BV)  # [BN, BV]
        seen = _seen(rows, cols, L, size)  # [BM, BN]
        b_s = tl.dot(b_q, tl.trans(b_k), out_dtype=ACC, input_precision=PRECISION) * scale
        b_low = tl.minimum(b_low, tl.min(tl.where(seen, b_s, float("inf")), 1))
        b_s = tl.where(seen, b_s, float("-inf"))
        m_new = tl.maximum(b_m, tl.max(b_s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row none of whose keys is in this tile yet
        b_p = tl.exp(b_s - m_safe[:, None])
        alpha = tl.exp(b_m - m_safe)
        b_l = b_l * alpha + tl.sum(b_p, 1)
        b_m = m_new
        if CAREFUL:
            bad_v = (b_v.to(tl.float32) * 0.0 != 0.0).to(tl.float32)  # [BN, BV]
            bad_s = tl.max((seen & (b_s * 0.0 != 0.0)).to(tl.float32), 1)  # [BM]
            b_p = tl.where(b_p == b_p, b_p, 0.0)
            b_o = b_o * alpha[:, None] + tl.dot(b_p.to(b_v.dtype), _finite(b_v), out_dtype=ACC, input_precision=PRECISION)
            b_o = tl.where(tl.dot(seen.to(tl.float32), bad_v) + bad_s[:, None] > 0, float("nan"), b_o)
        else:
            b_o = b_o * alpha[:, None] + tl.dot(b_p.to(b_v.dtype), b_v, out_dtype=ACC, input_precision=PRECISION)
    # a non-finite value reaches every row's product (p * inf, or 0 * inf = NaN where unseen), a non-finite key the
    # scores of the rows that see it (NaN or +inf through the max, -inf through the least score)
    met = (tl.sum(b_o * 0.0, 1) != 0.0) | (b_low == float("-inf")) | (b_m != b_m)
    return b_o, b_m, b_l, met


@triton.jit
def _tile(q, k, v, r, o, lse, i_t, bos, L, i_h, scale, weight, size, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
          BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PRECISION: tl.constexpr,
          CAREFUL: tl.constexpr, RESIDUAL: tl.constexpr):  # fmt: skip
    """One query tile's o = weight * (attention + r) and log-sum-exp, stored; returns whether a row met a non-finite
    key or value (always false where CAREFUL)."""
    ACC = tl.float64 if q.dtype.element_ty == tl.float64 else tl.float32
    o_m = tl.arange(0, BM)
    rows = i_t * BM + o_m  # [BM], within the sequence
    m_rows = rows < L
    rows = tl.where(m_rows, rows, L - 1)  # rows past the sequence repeat its last (not stored)
    b_q = _rows(q, bos + i_t * BM, i_h, o_m, m_rows, H, K, BK)  # [BM, BK]
    if RESIDUAL:  # loaded before the keys' loop, its latency hidden by it (bench/results/NOTES.md)
        b_r = _rows(r, bos + i_t * BM, i_h, o_m, m_rows, H, V, BV)
    b_o, b_m, b_l, b_met = _attend(b_q, k, v, bos, rows, i_h, L, size, scale, H, K, V, BM, BN, BK, BV, PRECISION, ACC, CAREFUL)
    b_o = b_o / b_l[:, None]
    if RESIDUAL:
        b_o += b_r.to(ACC)
    _put_rows(o, b_o * weight, bos + i_t * BM, i_h, o_m, m_rows, H, V, BV)
    tl.store(lse + (bos + i_t * BM + o_m) * H + i_h, (b_m + tl.log(b_l)).to(lse.dtype.element_ty), mask=m_rows)
    return tl.max(b_met.to(tl.int32), 0) != 0


@triton.jit(do_not_specialize=["T", "size"])
def block_attention_fwd_kernel(q, k, v, r, o, lse, tiles, cu_seqlens, scale, weight, T, size, H: tl.constexpr, K: tl.constexpr,
                               V: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                               IS_VARLEN: tl.constexpr, PRECISION: tl.constexpr, RESIDUAL: tl.constexpr):  # fmt: skip
    """o = weight * (attention + r) (r where RESIDUAL) and each row's log-sum-exp of its scores, for a tile of BM query
    rows: the keys they see in tiles of BN. A tile where a row met a non-finite key or value runs again, handling
    them, after its stores (_careful_tile)."""
    i_m, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_t, bos, L = _sequence(tiles, cu_seqlens, i_m, i_b, T, IS_VARLEN)
    met = _tile(q, k, v, r, o, lse, i_t, bos, L, i_h, scale, weight, size, H, K, V, BM, BN, BK, BV, PRECISION, False, RESIDUAL)
    if met:
        _careful_tile(q, k, v, r, o, lse, i_t, bos, L, i_h, scale, weight, size, H, K, V, BM, BN, BK, BV, PRECISION, RESIDUAL)


@triton.jit(noinline=True)
def _careful_tile(q, k, v, r, o, lse, i_t, bos, L, i_h, scale, weight, size, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PRECISION: tl.constexpr,
                  RESIDUAL: tl.constexpr):  # fmt: skip
    """The tile again, handling non-finite keys and values (_attend's CAREFUL): a function of its own, not inlined,
    so that its registers (255 and a few hundred bytes spilled on sm_90, bf16) are not the first pass's (255 and 4
    with a residual)."""
    _tile(q, k, v, r, o, lse, i_t, bos, L, i_h, scale, weight, size, H, K, V, BM, BN, BK, BV, PRECISION, True, RESIDUAL)


@triton.jit
def _weights(b_q, b_k, b_v, b_do, b_lse, b_delta, seen, scale, PRECISION: tl.constexpr, ACC: tl.constexpr):
    """A tile pair's attention weights P [BM, BN] (from each row's log-sum-exp) and the scores' gradient dS."""
    b_s = tl.dot(b_q, tl.trans(b_k), out_dtype=ACC, input_precision=PRECISION) * scale
    b_p = tl.where(seen, tl.exp(b_s - b_lse[:, None]), 0.0)
    b_dp = tl.dot(b_do, tl.trans(b_v), out_dtype=ACC, input_precision=PRECISION)
    return b_p, b_p * (b_dp - b_delta[:, None])


@triton.jit(do_not_specialize=["T", "size"])
def block_attention_dq_kernel(q, k, v, o, do, lse, delta, dq, tiles, cu_seqlens, scale, weight, T, size, H: tl.constexpr, K: tl.constexpr,
                              V: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                              IS_VARLEN: tl.constexpr, PRECISION: tl.constexpr):  # fmt: skip
    """dq of a query tile, and each of its rows' delta = rowsum(dO * O), which the key tiles' kernel reads. Keys and
    values are zeroed where not finite: the rows before one take none of it (their rows at and after are NaN)."""
    i_m, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_t, bos, L = _sequence(tiles, cu_seqlens, i_m, i_b, T, IS_VARLEN)
    ACC = tl.float64 if q.dtype.element_ty == tl.float64 else tl.float32
    o_m, o_n = tl.arange(0, BM), tl.arange(0, BN)
    rows = i_t * BM + o_m
    m_rows = rows < L
    first = bos + i_t * BM
    b_q = _rows(q, first, i_h, o_m, m_rows, H, K, BK)
    b_do = _rows(do, first, i_h, o_m, m_rows, H, V, BV)
    b_delta = tl.sum(b_do.to(ACC) * _rows(o, first, i_h, o_m, m_rows, H, V, BV).to(ACC), 1)  # [BM]
    tl.store(delta + (bos + rows) * H + i_h, b_delta.to(delta.dtype.element_ty), mask=m_rows)
    b_lse = tl.load(lse + (bos + rows) * H + i_h, mask=m_rows, other=0.0).to(ACC)
    b_dq = tl.zeros([BM, BK], ACC)
    for j in range((i_t * BM) // size * size, tl.minimum(i_t * BM + BM, L), BN):
        cols = j + o_n
        b_k = _finite(_rows(k, bos + j, i_h, o_n, cols < L, H, K, BK))
        b_v = _finite(_rows(v, bos + j, i_h, o_n, cols < L, H, V, BV))
        b_p, b_ds = _weights(b_q, b_k, b_v, b_do, b_lse, b_delta, _seen(rows, cols, L, size), scale, PRECISION, ACC)  # [BM, BN]
        b_dq += tl.dot(b_ds.to(b_k.dtype), b_k, out_dtype=ACC, input_precision=PRECISION)
    _put_rows(dq, b_dq * (scale * weight), first, i_h, o_m, m_rows, H, K, BK)


@triton.jit(do_not_specialize=["T", "size"])
def block_attention_dkv_kernel(q, k, v, do, lse, delta, dk, dv, tiles, cu_seqlens, scale, weight, T, size, H: tl.constexpr,
                               K: tl.constexpr, V: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                               BV: tl.constexpr, IS_VARLEN: tl.constexpr, PRECISION: tl.constexpr):  # fmt: skip
    """dk and dv of a key tile: the query rows from its first key to the end of its last key's block."""
    i_n, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_t, bos, L = _sequence(tiles, cu_seqlens, i_n, i_b, T, IS_VARLEN)
    ACC = tl.float64 if q.dtype.element_ty == tl.float64 else tl.float32
    o_m, o_n = tl.arange(0, BM), tl.arange(0, BN)
    cols = i_t * BN + o_n
    m_cols = cols < L
    first = bos + i_t * BN
    b_k = _finite(_rows(k, first, i_h, o_n, m_cols, H, K, BK))
    b_v = _finite(_rows(v, first, i_h, o_n, m_cols, H, V, BV))
    b_dk = tl.zeros([BN, BK], ACC)
    b_dv = tl.zeros([BN, BV], ACC)
    last = tl.minimum((tl.minimum(i_t * BN + BN, L) - 1) // size * size + size, L)  # past the last key's block
    for i in range(i_t * BN, last, BM):
        rows = i + o_m
        m_rows = rows < L
        b_q = _rows(q, bos + i, i_h, o_m, m_rows, H, K, BK)
        b_do = _rows(do, bos + i, i_h, o_m, m_rows, H, V, BV)
        b_lse = tl.load(lse + (bos + rows) * H + i_h, mask=m_rows, other=0.0).to(ACC)
        b_delta = tl.load(delta + (bos + rows) * H + i_h, mask=m_rows, other=0.0).to(ACC)
        b_p, b_ds = _weights(b_q, b_k, b_v, b_do, b_lse, b_delta, _seen(rows, cols, L, size), scale, PRECISION, ACC)  # [BM, BN]
        b_dv += tl.dot(tl.trans(b_p.to(b_do.dtype)), b_do, out_dtype=ACC, input_precision=PRECISION)
        b_dk += tl.dot(tl.trans(b_ds.to(b_q.dtype)), b_q, out_dtype=ACC, input_precision=PRECISION)
    _put_rows(dk, b_dk * (scale * weight), first, i_h, o_n, m_cols, H, K, BK)
    _put_rows(dv, b_dv * weight, first, i_h, o_n, m_cols, H, V, BV)


# (rows a program owns, rows of the other side per step, num_warps, num_stages) per kernel: the fastest of those
# timed at lln's shape (bench/results/NOTES.md); 128-row programs hold more registers and ran slower
LAUNCH = {"fwd": (64, 64, 4, 2), "dq": (64, 64, 4, 1), "dkv": (64, 64, 4, 1)}


def _shape(which: str, q: torch.Tensor, V: int, cu_seqlens: torch.Tensor | None) -> tuple:
    """(grid, tiles, own rows, other rows, warps, stages) of a kernel: every tile of its rows of every sequence and
    head; above a head dim of 128, or of 512 bytes a row (float64 at 128 asked for 256 KiB of shared memory), tiles of
    at most 32 rows."""
    B, T, H, K = q.shape
    own, other, warps, stages = LAUNCH[which]
    D = max(K, V)
    if D > 128 or D * q.element_size() > 512:
        own, other = min(own, 32), min(other, 32)
    n, tiles, _ = chunks(cu_seqlens, B, T, own)
    grid = (cdiv(T, own), H, B) if cu_seqlens is None else (n, H, 1)
    return grid, tiles, own, other, warps, stages


def _launch(kernel, which: str, q: torch.Tensor, cu_seqlens: torch.Tensor | None, *args, **kwargs) -> None:
    """kernel over `_shape`'s grid (none when it is empty)."""
    T, K = q.shape[1], q.shape[3]
    grid, tiles, own, other, warps, stages = _shape(which, q, kwargs["V"], cu_seqlens)
    if grid[0] * grid[1] * grid[2]:
        BM, BN = (other, own) if which == "dkv" else (own, other)
        kernel[grid](*args, tiles, cu_seqlens, kwargs.pop("scale"), kwargs.pop("weight"), T, kwargs.pop("size"), H=q.shape[2], K=K, BM=BM, BN=BN, BK=pow2(K),
                     IS_VARLEN=cu_seqlens is not None, PRECISION=PRECISION, num_warps=warps, num_stages=stages, **kwargs)  # fmt: skip


def _stats_dtype(q: torch.Tensor) -> torch.dtype:
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def _forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, size: int, cu_seqlens: torch.Tensor | None,
             residual: torch.Tensor | None = None, weight: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(o = weight * (attention + residual) [B, T, H, V] in q's dtype, each row's log-sum-exp of its scaled scores
    [B, T, H])."""
    B, T, H, _ = q.shape
    V = v.shape[-1]
    o = q.new_empty(B, T, H, V)
    lse = torch.empty(B, T, H, dtype=_stats_dtype(q), device=q.device)
    _launch(block_attention_fwd_kernel, "fwd", q, cu_seqlens, q, k, v, residual, o, lse, scale=scale, weight=weight, size=size,
            V=V, BV=pow2(V), RESIDUAL=residual is not None)  # fmt: skip
    return o, lse


def _backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor, scale: float, size: int,
              cu_seqlens: torch.Tensor | None, weight: float = 1.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """(dq, dk, dv) from the operands and the gradient of o = weight * (attention + residual): the attention's own,
    run again without the epilogue, with each gradient scaled by weight as it is stored."""
    o, lse = _forward(q, k, v, scale, size, cu_seqlens)
    V = v.shape[-1]
    do = do.contiguous()
    delta = torch.empty_like(lse)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    _launch(block_attention_dq_kernel, "dq", q, cu_seqlens, q, k, v, o, do, lse, delta, dq, scale=scale, weight=weight, size=size, V=V,
            BV=pow2(V))  # fmt: skip
    _launch(block_attention_dkv_kernel, "dkv", q, cu_seqlens, q, k, v, do, lse, delta, dk, dv, scale=scale, weight=weight, size=size,
            V=V, BV=pow2(V))  # fmt: skip
    return dq, dk, dv


def _output(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, size: int, cu_seqlens: torch.Tensor | None,
            residual: torch.Tensor | None, weight: float) -> tuple[torch.Tensor]:  # fmt: skip
    """(o,): a tuple, as launch.run_scan_op takes a scan's outputs."""
    return _forward(q, k, v, scale, size, cu_seqlens, residual, weight)[:1]


block_attention_op = torch.library.custom_op(f"{NAMESPACE}::block_attention", _output, mutates_args=())
block_attention_backward = torch.library.custom_op(f"{NAMESPACE}::block_attention_backward", _backward, mutates_args=())


@block_attention_op.register_fake
def _(q, k, v, scale, size, cu_seqlens, residual, weight):
    return (q.new_empty(*q.shape[:3], v.shape[-1]),)


@block_attention_backward.register_fake
def _(q, k, v, do, scale, size, cu_seqlens, weight=1.0):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _save(ctx, inputs, output) -> None:
    q, k, v, scale, size, cu_seqlens, residual, weight = inputs
    ctx.save_for_backward(q, k, v, cu_seqlens)
    ctx.shape = (scale, size)
    ctx.weight = weight
    ctx.residual = residual is not None


def _grads(ctx, do, backward) -> tuple:
    q, k, v, cu_seqlens = ctx.saved_tensors
    dr = do * ctx.weight if ctx.residual else None
    return (*backward(q, k, v, do, *ctx.shape, cu_seqlens, ctx.weight), None, None, None, dr, None)


block_attention_op.register_autograd(lambda ctx, do: _grads(ctx, do, block_attention_backward), setup_context=_save)


class _EagerBlockAttention(torch.autograd.Function):
    """The same as the custom op, without its dispatch, outside torch.compile."""

    @staticmethod
    def forward(ctx, *inputs):
        out = _output(*inputs)
        _save(ctx, inputs, out)
        return out

    @staticmethod
    def backward(ctx, do):
        return _grads(ctx, do, _backward)


def block_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, size: int,
                    cu_seqlens: torch.Tensor | None = None, residual: torch.Tensor | None = None,
                    weight: float = 1.0) -> torch.Tensor:  # fmt: skip
    """weight * (causal softmax attention (scores times `scale`) within blocks of `size` tokens of every sequence +
    residual): [B, T, H, K] queries and keys, [B, T, H, V] values and residual (all of one dtype, on the kernels'
    device) -> o [B, T, H, V]."""
    if residual is not None and (tuple(residual.shape) != (*q.shape[:3], v.shape[-1]) or residual.dtype != q.dtype):
        raise ArgumentError("residual", f"block attention's residual is o's shape {[*q.shape[:3], v.shape[-1]]} in q's dtype {q.dtype}, "
                                        f"got {list(residual.shape)} in {residual.dtype}")  # fmt: skip
    r = None if residual is None else residual.contiguous()
    args = (q.contiguous(), k.contiguous(), v.contiguous(), float(scale), int(size), cu_seqlens, r, float(weight))
    return run_scan_op(block_attention_op, _EagerBlockAttention, _output, args, (*args[:3], r), n=1)[0]
