"""An experiment on the sequential state passes (no decay, bf16, K = V = 128): the generated kernels, which hold the
state as 64-row key blocks addressed by int32 offsets (templates/state_blocks.jinja), against an older form (one
[K, BV] state, per-element int64 offsets: offsets_whole, additive_offsets_whole) and, for the delta rule's state
pass, two variants (state_block_pointers: block pointers, K whole; state_halves_offsets: two key blocks, offsets,
U0 added after the products), over value blocks, warps and stages.

    python bench/state_probe.py [--T 8192]

state_probe_s4.json in bench/results/h200_2026-11-29 is the run that chose the form (its "generated" the old
form, 477 us at the default launch against 216 for "halves"); state_probe_s5_*.json the runs that found a template
in that form still at 325, as its U0 load initialised the products' accumulator (bench/sm90.py's sync column).
Each delta variant computes, per (value block, sequence x head), the state entering every chunk (h) and
U = U0 + W S0 (u); each additive one the states entering the chunks; results are compared with the generated
kernel's at its default launch. Times in microseconds (triton do_bench, median). Writes $OUT (or bench/results)/state_probe.json. Under TRITON_INTERPRET=1
it only checks, at a small shape.
"""
from __future__ import annotations

import argparse
import json
import os

import torch
import triton
import triton.language as tl

from lamixer.render import kernel_cache as tb


@triton.jit(do_not_specialize=["T"])
def offsets_whole(a, w, u0, h0, h, u, ht, T, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr):
    """The delta state pass as the template wrote it before (no decay): one [K, BV] state, per-element int64 offsets."""
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_h = i_nh // H, i_nh % H
    bos = i_n.to(tl.int64) * T
    c0 = i_n.to(tl.int64) * tl.cdiv(T, BT)
    o_t, o_k, o_v = tl.arange(0, BT), tl.arange(0, K), i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    b_h = tl.load(h0 + i_nh.to(tl.int64) * K * V + o_k[:, None] * V + o_v[None, :], mask=m_v[None, :], other=0.).to(tl.float32)
    for i_t in range(0, tl.cdiv(T, BT)):
        t = bos + i_t * BT + o_t
        m_tv = (i_t * BT + o_t < T)[:, None] & m_v[None, :]
        tl.store(h + ((c0 + i_t) * H + i_h) * K * V + o_k[:, None] * V + o_v[None, :], b_h.to(h.dtype.element_ty), mask=m_v[None, :])
        b_w = tl.load(w + (t[:, None] * H + i_h) * K + o_k[None, :], mask=(i_t * BT + o_t < T)[:, None], other=0.)
        b_u = tl.load(u0 + (t[:, None] * H + i_h) * V + o_v[None, :], mask=m_tv, other=0.).to(tl.float32)
        b_u += tl.dot(b_w, b_h.to(w.dtype.element_ty))
        tl.store(u + (t[:, None] * H + i_h) * V + o_v[None, :], b_u.to(u.dtype.element_ty), mask=m_tv)
        b_a = tl.load(a + (t[:, None] * H + i_h) * K + o_k[None, :], mask=(i_t * BT + o_t < T)[:, None], other=0.)
        b_h += tl.dot(tl.trans(b_a), b_u.to(a.dtype.element_ty))
    tl.store(ht + i_nh.to(tl.int64) * K * V + o_k[:, None] * V + o_v[None, :], b_h, mask=m_v[None, :])


@triton.jit(do_not_specialize=["T"])
def state_block_pointers(a, w, u0, h0, h, u, ht, T, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr):
    """One [K, BV] state, every tile through a block pointer."""
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_h = i_nh // H, i_nh % H
    NT = tl.cdiv(T, BT)
    row0 = i_n.to(tl.int64) * T * H + i_h
    a += row0 * K
    w += row0 * K
    u0 += row0 * V
    u += row0 * V
    h += (i_n.to(tl.int64) * NT * H + i_h) * K * V
    p_h0 = tl.make_block_ptr(h0 + i_nh.to(tl.int64) * K * V, (K, V), (V, 1), (0, i_v * BV), (K, BV), (1, 0))
    b_h = tl.load(p_h0, boundary_check=(0, 1)).to(tl.float32)
    for i_t in range(NT):
        p_h = tl.make_block_ptr(h + i_t * H * K * V, (K, V), (V, 1), (0, i_v * BV), (K, BV), (1, 0))
        tl.store(p_h, b_h.to(h.dtype.element_ty), boundary_check=(0, 1))
        p_w = tl.make_block_ptr(w, (T, K), (H * K, 1), (i_t * BT, 0), (BT, K), (1, 0))
        b_u = tl.dot(tl.load(p_w, boundary_check=(0, 1)), b_h.to(w.dtype.element_ty))
        p_u0 = tl.make_block_ptr(u0, (T, V), (H * V, 1), (i_t * BT, i_v * BV), (BT, BV), (1, 0))
        b_u += tl.load(p_u0, boundary_check=(0, 1)).to(tl.float32)
        p_u = tl.make_block_ptr(u, (T, V), (H * V, 1), (i_t * BT, i_v * BV), (BT, BV), (1, 0))
        b_ub = b_u.to(u.dtype.element_ty)
        tl.store(p_u, b_ub, boundary_check=(0, 1))
        p_a = tl.make_block_ptr(a, (K, T), (1, H * K), (0, i_t * BT), (K, BT), (0, 1))
        b_h += tl.dot(tl.load(p_a, boundary_check=(0, 1)), b_ub)
    p_ht = tl.make_block_ptr(ht + i_nh.to(tl.int64) * K * V, (K, V), (V, 1), (0, i_v * BV), (K, BV), (1, 0))
    tl.store(p_ht, b_h, boundary_check=(0, 1))


@triton.jit(do_not_specialize=["T"])
def state_halves_offsets(a, w, u0, h0, h, u, ht, T, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr):
    """Two [64, BV] key blocks, the tiles addressed by int32 offsets off a base moved once per chunk."""
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_h = i_nh // H, i_nh % H
    NT = tl.cdiv(T, BT)
    row0 = i_n.to(tl.int64) * T * H + i_h
    o_t, o_k, o_v = tl.arange(0, BT), tl.arange(0, 64), i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    s_kv = o_k[:, None] * V + o_v[None, :]  # int32 offsets inside a state
    b_h1 = tl.load(h0 + i_nh.to(tl.int64) * K * V + s_kv, mask=m_v[None, :], other=0.)
    b_h2 = tl.load(h0 + i_nh.to(tl.int64) * K * V + 64 * V + s_kv, mask=m_v[None, :], other=0.)
    for i_t in range(NT):
        p_h = h + ((i_n.to(tl.int64) * NT + i_t) * H + i_h) * K * V
        tl.store(p_h + s_kv, b_h1.to(h.dtype.element_ty), mask=m_v[None, :])
        tl.store(p_h + 64 * V + s_kv, b_h2.to(h.dtype.element_ty), mask=m_v[None, :])
        m_t = i_t * BT + o_t < T
        r = row0 + i_t * BT * H  # the chunk's first row
        s_tk = o_t[:, None] * (H * K) + o_k[None, :]
        s_tv = o_t[:, None] * (H * V) + o_v[None, :]
        b_u = tl.dot(tl.load(w + r * K + s_tk, mask=m_t[:, None], other=0.), b_h1.to(w.dtype.element_ty))
        b_u += tl.dot(tl.load(w + r * K + 64 + s_tk, mask=m_t[:, None], other=0.), b_h2.to(w.dtype.element_ty))
        b_u += tl.load(u0 + r * V + s_tv, mask=m_t[:, None] & m_v[None, :], other=0.).to(tl.float32)
        b_ub = b_u.to(u.dtype.element_ty)
        tl.store(u + r * V + s_tv, b_ub, mask=m_t[:, None] & m_v[None, :])
        b_h1 += tl.dot(tl.trans(tl.load(a + r * K + s_tk, mask=m_t[:, None], other=0.)), b_ub)
        b_h2 += tl.dot(tl.trans(tl.load(a + r * K + 64 + s_tk, mask=m_t[:, None], other=0.)), b_ub)
    tl.store(ht + i_nh.to(tl.int64) * K * V + s_kv, b_h1, mask=m_v[None, :])
    tl.store(ht + i_nh.to(tl.int64) * K * V + 64 * V + s_kv, b_h2, mask=m_v[None, :])


@triton.jit(do_not_specialize=["T"])
def additive_offsets_whole(a, b, h0, hs, ht, T, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr):
    """chunk_additive's state walk as the template wrote it before (no decay): one [K, BV] state, per-element offsets."""
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_h = i_nh // H, i_nh % H
    bos = i_n.to(tl.int64) * T
    boc = i_n.to(tl.int64) * tl.cdiv(T, BT)
    o_t, o_k, o_v = tl.arange(0, BT), tl.arange(0, K), i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    p_kv = o_k[:, None] * V + o_v[None, :]
    b_h = tl.load(h0 + i_nh.to(tl.int64) * K * V + p_kv, mask=m_v[None, :], other=0.).to(tl.float32)
    for i_t in range(0, tl.cdiv(T, BT)):
        tl.store(hs + ((boc + i_t) * H + i_h) * K * V + p_kv, b_h.to(hs.dtype.element_ty), mask=m_v[None, :])
        t = bos + i_t * BT + o_t
        m_t = i_t * BT + o_t < T
        b_a = tl.load(a + (t[:, None] * H + i_h) * K + o_k[None, :], mask=m_t[:, None], other=0.)
        b_b = tl.load(b + (t[:, None] * H + i_h) * V + o_v[None, :], mask=m_t[:, None] & m_v[None, :], other=0.)
        b_h = b_h + tl.dot(tl.trans(b_a).to(b_b.dtype), b_b)
    tl.store(ht + i_nh.to(tl.int64) * K * V + p_kv, b_h, mask=m_v[None, :])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", type=int, default=8192)
    ap.add_argument("--out", default=os.environ.get("OUT", os.path.join(os.path.dirname(__file__), "results")))
    args = ap.parse_args()
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    dev = "cpu" if interpret else "cuda"
    B, T, H, K, V, BT = (1, 100, 2, 128, 128, 64) if interpret else (32768 // args.T, args.T, 16, 128, 128, 64)
    dt = torch.float32 if interpret else torch.bfloat16  # the interpreter runs no bf16 dot
    torch.manual_seed(0)
    a, w = (torch.randn(B, T, H, K, device=dev, dtype=dt) * 0.05 for _ in range(2))
    u0 = torch.randn(B, T, H, V, device=dev, dtype=dt)
    h0 = torch.randn(B, H, K, V, device=dev, dtype=torch.float32)
    NT = triton.cdiv(T, BT)
    mod = tb.kernels("scan_delta", decay="none", read="after", acc="float32")
    generated = getattr(mod, f"{mod.NAME}_state_kernel")
    offsets = torch.arange(B, device=dev) * NT

    def run(kind, BV, warps, stages):
        h = torch.empty(B * NT, H, K, V, device=dev, dtype=dt)
        u = torch.empty(B, T, H, V, device=dev, dtype=dt)
        ht = torch.empty(B, H, K, V, device=dev, dtype=torch.float32)
        grid = (triton.cdiv(V, BV), B * H)
        if kind == "generated":
            fn = lambda: generated[grid](a, None, w, u0, h0, h, u, ht, None, offsets, T, H=H, K=K, V=V, BT=BT, BK=min(64, K), BV=BV,  # noqa: E731
                                         STORE_HT=True, IS_VARLEN=False, ACC_PRECISION="ieee", num_warps=warps, num_stages=stages)  # fmt: skip
        else:
            kernel = dict(offsets_whole=offsets_whole, block_pointers=state_block_pointers, halves_offsets=state_halves_offsets)[kind]
            fn = lambda: kernel[grid](a, w, u0, h0, h, u, ht, T, H=H, K=K, V=V, BT=BT, BV=BV, num_warps=warps, num_stages=stages)  # noqa: E731
        fn()
        return fn, (h, u, ht)

    rows = []

    def sweep(kinds, run, reference):
        """Every kind at every launch, its results against `reference`'s launch of the first kind."""
        _, ref = run(kinds[0], *reference)
        for kind in kinds:
            for BV in (32, 64):
                for warps in ((4,) if interpret else (2, 4)):
                    for stages in ((1,) if interpret else (1, 2, 3)):
                        try:
                            fn, got = run(kind, BV, warps, stages)
                            err = max(((x.float() - y.float()).norm() / y.float().norm()).item() for x, y in zip(got, ref))
                            us = None if interpret else round(1e3 * triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median"), 1)
                            row = dict(kind=kind, BV=BV, warps=warps, stages=stages, rel_err=err, us=us)
                        except Exception as e:  # a configuration that does not compile is a result too
                            row = dict(kind=kind, BV=BV, warps=warps, stages=stages, error=f"{type(e).__name__}: {str(e)[:200]}")
                        print(row, flush=True)
                        rows.append(row)

    sweep(("generated", "offsets_whole", "block_pointers", "halves_offsets"), run, (64, 4, 3))  # the template's launch
    # chunk_additive's state walk (linear_attn's: no decay): the generated kernel against the previous form
    add = tb.kernels("chunk_additive", decay="none", read="after", acc="float32")
    walk = getattr(add, f"{add.NAME}_state_fwd")

    def run_additive(kind, BV, warps, stages):
        hs = torch.empty(B * NT, H, K, V, device=dev, dtype=dt)
        ht = torch.empty(B, H, K, V, device=dev, dtype=torch.float32)
        grid = (triton.cdiv(V, BV), B * H)
        if kind == "additive_generated":
            fn = lambda: walk[grid](a, u0, None, h0, hs, ht, None, offsets, T, H=H, K=K, V=V, BT=BT, BK=min(64, K), BV=BV, STORE_HT=True,  # noqa: E731
                                    IS_VARLEN=False, PRECISION="ieee", num_warps=warps, num_stages=stages)  # fmt: skip
        else:
            fn = lambda: additive_offsets_whole[grid](a, u0, h0, hs, ht, T, H=H, K=K, V=V, BT=BT, BV=BV, num_warps=warps, num_stages=stages)  # noqa: E731
        fn()
        return fn, (hs, ht)

    sweep(("additive_generated", "additive_offsets_whole"), run_additive, (32, 4, 2))  # the default configuration's walk
    if not interpret:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "state_probe.json"), "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), B=B, T=T, H=H, K=K, V=V, BT=BT, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
