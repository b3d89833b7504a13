"""kda's forward on the chunk kernels at B = 4, T = 8192, H = 16, D = 128, bf16, no gradient: its time (do_bench) and
the GPU time per kernel over 5 calls. argv[1]: a label, or "warm" to compile and stop."""
import json
import sys

import torch
from torch.profiler import ProfilerActivity, profile

import lamixer
from lamixer.tools import bench
from lamixer.tools.check import random_call

m = lamixer.load("kda")
t, s = random_call(m, B=4, T=8192, H=16, size=128, dtype=torch.bfloat16, initial_state=False, device="cuda", distinct=False)


def fn():
    return m(**t, backend="triton")


with torch.no_grad():
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    if sys.argv[1] == "warm":
        sys.exit(0)
    ms = bench.do_bench(fn)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
out = {e.key[:60]: round(e.device_time_total / 5, 1) for e in prof.key_averages() if e.device_time_total > 0}
print(json.dumps({"tree": sys.argv[1], "fwd_ms": round(ms, 4), "kernels_us": dict(sorted(out.items(), key=lambda kv: -kv[1])[:6])}))
