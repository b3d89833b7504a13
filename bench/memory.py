"""What a mixer's forward+backward keeps and allocates, measured on the CPU (the kernels under TRITON_INTERPRET=1), as
`lamixer bench` runs it on a GPU (the triton backend, bf16 inputs, fresh gradients), scaled to the bench's shape.

    TRITON_INTERPRET=1 python bench/memory.py lln [--T 512 --H 2 --D 128] [--emulate] [--fused] [--at-peak]

Two numbers, both in bytes per (token x head), which scale linearly to B * T * H of any shape:
- saved: the unique storages the autograd graph keeps from the forward for the backward (saved_tensors_hooks),
  less the inputs themselves;
- work: the peak of the bytes the forward+backward holds above what was allocated before it (torch.profiler's
  allocation events), the bench's work_GiB; the storages of the output, the gradients and the saved tensors count.
--emulate runs bf16 kernels in bf16 as a GPU does (lamixer.tools.emulate; without it the interpreter's kernels take
float32 copies; block attention then runs in bf16 too, as on a GPU); --fused runs the per-token work under
torch.compile as on a GPU (runtime/fuse.py; needs a C++ compiler for inductor's CPU code; the saved bytes are then
those of a call under saved-tensor hooks, which torch.compile partitions apart: read the held bytes instead).
--at-peak lists what is live at the forward+backward peak: each allocation by where it was made (the forward or the
backward, the compiled graph, the lamixer op around it), from the profiler's trace, which names each block's address.
--cuda measures on the GPU instead (the kernels compiled, the per-token work fused), from the caching allocator's
history: the peak and what is live at it, each block by the innermost lamixer or compiled-graph line that made it.

    python bench/memory.py lln --cuda --B 4 --T 8192 --H 16 --at-peak
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import traceback

os.environ.setdefault("TRITON_INTERPRET", "0" if "--cuda" in sys.argv else "1")

import torch  # noqa: E402

import lamixer  # noqa: E402
from lamixer.tools.check import random_call  # noqa: E402

BENCH = dict(B=4, T=8192, H=16, D=128)  # lamixer bench's shape at T = 8192 (B * T = 32768)


def _where() -> str:
    """The innermost lamixer source line on the stack (where a saved tensor was saved)."""
    for f in reversed(traceback.extract_stack()):
        if "/lamixer/" in f.filename:
            return f"{f.filename.rpartition('/lamixer/')[2]}:{f.lineno}"
    return "?"


def saved_bytes(fn) -> tuple[object, int, list[tuple[tuple, torch.dtype, int]]]:
    """fn()'s result and the bytes of the unique storages its autograd graph saved, with (shape, dtype, bytes) of each."""
    seen: dict[int, tuple] = {}

    def pack(t: torch.Tensor):
        s = t.untyped_storage()
        if s.data_ptr() not in seen and s.nbytes():
            seen[s.data_ptr()] = (tuple(t.shape), t.dtype, s.nbytes(), _where())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, seen


def allocation_peak(fn) -> tuple[int, int, int]:
    """The peak of the bytes fn() allocates and has not yet freed, what it still held at the mark and its peak before (a
    record_function named "mark" fn enters once, between its forward and its backward): every allocation and free as
    torch.profiler records it, in time order (the kernels' own numpy work under the interpreter is outside them)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=False) as prof:
        fn()
    events = sorted(prof.profiler.kineto_results.events(), key=lambda e: e.start_ns())
    mark = next(e.start_ns() for e in events if e.name() == "mark")
    live = peak = held = forward = 0
    for e in events:
        if e.name() == "[memory]":
            if e.start_ns() >= mark and not held:
                held, forward = live, peak
            live += e.nbytes()
            peak = max(peak, live)
    return peak, held, forward


# the enclosing events that say where a block was allocated: the autograd node running, a compiled graph, a custom op
_WHERE = ("evaluate_function", "CompiledFxGraph", "lamixer::", "aten::_scaled_dot_product")


def live_at_peak(fn) -> list[tuple[int, str]]:
    """(bytes, where) of every block fn() holds at its allocation peak (the blocks allocated before it left out),
    largest first; where: the enclosing events of _WHERE around its allocation, outermost first, and whether the
    forward or the backward made it (a record_function named "mark" fn enters between them)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    spans = sorted((e["ts"], e["ts"] + e.get("dur", 0), e["name"]) for e in events if e.get("ph") == "X")
    mark = next(t0 for t0, _, n in spans if n == "mark")
    blocks = sorted((e["ts"], e["args"]["Addr"], e["args"]["Bytes"]) for e in events if e.get("name") == "[memory]")
    live: dict[int, tuple[int, float]] = {}
    total = peak = 0
    at_peak: dict[int, tuple[int, float]] = {}
    for ts, addr, n in blocks:
        if n > 0:
            live[addr] = (n, ts)
        elif addr in live:  # a block made before the profile began is not counted, as allocation_peak does not
            n = -live.pop(addr)[0]
        else:
            continue
        total += n
        if total > peak:
            peak, at_peak = total, dict(live)

    def where(ts: float) -> str:
        around = [n[:72] for t0, t1, n in spans if t0 <= ts <= t1 and any(w in n for w in _WHERE)]
        return ("backward" if ts > mark else "forward") + "".join(f" > {n}" for n in around[-3:])

    return sorted(((n, where(ts)) for n, ts in at_peak.values()), key=lambda r: -r[0])


def _made_at(frames: list[dict]) -> str:
    """Where a CUDA block was made: the backward or the forward, and the innermost lamixer or compiled-graph lines."""
    names = [f"{f['filename'].rpartition('/')[2]}:{f['line']}" for f in frames
             if "/lamixer/" in f["filename"] or "torchinductor" in f["filename"]]  # fmt: skip
    side = "backward" if any(f["name"] == "backward" for f in frames) else "forward"
    return " > ".join([side] + names[:2][::-1])


def cuda_peak(fn) -> tuple[int, list[tuple[int, str]]]:
    """The peak of the bytes fn() holds on the GPU above what was allocated before it, and (bytes, where) of each block
    live then, largest first (the caching allocator's history, with Python stacks)."""
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(stacks="python", max_entries=1_000_000)
    try:
        fn()
        torch.cuda.synchronize()
        trace = torch.cuda.memory._snapshot()["device_traces"][torch.cuda.current_device()]
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    live: dict[int, tuple[int, str]] = {}
    total = peak = 0
    at_peak: dict[int, tuple[int, str]] = {}
    for e in trace:
        if e["action"] == "alloc":
            live[e["addr"]] = (e["size"], _made_at(e["frames"]))
            total += e["size"]
            if total > peak:
                peak, at_peak = total, dict(live)
        elif e["action"] == "free_completed" and e["addr"] in live:
            total -= live.pop(e["addr"])[0]
    return peak, sorted(at_peak.values(), key=lambda r: -r[0])


def measure_cuda(name: str, B: int, T: int, H: int, D: int) -> dict:
    m = lamixer.load(name)
    tensors, _ = random_call(m, B=B, T=T, H=H, size=D, dtype=torch.bfloat16, device="cuda", initial_state=False, distinct=False)
    tensors = {k: v.requires_grad_() for k, v in tensors.items()}
    do = torch.randn(B, T, H, D, dtype=torch.bfloat16, device="cuda")

    def fb():
        for t in tensors.values():
            t.grad = None
        m(**tensors, backend="triton")[0].backward(do)

    for _ in range(3):  # the first call of a signature runs unfused; the second compiles
        fb()
    for t in tensors.values():
        t.grad = None
    peak, live = cuda_peak(fb)
    units = B * T * H
    return dict(work=peak / units, units=units, live=live)


def measure(name: str, B: int, T: int, H: int, D: int, fused: bool = False, at_peak: bool = False) -> dict:
    m = lamixer.load(name)
    tensors, _ = random_call(m, B=B, T=T, H=H, size=D, dtype=torch.bfloat16, initial_state=False, distinct=False)
    tensors = {k: v.requires_grad_() for k, v in tensors.items()}
    do = torch.randn(B, T, H, D, dtype=torch.bfloat16)
    if fused:
        from lamixer.runtime import fuse

        fuse.DEVICES = ("cpu",)
        for _ in range(2):  # the first call of a signature runs unfused; the second compiles
            m(**tensors, backend="triton")[0].backward(do)
    for t in tensors.values():
        t.grad = None
    o, seen = saved_bytes(lambda: m(**tensors, backend="triton")[0])
    inputs = {t.untyped_storage().data_ptr() for t in tensors.values()}
    kept = {p: v for p, v in seen.items() if p not in inputs}
    del o
    for t in tensors.values():
        t.grad = None
    def fb():
        o = m(**tensors, backend="triton")[0]
        with torch.profiler.record_function("mark"):
            pass
        o.backward(do)

    peak, held, forward = allocation_peak(fb)
    units = B * T * H
    live = live_at_peak(fb) if at_peak else []
    return dict(saved=sum(v[2] for v in kept.values()) / units, work=peak / units, held=held / units, forward=forward / units,
                kept=sorted(kept.values(), key=lambda v: -v[2]), units=units, live=live)  # fmt: skip


def _half_attention(call) -> torch.dtype | None:
    """Block attention's dtype as on a GPU (runtime.scan.attention_dtype): the inputs' half type."""
    return call.out_dtype if call.out_dtype in (torch.bfloat16, torch.float16) else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("spec")
    p.add_argument("--B", type=int, default=1)
    p.add_argument("--T", type=int, default=512)
    p.add_argument("--H", type=int, default=2)
    p.add_argument("--D", type=int, default=128)
    p.add_argument("--emulate", action="store_true", help="bf16 kernels as on a GPU (lamixer.tools.emulate)")
    p.add_argument("--fused", action="store_true", help="the per-token work under torch.compile, as on a GPU")
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--at-peak", action="store_true", help="list what is live at the forward+backward peak, by where it was made")
    p.add_argument("--cuda", action="store_true", help="measure on the GPU (the caching allocator's history)")
    args = p.parse_args()
    if args.cuda:
        r = measure_cuda(args.spec, args.B, args.T, args.H, args.D)
        print(f"{args.spec}: B={args.B} T={args.T} H={args.H} D={args.D}, bf16, on the GPU")
        print(f"forward+backward peak above the inputs: {r['work']:.0f} bytes per token x head"
              f" -> {r['work'] * r['units'] / 2**30:.3f} GiB")  # fmt: skip
        if args.at_peak:
            print(*(f"{n / r['units']:7.0f}  {w}" for n, w in r["live"][: args.top]), sep="\n")
        return
    if args.emulate:
        from lamixer.backends import evaluate
        from lamixer.tools import emulate

        emulate.bf16_like_gpu()
        evaluate.attention_dtype = _half_attention
    r = measure(args.spec, args.B, args.T, args.H, args.D, args.fused, args.at_peak)
    scale = BENCH["B"] * BENCH["T"] * BENCH["H"] / r["units"]  # at the bench's D (128) bytes per token x head match it
    print(f"{args.spec}: B={args.B} T={args.T} H={args.H} D={args.D}, bf16, triton backend{' fused' if args.fused else ''}")
    print(f"saved for the backward: {r['saved']:.0f} bytes per token x head ({r['saved'] / args.D:.2f} per element)"
          f" -> {r['saved'] * r['units'] * scale / 1e6:.0f} MB at B=4 T=8192 H=16 D=128")  # fmt: skip
    print(f"forward+backward peak above the inputs: {r['work']:.0f} bytes per token x head"
          f" -> {r['work'] * r['units'] * scale / 1e6:.0f} MB at the bench shape")
    print(f"forward's own peak: {r['forward']:.0f} bytes per token x head -> {r['forward'] * r['units'] * scale / 1e6:.0f} MB")
    print(f"held after the forward (the output and what the backward keeps): {r['held']:.0f} bytes per token x head"
          f" -> {r['held'] * r['units'] * scale / 1e6:.0f} MB")  # fmt: skip
    print("kept:", *(f"{n} {list(s)} {str(d).removeprefix('torch.')} {w}" for s, d, n, w in r["kept"][: args.top]), sep="\n  ")
    if args.at_peak:
        live = r["live"]
        print(f"live at the peak ({sum(n for n, _ in live) / r['units']:.0f} bytes per token x head), largest first:")
        print(*(f"{n / r['units']:7.0f}  {w}" for n, w in live[: args.top]), sep="\n")


if __name__ == "__main__":
    main()
