"""The meaning of the IR's primitive operations on tensors, shared by every evaluator.

A value is a tensor whose trailing axes are its named feature dims; the leading axes (batch,
time, head: however many the evaluator uses) broadcast as usual.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .errors import ArgumentError

UNARY = {
    "exp": torch.exp,
    "log": torch.log,
    "sigmoid": torch.sigmoid,
    "logsigmoid": F.logsigmoid,
    "softplus": F.softplus,
    "silu": F.silu,
    "elu": F.elu,
    "relu": torch.relu,
    "tanh": torch.tanh,
    "sqrt": torch.sqrt,
    "abs": torch.abs,
}

BINARY = {
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "div": torch.div,
    "pow": torch.pow,
    "max": torch.maximum,
    "min": torch.minimum,
}


def filled(value: float, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A spec's number (or a call constant) as a [1, 1, 1] tensor of dtype: a fill, not a copy from host memory (nothing
    waits on the device, and a CUDA graph can capture it), rounded as a cast rounds it: past the dtype's range an
    infinity, as float32 arithmetic makes one, where torch.full refuses the value."""
    value = float(value)
    if dtype.is_floating_point and abs(value) > torch.finfo(dtype).max:
        value = torch.tensor(value, dtype=torch.float64).to(dtype).item()
    return torch.full((1, 1, 1), value, dtype=dtype, device=device)


def align(x: torch.Tensor, have: tuple[str, ...], want: tuple[str, ...]) -> torch.Tensor:
    """Permute and unsqueeze the trailing feature axes of x from dims `have` to dims `want` (have is a subset)."""
    n = len(have)
    if have == want:
        return x
    lead = x.dim() - n
    perm = list(range(lead)) + [lead + have.index(d) for d in want if d in have]
    x = x.permute(perm)
    shape = list(x.shape[:lead])
    it = iter(x.shape[lead:])
    for d in want:
        shape.append(next(it) if d in have else 1)
    return x.reshape(shape)


def feature_axes(x: torch.Tensor, ndims: int) -> tuple[int, ...]:
    return tuple(range(x.dim() - ndims, x.dim()))


def reduce(fn: str, x: torch.Tensor, ndims: int) -> torch.Tensor:
    """Reduce the trailing ndims feature axes."""
    if ndims == 0:
        return x
    axes = feature_axes(x, ndims)
    if fn == "sum":
        return x.sum(axes)
    if fn == "mean":
        return x.mean(axes)
    flat = x.flatten(-ndims) if ndims > 1 else x
    return flat.amax(-1) if fn == "max" else flat.amin(-1)


NORM_FLOOR = 1e-12  # l2norm's x / max(||x||, NORM_FLOOR)


def normalize(fn: str, x: torch.Tensor) -> torch.Tensor:
    """Normalize over the last axis (the vector's one dim)."""
    if fn == "softmax":
        return torch.softmax(x, dim=-1)
    return x / torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp_min(NORM_FLOOR)


def contract(x: torch.Tensor, dx: tuple[str, ...], y: torch.Tensor, dy: tuple[str, ...]) -> torch.Tensor:
    """x @ y: contract the last dim of x with the first of y (the result keeps the others, in order)."""
    union = dx + tuple(d for d in dy if d not in dx)
    prod = align(x, dx, union) * align(y, dy, union)
    return prod.sum(prod.dim() - len(union) + union.index(dx[-1]))


def check_decay(f: torch.Tensor, note: tuple[str, str, tuple[str, ...]]) -> None:
    """A decay factor whose log a scan takes must be positive (its log is NaN below 0 and -inf at 0, which the chunked
    forms turn into NaN): an ArgumentError naming what it is made of, on the CPU. On a GPU, and while torch.compile
    traces, a device-side assertion instead, which needs no host sync. note: (the state, where the spec writes the
    decay, the call's arguments it reads), as classification records it (the log node's `decay_of`)."""
    state, where, arguments = note
    message = (f"the decay factor of state '{state}' ({where}) is <= 0 at some token; the scans take its log, so it must be "
               "positive")  # fmt: skip
    bad = (f.detach() <= 0).any()  # NaN is no sign: a NaN input gives NaN outputs, as it does without a decay
    if f.device.type != "cpu" or torch.compiler.is_compiling():
        torch._assert_async(~bad, message)
    elif bad:
        raise ArgumentError(", ".join(arguments) or state, message)


def apply(node: dict, args: list[torch.Tensor], arg_dims: list[tuple[str, ...]]) -> torch.Tensor:
    """Evaluate one pointwise IR node (anything but leaves, stats, scans and block attention); a decay factor's log is
    checked first (check_decay)."""
    op, dims = node["op"], node["dims"]
    if op == "unary":
        if "decay_of" in node:
            check_decay(args[0], node["decay_of"])
        return UNARY[node["fn"]](args[0])
    if op == "binary":
        a, b = (align(x, d, dims) for x, d in zip(args, arg_dims))
        return BINARY[node["fn"]](a, b)
    if op == "reduce":
        return reduce(node["fn"], args[0], len(arg_dims[0]))
    if op == "normalize":
        return normalize(node["fn"], args[0])
    if op == "dot":
        a, b = args[0], align(args[1], arg_dims[1], arg_dims[0])
        return reduce("sum", a * b, len(arg_dims[0]))
    if op == "outer":
        return align(args[0], arg_dims[0], dims) * align(args[1], arg_dims[1], dims)
    if op == "matmul":
        return contract(args[0], arg_dims[0], args[1], arg_dims[1])
    if op in ("output", "state_out"):
        return args[0]
    raise ValueError(f"not a pointwise op: {op}")


def stat(fn: str, x: torch.Tensor, groups: tuple[str, ...]) -> torch.Tensor:
    """A whole-input statistic of x [B, T, H, *dims] -> [B|1, H|1], stop-gradient.

    Reduced over time, feature dims, and batch/head unless grouped by them; std and var are
    Bessel-corrected, as torch.std. Never a permuted copy of x, nor a GPU reduction over strided
    axes (which read x at a tenth of its bandwidth: lln's max per batch and head, 346 us for 134 MB
    on the H200). Without a group by head, each value's entries are contiguous (the whole input, or
    a batch row's): one reduction, a Welford one for var and std (inductor's split reduction: two
    kernels). Grouped by head, in two stages: each token's feature dims (contiguous), then its
    [B, T, H] partials, combined exactly (three kernels for var and std).
    """
    B, T, H = x.shape[:3]
    x = x.detach().reshape(B, T, H, -1)
    n = x.shape[-1]
    axes = (1,) + (() if "batch" in groups else (0,)) + (() if "head" in groups else (2,))
    shape = (B if "batch" in groups else 1, H if "head" in groups else 1)
    wide = torch.float64 if x.dtype == torch.float64 else torch.float32
    if "head" not in groups:
        return _contiguous_stat(fn, x.reshape(shape[0], -1), wide).reshape(shape).to(x.dtype)
    if fn in ("max", "min"):
        part = x.amax(-1) if fn == "max" else x.amin(-1)
        return (part.amax(axes) if fn == "max" else part.amin(axes)).reshape(shape)
    mean = x.mean(-1, dtype=wide)  # [B, T, H]
    if fn == "mean":
        return mean.mean(axes).reshape(shape).to(x.dtype)
    # each token's n entries stand as two points, mean -+ sqrt(squared deviations / n): the same mean and squared
    # deviations, so one Welford reduction over the pairs has the group's, where the tokens' squares and their means'
    # deviations would be reductions of their own
    half = ((x - mean.unsqueeze(-1)).square().sum(-1, dtype=wide) / n).sqrt()
    spread, _ = torch.var_mean(torch.stack([mean - half, mean + half], -1), axes + (3,), correction=0)
    count = n * mean.numel() // spread.numel()
    var = spread * count / (count - 1)
    return (var.sqrt() if fn == "std" else var).reshape(shape).to(x.dtype)


def _contiguous_stat(fn: str, rows: torch.Tensor, wide: torch.dtype) -> torch.Tensor:
    """stat's fn of each row of rows [R, entries], accumulated in `wide`."""
    if fn in ("max", "min"):
        return rows.amax(1) if fn == "max" else rows.amin(1)
    if fn == "mean":
        return rows.mean(1, dtype=wide)
    var, _ = torch.var_mean(rows.to(wide), 1, correction=1)
    return var.sqrt() if fn == "std" else var
