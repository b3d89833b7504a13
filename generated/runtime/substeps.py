"""Several writes per token as sub-steps of one chunked scan.

A token whose update is n writes, each after its own decays (DeltaProduct's n_h Householder steps;
RWKV-7's generalized delta rule, a write of a read of the state beside a plain one), is n sub-tokens
of the chunked scan (lamixer.runtime.scan): sub-token (t, j) carries the decays just above write j
and write j itself, so the scan runs over n * T sub-tokens as it runs over tokens, exactly, and
differentiably. A read at sub-step j and position p is that sub-token's read at position p, taken at
every n-th sub-token. A write whose erase reads the state before its decays marks its sub-token so
(ScanOperands.c_before). The scan is any implementation of ScanOperands: the torch scan, the delta rule's
chunk kernels (each sub-token a row of their chunks: a sub-step without a decay has a log decay of 0, one
without a value term b = 0, without an erase c = 0) or the recurrent kernel.

The cost of the queries: each read's query is given a row per token (ScanOperands.reads_per_token), and the scan is
told that only the read's own sub-step is used (ScanOperands.sub_steps, read_steps). The delta rule's chunk kernels
read the token's row for each of its sub-tokens and store dq at the read's, and its output kernel computes the read's
rows alone, O(T C (K + V)) for chunks of C sub-tokens rather than n times that, as does the backward's A^T dO (dO is
0 at the others); the other implementations copy the queries to every sub-token first (ScanOperands.per_row), compute
a read at every sub-token, and the n - 1 others are dropped here. The state work, solve and other gradients are n
times a token's anyway. A decay at one sub-step alone comes a row per token likewise (ScanOperands.decay_step): under a
per-key decay [T, K] float32 log decays rather than [n T, K], which the delta rule's kernels read at that sub-step's
rows (the other implementations, and those kernels under other decays, expand it first).
"""
from __future__ import annotations

import torch

from .scan import ScanOperands


def _full(x: torch.Tensor | None, shape: tuple[int, int, int], width: int, like: torch.Tensor) -> torch.Tensor:
    """An operand as [B, T, H, width]: a value with three leading axes that broadcast (a scalar has no fourth), or
    zeros for None."""
    if x is None:
        return like.new_zeros(*shape, width)
    if x.dim() == 3:
        x = x.unsqueeze(-1)
    return x.expand(*shape, width)


def _interleave(xs: list[torch.Tensor]) -> torch.Tensor:
    """[B, T, H, D] per sub-step -> [B, T * n, H, D], sub-step j of token t at t * n + j."""
    x = torch.stack(xs, 2)
    return x.reshape(x.shape[0], x.shape[1] * x.shape[2], *x.shape[3:])


def substep_scan(scan, shape: tuple[int, int, int], writes: list, decay: str, reads: list, h0: torch.Tensor,
                 cu_seqlens: torch.Tensor | None, chunk: int, strengths: list | None = None, query_factors: list | None = None,
                 forms: dict | None = None) -> tuple[list[torch.Tensor], torch.Tensor]:  # fmt: skip
    """One state's scan whose token update is the sub-steps `writes`, each (key [.., K] or None for a unit key,
    value [.., V] or None for zero, erase [.., K] or None, log decay [.., 1 | K | V] or None, whether the erase reads
    the state before that decay), operands with three leading axes that broadcast to shape (B, T, H); decay the kind
    over all sub-steps (the kernel plan's); reads [(query [.., K] or None for a unit query, sub-step, position)];
    h0 [N, H, K, V]; strengths: per write its strength s (a scalar with three leading axes) where its key is -s times its
    erase (the keys are then None: ScanOperands.strength); query_factors, forms: the queries' per-head factors and
    KeyForms ("q0", ..) that `scan` finishes (ScanOperands'). `scan` runs the ScanOperands (torch_scan). Returns ([o per
    read, [B, T, H, V]], the final state)."""
    B, T, H = shape
    K, V = h0.shape[2], h0.shape[3]
    n = len(writes)
    one = h0.new_ones(1, 1, 1, 1)
    a = None if strengths else _interleave([_full(one if k is None else k, shape, K, h0) for k, _, _, _, _ in writes])
    strength = _interleave([_full(x, shape, 1, h0) for x in strengths]) if strengths else None
    b = _interleave([_full(v, shape, V, h0) for _, v, _, _, _ in writes])
    erasing = any(c is not None for _, _, c, _, _ in writes)
    c = _interleave([_full(c, shape, K, h0) for _, _, c, _, _ in writes]) if erasing else None
    width = {"key": K, "value": V}.get(decay, 1)
    # a decay at one sub-step alone comes a row per token (ScanOperands.decay_step): for a per-key decay [T, K] rather
    # than n times that, mostly zeros, in the log decays' float32
    decaying = [j for j, w in enumerate(writes) if w[3] is not None]
    decay_step = decaying[0] if n > 1 and len(decaying) == 1 else None
    if decay_step is not None:
        g = _full(writes[decay_step][3], shape, width, h0)
    else:
        g = _interleave([_full(lg, shape, width, h0) for _, _, _, lg, _ in writes]) if decay != "none" else None
    before = None
    if any(w[4] for w in writes):  # (indexed, not star-unpacked: see Scan.plain)
        # made on the device (fills), not copied from the host: a CUDA graph's capture refuses host-to-device copies
        marks = torch.stack([torch.full((), bool(w[4]), dtype=torch.bool, device=h0.device) for w in writes])
        before = marks.reshape(1, 1, n, 1, 1).expand(B, T, n, H, 1).reshape(B, T * n, H, 1)
    queries = [(_full(one if q is None else q, shape, K, h0), position) for q, _, position in reads]  # a row per token
    cu = None if cu_seqlens is None else cu_seqlens * n
    ops = ScanOperands(a, b, c, g, decay, queries, query_factors or [None] * len(reads), h0, cu, chunk, c_before=before, sub_steps=n,
                       read_steps=tuple(step for _, step, _ in reads), reads_per_token=True, strength=strength, decay_step=decay_step,
                       forms=forms or {})  # fmt: skip
    outs, final = scan(ops)
    return [o.reshape(B, T, n, H, V)[:, :, step] for o, (_, step, _) in zip(outs, reads)], final
