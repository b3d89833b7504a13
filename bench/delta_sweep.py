"""Launch variants of the delta rule's forward output kernel, and its state pass, timed alone on a GPU (CUDA events,
triton.testing.do_bench), on random bf16 operands of the bench's shape: where the per-kernel profile (bench/probe.py)
says a kernel is slow, which tiles, warps and stages it wants.

    python bench/delta_sweep.py [--decay scalar] [--T 8192] [--n 2] [--out DIR]

--n: sub-tokens per token (a read at one of them: the output kernel's NSUB rows), so the kernels run over n T rows.
An output variant is BT,BK,BV,warps,stages; a state variant BV,warps[,stages] (the value block of a program, which
holds the whole [K, BV] state; the stages launch.state_stages' unless given); a dv variant (the backward's A^T dO) BK,BV,warps,stages.
"""
from __future__ import annotations

import argparse
import json
import os

import torch
from triton.testing import do_bench

from lamixer.kernels import delta
from lamixer.kernels.launch import acc_precision, cdiv, diagonal_span, state_key_block, state_stages
from lamixer.tools import bench

CHUNK = 64  # the state pass's chunk (delta_default_config)
STATE = "64,4;32,4;64,8;32,8"
DV = "64,128,4,1;64,128,4,2;128,128,4,1;128,128,4,2"
OUTPUT = "64,64,128,4,1;64,64,128,4,2;64,64,128,4,3;64,128,128,4,1;64,128,128,4,2;64,128,128,8,1;64,64,64,4,2;64,64,128,8,2"


def operands(decay: str, B: int, T: int, H: int, D: int, n: int = 1, device: str = "cuda") -> dict:
    """bf16 operands of one scan over T rows: l2-normalised write keys, weak log decays, bounded values and states;
    the queries a row per n rows (a token's, as lamixer.runtime.substeps gives them)."""
    torch.manual_seed(0)
    bf = dict(device=device, dtype=torch.bfloat16)
    a = torch.nn.functional.normalize(torch.randn(B, T, H, D, device=device), dim=-1).to(torch.bfloat16)
    return dict(
        q=torch.randn(B, T // n, H, D, **bf) * D**-0.5, a=a, w=torch.randn(B, T, H, D, **bf) * 0.1,
        g=(-0.05 * torch.rand(B, T, H, device=device)) if decay == "scalar" else None,
        u=torch.randn(B, T, H, D, **bf), h0=torch.zeros(B, H, D, D, device=device),
    )  # fmt: skip


def time_output(mod, x: dict, n: int, variant: str) -> float:
    BT, BK, BV, warps, stages = (int(v) for v in variant.split(","))
    B, T, H, D = x["a"].shape
    h = torch.randn(B * cdiv(T, BT), H, D, D, device=x["a"].device, dtype=torch.bfloat16)
    o = torch.empty_like(x["u"])
    nsub, step = delta.read_rows(n, 0, BT)
    kernel = getattr(mod, f"{mod.NAME}_output_kernel")
    grid = (cdiv(D, BV), cdiv(T, BT), B * H)

    def run():
        kernel[grid](x["q"], None, x["a"], x["g"], h, x["u"], None, o, None, None, T, H=H, K=D, V=D, BT=BT, BK=BK, BV=BV,
                     NSUB=nsub, STEP=step, QN=n, USE_QS=False, SPAN=diagonal_span(torch.bfloat16), IS_VARLEN=False,
                     PRECISION="ieee", num_warps=warps, num_stages=stages)  # fmt: skip

    return do_bench(run, warmup=25, rep=200)


def time_dv(mod, x: dict, n: int, variant: str) -> float:
    BK, BV, warps, stages = (int(v) for v in variant.split(","))
    B, T, H, D = x["a"].shape
    du = torch.empty_like(x["u"])
    nsub, step = delta.read_rows(n, 0, CHUNK)
    kernel = getattr(mod, f"{mod.NAME}_bwd_dv_kernel")

    def run():
        kernel[(cdiv(T, CHUNK), B * H)](x["q"], None, x["a"], x["g"], None, x["u"], du, None, None, T, H=H, K=D, V=D, BT=CHUNK,
                                        BK=BK, BV=BV, NSUB=nsub, STEP=step, QN=n, USE_QS=False, SPAN=diagonal_span(torch.bfloat16),
                                        IS_VARLEN=False, PRECISION="ieee", ACC_PRECISION=acc_precision(torch.float32),
                                        num_warps=warps, num_stages=stages)  # fmt: skip

    return do_bench(run, warmup=25, rep=200)


def time_state(mod, x: dict, variant: str) -> float:
    BV, warps, *stages = (int(v) for v in variant.split(","))
    B, T, H, D = x["a"].shape
    stages = stages[0] if stages else state_stages(torch.bfloat16, D)
    h = torch.empty(B * cdiv(T, CHUNK), H, D, D, device=x["a"].device, dtype=torch.bfloat16)
    ht = torch.empty(B, H, D, D, device=x["a"].device)
    u = torch.empty_like(x["u"])
    kernel = getattr(mod, f"{mod.NAME}_state_kernel")

    def run():
        kernel[(cdiv(D, BV), B * H)](x["a"], None, x["g"], None, x["w"], x["u"], x["h0"], h, u, ht, None, None, T, H=H, K=D,
                                     V=D, BT=CHUNK, BK=state_key_block(D), BV=BV, STORE_HT=True, IS_VARLEN=False,
                                     ACC_PRECISION=acc_precision(torch.float32), num_warps=warps, num_stages=stages)  # fmt: skip

    return do_bench(run, warmup=25, rep=200)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--decay", default="scalar")
    ap.add_argument("--read", default="after")
    ap.add_argument("--T", type=int, default=8192, help="tokens (the kernels run over n T rows)")
    ap.add_argument("--n", type=int, default=2)
    ap.add_argument("--output", default=OUTPUT, help="';'-separated BT,BK,BV,warps,stages")
    ap.add_argument("--state", default=STATE, help="';'-separated BV,warps[,stages]")
    ap.add_argument("--dv", default=DV, help="';'-separated BK,BV,warps,stages")
    ap.add_argument("--out", default=os.environ.get("OUT", os.path.join(os.path.dirname(__file__), "results")))
    args = ap.parse_args()
    mod = delta._module(args.decay, args.read, False, torch.float32)
    x = operands(args.decay, bench.BT_TOTAL // args.T, args.n * args.T, bench.H, bench.D, args.n)
    rows = []
    for variant in args.output.split(";"):
        try:
            rows.append(dict(kernel="output", variant=variant, us=round(time_output(mod, x, args.n, variant) * 1e3, 1)))
        except Exception as e:  # a variant out of shared memory or registers
            rows.append(dict(kernel="output", variant=variant, error=repr(e)[:200]))
        print(rows[-1], flush=True)
    for variant in args.dv.split(";"):
        rows.append(dict(kernel="dv", variant=variant, us=round(time_dv(mod, x, args.n, variant) * 1e3, 1)))
        print(rows[-1], flush=True)
    for variant in args.state.split(";"):
        rows.append(dict(kernel="state", variant=variant, us=round(time_state(mod, x, variant) * 1e3, 1)))
        print(rows[-1], flush=True)
    os.makedirs(args.out, exist_ok=True)
    name = f"delta_sweep_{args.decay}_n{args.n}.json"
    with open(os.path.join(args.out, name), "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), T=args.T, n=args.n, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
