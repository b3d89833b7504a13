"""linear_attn's scans on the generated Triton kernels: the package's one point of contact with them.

The kernels (chunk_additive_none_after in kernels/) are rendered from
lamixer's templates for this spec's classification; their host code is kernels/host.py.
"""
from __future__ import annotations

import functools
import os

import torch

from ..kernels import host


def unsupported(call) -> list[str]:
    """Why the kernels cannot run this call (empty when they can)."""
    reasons = []
    if call.compute_dtype == torch.float64:
        reasons.append("the kernels here accumulate in float32; float64 calls run on the torch fallback")
    for state, dim in [("S", "K"), ("S", "V")]:
        if call.sizes[dim] > host.MAX_HEAD_DIM:
            reasons.append(f"state {state}: {dim} = {call.sizes[dim]} is above the kernels' {host.MAX_HEAD_DIM}")
    return reasons


def scan(call):
    """The scan function for scan_group: the kernels in the inputs' dtype when it is bf16 or fp16, else in float32."""
    dtype = call.out_dtype if call.out_dtype in (torch.bfloat16, torch.float16) else call.compute_dtype
    if dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1":
        dtype = torch.float32  # Triton 3.6's CPU interpreter multiplies bf16 dot operands as raw bits
    return functools.partial(host.triton_scan, dtype=dtype)
