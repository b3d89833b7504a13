"""Host microseconds to issue one call on an idle GPU (synchronised before each, median of 30): block attention's op
through the dispatcher, its forward directly, one kernel launch, an empty tensor, lln's and linear_attn's calls.
Written for the tree of that call (79743ac: block attention's op without the epilogue's arguments).

    python host2.py 4096
"""
import sys
import time

import torch

import lamixer
from lamixer.kernels import block_attention as ba
from lamixer.tools.check import random_call


def host(fn, reps=30):
    ts = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return round(sorted(ts)[reps // 2] * 1e6, 1)


T = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
q, k, v = (torch.randn(32768 // T, T, 16, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
with torch.no_grad():
    for _ in range(3):
        torch.ops.lamixer.block_attention.default(q, k, v, 0.088, 128, None)
    print("op block_attention us", host(lambda: torch.ops.lamixer.block_attention.default(q, k, v, 0.088, 128, None)))
    print("direct _forward us", host(lambda: ba._forward(q, k, v, 0.088, 128, None)))
    print("one launch us", host(lambda: ba._launch(ba.block_attention_fwd_kernel, "fwd", q, None, q, k, v, q, q, q, scale=0.088, size=128, V=128, BV=128,
                                                   CAREFUL=False)))  # fmt: skip
    print("empty us", host(lambda: torch.empty(32768 // T, T, 16, 128, device="cuda", dtype=torch.bfloat16)))
    for name in ("lln", "linear_attn"):
        m = lamixer.load(name)
        tensors, _ = random_call(m, B=32768 // T, T=T, H=16, size=128, dtype=torch.bfloat16, initial_state=False, device="cuda", distinct=False)
        for _ in range(4):
            m(**tensors, backend="triton")
        print(f"{name} call us (idle GPU)", host(lambda m=m, tensors=tensors: m(**tensors, backend="triton")))
