"""Block attention alone on the GPU: the Triton kernels (kernels/block_attention.py) against runtime/scan.py's SDPA form
(its guarded copies and NaN pass) and against SDPA on the blocks with no guard, the kernel also with the plan's epilogue
(weight * (attention + residual)), bf16, forward and forward+backward with
fresh gradients, peak memory above the inputs; and each one's relative error (output, dq, dk, dv) against the SDPA form
in float64.

    python bench/block_attention.py [--T 4096,8192] [--size 128] [--out DIR]

B*T = 32768, H = 16, D = 128. Writes DIR (default $OUT or bench/results)/block_attention.json.
"""
from __future__ import annotations

import argparse
import functools
import json
import os

import torch
import torch.nn.functional as F

from lamixer.kernels.block_attention import block_attention
from lamixer.runtime.scan import _block_attention
from lamixer.tools.bench import do_bench
from lamixer.tools.check import rel_rms

H, D, TOKENS = 16, 128, 32768


def unguarded(q, k, v, scale: float, size: int) -> torch.Tensor:
    """SDPA on the blocks as views, no finite masking: the floor the guards are measured against."""
    B, T = q.shape[:2]

    def blocks(x):
        return x.reshape(B * (T // size), size, H, x.shape[-1]).transpose(1, 2)

    o = F.scaled_dot_product_attention(blocks(q), blocks(k), blocks(v), is_causal=True, scale=scale)
    return o.transpose(1, 2).reshape(B, T, H, -1)


def errors(size: int) -> dict:
    """Each form's bf16 error against the SDPA form in float64, at B = 2, T = 1000 (a partial last block)."""
    torch.manual_seed(0)
    x = [torch.randn(2, 1000, H, D, dtype=torch.float64, device="cuda") for _ in range(3)]
    do = torch.randn_like(x[2])

    def run(fn, dtype):
        leaves = [t.to(dtype).requires_grad_() for t in x]
        o = fn(*leaves, D**-0.5, size)
        return [o, *torch.autograd.grad(o, leaves, do.to(dtype))]

    want = run(lambda q, k, v, s, n: _block_attention(q, k, v, n, s), torch.float64)
    out = {}
    forms = [("kernel", block_attention, torch.bfloat16), ("kernel", block_attention, torch.float64),
             ("sdpa form", lambda q, k, v, s, n: _block_attention(q, k, v, n, s), torch.bfloat16)]  # fmt: skip
    for name, fn, dtype in forms:  # (the SDPA form in float64 is the reference itself)
        got = run(fn, dtype)
        out[f"{name} {str(dtype)[6:]}"] = {k: float(f"{rel_rms(a.double(), b):.3e}") for k, a, b in zip(("o", "dq", "dk", "dv"), got, want)}
    return out


def timings(T: int, size: int) -> list[dict]:
    B = TOKENS // T
    x = [torch.randn(B, T, H, D, dtype=torch.bfloat16, device="cuda", requires_grad=True) for _ in range(3)]
    do = torch.randn_like(x[2])
    r = torch.randn_like(x[2]).detach()  # the plan's epilogue (passes/epilogue.py): 0.5 * (attention + r), as lln's
    forms = {"kernel": block_attention, "kernel with an epilogue": lambda q, k, v, s, n: block_attention(q, k, v, s, n, None, r, 0.5),
             "sdpa form": lambda q, k, v, s, n: _block_attention(q, k, v, n, s), "sdpa unguarded": unguarded}  # fmt: skip
    rows = []
    for name, fn in forms.items():
        call = functools.partial(fn, *x, D**-0.5, size)
        with torch.no_grad():
            fwd = do_bench(call)
        fwdbwd = do_bench(lambda: call().backward(do), x)
        for t in x:
            t.grad = None
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        call().backward(do)
        work = (torch.cuda.max_memory_allocated() - before) / 2**30
        rows.append(dict(form=name, T=T, size=size, fwd_ms=round(fwd, 4), fwdbwd_ms=round(fwdbwd, 4), work_GiB=round(work, 3)))
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--T", default="4096,8192")
    p.add_argument("--size", type=int, default=128)
    p.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    a = p.parse_args()
    result = {"errors": errors(a.size)}
    print(json.dumps(result["errors"]), flush=True)
    result["timings"] = [row for T in a.T.split(",") for row in timings(int(T), a.size)]
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "block_attention.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
