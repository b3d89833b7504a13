"""The per-token work runtime/fuse.py compiles, as inductor writes it for an H200 (sm_90), on any machine: no GPU.

    python bench/fused_sm90.py [--specs lln,gla] [--B 4 --T 4096 --H 16 --D 128] [--code DIR] [--inductor KEY=VALUE ...]

Per spec, the launches of the fused forward in order: inductor's kernels (its Triton code for CUDA) and the
lamixer ops between them (each op launches its own kernels). On a GPU each launch costs host time (lln at T = 4096:
inductor's wrapper 481 us around its kernels under the profiler, a Triton JIT launch 45 us; bench/results/NOTES.md),
which a forward of short kernels waits for, so the count is what this reports. `--T 1` shows a decoding step (the
recurrent kernel's op, which fuse.run compiles with the work around it as on a GPU). A spec that does not fuse (no
per-token work around its scans) runs its ops eagerly, a launch each: those are listed as inductor would compile
them. --code: keep inductor's whole module (the kernels' source) per spec in DIR. --inductor: set one of inductor's
options (torch._inductor.config, the value as JSON: `--inductor combo_kernels=true`) for the run. Inference only:
a training step's graphs (AOT autograd's partition) need autograd metadata that asks a CUDA runtime for its device
guard.

How: the spec is called twice with fake CUDA tensors, initial states given so that they are inputs as in a real
call. The first call makes what a signature keeps (its kernel choices, its call constants); the second is traced
(make_fx), fuse.run's work evaluated as its compiled copy evaluates it, the ops through their registered fake
implementations as under torch.compile. The graph goes to inductor with the device's properties, its Triton
backend and Triton's target (bench/sm90.py's driver) supplied in place of the CUDA runtime this torch build lacks.
Inductor then writes its module and cannot load it (no CUDA streams): the code is taken before that. Tied to the
pinned torch's inductor (2.13), whose few calls that ask the CUDA runtime directly are replaced here, each named.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import sys
import types
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)  # before triton: kernels are compiled, not interpreted

import torch  # noqa: E402
import torch._inductor.compile_fx as compile_fx  # noqa: E402
import torch._inductor.fx_passes.joint_graph as joint_graph  # noqa: E402
import torch._inductor.fx_passes.misc_patterns as misc_patterns  # noqa: E402
import torch._inductor.scheduler as scheduler  # noqa: E402
from torch._inductor import config as inductor_config  # noqa: E402
from torch._inductor.graph import GraphLowering  # noqa: E402
from torch._inductor.runtime import hints  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402
from triton.runtime import driver  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from sm90 import H200  # noqa: E402

import lamixer  # noqa: E402
from lamixer.kernels import additive, block_attention, delta, recurrent  # noqa: E402
from lamixer.runtime import fuse  # noqa: E402
from lamixer.tools.check import random_call  # noqa: E402

PROPERTIES = types.SimpleNamespace(major=9, minor=0, multi_processor_count=132, name="NVIDIA H200", total_memory=141 * 2**30,
                                   regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, warp_size=32,
                                   shared_memory_per_block_optin=232448, L2_cache_size=60 * 2**20, gcnArchName="")  # fmt: skip


class Written(Exception):
    """Raised once inductor has written its module: the code is all this tool wants."""


def pretend_h200() -> None:
    """Inductor's CUDA code generation without a CUDA runtime: what it asks of the device answered for an H200."""
    hints.DeviceProperties.create = staticmethod(lambda device: hints.DeviceProperties(
        type="cuda", index=0, multi_processor_count=132, cc=90, major=9, regs_per_multiprocessor=65536,
        max_threads_per_multi_processor=2048, warp_size=32))  # fmt: skip
    torch.cuda.device_count = lambda: 1
    torch.cuda.current_device = lambda: 0
    torch.cuda.get_device_properties = lambda *a, **k: PROPERTIES
    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
    torch.cuda.get_device_name = lambda *a, **k: PROPERTIES.name
    driver.set_active(H200())  # Triton's target, for inductor's choice of backend
    scheduler.has_triton = lambda: True  # it asks the CUDA runtime for the device's capability
    misc_patterns._misc_patterns_init = lambda *a, **k: None  # traces its patterns on real CUDA tensors
    compile_fx._check_triton_bf16_support = lambda graph: None  # asks the CUDA runtime
    joint_graph.constant_fold_uniform_value = lambda gm: None  # evaluates constants on real CUDA tensors
    inductor_config.fx_graph_cache = False
    inductor_config.compile_threads = 1


def fake_call(m, B: int, T: int, H: int, D: int, fake: FakeTensorMode):
    """(names, inputs, initial states) of a bench-shaped bf16 call (every dim D), as fake CUDA tensors: shaped as
    random_call shapes a two-token call of H heads, the inputs then widened to [B, T, ...]."""
    tensors, states = random_call(m, B=1, T=2, H=H, size=D, dtype=torch.float32, distinct=False)
    with fake:
        inputs = {n: torch.empty(B, T, *v.shape[2:], dtype=torch.bfloat16, device="cuda") if v.dim() >= 3 and v.shape[:2] == (1, 2)
                  else torch.empty(v.shape, dtype=v.dtype, device="cuda") for n, v in tensors.items()}  # fmt: skip
        h0 = tuple(torch.empty(B, *h.shape[1:], dtype=torch.float32, device="cuda") for h in states)
    return list(inputs), list(inputs.values()), h0


def wrapper_code(name: str, B: int, T: int, H: int, D: int) -> str:
    """Inductor's module for the spec's fused forward."""
    m = lamixer.load(name)
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    names, inputs, h0 = fake_call(m, B, T, H, D, fake)

    def forward(*xs):
        return m(**dict(zip(names, xs[: len(names)])), initial_state=tuple(xs[len(names):]), backend="triton")[0]

    written: list[str] = []

    def keep(code: str) -> None:
        written.append(code)
        raise Written

    GraphLowering.save_output_code = staticmethod(keep)
    # the ops are called as under torch.compile, so that their fake implementations run
    # Tensor.contiguous's, indexing's and ~'s C++ paths take a CUDA device guard, which this torch build cannot give:
    # the same through ops that take none
    # A first call makes what a call's signature keeps (Call.memo: the kernel choices, the call constants), as a real
    # first call does unfused; the traced call then finds them, and evaluates what fuse.run compiles as it does
    patches = [*(_patched(module, "run_scan_op", _through_op) for module in (additive, delta, block_attention)), _patched(fuse, "run", _fused),
               _patched(recurrent, "launch", lambda *args, in_place=False, **flags: recurrent.recurrent_scan(*args, **flags)),
               _patched(torch.Tensor, "contiguous", _contiguous), _patched(torch.Tensor, "__getitem__", _getitem(torch.Tensor.__getitem__)),
               _patched(torch.Tensor, "__invert__", lambda x: torch.bitwise_not(x)), fake]  # fmt: skip
    with contextlib.ExitStack() as stack:
        for patch in patches:
            stack.enter_context(patch)
        forward(*inputs, *h0)
        gm = make_fx(forward)(*inputs, *h0)
    try:
        with fake:
            compile_fx.compile_fx(gm, [*inputs, *h0])
    except Exception:
        if not written:  # inductor failed before it wrote its module (Written arrives wrapped in its own error)
            raise
    return written[0]


def _fused(fn, name: str, call, *args, when: bool = True, version=None):
    """runtime.fuse.run's work as its compiled copy does it (a call without its signature's memo), when it fuses."""
    return fn(dataclasses.replace(call, memo=None), *args) if when else fn(call, *args)


def _through_op(op, eager, forward, args: tuple, differentiable: tuple, n: int = 2) -> tuple:
    """kernels.launch.run_scan_op as torch.compile's tracing takes it: through the custom op."""
    return op(*args)[:n]


def _contiguous(x: torch.Tensor, memory_format=torch.contiguous_format) -> torch.Tensor:
    return x if x.is_contiguous(memory_format=memory_format) else x.clone(memory_format=memory_format)


def _getitem(indexing):
    """Tensor.__getitem__ for ints, slices, None and Ellipsis through select, slice and unsqueeze (any other index
    through `indexing`, torch's own)."""

    def getitem(x: torch.Tensor, index):
        index = index if isinstance(index, tuple) else (index,)
        if not all(i is None or i is Ellipsis or isinstance(i, (int, slice)) for i in index):
            return indexing(x, index)
        if Ellipsis in index:
            at, taken = index.index(Ellipsis), sum(i is not None and i is not Ellipsis for i in index)
            index = index[:at] + (slice(None),) * (x.dim() - taken) + index[at + 1 :]
        dim = 0
        for i in index:
            if i is None:
                x, dim = x.unsqueeze(dim), dim + 1
            elif isinstance(i, int):
                x = x.select(dim, i)
            else:
                start, stop, step = i.indices(x.shape[dim])
                x, dim = torch.ops.aten.slice.Tensor(x, dim, start, max(start, stop), step), dim + 1
        return x

    return getitem


@contextlib.contextmanager
def _patched(owner, attr: str, value):
    old = getattr(owner, attr)
    setattr(owner, attr, value)
    try:
        yield
    finally:
        setattr(owner, attr, old)


def launches(code: str) -> list[str]:
    """The module's launches in order: inductor's kernels by name, lamixer's ops as `op NAME`."""
    found = re.findall(r"^\s+(?:(triton_\w+)\.run\(|.*torch\.ops\.lamixer\.(\w+)\.default\()", code, re.M)
    return [kernel or f"op {op}" for kernel, op in found]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--specs", default="lln", help="comma-separated shipped names or .lam files")
    p.add_argument("--B", type=int, default=4)
    p.add_argument("--T", type=int, default=4096)
    p.add_argument("--H", type=int, default=16)
    p.add_argument("--D", type=int, default=128)
    p.add_argument("--code", type=Path, help="keep each spec's inductor module in this folder")
    p.add_argument("--inductor", action="append", default=[], metavar="KEY=VALUE", help="an inductor option, the value as JSON")
    args = p.parse_args()
    pretend_h200()
    for option in args.inductor:
        key, _, value = option.partition("=")
        setattr(inductor_config, key, json.loads(value))
    for name in args.specs.split(","):
        code = wrapper_code(name, args.B, args.T, args.H, args.D)
        if args.code:
            args.code.mkdir(parents=True, exist_ok=True)
            (args.code / f"{Path(name).stem}.py").write_text(code)
        found = launches(code)
        kernels = sum(not f.startswith("op ") for f in found)
        print(f"{name}: {kernels} inductor launches, {len(found) - kernels} lamixer ops")
        for f in found:
            print(f"  {f[:110]}")


if __name__ == "__main__":
    main()
