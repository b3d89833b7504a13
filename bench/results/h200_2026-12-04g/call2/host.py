"""Where a no-grad forward's host time goes: torch.profiler (CPU and CUDA) over five calls, then cProfile over twenty.

    python host.py lln 4096
"""
import cProfile
import io
import pstats
import sys
import time

import torch

import lamixer
from lamixer.tools.check import random_call

name, T = sys.argv[1], int(sys.argv[2])
m = lamixer.load(name)
tensors, _ = random_call(m, B=32768 // T, T=T, H=16, size=128, dtype=torch.bfloat16, initial_state=False, device="cuda", distinct=False)


def fn():
    return m(**tensors, backend="triton")[0]


with torch.no_grad():
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=70))
    pr = cProfile.Profile()
    t0 = time.perf_counter()
    pr.enable()
    for _ in range(20):
        fn()
    pr.disable()
    print("host per call ms", (time.perf_counter() - t0) / 20 * 1e3)
    torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(30)
    print(s.getvalue()[-9000:])
