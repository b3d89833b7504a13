"""lln's scans on the generated Triton kernels: the package's one point of contact with them.

The kernels in kernels/ are rendered from lamixer's templates for this spec's classification and run
as lamixer's triton backend runs them: chunk_additive_none_after_ones for training and long
sequences; recurrent_additive_none_after for inference on sequences of at most 64 tokens (decoding).
Their host code is kernels/host*.py.
"""
from __future__ import annotations

import functools
import os

import torch

from ..kernels import host, host_recurrent
from ..runtime.call import pick_backend, remember
from ..runtime.scan import torch_scan

CHUNK_MISSING = ()  # the chunk kernels run every scan of this spec


def serves(call) -> bool:
    """Whether the recurrent kernel runs this call's scans: no gradient is asked for, no sequence is longer than
    host_recurrent.MAX_T and every key dim fits a program's registers (float32 calls and narrower)."""
    if call.longest > host_recurrent.MAX_T or call.compute_dtype == torch.float64:
        return False
    if torch.is_grad_enabled() and (any(t.requires_grad for t in call.inputs.values())
                                    or any(s.requires_grad for s in call.initial_state.values())):  # fmt: skip
        return False
    return call.sizes["K"] <= host_recurrent.MAX_HEAD_DIM


def unsupported(call) -> list[str]:
    """Why the chunk kernels cannot run this call (empty when they can)."""
    reasons = list(CHUNK_MISSING)
    if call.compute_dtype == torch.float64:
        reasons.append("the kernels here accumulate in float32; float64 calls run on the torch fallback")
    for state, dim in [("S", "K"), ("S", "V"), ("z", "K")]:
        if call.sizes[dim] > host.MAX_HEAD_DIM:
            reasons.append(f"state {state}: {dim} = {call.sizes[dim]} is above the kernels' {host.MAX_HEAD_DIM}")
    return reasons


def choose(call, backend):
    """The scan function for scan_group: the recurrent kernel for inference on short sequences, else the chunk kernels,
    in the inputs' dtype when it is bf16 or fp16, else in float32; torch_scan when backend "auto" finds they cannot
    run the call (or no GPU); an ArgumentError when backend "triton" insists. Worked out once per call signature."""
    key = ("scan", backend, torch.is_grad_enabled(), call.longest <= host_recurrent.MAX_T, os.environ.get("TRITON_INTERPRET") == "1")
    found = None if call.memo is None else call.memo.get(key)
    if found is None:
        found = _choose(call, backend)
        if call.memo is not None:
            remember(call.memo, key, found)
    return found


def _choose(call, backend):
    recurrent = serves(call)
    missing = ([] if recurrent else unsupported(call)) + (host.launch_problems(call.device) if backend == "triton" else [])
    if pick_backend("lln", backend, call, missing) == "torch":
        return torch_scan
    dtype = call.out_dtype if call.out_dtype in (torch.bfloat16, torch.float16) else call.compute_dtype
    if dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1" and not host.bf16_interpreted():
        dtype = torch.float32  # Triton 3.6's CPU interpreter multiplies bf16 dot operands as raw bits (lamixer.emulate)
    return functools.partial(host_recurrent.scan if recurrent else host.triton_scan, dtype=dtype)


def chunked(scan) -> bool:
    """Whether choose() picked the chunk kernels (whose per-token work runtime/fuse.py fuses on a GPU)."""
    return isinstance(scan, functools.partial) and scan.func is host.triton_scan
