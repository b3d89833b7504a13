"""One GPU run: check every Triton-backed spec against the interpreter, then time it against FLA and SDPA.

    python bench/gpu.py [--specs a,b] [--skip-check] [--skip-time] [--Ts 2048,4096,8192,16384] [--fla]

Check: the recurrent kernel (inference) on every spec, fp32 and bf16, outputs and final states; then
fp32 and bf16 inputs, outputs, final states and every gradient against the float64
interpreter on the same GPU (relative RMS: fp32 < 1e-3, bf16 < 1e-2), strong and weak decays,
odd lengths, initial states, packed sequences; at T = 16384 the reference is the float64 torch
backend (itself checked against the interpreter to ~1e-13 in CI). A backward miscompiled by the
GPU's Triton shows up here as a failed gradient.
Time: lamixer.tools.bench (the same as `lamixer bench`): forward and forward+backward at B*T = 32768,
H = 16, D = 128, bf16, peak memory, one-token decode; FLA (with --fla) and SDPA side by side.
Results go to $OUT (or bench/results) as gpu.json.

    python bench/gpu.py --emulate [--specs a,b]

runs the chunk kernels' bf16 checks on this machine's CPU instead, under Triton's interpreter computing bf16 and
float32 dots as the GPU does (lamixer.tools.emulate), without the long case: minutes per spec, no GPU needed.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

if "--emulate" in sys.argv:  # Triton reads it at import
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import triton  # noqa: E402

import lamixer  # noqa: E402
from lamixer.backends import triton as triton_backend  # noqa: E402
from lamixer.tools import bench  # noqa: E402
from lamixer.tools.check import compare, forward_backward, random_call, rel_rms  # noqa: E402

TOL = {torch.float32: 1e-3, torch.bfloat16: 1e-2}


def triton_specs() -> list[str]:
    return [n for n in lamixer.shipped_specs() if not triton_backend.unsupported(lamixer.load(n).compiled)]


def check(names, rows, quick=False, device="cuda", dtypes=(torch.float32, torch.bfloat16), long=True):
    cases = [  # B, T, H, size, gate, initial state, packed
        (2, 63, 4, 64, "strong", True, None),
        (2, 1000, 4, 64, "weak", True, None),
        (1, None, 2, 128, "normal", True, [0, 17, 400, 1024]),
    ][: 2 if quick else 3]
    for name in names:
        m = lamixer.load(name)
        for dtype in dtypes:
            for B, T, H, size, gate, init, cu in cases:
                t0 = time.time()
                tensors, states = random_call(m, B=B, T=T or 1, H=H, size=size, gate=gate, dtype=dtype, initial_state=init,
                                              cu_seqlens=cu, device=device, seed=T or 7)  # fmt: skip
                states = tuple(s.float() for s in states) if states else None
                c = compare(m, "triton", tensors, states, cu_seqlens=cu)
                ok = c.worst < TOL[dtype]
                rows.append(dict(kind="check", spec=name, dtype=str(dtype)[6:], T=T or cu[-1], gate=gate, varlen=cu is not None,
                                 worst=c.worst, worst_of=max(c.errors, key=c.errors.get), ok=ok, s=round(time.time() - t0, 1)))  # fmt: skip
                print(rows[-1], flush=True)
        # a long sequence at the benchmark's head dim (128) against the float64 torch backend: at 64 gla's bf16 d(log
        # decay) passed where at 128 it measured 2.1e-2 (bench/results/NOTES.md, 2026-11-30)
        for dtype in dtypes if long and not quick else ():
            tensors, states = random_call(m, B=1, T=16384, H=2, size=128, gate="normal", dtype=dtype, device="cuda", seed=1)
            states = tuple(s.float() for s in states)
            got = forward_backward(m, tensors, states, "triton")
            ref = forward_backward(m, {k: v.double() for k, v in tensors.items()}, tuple(s.double() for s in states), "torch")
            errs = {k: rel_rms(got[k], ref[k]) for k in ref}
            worst = max(errs.values())
            rows.append(dict(kind="check", spec=name, dtype=str(dtype)[6:], T=16384, gate="normal", varlen=False, worst=worst,
                             worst_of=max(errs, key=errs.get), ok=worst < TOL[dtype], reference="torch float64"))  # fmt: skip
            print(rows[-1], flush=True)


def check_recurrent(names, rows):
    """The recurrent kernel (inference, no gradients) on every spec, the delta rule included: fp32 and bf16 inputs,
    one token, a strongly gated prompt, packed sequences, against the float64 interpreter on the same GPU."""
    from lamixer.tools.check import compare_inference

    cases = [(2, 1, 4, 128, "normal", None), (2, 63, 4, 64, "strong", None), (1, None, 4, 128, "weak", [0, 1, 17, 40])]
    for name in names:
        m = lamixer.load(name)
        for dtype in (torch.float32, torch.bfloat16):
            for B, T, H, size, gate, cu in cases:
                tensors, states = random_call(m, B=B, T=T or 1, H=H, size=size, gate=gate, dtype=dtype, cu_seqlens=cu, device="cuda", seed=3)
                states = tuple(s.float() for s in states)
                c = compare_inference(m, "triton", tensors, states, cu_seqlens=cu)
                rows.append(dict(kind="check", spec=name, kernel="recurrent", dtype=str(dtype)[6:], T=T or cu[-1], gate=gate,
                                 varlen=cu is not None, worst=c.worst, worst_of=max(c.errors, key=c.errors.get), ok=c.worst < TOL[dtype]))  # fmt: skip
                print(rows[-1], flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--specs", default="")
    ap.add_argument("--skip-check", action="store_true")
    ap.add_argument("--skip-time", action="store_true")
    ap.add_argument("--skip-decode", action="store_true")
    ap.add_argument("--skip-recurrent", action="store_true", help="check the chunk kernels only")
    ap.add_argument("--quick", action="store_true", help="two check cases per spec and dtype, no T = 16384")
    ap.add_argument("--time-specs", default="", help="specs to time (default: those checked)")
    ap.add_argument("--Ts", default="2048,4096,8192,16384")
    ap.add_argument("--fla", action="store_true", help="time FLA beside lamixer (its first-call autotuning takes minutes per op and shape)")
    ap.add_argument("--autotune", type=int, default=0, metavar="N",
                    help="before timing, try N kernel configurations per timed spec at T = 8192 (cache: $LAMIXER_CACHE, else ~/.cache/lamixer)")
    ap.add_argument("--emulate", action="store_true", help="the bf16 checks on this CPU, bf16 as the GPU computes it (no timing)")
    ap.add_argument("--out", default=os.environ.get("OUT", os.path.join(os.path.dirname(__file__), "results")))
    args = ap.parse_args()
    names = args.specs.split(",") if args.specs else triton_specs()
    if args.emulate:
        return emulated(names, args)
    res = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__, rows=[])
    print(res, flush=True)
    try:
        if not args.skip_check:
            if not args.skip_recurrent:
                check_recurrent(args.specs.split(",") if args.specs else lamixer.shipped_specs(), res["rows"])
            check(names, res["rows"], args.quick)
        if args.autotune:
            from lamixer.tuning import search as autotune

            for n in args.time_specs.split(",") if args.time_specs else names:
                trials, keys = autotune.tune(lamixer.load(n), 4, 8192, 16, 128, torch.bfloat16, "cuda", args.autotune)
                res["rows"] += [dict(kind="autotune", spec=n, config=autotune.describe(t.config), error=t.error, ms=t.ms, note=t.note) for t in trials]
                print(n, "tuned:", [autotune.describe(t.config) + f" {t.ms}" for t in trials], flush=True)
        if not args.skip_time:
            timed = [lamixer.load(n) for n in (args.time_specs.split(",") if args.time_specs else names)]
            vs = {"sdpa"} | ({"fla"} if args.fla else set())
            bench.run(timed, [int(t) for t in args.Ts.split(",") if t], vs, decode=not args.skip_decode, log=lambda r: print(r, flush=True),
                      save=lambda timing: res.update(timing=timing))  # rows so far: a run cut short (timeout -s INT) keeps them  # fmt: skip
    finally:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "gpu.json"), "w") as f:
            json.dump(res, f, indent=1, default=str)
    bad = [r for r in res["rows"] if r.get("kind") == "check" and not r["ok"]]
    print(f"checks: {sum(r.get('kind') == 'check' for r in res['rows']) - len(bad)} ok, {len(bad)} failed")
    for r in bad:
        print("FAILED", r)


def emulated(names, args) -> None:
    from lamixer.tools import emulate

    emulate.bf16_like_gpu()
    res = dict(device="cpu: Triton's interpreter, bf16 as on the GPU (lamixer.tools.emulate)", triton=triton.__version__, rows=[])
    try:
        check(names, res["rows"], args.quick, device="cpu", dtypes=(torch.bfloat16,), long=False)
    finally:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "gpu_emulated.json"), "w") as f:
            json.dump(res, f, indent=1, default=str)
    bad = [r for r in res["rows"] if not r["ok"]]
    print(f"checks: {len(res['rows']) - len(bad)} ok, {len(bad)} failed")
    for r in bad:
        print("FAILED", r)


if __name__ == "__main__":
    main()
