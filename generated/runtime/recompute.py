"""Per-token work the backward recomputes instead of keeping: a scan's operands made from the inputs (feature maps,
gates) and block attention.

Such work is a few elementwise passes over tensors the caller holds anyway, while what autograd would keep of it (each
exp's output, each max's input, the scan kernels' copies of the finished operands, attention's masked keys and values)
is several times the inputs' size: a mixer's forward+backward memory, not its time, is what it costs. `recomputed`
runs a function under torch's non-reentrant checkpoint, which keeps only what the function reads (the caller's
tensors, statistics) and runs it again when the backward needs its values. Under torch.compile (runtime/fuse.py) it
leaves the choice to the partitioner, which recomputes cheap elementwise work itself and orders the backward's
recomputation with the rest (checkpointed there, the forward holds less but the backward peaks higher: bench/memory.py
--fused). `rebuilt` keeps a scan's own saved copies of such operands out of memory the same way, on eager calls.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch.utils.checkpoint import checkpoint


def recomputed(fn: Callable[..., torch.Tensor], *args: torch.Tensor) -> torch.Tensor:
    """fn(*args), recomputed in the backward rather than kept when a gradient reaches it. fn must read nothing but
    args, which the backward holds until it runs fn again (never a large intermediate of the caller's)."""
    if torch.compiler.is_compiling():  # the partitioner decides what to keep (the module's docstring)
        return fn(*args)
    if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
        return checkpoint(fn, *args, use_reentrant=False, preserve_rng_state=False)
    return fn(*args)


class _Recipe:
    """A saved tensor replaced by how to make it again: fn(*args) in the saved tensor's dtype."""

    __slots__ = ("fn", "args", "dtype")

    def __init__(self, fn, args: tuple, dtype: torch.dtype):
        self.fn, self.args, self.dtype = fn, args, dtype

    def make(self) -> torch.Tensor:
        with torch.no_grad():
            return self.fn(*self.args).to(self.dtype)


def _source(t: torch.Tensor, made: dict) -> tuple | None:
    """(fn, args) of the recomputed value t is, or a dtype conversion of (what a scan's host code makes of an operand
    before its kernels save it), else None. Matched by autograd node: a conversion's only input is its source's."""
    node = t.grad_fn
    if node is None:
        return None
    found = made.get(node)
    if found is None and node.name() == "ToCopyBackward0":
        found = made.get(node.next_functions[0][0])
    return found if found is not None and tuple(found[2]) == tuple(t.shape) else None


def _outer_hooks() -> tuple | None:
    """The saved-tensor hooks in force around the caller (torch.autograd.graph.saved_tensors_hooks), if any: hooks
    do not nest, the innermost alone packs."""
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    hooks = top(False) if top is not None else None
    return hooks if hooks and hooks[0] is not None else None


@contextlib.contextmanager
def rebuilt(values: list[tuple[torch.Tensor, Callable, tuple]]):
    """Within it, what autograd saves that is one of `values` (value, fn, args: value = fn(*args), a recomputed one),
    or a dtype conversion of one, is kept as a recipe and made again when the backward unpacks it. Nothing changes
    while torch.compile traces, or when no value takes part in autograd."""
    made = {} if torch.compiler.is_compiling() else {v.grad_fn: (fn, args, v.shape) for v, fn, args in values if v.grad_fn is not None}
    if not made:
        yield
        return

    outer = _outer_hooks()  # a caller's own hooks (offloading to the CPU, say) still see everything else

    def pack(t: torch.Tensor):
        found = _source(t, made)
        if found is not None:
            return _Recipe(found[0], found[1], t.dtype)
        return t if outer is None else (outer[0](t),)

    def unpack(x):
        if isinstance(x, _Recipe):
            return x.make()
        return x if outer is None else outer[1](x[0])

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        yield
