"""Time the delta rule's solve and prepare kernels alone: the forward's (the chunk's triangular solve, W and U0, and under
a per-key decay the read's scores) and the backward's rerun (W and U0 from the stored T), with their error against
float64 and their registers.

    python bench/prepare_probe.py [--configs scalar:64,key:32] [--out FILE]

B = 4, T = 8192, H = 16, K = V = 128, bf16 on the GPU: DeltaNet's operands (a = beta k, c = -k, b = beta v, unit keys,
beta in (0, 1)) under a scalar or per-key log-sigmoid decay. Off the GPU (TRITON_INTERPRET=1) it checks the same at
B = 1, T = 128, H = 1 in float32, untimed. The kernels are launched through kernels/delta.py's _prepare, with the
configuration's default warps and stages.
"""
from __future__ import annotations

import argparse
import json
import os

import torch
import torch.nn.functional as F
import triton

from lamixer.kernels import delta
from lamixer.kernels.config import Config, delta_default_config
from lamixer.kernels.launch import acc_precision

GPU = not os.environ.get("TRITON_INTERPRET")


def reference(a, b, c, g, BT):
    """float64 T = (I - M)^-1, W = T (c e^B), U0 = T b per chunk (the template's derivation)."""
    a, b, c, g = (x.double() for x in (a, b, c, g))
    B, T, H, K = a.shape
    if g.dim() == 3:
        g = g[..., None].expand(B, T, H, K)
    tm, w, u = torch.zeros(B, T, H, BT, dtype=torch.float64, device=a.device), torch.zeros_like(a), torch.zeros_like(b)
    for s in range(0, T, BT):
        rows = slice(s, s + BT)
        cum = g[:, rows].cumsum(1)
        ce, ae = c[:, rows] * cum.exp(), a[:, rows] * (-cum).exp()
        M = torch.einsum("bihk,bjhk->bhij", ce, ae).tril(-1)
        inv = torch.linalg.inv(torch.eye(BT, dtype=M.dtype, device=M.device) - M)
        tm[:, rows] = inv.permute(0, 2, 1, 3)
        w[:, rows] = torch.einsum("bhij,bjhk->bihk", inv, ce)
        u[:, rows] = torch.einsum("bhij,bjhk->bihk", inv, b[:, rows])
    return tm, w, u


def probe(decay: str, BT: int, B: int, T: int, H: int, D: int) -> dict:
    torch.manual_seed(0)
    dev, lp = ("cuda", torch.bfloat16) if GPU else ("cpu", torch.float32)
    k = F.normalize(torch.randn(B, T, H, D, device=dev), dim=-1)
    beta, v = torch.rand(B, T, H, 1, device=dev), torch.randn(B, T, H, D, device=dev)
    a, c, b = (beta * k).to(lp), (-k).to(lp), (beta * v).to(lp)
    g = F.logsigmoid(torch.randn(B, T, H, *((D,) if decay == "key" else ()), device=dev) + 2)
    mod = delta._module(decay, "after", False, torch.float32)
    cfg = Config(BT, *delta_default_config(decay, D, D).as_list()[1:])

    def launch(tm=None):
        tm, _, w, u, *_ = delta._prepare(mod, a, None, a, b, c, g, torch.float32, None, decay, cfg, acc_precision(torch.float32), tm)
        return tm, w, u

    tm, w, u = launch()
    ref = reference(a, b, c, g, BT)
    row = dict(decay=decay, BT=BT, rel_err={n: ((x.double() - y).norm() / y.norm()).item() for n, x, y in zip("TWU", (tm, w, u), ref)})
    if GPU:
        row["solve_us"] = round(triton.testing.do_bench(launch, warmup=20, rep=200) * 1e3, 1)
        row["rerun_us"] = round(triton.testing.do_bench(lambda: launch(tm), warmup=20, rep=200) * 1e3, 1)
        kernels = [getattr(mod, f"{mod.NAME}_{k}") for k in ("solve_kernel", "prepare_kernel") if hasattr(mod, f"{mod.NAME}_{k}")]
        compiled = [x for k in kernels for x in k.device_caches[torch.cuda.current_device()][0].values()]
        row["regs_spills_shared"] = [(x.n_regs, x.n_spills, x.metadata.shared) for x in compiled]
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default="scalar:64,key:32,key:64", help="decay:BT pairs")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    shape = dict(B=4, T=8192, H=16, D=128) if GPU else dict(B=1, T=128, H=1, D=128)
    rows = []
    for item in args.configs.split(","):
        decay, BT = item.split(":")
        rows.append(probe(decay, int(BT), **shape))
        print(json.dumps(rows[-1]), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(shape=shape, device=torch.cuda.get_device_name() if GPU else "interpreter", rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
