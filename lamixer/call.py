"""Binding a call's arguments to a compiled mixer, with a clear error for every bad argument.

Every check of a call's tensors depends only on their metadata (which arguments were given, and
each tensor's shape, dtype and device), so a call with the signature of an earlier valid one
reuses that binding's results and re-runs only the checks of values: cu_seqlens' offsets and a
given scale. A call with any other signature, a bad one included, goes through every check.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch

from . import ops
from .compiler import Compiled
from .errors import ArgumentError

BACKENDS = ("auto", "interpret", "torch", "triton")


@dataclass
class Call:
    """A validated call: the caller's tensors (per-token [B, T, H, *dims] and params, as given: each
    evaluator converts what it reads to compute_dtype), dim sizes, and states in compute dtype."""

    inputs: dict[str, torch.Tensor]
    sizes: dict[str, int]
    batch: int
    length: int
    heads: int
    scale: float
    initial_state: dict[str, torch.Tensor]  # [N, H, *dims] each
    cu_seqlens: torch.Tensor | None
    compute_dtype: torch.dtype
    out_dtype: torch.dtype
    state_dtype: torch.dtype
    device: torch.device
    longest: int = 0  # the longest sequence's length (T unless packed)
    # what later stages work out once per call signature (backend choice, constants), kept with the signature's
    # binding; None when nothing may be cached (an argument that is not a tensor, or torch.compile tracing)
    memo: dict | None = None


def _shape(dims) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"


def bind_operands(compiled: Compiled, args: tuple, kwargs: dict) -> dict[str, torch.Tensor]:
    """Match positional and keyword tensors to the declared inputs and params."""
    operands = compiled.graph.operands
    names = [op.name for op in operands]
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
        if not isinstance(bound[name], torch.Tensor):
            raise ArgumentError(name, f"must be a torch.Tensor, got {type(bound[name]).__name__}")
        if not bound[name].is_floating_point():
            raise ArgumentError(name, f"must be a floating-point tensor, got {bound[name].dtype}")
    return {name: bound[name] for name in names}


MEMO_ENTRIES = 256  # signatures kept per compiled spec (and entries per signature); a full memo starts over


def remember(memo: dict, key, value):
    """memo[key] = value in a bounded memo (cleared when full); returns value."""
    if len(memo) >= MEMO_ENTRIES:
        memo.clear()
    memo[key] = value
    return value


def _meta(x) -> tuple | None:
    return (x.shape, x.dtype, x.device, x.requires_grad) if isinstance(x, torch.Tensor) else None


def signature(args: tuple, kwargs: dict, initial_state, cu_seqlens, scale, compute_dtype) -> tuple | None:
    """What every metadata check of a call depends on: which arguments were given, each tensor's shape, dtype,
    device and requires_grad, the initial states' structure and metadata, cu_seqlens' length, dtype and device,
    whether a scale was given. None when an argument is not a tensor (the full checks say why) or while
    torch.compile traces (nothing is cached then)."""
    if torch.compiler.is_compiling():
        return None
    metas = []
    for x in args:
        if not isinstance(x, torch.Tensor):
            return None
        metas.append((x.shape, x.dtype, x.device, x.requires_grad))
    for x in kwargs.values():
        if not isinstance(x, torch.Tensor):
            return None
        metas.append((x.shape, x.dtype, x.device, x.requires_grad))
    if initial_state is None or isinstance(initial_state, torch.Tensor):
        states = _meta(initial_state)
    elif isinstance(initial_state, (tuple, list)):
        states = tuple(_meta(h) for h in initial_state)
        if any(m is None and h is not None for m, h in zip(states, initial_state)):
            return None
        states = ("seq", states)
    else:
        return None
    if cu_seqlens is None:
        cu = None
    elif isinstance(cu_seqlens, torch.Tensor):
        cu = (cu_seqlens.shape, cu_seqlens.dtype, cu_seqlens.device)
    else:
        return None
    return (len(args), tuple(kwargs), tuple(metas), states, cu, scale is None, compute_dtype)


class _Binding:
    """What a valid call's metadata checks found, for the next call of the same signature."""

    def __init__(self, compiled: Compiled, call: Call, scale_given: bool):
        self.names = list(call.inputs)
        self.sizes, self.B, self.T, self.H = call.sizes, call.batch, call.length, call.heads
        self.dtypes = (call.compute_dtype, call.out_dtype, call.state_dtype)
        self.device = call.device
        self.default_scale = None if scale_given else call.scale
        self.shapes = {name: tuple(h.shape) for name, h in call.initial_state.items()}  # (no tensor is kept)
        self.states = list(compiled.graph.states)
        self.memo: dict = {}  # for the later stages (Call.memo)

    def rebind(self, args: tuple, kwargs: dict, scale, initial_state, cu_seqlens) -> Call:
        compute, out, state = self.dtypes
        if kwargs:
            bound = dict(zip(self.names, args))
            bound.update(kwargs)
            tensors = {name: bound[name] for name in self.names}
        else:
            tensors = dict(zip(self.names, args))
        cu, longest = (None, self.T) if cu_seqlens is None else _check_cu(cu_seqlens, self.B, self.T, self.device)
        scale_value = self.default_scale if scale is None else _scale_value(scale)
        if initial_state is None:
            given = [None] * len(self.states)
        elif isinstance(initial_state, torch.Tensor):
            given = [initial_state]
        else:
            given = initial_state
        states = {name: torch.zeros(self.shapes[name], dtype=compute, device=self.device) if h0 is None
                  else h0 if h0.dtype == compute else h0.to(compute)
                  for name, h0 in zip(self.states, given)}  # fmt: skip
        return Call(tensors, self.sizes, self.B, self.T, self.H, scale_value, states, cu, compute, out, state, self.device, longest, self.memo)


def bind(compiled: Compiled, args: tuple, kwargs: dict, scale, initial_state, cu_seqlens, compute_dtype=None) -> Call:
    """The validated call (every bad argument an ArgumentError naming it); a signature seen valid before skips
    the metadata checks (see the module docstring)."""
    key = signature(args, kwargs, initial_state, cu_seqlens, scale, compute_dtype)
    if key is None:
        return _bind(compiled, args, kwargs, scale, initial_state, cu_seqlens, compute_dtype)
    known = compiled.cache.get(key)
    if known is not None:
        return known.rebind(args, kwargs, scale, initial_state, cu_seqlens)
    call = _bind(compiled, args, kwargs, scale, initial_state, cu_seqlens, compute_dtype)
    call.memo = remember(compiled.cache, key, _Binding(compiled, call, scale is not None)).memo
    return call


def _scale_value(scale) -> float:
    """A given scale as a finite float, or an ArgumentError."""
    try:
        value = float(scale) if isinstance(scale, numbers.Real) and not isinstance(scale, bool) else math.nan
    except OverflowError:  # an int or Fraction too large for a float
        value = math.inf
    if not math.isfinite(value):
        raise ArgumentError("scale", f"must be a finite number, got {scale!r}")
    return value


def _bind(compiled: Compiled, args: tuple, kwargs: dict, scale, initial_state, cu_seqlens, compute_dtype=None) -> Call:
    g = compiled.graph
    tensors = bind_operands(compiled, args, kwargs)
    first = next(op for op in g.operands if op.kind == "input") if any(op.kind == "input" for op in g.operands) else g.operands[0]
    device = tensors[first.name].device
    lead: tuple[int, int, int] | None = None
    sizes: dict[str, int] = {}
    size_from: dict[str, str] = {}  # dim -> the operand that set its size
    for op in g.operands:
        x = tensors[op.name]
        if x.device != device:
            raise ArgumentError(op.name, f"is on {x.device}, but '{first.name}' is on {device}")
        if op.kind == "input":
            want = 3 + len(op.dims)
            layout = "[B, T, H" + "".join(f", {d}" for d in op.dims) + "]"
            if x.dim() != want:
                raise ArgumentError(op.name, f"must have shape {layout}, got {_shape(x.shape)}")
            if lead is None:
                lead = tuple(x.shape[:3])
            elif tuple(x.shape[:3]) != lead:
                raise ArgumentError(op.name, f"has batch, time, heads {_shape(x.shape[:3])}, but '{first.name}' has {_shape(lead)}")
            feat = x.shape[3:]
        else:
            layout = "[" + ", ".join((["H"] if op.per_head else []) + list(op.dims)) + "]"
            if x.dim() != len(op.dims) + op.per_head:
                raise ArgumentError(op.name, f"must have shape {layout}, got {_shape(x.shape)}")
            feat = x.shape[1:] if op.per_head else x.shape
        for d, n in zip(op.dims, feat):
            if sizes.setdefault(d, n) != n:
                raise ArgumentError(op.name, f"has {d} = {n}, but '{size_from[d]}' has {d} = {sizes[d]}")
            size_from.setdefault(d, op.name)
    if lead is None:
        raise ArgumentError(first.name, "the mixer has no per-token input")
    B, T, H = lead
    if T < 1 or B < 1 or H < 1:
        raise ArgumentError(first.name, f"needs at least one batch row, token and head, got {_shape(lead)}")
    for op in g.operands:
        if op.kind == "param" and op.per_head and tensors[op.name].shape[0] != H:
            raise ArgumentError(op.name, f"has {tensors[op.name].shape[0]} heads, but the inputs have H = {H}")
        if any(n < 1 for n in tensors[op.name].shape[3 if op.kind == "input" else 0:]):
            raise ArgumentError(op.name, f"has an empty dim: {_shape(tensors[op.name].shape)}")
    sizes["H"] = H

    cu, longest = None, T
    if cu_seqlens is not None:
        cu, longest = _check_cu(cu_seqlens, B, T, device)
    N = B if cu is None else len(cu) - 1

    dtypes = {tensors[op.name].dtype for op in g.operands if op.kind == "input"}
    out_dtype = tensors[first.name].dtype
    if compute_dtype is None:
        compute_dtype = torch.float64 if dtypes == {torch.float64} else torch.float32
    state_dtype = torch.float64 if dtypes == {torch.float64} else torch.float32

    if scale is None:
        scale_value = _default_scale(compiled, sizes)
    else:
        if not g.uses_scale:
            raise ArgumentError("scale", f"{compiled.name} does not use a scale")
        scale_value = _scale_value(scale)

    states = _check_states(compiled, initial_state, N, H, sizes, device, compute_dtype)
    return Call(tensors, sizes, B, T, H, scale_value, states, cu, compute_dtype, out_dtype, state_dtype, device, longest)


def _default_scale(compiled: Compiled, sizes: dict[str, int]) -> float:
    g = compiled.graph
    if g.scale_default is None:
        if not g.states:  # then the spec does not use scale (the compiler requires a default otherwise)
            return 1.0
        first_state = next(iter(g.states.values()))
        return sizes[first_state.dims[0]] ** -0.5
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
    value = float(values[g.scale_default])
    if not math.isfinite(value) and g.uses_scale:
        sizes_text = ", ".join(f"{d} = {n}" for d, n in sizes.items())
        raise ArgumentError("scale", f"the default scale of {compiled.name} is {value} for {sizes_text}; pass a finite scale=")
    return value


def check_cu_seqlens(cu, B: int, T: int, device) -> torch.Tensor:
    """cu_seqlens as int64 offsets on `device`, or an ArgumentError saying what is wrong with it."""
    return _check_cu(cu, B, T, device)[0]


def _check_cu(cu, B: int, T: int, device) -> tuple[torch.Tensor, int]:
    """check_cu_seqlens, and the longest sequence's length."""
    if not isinstance(cu, torch.Tensor):
        raise ArgumentError("cu_seqlens", f"must be a 1-D integer tensor, got {type(cu).__name__}")
    if cu.dim() != 1 or cu.dtype not in (torch.int32, torch.int64) or cu.numel() < 2:
        raise ArgumentError("cu_seqlens", f"must be a 1-D int32/int64 tensor of N+1 offsets, got {cu.dtype} of shape {_shape(cu.shape)}")
    if B != 1:
        raise ArgumentError("cu_seqlens", f"needs the sequences packed into one batch row (B = 1), got B = {B}")
    offsets = cu.tolist()
    if offsets[0] != 0 or offsets[-1] != T:
        raise ArgumentError("cu_seqlens", f"must start at 0 and end at T = {T} (cover the batch), got {offsets[0]} ... {offsets[-1]}")
    if any(b <= a for a, b in zip(offsets, offsets[1:])):
        raise ArgumentError("cu_seqlens", "must be strictly increasing (every sequence non-empty)")
    return cu.to(device=device, dtype=torch.int64), max(b - a for a, b in zip(offsets, offsets[1:]))


def _check_states(compiled: Compiled, initial_state, N: int, H: int, sizes, device, dtype) -> dict[str, torch.Tensor]:
    g = compiled.graph
    names = list(g.states)
    if initial_state is None:
        given = [None] * len(names)
    elif isinstance(initial_state, torch.Tensor):
        if len(names) != 1:
            raise ArgumentError("initial_state", f"{compiled.name} has {len(names)} states ({', '.join(names)}): pass a tuple")
        given = [initial_state]
    elif isinstance(initial_state, (tuple, list)):
        if len(initial_state) != len(names):
            raise ArgumentError("initial_state", f"needs {len(names)} tensors ({', '.join(names)}), got {len(initial_state)}")
        given = list(initial_state)
    else:
        raise ArgumentError("initial_state", f"must be a tensor or a tuple of tensors, got {type(initial_state).__name__}")
    out = {}
    for name, h0 in zip(names, given):
        dims = g.states[name].dims
        want = (N, H, *[sizes[d] for d in dims])
        label = "initial_state" if len(names) == 1 else f"initial_state[{names.index(name)}] ({name})"
        if h0 is None:
            out[name] = torch.zeros(want, dtype=dtype, device=device)
            continue
        if not isinstance(h0, torch.Tensor) or not h0.is_floating_point():
            raise ArgumentError(label, "must be a floating-point tensor")
        if tuple(h0.shape) != want:
            layout = "[N, H, " + ", ".join(dims) + "]"
            raise ArgumentError(label, f"must have shape {layout} = {_shape(want)}, got {_shape(h0.shape)}")
        if h0.device != device:
            raise ArgumentError(label, f"is on {h0.device}, but the inputs are on {device}")
        out[name] = h0.to(dtype)
    return out
