"""Binding a call's arguments to a compiled mixer (the checks and the per-signature cache are lamixer.runtime.call's)."""
from __future__ import annotations

import torch

from ..errors import ArgumentError
from ..passes.pipeline import Compiled
from ..runtime import call as runtime_call
from ..runtime import ops
from ..runtime.call import Call, remember

__all__ = ["BACKENDS", "Call", "bind", "bind_operands", "remember"]

BACKENDS = ("auto", "interpret", "torch", "triton")


def bind_operands(compiled: Compiled, args: tuple, kwargs: dict) -> dict:
    """Match positional and keyword arguments to the declared inputs and params."""
    names = [op.name for op in compiled.graph.operands]
    if len(args) > len(names):
        raise ArgumentError(f"#{len(names) + 1}", f"{compiled.name} takes {len(names)} tensors ({', '.join(names)}), got {len(args)}")
    bound = dict(zip(names, args))
    for key, value in kwargs.items():
        if key not in names:
            raise ArgumentError(key, f"{compiled.name} has no input named '{key}' (its inputs: {', '.join(names)})")
        if key in bound:
            raise ArgumentError(key, "given both by position and by name")
        bound[key] = value
    for name in names:
        if name not in bound:
            raise ArgumentError(name, f"missing: {compiled.name} needs {', '.join(names)}")
    return bound


def bind(compiled: Compiled, args: tuple, kwargs: dict, scale, initial_state, cu_seqlens, compute_dtype=None) -> Call:
    """The validated call (every bad argument an ArgumentError naming it); a signature seen valid before skips
    the metadata checks (lamixer.runtime.call; the bindings are kept in compiled.cache)."""
    return runtime_call.bind(compiled.signature, compiled.cache, args, kwargs, scale, initial_state, cu_seqlens, compute_dtype,
                             lambda: _bind(compiled, args, kwargs, scale, initial_state, cu_seqlens, compute_dtype))  # fmt: skip


def _bind(compiled: Compiled, args: tuple, kwargs: dict, scale, initial_state, cu_seqlens, compute_dtype=None) -> Call:
    """Every check of a call."""
    tensors = bind_operands(compiled, args, kwargs)
    return runtime_call.check(compiled.signature, tensors, scale, initial_state, cu_seqlens, lambda sizes: _default_scale(compiled, sizes),
                              compute_dtype)  # fmt: skip


def _default_scale(compiled: Compiled, sizes: dict[str, int]) -> float:
    """The graph's default-scale expression (the spec's `default scale`, else the language's rule) at these sizes."""
    values: dict[int, torch.Tensor] = {}
    nodes = compiled.plan.nodes
    for n in compiled.plan.scale_order:
        d = nodes[n]
        if d["op"] == "const":
            values[n] = torch.tensor(d["value"], dtype=torch.float64)
        elif d["op"] == "dim":
            values[n] = torch.tensor(float(sizes[d["name"]]), dtype=torch.float64)
        else:
            values[n] = ops.apply(d, [values[a] for a in d["args"]], [() for _ in d["args"]])
    return float(values[compiled.graph.scale_default])
