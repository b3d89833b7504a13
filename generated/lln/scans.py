"""lln's scans on the generated Triton kernels: the package's one point of contact with them.

The kernels in kernels/ are rendered from lamixer's templates for this spec's kernel plan and run as
lamixer's triton backend runs them: chunk_additive_none_after_ones for training and long sequences;
recurrent_additive_none_after for inference on sequences of at most 64 tokens (decoding). Their host
code is lamixer's, copied whole into kernels/.
"""
from __future__ import annotations

import functools
import os

import torch

from ..kernels import additive, block_attention, config, launch, recurrent
from ..runtime.call import pick_backend, remember
from ..runtime.scan import STATES_IN_PLACE, torch_scan

CHUNK_MISSING = ()  # the chunk kernels run every scan of this spec
DECODES = True  # whether every scan group has a recurrent kernel
# per scan group of the kernel plan, in order: (chunk kernels' host entry, their default configuration, decay kind,
# key dim, value widths side by side (a dim's name, or 1 for a vector state's column), whether they carry the group's normaliser)
GROUPS = (
    (additive.scan, config.default_config, "none", "K", ('V',), True),
)


def serves(call) -> bool:
    """Whether the recurrent kernel runs this call's scans: no gradient is asked for, no sequence is longer than
    recurrent.MAX_T and every key dim fits a program's registers (float32 calls and narrower)."""
    if not DECODES or call.longest > recurrent.MAX_T or call.compute_dtype == torch.float64:
        return False
    if torch.is_grad_enabled() and (any(t.requires_grad for t in call.inputs.values())
                                    or any(s.requires_grad for s in call.initial_state.values())):  # fmt: skip
        return False
    return call.sizes["K"] <= launch.MAX_HEAD_DIM


def unsupported(call) -> list[str]:
    """Why the chunk kernels cannot run this call (empty when they can)."""
    reasons = list(CHUNK_MISSING)
    if call.compute_dtype == torch.float64:
        reasons.append("the kernels here accumulate in float32; float64 calls run on the torch fallback")
    for state, dim in [("S", "K"), ("S", "V")]:
        if call.sizes[dim] > launch.MAX_HEAD_DIM:
            reasons.append(f"state {state}: {dim} = {call.sizes[dim]} is above the kernels' {launch.MAX_HEAD_DIM}")
    return reasons


def choose(call, backend):
    """Per scan group, (scan function for scan_group, whether it carries the group's normaliser): the recurrent kernel
    for inference on short sequences, else the chunk kernels with their default configuration, in the inputs' dtype
    when it is bf16 or fp16, else in float32; torch_scan when backend "auto" finds they cannot run the call (or no
    GPU); an ArgumentError when backend "triton" insists. Worked out once per call signature."""
    in_place = STATES_IN_PLACE.get()  # a graphed decoder's states, updated in place by the recurrent kernel
    key = ("scan", backend, torch.is_grad_enabled(), call.longest <= recurrent.MAX_T, os.environ.get("TRITON_INTERPRET") == "1", in_place)
    found = None if call.memo is None else call.memo.get(key)
    if found is None:
        found = _choose(call, backend, in_place)
        if call.memo is not None:
            remember(call.memo, key, found)
    return found


def _choose(call, backend, in_place):
    decoding = serves(call)
    missing = ([] if decoding else unsupported(call)) + (launch.launch_problems(call.device) if backend == "triton" else [])
    if pick_backend("lln", backend, call, missing) == "torch":
        return [(torch_scan, False)] * len(GROUPS)
    dtype = call.out_dtype if call.out_dtype in (torch.bfloat16, torch.float16) else call.compute_dtype
    if dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1" and not launch.bf16_interpreted():
        dtype = torch.float32  # Triton 3.6's CPU interpreter multiplies bf16 dot operands as raw bits (lamixer.tools.emulate)
    if decoding:
        return [(functools.partial(recurrent.scan, dtype=dtype, in_place=in_place), False)] * len(GROUPS)
    out = []
    for run, default, decay, key_dim, widths, carries in GROUPS:
        V = sum(call.sizes[w] if isinstance(w, str) else w for w in widths)
        out.append((functools.partial(run, dtype=dtype, config=default(decay, call.sizes[key_dim], V)), carries))
    return out


def fused(scans, call) -> bool:
    """Whether runtime/fuse.py compiles this call's per-token work on a GPU: around the chunk kernels choose() picked,
    or around the recurrent kernel in a one-token decoding step (whose work unfused is one small kernel per operation)."""
    kernels = [run.func for run, _ in scans if isinstance(run, functools.partial)]
    return any(f is not recurrent.scan for f in kernels) or (call.longest == 1 and recurrent.scan in kernels)


def attention(scans):
    """Block attention's kernel (kernels/block_attention.py) when choose() picked the Triton kernels, else None (torch's
    SDPA)."""
    return block_attention.block_attention if any(run is not torch_scan for run, _ in scans) else None
