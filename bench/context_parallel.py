"""Context parallelism on GPUs: forward+backward time and peak memory per GPU of one long sequence, whole on one
GPU and split over the ranks of a torchrun group (NCCL).

    torchrun --nproc_per_node 1 bench/context_parallel.py [--specs gla,gated_deltanet,kda] [--lengths 32768,131072,524288] [--fla]
    torchrun --nproc_per_node 2 bench/context_parallel.py [same options]
    python bench/context_parallel.py --table DIR     # the two runs side by side, against the targets

Each run times mixer(q, k, v, ...) forward and backward (B = 1, H = 16, D = 128, bf16, the Triton kernels) at
each length T: on one GPU the whole sequence, on N the call with context_parallel=group, each rank T / N tokens.
Inputs are the spec's random ones (lamixer.tools.check.random_call) for 8192 tokens, repeated along time. The
time is the median of the iterations after warm-up, the slowest rank's; the memory the largest rank's peak
(torch.cuda.max_memory_allocated) over one forward and backward. With --fla, FLA's own context parallelism
(fla.ops.cp: gated delta rule and KDA) beside them, where FLA is installed and has it. Results go to
$OUT (or bench/results) as context_parallel_<N>gpu.json; --table reads both and prints the 2-GPU / 1-GPU
ratios (targets at T = 128K: time <= 0.6, memory <= 0.55).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch
import torch.distributed as dist

import lamixer
from lamixer.tools.check import random_call

PIECE = 8192  # tokens drawn at random, then repeated to the length (drawing 512K tokens in float64 on the host is slow)


def _inputs(mixer, T: int, H: int, D: int, device) -> dict[str, torch.Tensor]:
    tensors, _ = random_call(mixer, B=1, T=min(PIECE, T), H=H, size=D, dtype=torch.bfloat16, initial_state=False, device=device,
                             distinct=False, seed=dist.get_rank() if dist.is_initialized() else 0)  # fmt: skip
    kinds = {op.name: op.kind for op in mixer.compiled.graph.operands}
    out = {}
    for name, x in tensors.items():
        if kinds[name] == "input" and x.shape[1] < T:
            x = x.repeat(1, -(-T // x.shape[1]), *([1] * (x.dim() - 2)))[:, :T]
        out[name] = x.contiguous().requires_grad_()
    return out


def _measure(step, leaves: list[torch.Tensor], iters: int) -> tuple[float, float]:
    """(median ms of step() forward and backward over `iters` after two warm-ups, peak GB), the slowest rank's."""
    for _ in range(2):
        step()
    times = []
    torch.cuda.reset_peak_memory_stats()
    for _ in range(iters):
        for x in leaves:
            x.grad = None
        if dist.is_initialized():
            dist.barrier()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    result = torch.tensor([statistics.median(times), torch.cuda.max_memory_allocated() / 1e9], device="cuda")
    if dist.is_initialized():
        dist.all_reduce(result, op=dist.ReduceOp.MAX)
    return float(result[0]), float(result[1])


def lamixer_row(name: str, T: int, args, group) -> dict:
    world = dist.get_world_size() if dist.is_initialized() else 1
    mixer = lamixer.load(name)
    tensors = _inputs(mixer, T // world, args.heads, args.dim, "cuda")
    cp = {} if group is None else {"context_parallel": group}

    def step():
        o, _ = mixer(**tensors, backend="triton", **cp)
        o.backward(torch.ones_like(o))

    ms, gb = _measure(step, list(tensors.values()), args.iters)
    return {"impl": "lamixer", "spec": name, "T": T, "gpus": world, "ms": ms, "peak_gb": gb}


def fla_row(name: str, T: int, args, group) -> dict | None:
    """FLA's context parallelism for the delta-rule specs it covers (None where it has none)."""
    try:
        from fla.ops.cp import build_cp_context
    except ImportError:
        return None
    world = dist.get_world_size() if dist.is_initialized() else 1
    if name == "gated_deltanet":
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as op
    elif name == "kda":
        from fla.ops.kda import chunk_kda as op
    else:
        return None
    mixer = lamixer.load(name)
    t = _inputs(mixer, T // world, args.heads, args.dim, "cuda")
    q, k = (torch.nn.functional.normalize(t[n].detach(), dim=-1).requires_grad_() for n in ("q", "k"))
    leaves = [q, k, t["v"], t["g"], t["beta"]]
    cu = torch.tensor([0, T], dtype=torch.long, device="cuda")
    extra = {} if group is None else {"cp_context": build_cp_context(cu, group=group)}

    def step():
        o, _ = op(q, k, t["v"], t["g"], t["beta"], **extra)
        o.backward(torch.ones_like(o))

    ms, gb = _measure(step, leaves, args.iters)
    return {"impl": "fla", "spec": name, "T": T, "gpus": world, "ms": ms, "peak_gb": gb}


def run(args) -> None:
    if "WORLD_SIZE" in os.environ:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group("nccl")
    world = dist.get_world_size() if dist.is_initialized() else 1
    rank = dist.get_rank() if dist.is_initialized() else 0
    group = dist.new_group(list(range(world))) if world > 1 else None
    rows = []
    for name in args.specs.split(","):
        for T in (int(t) for t in args.lengths.split(",")):
            for make in (lamixer_row, fla_row) if args.fla else (lamixer_row,):
                try:
                    row = make(name, T, args, group)
                except torch.cuda.OutOfMemoryError:
                    row = {"impl": make.__name__.split("_")[0], "spec": name, "T": T, "gpus": world, "ms": None, "peak_gb": None, "error": "out of memory"}
                    torch.cuda.empty_cache()
                except Exception as e:  # a peer's API differs: recorded, not fatal
                    row = {"impl": make.__name__.split("_")[0], "spec": name, "T": T, "gpus": world, "ms": None, "peak_gb": None, "error": repr(e)[:200]}
                if row is not None:
                    rows.append(row)
                    if rank == 0:
                        print(json.dumps(row), flush=True)
    if rank == 0:
        out = os.environ.get("OUT") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
        os.makedirs(out, exist_ok=True)
        meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "H": args.heads, "D": args.dim, "dtype": "bfloat16"}
        with open(os.path.join(out, f"context_parallel_{world}gpu.json"), "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    if dist.is_initialized():
        dist.destroy_process_group()


def table(folder: str) -> None:
    """The 1-GPU and N-GPU runs side by side: time and peak memory per GPU, and their ratios."""
    runs = {}
    for f in sorted(os.listdir(folder)):
        if f.startswith("context_parallel_") and f.endswith("gpu.json"):
            for row in json.load(open(os.path.join(folder, f)))["rows"]:
                runs[(row["impl"], row["spec"], row["T"], row["gpus"])] = row
    print("| impl | spec | T | 1 GPU ms | N GPUs ms | time ratio | 1 GPU GB | N GPUs GB | memory ratio |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (impl, spec, T, gpus), row in sorted(runs.items()):
        one = runs.get((impl, spec, T, 1))
        if gpus == 1:
            continue

        def ratio(key):
            return f"{row[key] / one[key]:.2f}" if one and one.get(key) and row.get(key) else "-"

        def cell(r, key):
            return "-" if r is None else r.get("error", "") if r.get(key) is None else f"{r[key]:.2f}"

        print(f"| {impl} | {spec} | {T} | {cell(one, 'ms')} | {cell(row, 'ms')} ({gpus}) | {ratio('ms')} | {cell(one, 'peak_gb')} | "
              f"{cell(row, 'peak_gb')} | {ratio('peak_gb')} |")  # fmt: skip


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--specs", default="gla,gated_deltanet,kda")
    p.add_argument("--lengths", default="32768,131072,524288")
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--fla", action="store_true", help="FLA's context parallelism beside, where it has one")
    p.add_argument("--table", metavar="DIR", help="print the runs in DIR side by side instead of running")
    return p.parse_args(argv)


if __name__ == "__main__":
    args = parse_args()
    if args.table:
        table(args.table)
        sys.exit(0)
    run(args)
