"""CPU timing of the chunkwise torch backend against the token-by-token interpreter.

    python bench/torch_vs_interpret.py [--T 4096] [--specs gla,deltanet,...]

Correctness first: each spec's torch output is checked against the interpreter's before timing.
Writes bench/results/torch_vs_interpret_cpu.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import time

import torch

import lamixer
from lamixer.tools.check import random_call, rel_rms


def timed(fn, repeat: int) -> float:
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--T", type=int, default=4096)
    ap.add_argument("--B", type=int, default=1)
    ap.add_argument("--H", type=int, default=2)
    ap.add_argument("--size", type=int, default=32, help="every feature dim (K, V, M, ...)")
    ap.add_argument("--specs", default="linear_attn,simple_gla,gla,rwkv6,deltanet,gated_deltanet,gsa,lln,mamba2")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "torch_vs_interpret_cpu.json"))
    args = ap.parse_args()
    torch.manual_seed(0)
    rows = []
    print(f"B={args.B} T={args.T} H={args.H} dims={args.size}, float32, forward, {torch.get_num_threads()} threads")
    print(f"{'spec':16} {'interpret s':>12} {'torch s':>10} {'speed-up':>9} {'rel err':>9}")
    for name in args.specs.split(","):
        m = lamixer.load(name)
        tensors, _ = random_call(m, B=args.B, T=args.T, H=args.H, size=args.size, dtype=torch.float32, initial_state=False)
        h0 = None
        with torch.no_grad():
            ref, _ = m(**tensors, initial_state=h0, backend="interpret")
            out, _ = m(**tensors, initial_state=h0, backend="torch")
            err = rel_rms(out, ref)
            assert err < 1e-4, f"{name}: torch backend off by {err:.2e}"
            t_int = timed(lambda: m(**tensors, initial_state=h0, backend="interpret"), 1)
            t_torch = timed(lambda: m(**tensors, initial_state=h0, backend="torch"), 3)
        rows.append(dict(spec=name, interpret_s=round(t_int, 4), torch_s=round(t_torch, 5), speedup=round(t_int / t_torch, 1), rel_err=err))
        print(f"{name:16} {t_int:12.3f} {t_torch:10.4f} {t_int / t_torch:8.0f}x {err:9.1e}", flush=True)
    result = dict(config=vars(args), machine=platform.processor() or platform.machine(), threads=torch.get_num_threads(),
                  torch=torch.__version__, rows=rows)  # fmt: skip
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
