"""Compile, without running, the Triton kernels specs launch, for an H200 (sm_90), on any machine: no GPU needed.

    python bench/sm90.py [--specs deltanet,gla] [--dtypes bfloat16,float32] [--T 150] [--D 128] [--config 64,64,32,8,2,0,128]
                         [--variants FILE.json] [--block-attention]

Triton's own compiler and ptxas (shipped with triton) build each kernel: the active driver is replaced by one
naming an sm_90 device that is never used, and every launch becomes a compile-only warmup, so the specs' calls run
their host code with kernels that do nothing (results are not looked at). Each spec runs forward and backward on
the chunk kernels (lengths past one chunk) and forward without gradients on 5 tokens (the recurrent kernel), at
the default configurations (or --config's, as the autotuner sets a candidate). Prints, per kernel, shared memory, warps, stages, the registers per thread and
bytes spilled that ptxas reports, and the loads left synchronous in loops (sync: see loop_loads). --variants: the
delta rule's kernels (or --family additive's) once per variant of a bench/kernel_variants.py file (its launch overrides and source edits), each
variant's rows under its label. --block-attention: block attention's kernels alone, in --dtypes (a spec's call here runs
them in float32). tests/test_gpu_compile.py runs the same compilation over every spec.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import re

os.environ.pop("TRITON_INTERPRET", None)  # before triton: kernels are compiled, not interpreted

import torch  # noqa: E402
from triton import knobs  # noqa: E402
from triton._C.libtriton import ir, nvidia, passes  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.backends.nvidia.compiler import get_ptx_version_from_options  # noqa: E402
from triton.runtime import driver  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

SHARED_LIMIT = 232448  # bytes of shared memory one block may use on sm_90 (227 KB)


class H200:
    """The driver a launch asks for its device, stream and target: an sm_90 device that is never used."""

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)

    def get_active_torch_device(self):
        return torch.device("cpu")


def _lowered(backend, stages, options, language, capability):
    """Triton's add_stages_inspection_hook for a compilation without machine code: after Triton's own passes to its
    GPU dialect, only the first passes of its lowering to LLVM, through the shared-memory allocation (Triton 3.6's
    make_llir up to add_allocate_shared_memory_nv), whose size is what this compilation checks; placeholders for
    LLVM IR, PTX and the binary. A tenth of a full compilation's time; the compile test checks that it allocates
    what a full compilation does."""

    def allocate(src, metadata):
        pm = ir.pass_manager(src.context)
        passes.ttgpuir.add_combine_tensor_select_and_if(pm)
        passes.ttgpuir.add_allocate_warp_groups(pm)
        passes.convert.add_scf_to_cf(pm)
        passes.gluon.add_inliner(pm)
        nvidia.passes.ttgpuir.add_allocate_shared_memory_nv(pm, capability, get_ptx_version_from_options(options, backend.target.arch))
        pm.run(src, "allocate_shared_memory")
        metadata.update(shared=src.get_int_attr("ttg.shared"), name=re.search(r"tt\.func public @([\w.$]+)", str(src)).group(1))
        for key in ("tmem_size", "global_scratch_size", "global_scratch_align", "profile_scratch_size"):
            metadata.setdefault(key, 0)
        return ""

    stages["llir"] = allocate
    stages["ptx"] = lambda src, metadata: ""
    stages["cubin"] = lambda src, metadata: b""


@contextlib.contextmanager
def compile_only(on_kernel, machine_code: bool = True):
    """Within: every Triton launch compiles its kernel for sm_90 and calls on_kernel(jit function, compiled kernel)
    instead of running it. machine_code=False stops at the shared-memory allocation (_lowered): kernels compiled so
    belong in a Triton cache of their own (Triton's cache key does not tell them apart)."""
    previous = driver._active  # None where there is no GPU (asking `active` would raise)
    launch = JITFunction.run
    hook = knobs.runtime.add_stages_inspection_hook

    def run(self, *args, grid, warmup, **kwargs):
        on_kernel(self, launch(self, *args, grid=grid, warmup=True, **kwargs))

    driver.set_active(H200())
    JITFunction.run = run
    if not machine_code:
        knobs.runtime.add_stages_inspection_hook = _lowered
    try:
        yield
    finally:
        JITFunction.run = launch
        driver._active = previous
        knobs.runtime.add_stages_inspection_hook = hook


def resources(kernel) -> dict[str, int]:
    """Registers per thread and bytes spilled of a compiled kernel, as ptxas -v reports them for its PTX
    (bench/recurrent_registers.py's reading)."""
    from recurrent_registers import registers

    regs, spills = registers(kernel)
    return dict(registers=regs, spills=spills)


def loop_loads(kernel) -> int:
    """Loads left synchronous inside loops and branches of a compiled kernel: `tt.load`s nested below the function's
    top level in its TTGIR whose results the loop does not carry to its next iteration. With stages > 1 Triton's
    pipeliner turns a loop's loads into asynchronous copies or issues them an iteration ahead (carried); one it
    leaves (e.g. a load that initialises a dot's accumulator) stalls every iteration on global memory."""
    lines = kernel.asm["ttgir"].splitlines()
    carried = {value for line in lines if "scf.yield" in line for value in re.findall(r"%[\w#]+", line)}
    nested = [line for line in lines if " tt.load " in line and len(line) - len(line.lstrip()) > 4]
    return sum(line.split("=", 1)[0].strip() not in carried for line in nested)


def compile_specs(specs, dtypes, T: int = 150, D: int = 128, with_resources: bool = False, machine_code: bool = True) -> list[dict]:
    """One row per kernel each spec and dtype compiles (spec, dtype, kernel, shared, warps, stages[, registers,
    spills]), or one row with the error that stopped a spec. machine_code=False: see compile_only."""
    import lamixer
    from lamixer.tools.check import forward_backward, random_call

    rows: list[dict] = []
    where: dict = {}

    def record(fn, kernel):
        row = dict(where, kernel=fn.__name__, shared=kernel.metadata.shared, warps=kernel.metadata.num_warps,
                   stages=kernel.metadata.num_stages, loop_loads=loop_loads(kernel))  # fmt: skip
        if with_resources:
            row.update(resources(kernel))
        rows.append(row)

    with compile_only(record, machine_code):
        for spec in specs:
            for dtype in dtypes:
                where.update(spec=os.path.basename(spec), dtype=str(dtype).removeprefix("torch."))
                try:
                    m = lamixer.load(spec)
                    tensors, states = random_call(m, B=1, T=T, H=2, size=D, dtype=dtype, distinct=False, seed=0)
                    forward_backward(m, tensors, tuple(s.float() for s in states), "triton")
                    short, states = random_call(m, B=1, T=5, H=2, size=D, dtype=dtype, distinct=False, seed=0)
                    with torch.no_grad():
                        m(**short, initial_state=tuple(s.float() for s in states) or None, output_final_state=True, backend="triton")
                except Exception as e:  # reported with the spec's name
                    rows.append(dict(where, error=f"{type(e).__name__}: {e}"[:2000]))
    return rows


def compile_block_attention(dtypes, T: int = 300, D: int = 128) -> list[dict]:
    """Block attention's kernels as its op launches them, forward (with and without a residual) and backward, in each
    dtype: a spec's call on this machine runs them in its compute dtype (runtime/scan.py's attention_dtype takes the
    inputs' half type on a GPU only), so compile_specs shows them in float32."""
    from lamixer.kernels import block_attention as kernels

    rows: list[dict] = []
    where: dict = {}

    def record(fn, kernel):
        rows.append(dict(dtype=where["dtype"], kernel=fn.__name__ + where["tag"], shared=kernel.metadata.shared, warps=kernel.metadata.num_warps,
                         stages=kernel.metadata.num_stages, loop_loads=loop_loads(kernel), **resources(kernel)))  # fmt: skip

    with compile_only(record):
        for dtype in dtypes:
            q, k, v = (torch.randn(1, T, 2, D, dtype=dtype) for _ in range(3))
            where.update(dtype=str(dtype).removeprefix("torch."))
            for residual in (v, None):
                where["tag"] = " (residual)" if residual is not None else ""
                kernels._forward(q, k, v, 0.1, 64, None, residual, 0.5)
            kernels._backward(q, k, v, v, 0.1, 64, None, 0.5)
    return rows


def main():
    import lamixer

    ap = argparse.ArgumentParser()
    ap.add_argument("--specs", default=",".join(lamixer.shipped_specs()))
    ap.add_argument("--dtypes", default="bfloat16")
    ap.add_argument("--T", type=int, default=150)
    ap.add_argument("--D", type=int, default=128)
    ap.add_argument("--config", default="", help="BT,BV,BK,warps,stages[,BW,BG,warps_grad] for every scan (default: each one's own)")
    ap.add_argument("--variants", help="a bench/kernel_variants.py file: the family's kernels under each of its variants")
    ap.add_argument("--family", default="delta", choices=["delta", "additive"], help="the template --variants applies to")
    ap.add_argument("--block-attention", action="store_true", help="block attention's kernels alone, in each of --dtypes")
    args = ap.parse_args()
    if args.config:
        from lamixer.backends import triton as triton_backend
        from lamixer.kernels.config import Config

        given = Config.from_list(args.config.split(","))
        triton_backend.chunk_config = lambda *a, **k: given  # every scan group launches with it
    dtypes = [getattr(torch, d) for d in args.dtypes.split(",")]
    if args.block_attention:
        _print(compile_block_attention(dtypes, max(args.T, 300), args.D))
        return
    if not args.variants:
        _print(compile_specs(args.specs.split(","), dtypes, args.T, args.D, with_resources=True))
        return
    import json

    import kernel_variants  # beside this file

    for label, overrides, edits in json.load(open(args.variants)):
        kernel_variants.use(args.family, overrides, edits)
        print(f"\n{label}")
        _print(compile_specs(args.specs.split(","), dtypes, args.T, args.D, with_resources=True))


def _print(rows: list[dict]) -> None:
    seen = set()
    print(f"{'kernel':<56} {'dtype':<9} {'warps':>5} {'stages':>6} {'shared':>7} {'regs':>4} {'spill':>5} {'sync':>4}")
    for row in rows:
        if "error" in row:
            print(f"{row['spec']} ({row['dtype']}): {row['error']}")
            continue
        key = (row["kernel"], row["dtype"], row["shared"], row["stages"], row["warps"])
        if key not in seen:
            seen.add(key)
            flag = "  over the shared-memory limit" if row["shared"] > SHARED_LIMIT else ""
            print(f"{row['kernel']:<56} {row['dtype']:<9} {row['warps']:>5} {row['stages']:>6} {row['shared']:>7} "
                  f"{row['registers']:>4} {row['spills']:>5} {row['loop_loads']:>4}{flag}")  # fmt: skip


if __name__ == "__main__":
    main()
