"""lamixer's Triton kernels and FLA's hand-written ones on the same bf16 inputs, both against the float64 torch backend.

    python bench/accuracy.py [--specs gla,deltanet] [--gates strong,weak] [--B 1 --T 8192 --H 16 --D 128]
    python bench/accuracy.py --dtype fp32 --log-decay -20,-88 --T 1024   # strong decays in float32, final states too

For each spec with an FLA competitor (lamixer.tools.bench.COMPETITORS): random bf16 inputs (no initial state, as FLA's
chunk calls take them here), one output gradient, and the relative RMS error of the output and of every input's
gradient, for lamixer (backend "triton") and for FLA. It says whether an error is the kernels' or the format's:
what bf16 inputs and outputs cost a kernel that accumulates in float32. `--log-decay L` sets every log decay input
(declared in (-inf, 0)) to L times a uniform factor in [0.9, 1.1] instead of a gate's random values, and adds the
final state's error (from a zero initial state, as FLA's peers take one). Writes $OUT (or bench/results)/accuracy.json.
The default shape is the benchmark's heads and dims at T = 8192 (B = 1), so FLA can reuse the autotuning its timing
did (its tuning keys are dims, not lengths): at a new shape its first call tunes for minutes per op.
"""
from __future__ import annotations

import argparse
import json
import os

import torch

import lamixer
from lamixer.tools import bench
from lamixer.tools.check import random_call, rel_rms


def grads(fn, tensors: dict, seed: int = 0) -> dict:
    leaves = {k: v.detach().clone().requires_grad_() for k, v in tensors.items()}
    o = fn(leaves)
    gen = torch.Generator(device=o.device).manual_seed(seed)
    do = torch.randn(o.shape, generator=gen, device=o.device, dtype=torch.float64)
    gs = torch.autograd.grad(o, list(leaves.values()), do.to(o.dtype), allow_unused=True)
    return {"o": o.detach(), **{f"d{k}": g for k, g in zip(leaves, gs) if g is not None}}


DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def fix_log_decays(m, tensors: dict, level: float, seed: int) -> dict:
    """The call's log decay inputs (declared in (-inf, 0)) at level * U(0.9, 1.1): a decay as strong as asked."""
    out = dict(tensors)
    gen = torch.Generator().manual_seed(seed)
    for op in m.compiled.graph.operands:
        if op.kind == "input" and op.domain == (float("-inf"), 0.0):
            x = tensors[op.name]
            out[op.name] = (level * (0.9 + 0.2 * torch.rand(x.shape, generator=gen, dtype=torch.float64))).to(x.dtype).to(x.device)
    return out


def final_states(m, entry, tensors: dict) -> dict:
    """Relative RMS error of lamixer's and the peer's final states (zero initial states; the worst state) against the
    float64 torch backend."""
    g = m.compiled.graph
    sizes = {d: n for op in g.operands if op.kind == "input" for d, n in zip(op.dims, tensors[op.name].shape[3:])}
    N, H = tensors["q"].shape[0], tensors["q"].shape[2]
    zeros = tuple(torch.zeros(N, H, *[sizes[d] for d in st.dims], device=tensors["q"].device) for st in g.states.values())

    def call(states):  # one state as itself, several as a tuple: as lamixer and FLA take them
        return states[0] if len(states) == 1 else states

    def worst(found, ref) -> float:
        found = found if isinstance(found, (tuple, list)) else (found,)
        return float(f"{max(rel_rms(f, r) for f, r in zip(found, ref)):.3g}")

    ref = m(**{k: v.double() for k, v in tensors.items()}, initial_state=call(tuple(z.double() for z in zeros)), backend="torch",
            output_final_state=True)[1]  # fmt: skip
    ref = ref if isinstance(ref, (tuple, list)) else (ref,)
    out = {"lamixer": worst(m(**tensors, initial_state=call(zeros), backend="triton", output_final_state=True)[1], ref)}
    if entry is not None:
        try:
            out["fla"] = worst(bench.peer_call(entry, tensors, call(zeros))[1], ref)
        except Exception as e:  # a failing peer must not stop the run
            out["fla"] = repr(e)[:300]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--specs", default=",".join(bench.COMPETITORS))
    ap.add_argument("--gates", default="strong,weak")
    ap.add_argument("--B", type=int, default=1)  # the float64 reference of a key-dim decay holds [C, C, K] per chunk
    ap.add_argument("--T", type=int, default=8192)
    ap.add_argument("--H", type=int, default=bench.H)
    ap.add_argument("--D", type=int, default=bench.D)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--log-decay", help="comma-separated log decay levels (e.g. -20,-88) in place of --gates")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default=os.environ.get("OUT", os.path.join(os.path.dirname(__file__), "results")))
    args = ap.parse_args()
    have_fla = bench.fla_available()
    rows = []
    for name in args.specs.split(","):
        m = lamixer.load(name)
        cases = [("normal", float(x)) for x in args.log_decay.split(",")] if args.log_decay else [(g, None) for g in args.gates.split(",")]
        for gate, level in cases:
            tensors, _ = random_call(m, B=args.B, T=args.T, H=args.H, size=args.D, gate=gate, dtype=DTYPES[args.dtype], initial_state=False,
                                     device=args.device, seed=args.T, distinct=False)  # fmt: skip
            if level is not None:
                tensors = fix_log_decays(m, tensors, level, seed=args.T)
            ref = grads(lambda t: m(**t, backend="torch")[0], {k: v.double() for k, v in tensors.items()})
            row = dict(spec=name, gate=gate if level is None else f"log decay {level:g}", dtype=args.dtype, B=args.B, T=args.T, H=args.H, D=args.D)
            ours = grads(lambda t: m(**t, backend="triton")[0], tensors)
            row["lamixer"] = {k: float(f"{rel_rms(ours[k], ref[k]):.3g}") for k in ref}
            entry = bench.COMPETITORS[name]["chunk"] if have_fla and name in bench.COMPETITORS else None
            if entry is not None:
                try:
                    theirs = grads(lambda t: bench.peer_call(entry, t)[0], tensors)
                    row["fla"] = {k: float(f"{rel_rms(theirs[k], ref[k]):.3g}") for k in ref if k in theirs}
                except Exception as e:  # a failing competitor must not stop the run
                    row["fla"] = repr(e)[:300]
            if level is not None:
                row["final state"] = final_states(m, entry, tensors)
            rows.append(row)
            print(json.dumps(row), flush=True)
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, "accuracy.json"), "w") as f:
                json.dump(dict(device=str(args.device), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
