"""Where a decode step's time goes: `lamixer bench`'s decode rows (lamixer and FLA, called and replayed from a CUDA
graph) and the GPU kernels of one replayed step, per kernel name.

    python bench/decode_probe.py --specs rwkv7,gated_deltaproduct,kda [--batches 1,256] [--no-rows] [--no-fla]

The layer's kernels are those of its graphed decoder (Layer.decoder: states updated in place). One token per
sequence, bf16 inputs, float32 states, H = 16, D = 128 (as `lamixer bench`). Writes $OUT (or
bench/results)/decode_probe.json.
"""
from __future__ import annotations

import argparse
import json
import os

import torch

import lamixer
from lamixer.layer import Layer
from lamixer.tools import bench
from lamixer.tools.check import random_call
from lamixer.tools.peers import COMPETITORS, peer_call


def replay_kernels(replay, n: int = 20) -> dict[str, list[float]]:
    """{kernel name: [launches per replay, GPU us per replay]} over n replays of a captured step."""
    from torch.profiler import ProfilerActivity, profile

    replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            replay()
        torch.cuda.synchronize()
    out = {e.key[:80]: [e.count / n, round(e.device_time_total / n, 2)] for e in prof.key_averages() if e.device_time_total > 0}
    return dict(sorted(out.items(), key=lambda kv: -kv[1][1]))


def probe(name: str, B: int, fla: bool = True) -> dict:
    """The replayed step's kernels at batch B: the mixer's, its layer decoder's and (`fla`, where FLA has the spec)
    FLA's."""
    m = lamixer.load(name)
    tensors, states = random_call(m, B=B, T=1, H=bench.H, size=bench.D, dtype=torch.bfloat16, device="cuda", distinct=False)
    h0 = tuple(s.float() for s in states)
    h0 = h0 if len(h0) > 1 else h0[0]
    out = {}
    with torch.no_grad():
        out["lamixer"] = replay_kernels(bench.graphed(lambda: m(**tensors, initial_state=h0, output_final_state=True, backend="triton")))
        if m.compiled.graph.layer is not None and m.compiled.graph.carries_state():
            layer = Layer(m, bench.H * bench.D, bench.H, backend="triton").to(device="cuda", dtype=torch.bfloat16)
            dec = layer.decoder(B)
            x = torch.randn(B, bench.H * bench.D, device="cuda", dtype=torch.bfloat16)
            out["layer"] = replay_kernels(lambda: dec.step(x))
        if fla and bench.fla_available() and name in COMPETITORS:
            entry = COMPETITORS[name]["decode"]
            out["fla"] = replay_kernels(bench.graphed(lambda: peer_call(entry, tensors, h0)))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--specs", default="rwkv7,gated_deltaproduct,kda")
    p.add_argument("--batches", default="1,256", help="batches whose replayed step is profiled")
    p.add_argument("--no-rows", action="store_true", help="profile only (no decode rows)")
    p.add_argument("--no-fla", action="store_true", help="leave FLA out")
    args = p.parse_args()
    bandwidth = bench.copy_bandwidth()
    res = {}
    for name in args.specs.split(","):
        fla = not args.no_fla and bench.fla_available()
        rows = [] if args.no_rows else bench.decode_rows(lamixer.load(name), bandwidth, have_fla=fla)
        res[name] = {"rows": rows, "kernels": {B: probe(name, int(B), fla) for B in args.batches.split(",")}}
        print(json.dumps({name: res[name]}), flush=True)
    out = os.environ.get("OUT", "bench/results")
    with open(os.path.join(out, "decode_probe.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
