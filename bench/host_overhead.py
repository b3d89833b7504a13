"""The Python cost of one decode step on the CPU: what a call spends before and after its kernels.

    python bench/host_overhead.py [--spec gla] [--profile] [--n 2000]

Times, in microseconds per call (best of 10 rounds, one torch thread), with B = 1, T = 1:
- bind: argument checking and binding alone;
- torch: the mixer call on the torch backend (tiny dims: its chunked scan's own ops included);
- triton host: the mixer call on the Triton backend with the kernel launches replaced by allocating
  their outputs (H = 16, D = 128): the host work a GPU decode step pays in Python besides Triton's launch;
- layer step host: lamixer.Layer.step the same way (hidden 64, 2 heads, the spec's layer section).
--profile prints cProfile's top entries for the triton host call.
"""
from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import time

import torch

import lamixer
from lamixer.backends import triton as triton_backend
from lamixer.backends.binding import bind
from lamixer.tools.check import random_call


def best_us(fn, n: int, rounds: int = 10) -> float:
    for _ in range(min(n, 200)):
        fn()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return round(best, 1)


def mock_kernels():
    """Replace every kernel launch by allocating its outputs (the chunk kernels' op, and the recurrent kernel's launch)."""

    def additive(q, qs, a, b, g, h0, cu, decay, read, cfg):
        N = a.shape[0] if cu is None else cu.shape[0] - 1
        return b.new_empty(b.shape), h0.new_empty(N, *h0.shape[1:])

    from lamixer.kernels import additive as additive_host
    from lamixer.kernels import recurrent

    additive_host.run_chunk_scan = additive
    triton_backend.launch_problems = lambda device: []  # CPU tensors stand in for CUDA ones: nothing is launched

    def launch(queries, qs, a, b, c, g, h0, cu, rule, decay, reads, out_dtype, *forms, **flags):
        N = a.shape[0] if cu is None else cu.shape[0] - 1
        return b.new_empty(len(queries), *b.shape, dtype=out_dtype), h0.new_empty(N, *h0.shape[1:])

    recurrent.launch = launch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", default="gla")
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    m = lamixer.load(args.spec)
    rows = {}

    def state_arg(states):
        return states[0] if len(states) == 1 else states

    tensors, states = random_call(m, B=1, T=1, H=2, size=4, dtype=torch.float32, distinct=False)
    h0 = state_arg(states)
    rows["bind"] = best_us(lambda: bind(m.compiled, (), tensors, None, h0, None), args.n)
    rows["torch"] = best_us(lambda: m(**tensors, initial_state=h0, output_final_state=True, backend="torch"), max(args.n // 10, 50))
    mock_kernels()
    tensors, states = random_call(m, B=1, T=1, H=16, size=128, dtype=torch.float32, distinct=False)
    h0 = state_arg(states)

    def step():
        return m(**tensors, initial_state=h0, output_final_state=True, backend="triton")

    rows["triton host"] = best_us(step, args.n)
    if m.compiled.graph.layer is not None:
        layer = lamixer.Layer(m, 64, 2, backend="triton")  # small: the projections' own work is not the point
        x = torch.randn(1, 64)
        _, state = layer.step(x)
        rows["layer step host"] = best_us(lambda: layer.step(x, state), max(args.n // 4, 50))
    print(json.dumps({"spec": args.spec, "us": rows}))
    if args.profile:
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(args.n):
            step()
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(20)


if __name__ == "__main__":
    main()
