"""lamixer's Triton kernels and FLA's hand-written ones on the same bf16 inputs, both against the float64 torch backend.

    python bench/accuracy.py [--specs gla,deltanet] [--gates strong,weak] [--B 1 --T 8192 --H 16 --D 128]

For each spec with an FLA competitor (lamixer.tools.bench.COMPETITORS): random bf16 inputs (no initial state, as FLA's
chunk calls take them here), one output gradient, and the relative RMS error of the output and of every input's
gradient, for lamixer (backend "triton") and for FLA. It says whether an error is the kernels' or the format's:
what bf16 inputs and outputs cost a kernel that accumulates in float32. Writes $OUT (or bench/results)/accuracy.json.
The default shape is the benchmark's heads and dims at T = 8192 (B = 1), so FLA can reuse the autotuning its timing
did (its tuning keys are dims, not lengths): at a new shape its first call tunes for minutes per op.
"""
from __future__ import annotations

import argparse
import json
import os

import torch

import lamixer
from lamixer.tools import bench
from lamixer.tools.check import random_call, rel_rms


def grads(fn, tensors: dict, seed: int = 0) -> dict:
    leaves = {k: v.detach().clone().requires_grad_() for k, v in tensors.items()}
    o = fn(leaves)
    gen = torch.Generator(device=o.device).manual_seed(seed)
    do = torch.randn(o.shape, generator=gen, device=o.device, dtype=torch.float64)
    gs = torch.autograd.grad(o, list(leaves.values()), do.to(o.dtype), allow_unused=True)
    return {"o": o.detach(), **{f"d{k}": g for k, g in zip(leaves, gs) if g is not None}}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--specs", default=",".join(bench.COMPETITORS))
    ap.add_argument("--gates", default="strong,weak")
    ap.add_argument("--B", type=int, default=1)  # the float64 reference of a key-dim decay holds [C, C, K] per chunk
    ap.add_argument("--T", type=int, default=8192)
    ap.add_argument("--H", type=int, default=bench.H)
    ap.add_argument("--D", type=int, default=bench.D)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default=os.environ.get("OUT", os.path.join(os.path.dirname(__file__), "results")))
    args = ap.parse_args()
    have_fla = bench.fla_available()
    rows = []
    for name in args.specs.split(","):
        m = lamixer.load(name)
        for gate in args.gates.split(","):
            tensors, _ = random_call(m, B=args.B, T=args.T, H=args.H, size=args.D, gate=gate, dtype=torch.bfloat16, initial_state=False,
                                     device=args.device, seed=args.T, distinct=False)  # fmt: skip
            ref = grads(lambda t: m(**t, backend="torch")[0], {k: v.double() for k, v in tensors.items()})
            row = dict(spec=name, gate=gate, B=args.B, T=args.T, H=args.H, D=args.D)
            ours = grads(lambda t: m(**t, backend="triton")[0], tensors)
            row["lamixer"] = {k: float(f"{rel_rms(ours[k], ref[k]):.3g}") for k in ref}
            if have_fla and name in bench.COMPETITORS:
                entry = bench.COMPETITORS[name]["chunk"]
                try:
                    theirs = grads(lambda t: bench.peer_call(entry, t)[0], tensors)
                    row["fla"] = {k: float(f"{rel_rms(theirs[k], ref[k]):.3g}") for k in ref if k in theirs}
                except Exception as e:  # a failing competitor must not stop the run
                    row["fla"] = repr(e)[:300]
            rows.append(row)
            print(json.dumps(row), flush=True)
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, "accuracy.json"), "w") as f:
                json.dump(dict(device=str(args.device), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
