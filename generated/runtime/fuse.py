"""The per-token work around the scans (feature maps, normalisations, gates, statistics, the output's epilogue)
fused by torch.compile (inductor) on a GPU, forward and backward, into a few kernels around the scans, which it sees
as custom ops.

Unfused, that work was about half of deltanet's and lln's time (bench/results/NOTES.md). Each call signature
(shapes, dtypes, which arguments are given; Call.memo) and grad mode compiles once, for its static shapes: a
dynamic-shape graph ran slower; a signature's first call runs unfused, the second compiles.
A one-token decoding step is fused around the recurrent kernel the same way: unfused, a CUDA graph's replay of it
still runs one small kernel per operation. Packed sequences (their lengths change from batch to batch), calls made
while a caller's torch.compile traces (Call.memo is None then), prefills on the recurrent kernel (a compilation per
prompt length) and specs with no per-token work around their scans (the caller's `when`: fusing would only add host
time) run unfused. LAMIXER_FUSE=0 turns fusion off.
"""
from __future__ import annotations

import dataclasses
import os
import types
import warnings

import torch

from .call import Call, remember

ENABLED = os.environ.get("LAMIXER_FUSE", "1") != "0"
DEVICES = ("cuda",)  # where it fuses (inductor's CPU code needs a C++ compiler, and a CPU gains little)
BACKEND = "inductor"
_failed: set[str] = set()  # names whose compilation failed: they run unfused from then on
_functions: dict = {}  # (function, argument signature) -> its compiled copy (see function)


def run(fn, name: str, call: Call, *args, when: bool = True, version=None):
    """fn(call, *args), under torch.compile when `when` (the caller's scans are the chunk kernels, or a decoding step's recurrent kernel) and the call is
    on a fusing device, unpacked and not itself being traced. `name` names fn's work (a spec) in its compiled
    code and in the warning should compilation fail, after which that name runs unfused. A new `version` (of the
    choices args carry) compiles a new copy, traced afresh from its first call's choices."""
    if not (when and ENABLED and call.memo is not None and call.cu_seqlens is None and call.device.type in DEVICES
            and name not in _failed):  # fmt: skip
        return fn(call, *args)
    key = ("fused", name, torch.is_grad_enabled(), version)
    fused = call.memo.get(key)
    if fused is None:
        remember(call.memo, key, _compiled_copy(fn, name))
        # the first call runs unfused: it makes the host-side choices tracing cannot (kernel configurations from the
        # tuning cache, rendered templates), which the traced calls then find made
        return fn(call, *args)
    return _run_or_fall_back(name, lambda: fused(dataclasses.replace(call, memo=None), *args), lambda: fn(call, *args))


def function(fn, device: torch.device, *args, when: bool = True, **kwargs):
    """fn(*args, **kwargs) for torch work the kernels' host code does between kernels, outside any traced graph (the
    decay gradient's assembly inside a backward op): under torch.compile on a fusing device when `when`, one static
    compiled copy per argument signature (tensors' shapes and dtypes, other arguments' values)."""
    name = fn.__name__
    if not (when and ENABLED and device.type in DEVICES and name not in _failed) or torch.compiler.is_compiling():
        return fn(*args, **kwargs)
    key = (fn, *(_meta(a) for a in args), *sorted((k, _meta(v)) for k, v in kwargs.items()))
    compiled = _functions.get(key)
    if compiled is None:
        compiled = remember(_functions, key, _compiled_copy(fn, str(len(_functions))))
    return _run_or_fall_back(name, lambda: compiled(*args, **kwargs), lambda: fn(*args, **kwargs))


def _compiled_copy(fn, suffix: str):
    """torch.compile (static shapes, one whole graph) of a copy of fn's code: dynamo keeps compiled graphs, and counts
    recompilations against its limit, per code object, so each copy's graph lives alone. A graph break raises (and
    _run_or_fall_back runs that work unfused, with a warning naming the break): past a break dynamo would compile the
    functions called after it as frames of their own, shared by every spec and signature, and, once their
    recompilations reach dynamo's limit, run them unfused without a word."""
    code = fn.__code__.replace(co_name=f"{fn.__name__}_{suffix}")
    copy = types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)
    return torch.compile(copy, backend=BACKEND, dynamic=False, fullgraph=True)


def _run_or_fall_back(name: str, fused, unfused):
    """fused(); should torch.compile fail, a warning, and unfused() now and for `name` from then on."""
    try:
        return fused()
    except Exception as e:
        if not type(e).__module__.startswith(("torch._dynamo", "torch._inductor")):
            raise
        warnings.warn(f"torch.compile could not fuse {name}, which runs unfused from now on ({type(e).__name__}: {str(e)[:200]})",
                      stacklevel=3)  # fmt: skip
        _failed.add(name)
        return unfused()


def _meta(x):
    return (tuple(x.shape), x.dtype, x.device) if isinstance(x, torch.Tensor) else x
