"""Time a chunk template's kernels, forward and backward, one GPU time per kernel, under variants: launch arguments
overridden per kernel, or edits of the rendered kernel source. What a kernel's part costs (remove it, results then
wrong) and what a reordering or another launch gains, measured in one process beside the unchanged kernels.

    python bench/kernel_variants.py --variants FILE.json [--family delta|additive] [--decay none|scalar|key|constant]
                                    [--T 8192] [--out DIR]

FILE holds a list of [label, {kernel: {argument: value}}, [[old, new] or [old, new, kernel], ...]]: each edit replaces
the one occurrence of `old` in the family's rendered source (within the named kernel's function where given). Labels
ending in "(wrong)" mark ablations. B*T = 32768, H = 16, D = 128, bf16 on the GPU. --family delta (scan_delta, the
default): gated DeltaNet's operands (keys and queries the kernels l2-normalise, the keys' sign and the queries' scale
theirs, strengths in (0, 1), log-sigmoid decays: per token and head, or per key too, KDA's, under --decay key).
--family additive (chunk_additive): q, keys and values, the queries' scale, log-sigmoid decays per token and head
(scalar), per key (key), or one per sequence and head (constant). Both with an initial state and a final state's
gradient. Under TRITON_INTERPRET=1 (B = 1, T = 130, H = 1, float32) it checks instead that every edit applies and that
the variants not marked wrong give the unchanged results. Writes DIR/kernel_variants_T.json.
"""
from __future__ import annotations

import argparse
import json
import os
import types

import torch
import torch.nn.functional as F

from lamixer.kernels import additive, delta
from lamixer.kernels.config import default_config, delta_default_config
from lamixer.render import kernel_cache

GPU = not os.environ.get("TRITON_INTERPRET")


class _Overridden:
    """A kernel whose launches take some arguments from `over`."""

    def __init__(self, kernel, over: dict):
        self.kernel, self.over = kernel, over

    def __getitem__(self, grid):
        launch = self.kernel[grid]
        return lambda *args, **kwargs: launch(*args, **{**kwargs, **self.over})


def _edited(source: str, edits: list) -> str:
    for old, new, *within in edits:
        lo = source.index(f"_{within[0]}(") if within else 0
        hi = source.find("@triton.jit", lo) if within else -1
        hi = len(source) if hi < 0 else hi
        part = source[lo:hi]
        if part.count(old) != 1:
            raise SystemExit(f"edit {old[:60]!r}: {part.count(old)} occurrences where one was expected")
        source = source[:lo] + part.replace(old, new) + source[hi:]
    return source


_RENDER, _MODULE, _KERNELS = kernel_cache.render, delta._module, additive.kernels  # as the library has them
FAMILIES = {"delta": delta.FAMILY, "additive": additive.FAMILY}


def _overridden(mod, overrides: dict):
    """The kernel module `mod` with the overridden kernels' launches taking their arguments from `overrides`."""
    ns = types.SimpleNamespace(**{n: getattr(mod, n) for n in dir(mod) if not n.startswith("__")})
    for kernel, over in overrides.items():
        name = f"{mod.NAME}_{kernel}"
        setattr(ns, name, _Overridden(getattr(mod, name), over))
    return ns


def use(family: str, overrides: dict, edits: list) -> None:
    """Launch `family`'s kernels from the edited source, with the overridden arguments."""

    def rendered(name, **config):
        source = _RENDER(name, **config)
        return _edited(source, edits) if name == FAMILIES[family] else source

    kernel_cache.render = rendered
    kernel_cache.kernels.cache_clear()
    delta._module = lambda *args, **kwargs: _overridden(_MODULE(*args, **kwargs), overrides if family == "delta" else {})
    additive.kernels = lambda *args, **kwargs: _overridden(_KERNELS(*args, **kwargs), overrides if family == "additive" else {})


def inputs(family: str, decay: str, T: int) -> dict:
    dev, dt = ("cuda", torch.bfloat16) if GPU else ("cpu", torch.float32)
    B, H, D = (32768 // T, 16, 128) if GPU else (1, 1, 128)
    torch.manual_seed(0)
    x = dict(q=torch.randn(B, T, H, D, device=dev).to(dt), c=torch.randn(B, T, H, D, device=dev).to(dt),
             s=torch.rand(B, T, H, device=dev).to(dt), v=torch.randn(B, T, H, D, device=dev).to(dt),
             g=F.logsigmoid(torch.randn(B, T, H, *((D,) if decay == "key" else ()), device=dev) + 2) if decay != "none" else None,
             h0=torch.randn(B, H, D, D, device=dev) * 0.1, do=torch.randn(B, T, H, D, device=dev).to(dt),
             dht=torch.randn(B, H, D, D, device=dev) * 0.1)  # fmt: skip
    x["qs"] = torch.full((H,), D**-0.5, device=dev)  # the read-out scale, a per-head factor the kernels apply
    if family == "additive":
        x["c"] = x["c"] * D**-0.5  # the keys at attention's scale: an additive state grows with T
        if decay == "constant":
            x["g"] = F.logsigmoid(torch.randn(B, H, device=dev) + 4)  # one log decay per sequence and head
        x["cfg"] = default_config(decay, D, D).as_list()
        return x
    x["cs"] = torch.full((H,), -1., device=dev)  # the erase keys' sign: -l2norm(k), which the kernels finish
    x["cfg"] = delta_default_config(decay, D, D).as_list()
    return x


def run(x: dict, family: str, decay: str) -> list[torch.Tensor]:
    if family == "additive":
        args = (x["q"], x["qs"], x["c"], x["v"], x["g"], x["h0"], None)
        o, ht, _, _, hs, A, _ = additive._chunk_forward(*args, decay, "after", x["cfg"])
        grads = additive._chunk_backward_impl(*args, hs, A, x["do"], x["dht"], decay, "after", x["cfg"])
        return [o, ht, *grads]
    args = (x["q"], x["qs"], x["s"], x["v"], x["c"], x["g"], x["h0"], None)
    o, ht, tm, sc, rq, cn, rc = delta._delta_forward(*args, decay, "after", x["cfg"], strength=True, qnorm=True, knorm=True, cs=x["cs"])
    grads = delta._delta_backward(*args, tm, sc, rq, cn, rc, x["do"], x["dht"], decay, "after", x["cfg"], strength=True, qnorm=True,
                                  knorm=True, cs=x["cs"])  # fmt: skip
    return [o, ht, *grads]


def kernel_times(x: dict, family: str, decay: str, reps: int = 20) -> dict[str, float]:
    from torch.profiler import ProfilerActivity, profile

    run(x, family, decay)
    run(x, family, decay)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            run(x, family, decay)
        torch.cuda.synchronize()
    out = {e.key.split("float32_")[-1]: round(e.device_time_total / reps, 1) for e in prof.key_averages()
           if e.device_time_total > 0 and FAMILIES[family] in e.key}  # fmt: skip
    out["sum"] = round(sum(out.values()), 1)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variants", help="JSON file of [label, overrides, edits] (default: the kernels as they are)")
    ap.add_argument("--family", default="delta", choices=sorted(FAMILIES))
    ap.add_argument("--decay", default="scalar", choices=["none", "scalar", "key", "constant"])
    ap.add_argument("--T", type=int, default=8192)
    ap.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    args = ap.parse_args()
    variants = json.load(open(args.variants)) if args.variants else [["base", {}, []]]
    if args.family == "delta" and args.decay == "constant":
        raise SystemExit("the delta rule runs a per-head constant decay as a scalar one: use --decay scalar")
    x = inputs(args.family, args.decay, args.T if GPU else 130)
    if not GPU:
        use(args.family, {}, [])
        reference = run(x, args.family, args.decay)
        for label, overrides, edits in variants:
            use(args.family, overrides, edits)
            got = run(x, args.family, args.decay)
            err = max(((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item() for a, b in zip(got, reference) if a.numel())
            print(f"{label:40s} {err:.2e}")
            if err > 1e-6 and not label.endswith("(wrong)"):
                raise SystemExit(f"{label}: results changed by {err:.2e}")
        return
    rows = []
    for label, overrides, edits in variants:
        use(args.family, overrides, edits)
        rows.append(dict(variant=label, us=kernel_times(x, args.family, args.decay)))
        print(json.dumps(rows[-1]), flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"kernel_variants_{args.T}.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
