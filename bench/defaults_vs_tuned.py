"""The plan's default kernel configuration against the best `lamixer autotune` finds, spec by spec and length by length.

    python bench/defaults_vs_tuned.py --specs examples/specs/*.lam gla [--lengths 2048,8192] [--budget 330]
                                      [--out bench/results/defaults_vs_tuned.json]
    python bench/defaults_vs_tuned.py --specs examples/specs/*.lam gla --interpret    # the machinery, on the CPU
    python bench/defaults_vs_tuned.py --specs gla --configs 64,64,32,4,3,128,32,8 ...   # given candidates, no search

For each spec (a shipped name or a .lam file) and length T, at the benchmark's shape (B*T = 32768, H = 16, D = 128,
bf16): autotune's search (lamixer.tuning.search.tune, the coordinate descent of `lamixer autotune`: each candidate
checked against the torch backend, then timed) on the spec's first chunk template, then the default configuration
(lamixer.tuning.choose.default, what a spec nobody tuned launches with) and the search's fastest, each timed forward
and forward+backward as `lamixer bench` times (median ms, fresh gradients for every backward), through the spec's
own call with the configuration stored in the run's private cache (per-token work fused on a GPU, as a user's call
runs it: timed through the autotuner's call instead, whose per-token work is unfused, the same added time on both
sides made the ratio understate a difference between the kernels). The ratio default / tuned is the cost of not
tuning; the target is at most 1.15.

The search runs against a private cache (a temporary LAMIXER_CACHE): the user's tuned entries neither steer it nor
receive its winners; the shipped entries (lamixer/tuning/configs) are read as always, so a shipped spec's search
starts from its shipped configuration. --budget is the whole run's time, shared evenly by the (spec, length) pairs
still to come, of which a pair's search takes 80 % and the timing of the two configurations the rest; a search stops
starting candidates when its share is spent (its first candidate, the default or the shipped entry, always runs, and
a pair's overrun comes out of the later pairs' shares), so a short budget finds less than a long one: each row says
how many candidates its search tried. The default, 300 s, leaves a minute of a 6-minute slot for start-up and the last
pairs' overrun (the first candidate of each spec compiles its kernels: a warm Triton cache leaves more of the budget
to the search). The table is printed and saved (JSON, after every row) to --out. --configs replaces the search by the candidates
given (Config.as_list's order, each timed for the specs whose search space holds it; "tuned" is then the fastest of
them), for comparing candidate defaults across specs.

--interpret runs under Triton's CPU interpreter at a tiny size (B*T = 64, H = 2, D = 16, float32, T = 16 and 32
unless given): it checks that the script runs; its times mean nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

if "--interpret" in sys.argv:  # Triton reads it at import
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

import lamixer  # noqa: E402
from lamixer.kernels.config import Config  # noqa: E402
from lamixer.tools import bench  # noqa: E402
from lamixer.tools.check import random_call  # noqa: E402
from lamixer.tuning import choose, config_cache, search  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
TARGET = 1.15  # default / tuned at most this
RESERVE = 0.8  # of a pair's share of the budget, what its search may take: the rest times the two configurations


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--specs", nargs="+", required=True, help="shipped spec names and .lam files")
    ap.add_argument("--lengths", help="comma-separated sequence lengths (default 2048,8192; 16,32 with --interpret)")
    ap.add_argument("--tokens", type=int, help="B*T (default 32768; 64 with --interpret)")
    ap.add_argument("--heads", type=int, help="H (default 16; 2 with --interpret)")
    ap.add_argument("--size", type=int, help="every feature dim (default 128; 16 with --interpret)")
    ap.add_argument("--dtype", choices=sorted(DTYPES), help="the inputs' dtype (default bf16; fp32 with --interpret)")
    ap.add_argument("--budget", type=float, default=300.0, help="seconds for the whole run's searches and timings (default 300)")
    ap.add_argument("--limit", type=int, default=None, help="at most this many candidates per search")
    ap.add_argument("--configs", nargs="+", help="candidates to time instead of searching (BT,BV,BK,warps,stages,BW,BG,warps_grad)")
    ap.add_argument("--interpret", action="store_true", help="run under Triton's CPU interpreter at a tiny size")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", os.path.join(os.path.dirname(__file__), "results")), "defaults_vs_tuned.json"),
                    help="the JSON file to write (default $OUT or bench/results, defaults_vs_tuned.json)")  # fmt: skip
    args = ap.parse_args()
    tiny = args.interpret
    args.lengths = [int(t) for t in (args.lengths or ("16,32" if tiny else "2048,8192")).split(",")]
    args.tokens = args.tokens or (64 if tiny else bench.BT_TOTAL)
    args.heads = args.heads or (2 if tiny else bench.H)
    args.size = args.size or (16 if tiny else bench.D)
    args.dtype = args.dtype or ("fp32" if tiny else "bf16")
    if not tiny and not torch.cuda.is_available():
        ap.error("no GPU is visible: pass --interpret to run the machinery on the CPU")
    if any(t < 1 or args.tokens % t for t in args.lengths):
        ap.error(f"every length must divide --tokens ({args.tokens})")
    return args


def timings(source: str, config, template: str, B: int, T: int, H: int, size: int, dtype, device: str) -> tuple[float, float]:
    """(forward ms, forward+backward ms) of the spec's own call, as `lamixer bench` times it (its per-token work fused
    on a GPU), with `config` for `template`'s kernels: the configuration stored as this shape's entry in the run's
    private cache, read by the mixer's next call (choose.forget: the configurations its calls chose before are
    dropped, and their compiled graphs)."""
    mixer = lamixer.load(source)
    for key in search.entry_keys(mixer, template, B, T, H, size, dtype, device):
        config_cache.store(key, config, {})
    choose.forget()
    torch._dynamo.reset()
    for group in mixer.compiled.plan.groups:
        if group.train is not None and group.train.template == template:
            chosen = choose.choose(group, dtype, B, T, H, size, size, torch.device(device))
            assert chosen == config, f"{source}: the call would launch {search.describe(chosen)}, not {search.describe(config)}"
    tensors, _ = random_call(mixer, B=B, T=T, H=H, size=size, dtype=dtype, initial_state=False, device=device, distinct=False)
    tensors = {k: v.requires_grad_() for k, v in tensors.items()}

    def fwd():
        return mixer(**tensors, backend="triton")[0]

    do = torch.randn_like(fwd().detach())

    def fwd_bwd():
        fwd().backward(do)

    for _ in range(2):  # a signature's first call runs unfused, the second compiles (runtime/fuse.py): neither timed
        fwd_bwd()
        with torch.no_grad():
            fwd()
    with torch.no_grad():
        fwd_ms = bench.do_bench(fwd)
    return fwd_ms, bench.do_bench(fwd_bwd, list(tensors.values()))


def row(name: str, T: int, args, budget_s: float) -> dict:
    """One (spec, length): the search, then both configurations timed."""
    device = "cpu" if args.interpret else "cuda"
    dtype, H, size, B = DTYPES[args.dtype], args.heads, args.size, args.tokens // T
    m = lamixer.load(name)
    out = dict(spec=m.name, source=name, T=T, B=B, H=H, size=size, dtype=args.dtype)
    template, _ = search.search_space(m, size)
    default = choose.default(m.compiled.plan.groups[0], size, size)
    started = time.perf_counter()
    if args.configs:
        best = given(m, template, default, args.configs, B, T, H, size, dtype, device, out)
        if best is None:
            return dict(out, error="no --configs candidate runs this spec's template")
    else:
        trials, _ = search.tune(m, B, T, H, size, dtype, device, args.limit, budget_s=budget_s)
        timed = [t for t in trials if t.ms is not None]
        out.update(template=template, decay=m.compiled.plan.groups[0].decay.kind, search_s=round(time.perf_counter() - started, 1),
                   trials=len(trials), timed=len(timed))  # fmt: skip
        if not timed:
            return dict(out, error="no candidate was both correct and runnable: " + "; ".join(t.note for t in trials)[:300])
        best = min(timed, key=lambda t: t.ms).config
    out.update(default=search.describe(default), tuned=search.describe(best), tuned_is_default=best == default)
    for label, config in (("default", default), ("tuned", best)):
        if label == "tuned" and best == default:  # one configuration: its ratio is 1 by definition, not a second sample's noise
            out.update(tuned_fwd_ms=out["default_fwd_ms"], tuned_fwdbwd_ms=out["default_fwdbwd_ms"])
            continue
        fwd_ms, fb_ms = timings(name, config, template, B, T, H, size, dtype, device)
        out.update({f"{label}_fwd_ms": round(fwd_ms, 4), f"{label}_fwdbwd_ms": round(fb_ms, 4)})
    for k in ("fwd", "fwdbwd"):
        out[f"{k}_default_over_tuned"] = round(out[f"default_{k}_ms"] / out[f"tuned_{k}_ms"], 3)
    return out


def given(m, template: str, default: Config, configs: list[str], B, T, H, size, dtype, device, out: dict) -> Config | None:
    """The fastest (forward+backward) of the --configs candidates in the spec's search space, each timed through the
    spec's call like the default; their times go to out."""
    _, space = search.search_space(m, size)
    candidates = [c for c in (Config.from_list(c.split(",")) for c in configs) if c != default and c in space]
    out.update(template=template, decay=m.compiled.plan.groups[0].decay.kind, trials=len(candidates), timed=len(candidates))
    best, best_ms, times = None, None, {}
    for c in candidates:
        fwd_ms, fb_ms = timings(out["source"], c, template, B, T, H, size, dtype, device)
        times[search.describe(c)] = [round(fwd_ms, 4), round(fb_ms, 4)]
        if best_ms is None or fb_ms < best_ms:
            best, best_ms = c, fb_ms
    out["candidates_ms"] = times
    return best


def summary(rows: list[dict]) -> dict:
    done = [r for r in rows if "fwd_default_over_tuned" in r]
    worst = {k: max((r[f"{k}_default_over_tuned"] for r in done), default=None) for k in ("fwd", "fwdbwd")}
    return dict(worst_fwd=worst["fwd"], worst_fwdbwd=worst["fwdbwd"], target=TARGET, failed=len(rows) - len(done),
                within_target=bool(done) and all(v <= TARGET for v in worst.values()))  # fmt: skip


def save(res: dict, path: str) -> None:
    """Atomically, after every row: a run cut short keeps what it measured."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(res, f, indent=1)
    os.replace(path + ".tmp", path)


def table(rows: list[dict]) -> str:
    head = f"{'spec':<22} {'T':>6} {'tried':>5} {'fwd default/tuned':>20} {'ratio':>6} {'fwd+bwd default/tuned':>24} {'ratio':>6}"
    lines = [head, "-" * len(head)]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['spec']:<22} {r['T']:>6} {r.get('trials', 0):>5}  {r['error'][:80]}")
            continue
        lines.append(f"{r['spec']:<22} {r['T']:>6} {r['trials']:>5} {r['default_fwd_ms']:>9.3f} / {r['tuned_fwd_ms']:<8.3f} "
                     f"{r['fwd_default_over_tuned']:>6.2f} {r['default_fwdbwd_ms']:>11.3f} / {r['tuned_fwdbwd_ms']:<10.3f} "
                     f"{r['fwdbwd_default_over_tuned']:>6.2f}")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    args = parse()
    if args.interpret:
        bench.DEVICE = "cpu"  # bench.do_bench: wall time off a GPU
    pairs = [(name, T) for T in args.lengths for name in args.specs]
    res = {"device": torch.cuda.get_device_name() if not args.interpret else "cpu-interpreter", "torch": torch.__version__,
           "shape": dict(tokens=args.tokens, H=args.heads, size=args.size, dtype=args.dtype), "budget_s": args.budget, "rows": []}  # fmt: skip
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="lamixer-defaults-vs-tuned-") as cache:
        os.environ["LAMIXER_CACHE"] = cache  # the search's winners go here, not to the user's cache
        for i, (name, T) in enumerate(pairs):
            share = max(0.0, args.budget - (time.perf_counter() - started)) / (len(pairs) - i)
            try:
                r = row(name, T, args, RESERVE * share)
            except Exception as e:  # one spec that cannot be tuned (no chunk kernels, a failed launch) must not stop the run
                r = dict(spec=name, source=name, T=T, error=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300])
            res["rows"].append(r)
            res["summary"] = summary(res["rows"])
            res["elapsed_s"] = round(time.perf_counter() - started, 1)
            save(res, args.out)
            print(json.dumps(r), flush=True)
            torch.cuda.empty_cache()
    print(table(res["rows"]))
    s = res["summary"]
    print(f"worst default/tuned: forward {s['worst_fwd']}, forward+backward {s['worst_fwdbwd']} (target <= {TARGET}); "
          f"{res['elapsed_s']} s; written to {args.out}")  # fmt: skip


if __name__ == "__main__":
    main()
