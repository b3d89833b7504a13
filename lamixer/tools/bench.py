"""Timing lamixer's Triton kernels against FLA and SDPA on a GPU, and against the memory floor.

One run times forward and forward+backward at B*T = 32768, H = 16, D = 128 (bf16) for each length,
peak memory, and the one-token decode step (the mixer call and a layer's step, from Python and
replayed from a CUDA graph, with the state's GB/s); ratios to the peers (FLA's kernel of a shipped spec, when FLA
is importable: an optional benchmark dependency, never a runtime one; a user's own kernel, described as
lamixer/tools/peers.py says) and to the time to move the inputs and outputs (for decoding: the state) once at the
measured copy bandwidth. A peer is checked against lamixer on the benchmark's own inputs before it is timed: its
output and every gradient, as relative errors; one that disagrees is not timed. Every timed backward writes fresh
gradients. `lamixer bench` and bench/gpu.py use it.
"""
from __future__ import annotations

import statistics
import time
import traceback
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ..api import Mixer
from . import peers
from .check import random_call, rel_rms
from .peers import COMPETITORS, peer_call

H, D, BT_TOTAL = 16, 128, 32768
DEVICE = "cuda"  # where run() puts its tensors

def fla_available() -> bool:
    try:
        import fla.ops.common.chunk_o as chunk_o

        # FLA refuses its gated backward on Triton 3.6 Hopper (its issue #640); time it anyway, as its users would
        chunk_o.TRITON_ABOVE_3_7_1 = True
        return True
    except Exception:
        return False


def do_bench(fn, leaves=()) -> float:
    """Median ms of fn; `leaves` (tensors fn's backward reaches) get no gradient to accumulate into: each timed
    backward writes fresh ones, as a model's activations do (an accumulating add per input is a whole extra pass,
    which would count on both sides of every comparison). Off a GPU (tests), the median wall time of three calls."""
    if DEVICE != "cuda":
        return _wall_ms(fn, leaves)
    import triton

    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median", grad_to_none=list(leaves) or None)


def _wall_ms(fn, leaves=()) -> float:
    times = []
    for _ in range(3):
        for leaf in leaves:
            leaf.grad = None
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def copy_bandwidth() -> float:
    """Bytes per second of a device-to-device copy of 1 GiB (read plus write)."""
    x = torch.empty(2**29, dtype=torch.bfloat16, device="cuda").normal_()
    y = torch.empty_like(x)
    ms = do_bench(lambda: y.copy_(x))
    return 2 * x.numel() * x.element_size() / (ms * 1e-3)


def _time(label, fn, do, row, leaves=()) -> dict:
    """Time fn's forward and forward+backward (with `do` as the output's gradient) into row; on a GPU also the peak
    memory of one forward+backward with fresh gradients: peak_GiB all told, work_GiB above what was allocated before
    it (the inputs and whatever the run holds), which a peer whose inputs are laid out anew is compared by."""
    try:
        with torch.no_grad():
            row["fwd_ms"] = round(do_bench(fn), 4)

        def fb():
            fn().backward(do)

        row["fwdbwd_ms"] = round(do_bench(fb, leaves), 4)
        if DEVICE == "cuda":
            for leaf in leaves:
                leaf.grad = None
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            fb()
            peak = torch.cuda.max_memory_allocated()
            row.update(peak_GiB=round(peak / 2**30, 2), work_GiB=round((peak - before) / 2**30, 3))
    except Exception as e:  # a failing competitor must not stop the run
        traceback.print_exc()
        row["error"] = repr(e)[:300]
    return dict(op=label, **row)


def _gradients(fn: Callable[[], torch.Tensor], leaves: dict, do: torch.Tensor) -> dict:
    """fn's output and the gradient of <o, do> for each leaf (None where none reaches it), leaving .grad alone."""
    o = fn()
    grads = torch.autograd.grad(o, list(leaves.values()), do, allow_unused=True)
    return {"o": o.detach(), **{f"d{k}": g for k, g in zip(leaves, grads)}}


def agreement(m: Mixer, entry: dict, tensors: dict, theirs: dict, do: torch.Tensor) -> dict[str, float]:
    """Relative RMS errors of a peer's output and of its gradient for every input against lamixer's (the triton
    backend) on the same inputs and output gradient; theirs: the inputs as the peer takes them (peers.lay_out)."""
    ours = _gradients(lambda: m(**tensors, backend="triton")[0], tensors, do)
    got = _gradients(lambda: peers.output(peer_call(entry, theirs)), theirs, peers.to_layout(entry, do))
    tokens = peers.per_token(m)
    errors = {"o": rel_rms(peers.to_bthd(entry, got["o"]), ours["o"])}
    for k in tensors:
        g = got[f"d{k}"]
        errors[f"d{k}"] = rel_rms(peers.to_bthd(entry, g) if k in tokens else g, ours[f"d{k}"])
    return errors


TOLERANCE = 5e-2  # a peer further than this from lamixer (relative, bf16) computes something else: it is not timed


def _peer_row(label: str, m: Mixer, entry: dict, tensors: dict, do: torch.Tensor, row: dict, tolerance: float) -> dict:
    """A peer checked against lamixer, then timed (fresh gradients for its own leaves, which a head-first layout
    makes anew); a row with an error and no times when the check fails or finds it disagreeing."""
    try:
        theirs = peers.lay_out(entry, m, tensors)
        errors = agreement(m, entry, tensors, theirs, do)
    except Exception as e:  # a failing peer must not stop the run
        traceback.print_exc()
        return dict(op=label, **row, error=f"the check against lamixer failed: {e!r}"[:300])
    row = dict(row, vs_lamixer={k: float(f"{v:.3g}") for k, v in errors.items()})
    worst = max(errors, key=lambda k: errors[k] if errors[k] == errors[k] else float("inf"))  # NaN counts as the worst
    if not errors[worst] <= tolerance:
        return dict(op=label, **row, error=f"disagrees with lamixer: {worst} off by {errors[worst]:.2e} relative (tolerance {tolerance:g}); not timed")
    return _time(label, lambda: peers.output(peer_call(entry, theirs)), peers.to_layout(entry, do), row, list(theirs.values()))


def without_fla(mixers: list[Mixer]) -> list[str]:
    """Why some of `mixers` will get no FLA row when FLA is asked for: FLA not importable, or a spec with no entry in
    competitors.json (a user's file, or a shipped spec FLA has no kernel for)."""
    if not fla_available():
        return ["flash-linear-attention is not importable here: no FLA rows"]
    return [f"{m.name} has no FLA peer in lamixer/tools/competitors.json: time yours with --peer" for m in mixers if m.name not in COMPETITORS]


def _peers(m: Mixer, have_fla: bool, peer: dict | None) -> list[tuple[str, dict, str]]:
    """(row label, entry, the key its ratios take) of each peer m is timed against: FLA's, the user's."""
    out = []
    if have_fla and m.name in COMPETITORS:
        entry = COMPETITORS[m.name]["chunk"]
        out.append((f"fla {entry['fn'].split(':')[1]}", entry, "fla"))
    if peer is not None:
        out.append((f"peer {peer['fn'].rpartition(':')[2]}", peer, "peer"))
    return out


def floors(tensors: dict, out_numel: int, bandwidth: float) -> tuple[float, float]:
    """The memory floor (ms) of a forward (inputs read, output written once) and a forward+backward
    (also the output's gradient read and one gradient per input written)."""
    ins = sum(t.numel() * t.element_size() for t in tensors.values())
    out = out_numel * 2
    return 1e3 * (ins + out) / bandwidth, 1e3 * (2 * ins + 2 * out) / bandwidth


def run(mixers: list[Mixer], Ts: list[int], vs: set[str], decode: bool = True, log=print, save=None, peer: dict | None = None,
        tolerance: float = TOLERANCE) -> dict:  # fmt: skip
    """Every row of one benchmark run; save(result so far) after each row, so that a run cut short keeps its rows.
    peer: a user's kernel, an entry as lamixer/tools/peers.py describes (checked against each spec's inputs first)."""
    bandwidth = copy_bandwidth()
    have_fla = "fla" in vs and fla_available()
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "copy_GBps": round(bandwidth / 1e9, 1),
           "fla": have_fla, "peer": peer, "rows": []}  # fmt: skip
    rows = res["rows"]

    def emit(row: dict) -> None:
        rows.append(row)
        log(row)
        if save:
            save(res)
    for T in Ts:
        B = BT_TOTAL // T
        for m in mixers:
            tensors, _ = random_call(m, B=B, T=T, H=H, size=D, dtype=torch.bfloat16, initial_state=False, device=DEVICE, distinct=False)
            tensors = {k: v.requires_grad_() for k, v in tensors.items()}
            do = torch.randn(B, T, H, D, device=DEVICE, dtype=torch.bfloat16)
            fwd_floor, fb_floor = floors({k: v for k, v in tensors.items() if v.dim() >= 3}, do.numel(), bandwidth)
            leaves = list(tensors.values())
            ours = _time(f"lamixer {m.name}", lambda: m(**tensors, backend="triton")[0], do, dict(T=T, B=B), leaves)
            ours.update(fwd_floor_ms=round(fwd_floor, 4), fwdbwd_floor_ms=round(fb_floor, 4))
            if "fwd_ms" in ours:
                ours["fwd_vs_floor"] = round(ours["fwd_ms"] / fwd_floor, 2)
            emit(ours)
            for label, entry, key in _peers(m, have_fla, peer):
                theirs = _peer_row(label, m, entry, tensors, do, dict(T=T, B=B), tolerance)
                for k in ("fwd_ms", "fwdbwd_ms", "work_GiB"):
                    if k in ours and k in theirs:
                        ours[f"{k.rpartition('_')[0]}_vs_{key}"] = round(ours[k] / theirs[k], 2)
                emit(theirs)
        if "sdpa" in vs:
            q, k, v = (torch.randn(B, T, H, D, device=DEVICE, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
            do = torch.randn(B, T, H, D, device=DEVICE, dtype=torch.bfloat16)
            emit(_time("sdpa causal", lambda: F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                                              is_causal=True).transpose(1, 2), do, dict(T=T, B=B), (q, k, v)))  # fmt: skip
        torch.cuda.empty_cache()
    if decode:
        for m in mixers:
            for row in decode_rows(m, bandwidth, have_fla):
                emit(row)
    return res


# ---- decoding: one token per sequence, from Python and replayed from a CUDA graph ----
DECODE_BATCHES = (1, 64, 256)


def wall_us(fn, n: int = 200, sync=None) -> float:
    """Wall-clock microseconds per call of fn called back to back from Python, as a decoding loop calls it:
    the host's work and the device's overlap, so this is the larger of the two, launch overhead included
    (triton's do_bench flushes the L2 cache between calls, which hides the host's share)."""
    sync = sync or torch.cuda.synchronize
    for _ in range(10):
        fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    sync()
    return (time.perf_counter() - t0) / n * 1e6


def graphed(fn):
    """fn captured in a CUDA graph (after warm-up calls on a side stream, which also fill lamixer's per-signature
    caches); returns the graph's replay, which reruns the captured kernels on the same tensors."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def decode_row(op: str, B: int, state_bytes: int, bandwidth: float, step, replay=None, wall=wall_us) -> dict:
    """Timing of one decode step: us from Python (and graph_us of `replay` when given: a CUDA graph's replay, for a
    layer Layer.decoder's step, its input's copy included), with the state's bytes read and written per microsecond
    (state_GBps) and the ratio to moving the state once each way at the copy bandwidth (vs_floor)."""
    floor_us = 1e6 * 2 * state_bytes / bandwidth
    row = dict(op=op, B=B, state_MB=round(state_bytes / 2**20, 2), state_floor_us=round(floor_us, 2))
    timings = [("", step)] + ([("graph_", replay)] if replay is not None else [])
    for prefix, fn in timings:
        us = wall(fn)
        row[f"{prefix}us"] = round(us, 1)
        row[f"{prefix}state_GBps"] = round(2 * state_bytes / us / 1e3, 1)
        row[f"{prefix}vs_floor"] = round(us / floor_us, 2)
    return row


def _guarded(op: str, B: int, make) -> dict:
    try:
        return make()
    except Exception as e:  # one failing configuration must not stop the run
        traceback.print_exc()
        return dict(op=op, B=B, error=repr(e)[:300])


def decode_rows(m: Mixer, bandwidth: float, have_fla: bool = False) -> list[dict]:
    """The one-token step of the mixer call (bf16 inputs, float32 states, H = 16, D = 128) and of a layer of the
    spec (hidden = H * D), each from Python and as a CUDA-graph replay, at B = 1, 64, 256."""
    from ..layer import Layer

    rows = []
    for B in DECODE_BATCHES:
        tensors, states = random_call(m, B=B, T=1, H=H, size=D, dtype=torch.bfloat16, device="cuda", distinct=False)
        h0 = tuple(s.float() for s in states)
        h0_arg = h0 if len(h0) > 1 else h0[0]

        def step():
            return m(**tensors, initial_state=h0_arg, output_final_state=True, backend="triton")

        def mixer_row():
            with torch.no_grad():
                row = decode_row(f"lamixer {m.name} decode", B, sum(s.numel() * 4 for s in h0), bandwidth, step, graphed(step))
                if have_fla and m.name in COMPETITORS:
                    entry = COMPETITORS[m.name]["decode"]

                    def fla_step():
                        return peer_call(entry, tensors, h0_arg)

                    row["fla_us"] = round(wall_us(fla_step), 1)
                    try:  # FLA's step replayed as ours is, where its call can be captured
                        row["fla_graph_us"] = round(wall_us(graphed(fla_step)), 1)
                    except Exception as e:
                        row["fla_graph_error"] = repr(e)[:200]
            return row

        rows.append(_guarded(f"lamixer {m.name} decode", B, mixer_row))
        if m.compiled.graph.layer is not None:

            def layer_row():
                layer = Layer(m, H * D, H, backend="triton").to(device="cuda", dtype=torch.bfloat16)
                xs = torch.randn(4, B, H * D, device="cuda", dtype=torch.bfloat16)
                with torch.no_grad():
                    state = layer.initial_state(B, "cuda")
                    dec = layer.decoder(B, state)  # Layer.decoder: the step captured in a CUDA graph
                    worst = 0.0
                    for x in xs:  # the decoder's steps against the plain ones, state carried by each
                        y, state = layer.step(x, state)
                        worst = max(worst, rel_rms(dec.step(x), y))
                    state_bytes = sum(s.numel() * s.element_size() for s in state.mixer)

                    def layer_step():
                        return layer.step(xs[0], state)

                    row = decode_row(f"lamixer {m.name} layer step", B, state_bytes, bandwidth, layer_step, lambda: dec.step(xs[0]))
                    row["graph_vs_step"] = float(f"{worst:.2e}")
                    return row

            if m.compiled.graph.carries_state():
                rows.append(_guarded(f"lamixer {m.name} layer step", B, layer_row))
    return rows


def plot(res: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, title in ((axes[0], "fwd_ms", "forward"), (axes[1], "fwdbwd_ms", "forward + backward")):
        ops = sorted({r["op"] for r in res["rows"] if key in r})
        for op in ops:
            pts = sorted((r["T"], r[key]) for r in res["rows"] if r.get("op") == op and key in r)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=op)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("T (B*T = 32768, H = 16, D = 128, bf16)")
        ax.set_ylabel("ms")
        ax.set_title(f"{title}, {res['device']}")
        ax.grid(True, which="both", alpha=0.3)
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
