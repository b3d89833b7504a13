"""Relative RMS error at the benchmark's shape, of lamixer's Triton kernels and of FLA's, both on bf16 inputs, against
the float32 torch backend on the same (bf16-rounded) inputs: the output and every input's gradient.

    python bench/precision.py --specs gla,simple_gla [--B 4 --T 8192 --H 16 --D 128] [--gate normal] [--fla]

The GPU check (bench/gpu.py) holds bf16 to 1e-2 on shapes of head dim 64 to 128 up to T = 16384; this measures
what the timed shape (B*T = 32768, H = 16, D = 128) gets, and whether FLA does better. One cotangent for the
output, no initial or final state (FLA's chunk ops are called as the benchmark calls them). Writes
$OUT (or bench/results)/precision.json.
"""
from __future__ import annotations

import argparse
import json
import os

import torch

import lamixer
from lamixer import bench
from lamixer.check import random_call, rel_rms


def grads(fn, leaves: dict, do: torch.Tensor) -> dict[str, torch.Tensor]:
    """{"o", "d<input>"} of one forward of fn(leaves) and a backward of (o * do).sum()."""
    leaves = {k: v.detach().clone().requires_grad_() for k, v in leaves.items()}
    o = fn(leaves)
    got = torch.autograd.grad((o.double() * do).sum(), list(leaves.values()), allow_unused=True)
    return {"o": o.detach(), **{f"d{k}": g for k, g in zip(leaves, got)}}


def errors(got: dict, ref: dict) -> dict[str, float]:
    return {k: round(rel_rms(got[k], ref[k]), 6) for k in ref if ref[k] is not None and got.get(k) is not None}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--specs", required=True)
    ap.add_argument("--B", type=int, default=4)
    ap.add_argument("--T", type=int, default=8192)
    ap.add_argument("--H", type=int, default=16)
    ap.add_argument("--D", type=int, default=128)
    ap.add_argument("--gate", default="normal", choices=["normal", "strong", "weak"])
    ap.add_argument("--fla", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT", os.path.join(os.path.dirname(__file__), "results")))
    args = ap.parse_args()
    rows = []
    for name in args.specs.split(","):
        m = lamixer.load(name)
        tensors, _ = random_call(m, B=args.B, T=args.T, H=args.H, size=args.D, gate=args.gate, dtype=torch.bfloat16, initial_state=False,
                                 device="cuda", distinct=False, seed=1)  # fmt: skip
        o_shape = m(**tensors, backend="triton")[0].shape
        do = torch.randn(o_shape, generator=torch.Generator(device="cuda").manual_seed(2), dtype=torch.float64, device="cuda")
        ref = grads(lambda t: m(**t, backend="torch")[0], {k: v.float() for k, v in tensors.items()}, do)
        row = dict(spec=name, B=args.B, T=args.T, H=args.H, D=args.D, gate=args.gate)
        row["lamixer"] = errors(grads(lambda t: m(**t, backend="triton")[0], tensors, do), ref)
        if args.fla and name in bench.COMPETITORS:
            path, call = bench.COMPETITORS[name][:2]
            fn = bench._import(path)
            row["fla"] = errors(grads(lambda t: call(fn, t)[0], tensors, do), ref)
        rows.append(row)
        print(json.dumps(row), flush=True)
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "precision.json"), "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
