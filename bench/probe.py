"""Where the time goes: time chosen kernel configurations of specs and list each launch's GPU time.

    python bench/probe.py --specs gla,simple_gla --configs "64,64,128,4,2,32;64,32,128,4,2,32" [--T 8192] [--fla]

Each configuration (kernels.config.Config as BT,BV,BK,num_warps,num_stages[,BW,BG,warps_grad]) is first checked against
the torch backend at a small shape (fp32), then timed at B*T = 32768, H = 16, D = 128, bf16 (forward
and forward+backward), then profiled once (torch.profiler: GPU time per kernel name). With --fla the
spec's FLA competitor is timed and profiled the same way. Writes $OUT (or bench/results)/probe.json.

The default configuration runs the mixer's own call (its per-token work fused, as `lamixer bench` times it); a given
one runs through the autotuner's call (lamixer.tuning.search.configured), whose per-token work is unfused: its
copies and elementwise passes then appear in the profile and the totals exceed the bench's, while the chunk
kernels' own times compare.
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch

import lamixer
from lamixer.kernels.config import Config
from lamixer.tools import bench
from lamixer.tools.check import forward_backward, random_call, rel_rms
from lamixer.tuning.search import configured

TOP = 14  # kernels listed per profile (--top)


def kernel_times(fn, do, backward: bool = True, leaves=()) -> dict[str, float]:
    """GPU microseconds per kernel name over one forward+backward (the forward alone without `backward`); `leaves`
    get no gradient to accumulate into (bench.do_bench)."""
    from torch.profiler import ProfilerActivity, profile

    def step():
        for x in leaves:
            x.grad = None
        if backward:
            fn().backward(do)
        else:
            with torch.no_grad():
                fn()

    step()  # the first call of a signature runs unfused, the second compiles (runtime/fuse.py)
    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    out: dict[str, float] = {}
    for e in prof.key_averages():
        if e.device_time_total > 0:  # whole names: inductor's differ in their tails alone
            out[e.key] = round(e.device_time_total, 1)
    return dict(sorted(out.items(), key=lambda kv: -kv[1])[:TOP])


def forward_pace(fn, reps: int = 20) -> dict[str, float]:
    """Where a no-grad forward's time goes when its kernels do not fill it: the GPU time of all its kernels, and the
    host's time to issue one call (no synchronisation): a host time near the timed forward says the host bounds it."""
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad():
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        host = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            host.append(time.perf_counter() - t0)
            torch.cuda.synchronize()
    busy = sum(e.device_time_total for e in prof.key_averages() if e.device_time_total > 0)
    return dict(gpu_busy_us=round(busy, 1), host_ms=round(sorted(host)[reps // 2] * 1e3, 3))


def launcher(m, config):
    """m's call, its first scan group's chunk template launched with `config` (None: the tuned or default one)."""
    if config is None:
        return lambda **kw: m(**{"backend": "triton", **kw})  # check() names its backend itself
    return configured(m, {m.compiled.plan.groups[0].train.template: config})


def check(m, config) -> float:
    tensors, states = random_call(m, B=2, T=300, H=4, size=64, dtype=torch.float32, device="cuda", seed=3)
    states = tuple(s.float() for s in states)
    got = forward_backward(m, tensors, states, "triton", call=launcher(m, config))
    ref = forward_backward(m, {k: v.double() for k, v in tensors.items()}, tuple(s.double() for s in states), "torch")
    return max(rel_rms(got[k], ref[k]) for k in ref)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--specs", required=True)
    ap.add_argument("--configs", default="", help="';'-separated BT,BV,BK,warps,stages[,BW,BG,warps_grad] (default: the spec's default)")
    ap.add_argument("--T", type=int, default=8192)
    ap.add_argument("--fla", action="store_true")
    ap.add_argument("--compile", action="store_true", help="also time the call under torch.compile(fullgraph=True)")
    ap.add_argument("--top", type=int, default=14, help="kernels listed per profile")
    ap.add_argument("--forward", action="store_true", help="also list the kernels of a forward alone (no grad), FLA's too")
    ap.add_argument("--budget", type=float, default=1e9, help="seconds: skip what starts after this")
    ap.add_argument("--out", default=os.environ.get("OUT", os.path.join(os.path.dirname(__file__), "results")))
    args = ap.parse_args()
    global TOP
    TOP = args.top
    t_start = time.time()
    T = args.T
    B = bench.BT_TOTAL // T
    rows = []
    out = dict(device=torch.cuda.get_device_name(), T=T, B=B, rows=rows)
    have_fla = args.fla and bench.fla_available()

    def save():
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "probe.json"), "w") as f:
            json.dump(out, f, indent=1)

    for name in args.specs.split(","):
        m = lamixer.load(name)
        tensors, _ = random_call(m, B=B, T=T, H=bench.H, size=bench.D, dtype=torch.bfloat16, initial_state=False, device="cuda", distinct=False)
        tensors = {k: v.requires_grad_() for k, v in tensors.items()}
        do = torch.randn(B, T, bench.H, bench.D, device="cuda", dtype=torch.bfloat16)
        configs = [Config.from_list(c.split(",")) for c in args.configs.split(";") if c] or [None]
        for config in configs:
            if time.time() - t_start > args.budget:
                break
            row = dict(spec=name, config=config.as_list() if config else "default")
            try:
                row["check"] = check(m, config)
                call = launcher(m, config)
                row.update(bench._time(name, lambda: call(**tensors)[0], do, {}, tensors.values()))
                row["kernels_us"] = kernel_times(lambda: call(**tensors)[0], do, leaves=tensors.values())
                if args.forward:
                    row["forward_kernels_us"] = kernel_times(lambda: call(**tensors)[0], do, backward=False)
                    row["forward_pace"] = forward_pace(lambda: call(**tensors)[0])
            except Exception as e:
                row["error"] = repr(e)[:300]
            rows.append(row)
            print(json.dumps(row), flush=True)
            save()
        if args.compile and time.time() - t_start < args.budget:
            fused = torch.compile(lambda **t: m(**t, backend="triton")[0], fullgraph=True)
            t0 = time.time()
            row = dict(spec=name, config="default, torch.compile")
            try:
                eager = m(**tensors, backend="triton")[0].float()
                row["vs_eager"] = rel_rms(fused(**tensors).float(), eager)
                row["compile_s"] = round(time.time() - t0, 1)
                row.update(bench._time(name, lambda: fused(**tensors), do, {}, tensors.values()))
                row["kernels_us"] = kernel_times(lambda: fused(**tensors), do, leaves=tensors.values())
            except Exception as e:
                row["error"] = repr(e)[:300]
            rows.append(row)
            print(json.dumps(row), flush=True)
            save()
        if have_fla and name in bench.COMPETITORS and time.time() - t_start < args.budget:
            entry = bench.COMPETITORS[name]["chunk"]
            t0 = time.time()
            row = bench._time("fla " + entry["fn"], lambda: bench.peer_call(entry, tensors)[0], do, dict(spec=name), tensors.values())
            row["first_call_s"] = round(time.time() - t0, 1)
            if "error" not in row:
                row["kernels_us"] = kernel_times(lambda: bench.peer_call(entry, tensors)[0], do, leaves=tensors.values())
                if args.forward:
                    row["forward_kernels_us"] = kernel_times(lambda: bench.peer_call(entry, tensors)[0], do, backward=False)
                    row["forward_pace"] = forward_pace(lambda: bench.peer_call(entry, tensors)[0])
            rows.append(row)
            print(json.dumps(row), flush=True)
            save()
    save()


if __name__ == "__main__":
    main()
