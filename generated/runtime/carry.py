"""What a call carries besides the recurrent states: given statistics and block attention's window.

A spec's `stat`s are whole-input statistics unless the call gives their values (`stats={name: value}`): a
layer gives its running estimates so, which makes a spec with statistics a recurrence whose output at a token
depends on earlier tokens alone. A given value has the statistic's own shape, `[N]` leading for a statistic
per batch (one value per sequence) and `[H]` for one per head, or that shape without the `[N]` (one value
for every sequence); it is a constant, as a computed statistic is (no gradient reaches it). A call reports the
statistics it used with `output_stats=True`, in the statistic's own shape.

Block attention attends within blocks of `size` tokens counted from each sequence's start. A call that
continues sequences gives their Window: the tokens each has seen, and each block attention's keys and values
of the current block so far (the first `position % size` rows); with `output_window=True` it returns the window
after its tokens, rows past the current block's zero.

Signature.stats holds (name, groups) of each statistic and Signature.blocks (size, key dim, value dim) of each
block attention, in the graph's order; a Call holds what was given, checked (`attach`).
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from . import scan
from .errors import ArgumentError
from .scan import _block_attention, stat


@dataclass
class Window:
    """Block attention's current block of N sequences: what a call that continues them needs."""

    position: torch.Tensor  # [N] int64: the tokens each sequence has seen
    keys: tuple[torch.Tensor, ...]  # each block attention's, [N, H, size, key dim]: the first position % size rows hold the block's keys
    values: tuple[torch.Tensor, ...]  # [N, H, size, value dim] likewise


def _shape(dims) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"


def _sequences(call) -> int:
    return call.batch if call.cu_seqlens is None else call.cu_seqlens.numel() - 1


def _lengths(call) -> torch.Tensor:
    """Each sequence's number of tokens in this call, [N]."""
    if call.cu_seqlens is None:
        return torch.full((call.batch,), call.length, dtype=torch.int64, device=call.device)
    return call.cu_seqlens[1:] - call.cu_seqlens[:-1]


def block_size(size: int | str, sizes: dict[str, int]) -> int:
    return size if isinstance(size, int) else sizes[size]


# ---- checking what a call gives ----
def attach(sig, call, stats, window, output_stats, output_window):
    """The call with its given statistics and window checked (an ArgumentError naming the argument for each mistake)."""
    for name, flag in (("output_stats", output_stats), ("output_window", output_window)):
        if not isinstance(flag, bool):
            raise ArgumentError(name, f"must be True or False, got {flag!r}")
    if stats is None and window is None and not output_stats and not output_window:
        return call
    if output_stats and not sig.stats:
        raise ArgumentError("output_stats", f"{sig.name} has no statistics")
    if output_window and not sig.blocks:
        raise ArgumentError("output_window", f"{sig.name} has no block attention")
    given = None if stats is None else _check_stats(sig, call, stats)
    return dataclasses.replace(call, stats=given, window=None if window is None else _check_window(sig, call, window),
                               output_stats=output_stats, output_window=output_window)  # fmt: skip


def _check_stats(sig, call, stats) -> dict[str, torch.Tensor]:
    if not isinstance(stats, Mapping):
        raise ArgumentError("stats", f"must be a dict of statistic values by name, got {type(stats).__name__}")
    if not sig.stats:
        raise ArgumentError("stats", f"{sig.name} has no statistics")
    groups = dict(sig.stats)
    N, H = _sequences(call), call.heads
    out = {}
    for name, value in stats.items():
        if name not in groups:
            raise ArgumentError("stats", f"{sig.name} has no statistic {name!r} (its statistics: {', '.join(groups)})")
        label = f"stats[{name!r}]"
        if not isinstance(value, torch.Tensor) or not value.is_floating_point():
            raise ArgumentError(label, "must be a floating-point tensor")
        own = ((H,) if "head" in groups[name] else ())
        shapes = [own, (N, *own)] if "batch" in groups[name] else [own]
        if tuple(value.shape) not in shapes:
            raise ArgumentError(label, f"must have shape {' or '.join(_shape(s) for s in shapes)}, got {_shape(value.shape)}")
        if value.device != call.device:
            raise ArgumentError(label, f"is on {value.device}, but the inputs are on {call.device}")
        if value.device.type == "cpu" and not torch.compiler.is_compiling() and not torch.isfinite(value).all():
            raise ArgumentError(label, "holds a value that is not finite")
        out[name] = value.detach().to(call.compute_dtype)
    return out


def _check_window(sig, call, window) -> Window:
    if not sig.blocks:
        raise ArgumentError("window", f"{sig.name} has no block attention")
    if not isinstance(window, Window):
        raise ArgumentError("window", f"must be a lamixer Window (returned by a call with output_window=True), got {type(window).__name__}")
    N, H = _sequences(call), call.heads
    p = window.position
    if not isinstance(p, torch.Tensor) or p.dtype not in (torch.int32, torch.int64) or tuple(p.shape) != (N,):
        raise ArgumentError("window", f"position must be [N] = [{N}] integers, the tokens each sequence has seen")
    if p.device.type == "cpu" and not torch.compiler.is_compiling() and bool((p < 0).any()):
        raise ArgumentError("window", "position must not be negative")
    for part in ("keys", "values"):
        got = getattr(window, part)
        if not isinstance(got, (tuple, list)) or len(got) != len(sig.blocks):
            raise ArgumentError("window", f"{part} must be a tuple of {len(sig.blocks)} tensor(s), one per block attention")
        for i, (x, (size, kd, vd)) in enumerate(zip(got, sig.blocks)):
            want = (N, H, block_size(size, call.sizes), call.sizes[kd if part == "keys" else vd])
            if not isinstance(x, torch.Tensor) or not x.is_floating_point() or tuple(x.shape) != want:
                raise ArgumentError("window", f"{part}[{i}] must be a floating-point tensor of shape {_shape(want)}")
            if x.device != call.device:
                raise ArgumentError("window", f"{part}[{i}] is on {x.device}, but the inputs are on {call.device}")
    return Window(p.to(device=call.device, dtype=torch.int64), tuple(k.to(call.compute_dtype) for k in window.keys),
                  tuple(v.to(call.compute_dtype) for v in window.values))  # fmt: skip


# ---- statistics ----
def check_spread(call, name: str, fn: str, x: torch.Tensor, groups: tuple[str, ...]) -> None:
    """A var or std made from the call needs two values in each group (one value's is 0 / 0, NaN): an ArgumentError
    naming the statistic where a group of this call holds one. x: its argument, [B, T, H, *dims]."""
    if fn not in ("var", "std"):
        return
    width = math.prod(x.shape[3:]) * (1 if "head" in groups else x.shape[2])  # each token's values in a group
    if width > 1:
        return
    if "batch" not in groups:
        tokens = x.shape[0] * x.shape[1]
    else:  # each sequence's own (a packed batch's lengths read on the host, as binding read its offsets)
        tokens = x.shape[1] if call.cu_seqlens is None else int(_lengths(call).min())
    if tokens * width < 2:
        where = f"per {', '.join(groups)}" if groups else "over the whole input"
        raise ArgumentError("stats", f"statistic {name!r}, a {fn} {where}, has a single value to reduce in this call (a {fn} "
                                     f"needs two): give its value (stats={{{name!r}: ...}}), or call with more tokens")  # fmt: skip


def statistic(call, name: str, fn: str, x: torch.Tensor, groups: tuple[str, ...]) -> torch.Tensor:
    """A statistic over [B, T, H, *dims] tensors, as the torch backend holds it ([B|1, 1, H|1]; per batch with packed
    sequences [1, T, H|1], each token its own sequence's): the call's given value, else the whole input's."""
    given = None if call.stats is None else call.stats.get(name)
    if given is None:
        check_spread(call, name, fn, x, groups)
        return stat(fn, x, groups, call.cu_seqlens)
    H = call.heads if "head" in groups else 1
    if given.dim() == (1 if "head" in groups else 0):  # one value for every sequence
        return given.reshape(1, 1, H)
    if call.cu_seqlens is None:
        return given.reshape(call.batch, 1, H)
    return given.reshape(-1, H).repeat_interleave(_lengths(call), 0, output_size=call.length).unsqueeze(0)


def reported(call, value: torch.Tensor, groups: tuple[str, ...]) -> torch.Tensor:
    """A statistic as `statistic` holds it, in its own shape ([N] leading per batch, [H] per head)."""
    if "batch" in groups and call.cu_seqlens is not None and value.shape[1] > 1:
        value = value[0, call.cu_seqlens[:-1]]  # each sequence's first token holds its value
    N = _sequences(call)
    value = value.reshape(-1, value.shape[-1])
    value = value.expand(N, -1) if "batch" in groups else value[:1]  # a value given for every sequence is repeated
    return value.reshape(((N,) if "batch" in groups else ()) + ((call.heads,) if "head" in groups else ()))


# ---- block attention ----
def block_attention(call, index: int, q, k, v, scale, size: int, dtype: torch.dtype | None, kernel=None,
                    residual: torch.Tensor | None = None, weight: float = 1.0) -> tuple[torch.Tensor, tuple | None]:  # fmt: skip
    """Block attention number `index` of a call over [B, T, H, D] tensors, with the plan's epilogue (weight *
    (attention + residual), scan.epilogue): (o, the window after the call or None unless asked for). Without a
    window given or asked for, runtime.scan's, which knows of none, on `kernel` when the backend gives one
    (scan.block_attention)."""
    if call.window is None and not call.output_window:
        return scan.block_attention(q, k, v, scale, size, call.cu_seqlens, dtype, kernel, residual, weight), None
    o, window = attend(call, index, q, k, v, scale, size, dtype)
    return scan.epilogue(o, residual, weight), window


def attend(call, index: int, q, k, v, scale, size: int, dtype: torch.dtype | None) -> tuple[torch.Tensor, tuple | None]:
    """Block attention number `index` over [B, T, H, D] tensors continuing the call's window (none: every sequence
    starts here): (o [B, T, H, Dv] in q's dtype, (keys, values) of the window after the call or None unless asked)."""
    out_dtype = q.dtype
    q, scale = scan.scaled_queries(q, scale)
    if dtype is not None:
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    if call.window is not None and call.cu_seqlens is None and q.shape[1] == 1:
        return _step(call, index, q, k, v, float(scale), size, out_dtype)
    N = _sequences(call)
    counts = [0] * N if call.window is None else (call.window.position % size).tolist()
    past = None if call.window is None else (call.window.keys[index], call.window.values[index])
    outs, keys, values = [None] * N, [None] * N, [None] * N
    # sequences that start at one same place in a block run together: unpacked rows usually all do
    for c, rows in _groups(counts, call.cu_seqlens is None):
        qs, ks, vs = (_rows(x, rows, call.cu_seqlens) for x in (q, k, v))
        if c:
            pk, pv = (p[rows, :, :c].transpose(1, 2).to(ks.dtype) for p in past)  # [n, c, H, D]
            qs, ks, vs = torch.cat([qs.new_zeros(len(rows), c, *qs.shape[2:]), qs], 1), torch.cat([pk, ks], 1), torch.cat([pv, vs], 1)
        o = _block_attention(qs, ks, vs, size, float(scale))[:, c:]
        left = ks.shape[1] % size  # the rows of the block the last token is in, past or present
        for j, n in enumerate(rows):
            outs[n] = o[j : j + 1]
            if call.output_window:
                keys[n], values[n] = (_block(x[j], left, size) for x in (ks, vs))
    o = torch.cat(outs, 1 if call.cu_seqlens is not None else 0).to(out_dtype)
    return o, (torch.stack(keys).to(call.compute_dtype), torch.stack(values).to(call.compute_dtype)) if call.output_window else None


def _step(call, index: int, q, k, v, scale: float, size: int, out_dtype) -> tuple[torch.Tensor, tuple | None]:
    """One token per sequence [B, 1, H, D] attending to its block's earlier keys in the window and to itself, with no
    host synchronisation (a decoding step, which a CUDA graph may capture)."""
    count = (call.window.position % size)[:, None, None]  # [B, 1, 1]
    past_k, past_v = call.window.keys[index].to(k.dtype), call.window.values[index].to(v.dtype)  # [B, H, size, D]
    slots = torch.arange(size, device=k.device)[None, None, :]
    held = slots < count  # [B, 1, size]: the rows of the current block
    keys = torch.cat([torch.where(held[..., None], past_k, 0.0), k.transpose(1, 2)], 2)  # [B, H, size + 1, D]
    vals = torch.cat([torch.where(held[..., None], past_v, 0.0), v.transpose(1, 2)], 2)
    scores = (q.transpose(1, 2) * keys).sum(-1) * scale  # [B, H, size + 1]
    seen = torch.cat([held, torch.ones_like(held[..., :1])], -1)
    scores = torch.where(seen, scores, float("-inf"))
    o = (torch.softmax(scores, -1).unsqueeze(-1) * vals).sum(-2).unsqueeze(1).to(out_dtype)  # [B, 1, H, Dv]
    if not call.output_window:
        return o, None
    # the token joins its block at row `count`; a block it completes leaves an empty window
    put = (slots == count)[..., None]  # [B, 1, size, 1]
    full = (count + 1 == size)[..., None]
    new_k = torch.where(full, 0.0, torch.where(put, k.transpose(1, 2), keys[:, :, :size]))
    new_v = torch.where(full, 0.0, torch.where(put, v.transpose(1, 2), vals[:, :, :size]))
    return o, (new_k.to(call.compute_dtype), new_v.to(call.compute_dtype))


def _groups(counts: list[int], unpacked: bool) -> list[tuple[int, list[int]]]:
    """(count, the sequences that have it): all sequences of one count together when unpacked, one by one when packed."""
    if not unpacked:
        return [(c, [n]) for n, c in enumerate(counts)]
    found: dict[int, list[int]] = {}
    for n, c in enumerate(counts):
        found.setdefault(c, []).append(n)
    return list(found.items())


def _rows(x: torch.Tensor, rows: list[int], cu) -> torch.Tensor:
    """Sequences `rows` of x [B, T, ...]: batch rows, or one packed sequence as [1, its length, ...]."""
    if cu is None:
        return x if len(rows) == x.shape[0] else x[rows]
    (n,) = rows
    return x[:, int(cu[n]) : int(cu[n + 1])]


def _block(x: torch.Tensor, left: int, size: int) -> torch.Tensor:
    """The last `left` rows of one sequence's x [T, H, D] as a window [H, size, D], zeros after them."""
    out = x.new_zeros(size, *x.shape[1:])
    if left:
        out[:left] = x[x.shape[0] - left :]
    return out.transpose(0, 1)


# ---- what a call returns beside o and its final states ----
def extras(call, windows: list[tuple | None], stats: list[tuple[torch.Tensor, tuple[str, ...]]]) -> list[torch.Tensor]:
    """The tensors a backend returns after the final states: each block attention's window keys and values (when
    output_window), then each statistic (stats: as `statistic` holds them, with their groups) in its own shape
    (when output_stats)."""
    out = [x for w in windows for x in w] if call.output_window else []
    return out + ([reported(call, value, groups) for value, groups in stats] if call.output_stats else [])


def outputs(call, sig, tensors: list[torch.Tensor]) -> tuple:
    """`extras`' tensors as the caller gets them: (the Window after the call,) when output_window, then ({name:
    statistic},) when output_stats."""
    out: tuple = ()
    if call.output_window:
        n = 2 * len(sig.blocks)
        position = (call.window.position if call.window is not None else torch.zeros(_sequences(call), dtype=torch.int64, device=call.device))
        state = call.state_dtype
        out += (Window(position + _lengths(call), tuple(t.to(state) for t in tensors[0:n:2]), tuple(t.to(state) for t in tensors[1:n:2])),)
        tensors = tensors[n:]
    if call.output_stats:
        out += ({name: t.to(call.state_dtype) for (name, _), t in zip(sig.stats, tensors)},)
    return out


def interpret_stat(call, name: str, groups: tuple[str, ...]) -> torch.Tensor | None:
    """A given statistic as the interpreter holds statistics ([rows|1, H|1]), or None when not given."""
    given = None if call.stats is None else call.stats.get(name)
    if given is None:
        return None
    H = call.heads if "head" in groups else 1
    return given.reshape(-1, H) if given.dim() > (1 if "head" in groups else 0) else given.reshape(1, H)

