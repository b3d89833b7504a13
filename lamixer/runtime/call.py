"""Binding a call's arguments to a mixer's signature, with a clear error for every bad argument.

A Signature is plain data (names, dims, kinds, domains), so lamixer (from a compiled spec) and a
compiled package (from a literal) check calls the same way and bind them to the same Call.

An input declared with a domain (`g[] in (-inf, 0)`, `beta[] in (0, 1)`) is checked to lie in it, bounds
included (a gate computed in float32 can round onto its bound; NaN is in every domain): on the CPU, an
ArgumentError naming it. On a GPU the check is opt-in, LAMIXER_CHECK_DOMAINS=1: it is then
torch._assert_async, a device-side assertion that needs no host sync (a failed one ends the CUDA context, as
any device assertion does), and it reads each such input once per call, which took gla's forward on the H200
from 1.24 to 1.41 ms (B = 4, T = 8192, H = 16, D = 128, bf16). While torch.compile traces, it is the same
assertion on any device. LAMIXER_CHECK_DOMAINS=0 turns it off everywhere.

Every check of a call's tensors depends only on their metadata (which arguments were given, and
each tensor's shape, dtype and device), so a call with the signature of an earlier valid one
reuses that binding's results and re-runs only the checks of values: cu_seqlens' offsets and a
given scale. A call with any other signature, a bad one included, goes through every check.
"""
from __future__ import annotations

import math
import numbers
import os
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from . import carry
from .errors import ArgumentError


@dataclass(frozen=True)
class Operand:
    """A declared input (per token: [B, T, H, *dims]) or param ([H, *dims] when per_head, else [*dims]), in call order."""

    name: str
    kind: str  # "input" | "param"
    dims: tuple[str, ...]
    per_head: bool
    domain: tuple[float, float] = (-math.inf, math.inf)  # an input's declared (lo, hi)


@dataclass(frozen=True)
class Signature:
    """What binding a call needs to know of a mixer."""

    name: str
    operands: tuple[Operand, ...]
    states: tuple[tuple[str, tuple[str, ...]], ...]  # (name, dims) of each state, in declaration order
    uses_scale: bool
    stats: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (name, groups) of each statistic (runtime/carry.py)
    blocks: tuple[tuple[int | str, str, str], ...] = ()  # (size, key dim, value dim) of each block attention
    # the inputs with a declared domain, as check_domains takes them (worked out here, not while torch.compile traces)
    domains: tuple[tuple[str, float | None, float | None, str], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "domains", tuple(_domain(op) for op in self.operands if op.kind == "input" and op.domain != (-math.inf, math.inf)))


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
    # what the call carries besides the states (runtime/carry.py: attach): given statistics by name, block attention's
    # window, and whether the window after the call and the statistics used are returned
    stats: dict[str, torch.Tensor] | None = None
    window: carry.Window | None = None
    output_stats: bool = False
    output_window: bool = False
    # context parallelism: the lamixer.parallel Shard saying where this rank's slice of the time axis lies (None: the
    # call holds whole sequences)
    context_parallel: object | None = None


def _shape(dims) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"


def check_backend(backend, backends: tuple[str, ...]) -> str:
    if not isinstance(backend, str) or backend not in backends:
        raise ArgumentError("backend", f"must be one of {', '.join(backends)}, got {backend!r}")
    return backend


def check_flags(backend, backends: tuple[str, ...], output_final_state) -> None:
    """The call's backend name and output_final_state flag, checked before anything else."""
    check_backend(backend, backends)
    if not isinstance(output_final_state, bool):
        raise ArgumentError("output_final_state", f"must be True or False, got {output_final_state!r}")


# where inputs are checked against their domains (see the module docstring): "cpu" (the default), "all" or "none"
CHECK_DOMAINS = {"0": "none", "1": "all"}.get(os.environ.get("LAMIXER_CHECK_DOMAINS", ""), "cpu")


def _bound(x: float) -> str:
    return "inf" if x == math.inf else "-inf" if x == -math.inf else f"{x:g}"


def check_domains(domains, tensors: dict) -> None:
    """Each named input lies in its declared domain (see the module docstring): an ArgumentError on the CPU, a
    device-side assertion on a GPU (when asked for) and while torch.compile traces. domains: Signature.domains."""
    if CHECK_DOMAINS == "none":
        return
    for name, lo, hi, text in domains:
        x = tensors[name].detach()
        if x.device.type != "cpu" and CHECK_DOMAINS != "all":
            continue
        below, above = (x < lo) if lo is not None else None, (x > hi) if hi is not None else None
        outside = above if below is None else below if above is None else below | above
        what = f"must lie in its declared domain {text}"
        if x.device.type != "cpu" or torch.compiler.is_compiling():
            torch._assert_async(~outside.any(), f"argument '{name}': {what}")
        elif outside.any():
            raise ArgumentError(name, f"{what}, but holds {x[outside][0].item():g}")


def _domain(op: Operand) -> tuple[str, float | None, float | None, str]:
    """(name, lower bound, upper bound, the domain as written), an infinite bound as None."""
    lo, hi = op.domain
    return op.name, lo if math.isfinite(lo) else None, hi if math.isfinite(hi) else None, f"({_bound(lo)}, {_bound(hi)})"


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # lamixer's folder, or a compiled package's


def warn(message: str) -> None:
    """warnings.warn, attributed to the caller's line: the first frame outside this package."""
    frame, level = sys._getframe(0), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, stacklevel=level)


MEMO_ENTRIES = 256  # signatures kept per mixer (and entries per signature); a full memo starts over


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

    def __init__(self, sig: Signature, call: Call, scale_given: bool):
        self.names = list(call.inputs)
        self.sizes, self.B, self.T, self.H = call.sizes, call.batch, call.length, call.heads
        self.dtypes = (call.compute_dtype, call.out_dtype, call.state_dtype)
        self.device = call.device
        self.default_scale = None if scale_given else call.scale
        self.shapes = {name: tuple(h.shape) for name, h in call.initial_state.items()}  # (no tensor is kept)
        self.states = [name for name, _ in sig.states]
        self.domains = sig.domains
        self.memo: dict = {}  # for the later stages (Call.memo)

    def rebind(self, args: tuple, kwargs: dict, scale, initial_state, cu_seqlens) -> Call:
        compute, out, state = self.dtypes
        if kwargs:
            bound = dict(zip(self.names, args))
            bound.update(kwargs)
            tensors = {name: bound[name] for name in self.names}
        else:
            tensors = dict(zip(self.names, args))
        check_domains(self.domains, tensors)
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


def bind(sig: Signature, cache: dict, args: tuple, kwargs: dict, scale, initial_state, cu_seqlens, compute_dtype,
         check_all: Callable[[], Call]) -> Call:  # fmt: skip
    """The validated call (every bad argument an ArgumentError naming it): check_all() runs every check (`check`
    on the call's arguments); a signature seen valid before (in cache, the mixer's own dict) skips the metadata
    checks (see the module docstring)."""
    key = signature(args, kwargs, initial_state, cu_seqlens, scale, compute_dtype)
    if key is None:
        return check_all()
    known = cache.get(key)
    if known is not None:
        return known.rebind(args, kwargs, scale, initial_state, cu_seqlens)
    call = check_all()
    call.memo = remember(cache, key, _Binding(sig, call, scale is not None)).memo
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


def check(sig: Signature, tensors: dict, scale, initial_state, cu_seqlens, default_scale: Callable[[dict[str, int]], float],
          compute_dtype=None) -> Call:  # fmt: skip
    """Check every argument against the signature and bind them; tensors holds every operand by name.

    default_scale maps the call's dim sizes to the scale used when scale is None."""
    for op in sig.operands:
        if not isinstance(tensors[op.name], torch.Tensor):
            raise ArgumentError(op.name, f"must be a torch.Tensor, got {type(tensors[op.name]).__name__}")
        if not tensors[op.name].is_floating_point():
            raise ArgumentError(op.name, f"must be a floating-point tensor, got {tensors[op.name].dtype}")
    inputs = [op for op in sig.operands if op.kind == "input"]
    first = inputs[0] if inputs else sig.operands[0]
    device = tensors[first.name].device
    lead: tuple[int, int, int] | None = None
    sizes: dict[str, int] = {}
    size_from: dict[str, str] = {}  # dim -> the operand that set its size
    for op in sig.operands:
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
    for op in sig.operands:
        if op.kind == "param" and op.per_head and tensors[op.name].shape[0] != H:
            raise ArgumentError(op.name, f"has {tensors[op.name].shape[0]} heads, but the inputs have H = {H}")
        if any(n < 1 for n in tensors[op.name].shape[3 if op.kind == "input" else 0:]):
            raise ArgumentError(op.name, f"has an empty dim: {_shape(tensors[op.name].shape)}")
    sizes["H"] = H

    cu, longest = None, T
    if cu_seqlens is not None:
        cu, longest = _check_cu(cu_seqlens, B, T, device)
    elif 1 < T < H and not torch.compiler.is_compiling():  # a decoding step has T = 1 < H by design
        warn(f"{sig.name}: '{first.name}' has {T} tokens and {H} heads; the inputs are laid out [B, T, H, ...], were they given head "
             "first, [B, H, T, ...]?")  # fmt: skip
    N = B if cu is None else len(cu) - 1

    dtypes = {tensors[op.name].dtype for op in inputs}
    out_dtype = tensors[first.name].dtype
    _check_dtypes(inputs, tensors, first.name, out_dtype)
    if compute_dtype is None:
        compute_dtype = torch.float64 if dtypes == {torch.float64} else torch.float32
    state_dtype = torch.float64 if dtypes == {torch.float64} else torch.float32

    if scale is None:
        scale_value = default_scale(sizes)
        if not math.isfinite(scale_value) and sig.uses_scale:
            sizes_text = ", ".join(f"{d} = {n}" for d, n in sizes.items())
            raise ArgumentError("scale", f"the default scale of {sig.name} is {scale_value} for {sizes_text}; pass a finite scale=")
    else:
        if not sig.uses_scale:
            raise ArgumentError("scale", f"{sig.name} does not use a scale")
        scale_value = _scale_value(scale)

    states = check_states(sig, initial_state, N, H, sizes, device, compute_dtype)
    check_domains(sig.domains, tensors)
    return Call({op.name: tensors[op.name] for op in sig.operands}, sizes, B, T, H, scale_value, states, cu, compute_dtype, out_dtype,
                state_dtype, device, longest)  # fmt: skip


# how much precision each dtype keeps; the two half types keep it differently
_WIDTH = {torch.float16: 1, torch.bfloat16: 1, torch.float32: 2, torch.float64: 3}


def _check_dtypes(inputs: list[Operand], tensors: dict, first: str, out_dtype: torch.dtype) -> None:
    """The output takes the first input's dtype; another input may be wider (a float32 gate beside bfloat16 data, as
    FLA's users call it), but one narrower, or the other half type, would make the output's dtype depend on the order
    of the arguments: an ArgumentError naming it."""
    for op in inputs:
        dtype = tensors[op.name].dtype
        if dtype != out_dtype and _WIDTH.get(dtype, 1) <= _WIDTH.get(out_dtype, 1):
            raise ArgumentError(op.name, f"is {dtype}, but the first input '{first}' is {out_dtype}, whose dtype the output takes: an input may be "
                                         "wider than the first (a float32 gate), not narrower or another half type")  # fmt: skip


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


def check_states(sig: Signature, initial_state, N: int, H: int, sizes, device, dtype) -> dict[str, torch.Tensor]:
    names = [name for name, _ in sig.states]
    if initial_state is None:
        given = [None] * len(names)
    elif isinstance(initial_state, torch.Tensor):
        if len(names) != 1:
            raise ArgumentError("initial_state", f"{sig.name} has {len(names)} states ({', '.join(names)}): pass a tuple")
        given = [initial_state]
    elif isinstance(initial_state, (tuple, list)):
        if len(initial_state) != len(names):
            raise ArgumentError("initial_state", f"needs {len(names)} tensors ({', '.join(names)}), got {len(initial_state)}")
        given = list(initial_state)
    else:
        raise ArgumentError("initial_state", f"must be a tensor or a tuple of tensors, got {type(initial_state).__name__}")
    out = {}
    for (name, dims), h0 in zip(sig.states, given):
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


def pick_backend(name: str, backend: str, call: Call, missing: list[str]) -> str:
    """The backend a checked call runs on: "auto" is the Triton kernels on CUDA when they can run it (missing is
    empty), else torch; asking for "triton" when they cannot is an error naming why."""
    if backend == "triton" and missing:
        raise ArgumentError("backend", f"{name} cannot run on Triton kernels: {'; '.join(missing)}")
    if backend == "auto":
        return "triton" if call.device.type == "cuda" and not missing else "torch"
    return backend


def results(call: Call, o: torch.Tensor, finals: list[torch.Tensor], output_final_state: bool, sig: Signature | None = None):
    """(o, final_state) as the caller gets them: o in the first input's dtype; the final states (None unless
    output_final_state; a tuple for several states) in float32, float64 for float64 inputs. finals may end with
    runtime/carry.py's extras (sig is then the mixer's Signature), which follow as carry.outputs gives them."""
    o = o if o.dtype == call.out_dtype else o.to(call.out_dtype)
    finals, more = finals[: len(call.initial_state)], finals[len(call.initial_state) :]
    more = carry.outputs(call, sig, more) if call.output_stats or call.output_window else ()
    if not output_final_state:
        return (o, None, *more)
    finals = [f if f.dtype == call.state_dtype else f.to(call.state_dtype) for f in finals]
    return (o, finals[0] if len(finals) == 1 else tuple(finals), *more)
