"""Collectives over a process group as autograd sees them.

Gathering a tensor from every rank and summing one over every rank, each a custom autograd Function
around a plain torch.distributed collective, whose backward is the adjoint collective: the gradient of
a gathered slot is summed over the ranks that used it and lands on the rank it came from; the gradient
of a sum is the sum of its users' gradients. A loss under context parallelism is the sum of every
rank's own loss, and each rank runs backward on its own.

Collectives in a backward pass must run in the same order on every rank, or they would pair up wrongly.
Autograd orders only what depends on what, so `Sequence` makes every collective of a call depend on the
one before it (and the call's output on the last): backward then meets them in reverse order on every
rank, and meets all of them on every rank, also where a rank's own output did not need what it gathered.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

# torch 2.13 renamed the tensor collectives (the old names warn); older releases have only the old ones
_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def gather_plain(x: torch.Tensor, group) -> torch.Tensor:
    """[world, *x.shape]: every rank's x, in rank order (no gradient)."""
    x = x.detach().contiguous()
    out = x.new_empty((dist.get_world_size(group), *x.shape))
    _GATHER(out.view(-1), x.view(-1), group=group)
    return out


def _scatters(group) -> bool:
    """Whether the group's backend reduce-scatters (NCCL does; elsewhere a sum over all ranks, then this rank's part)."""
    return dist.get_backend(group) == "nccl"


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        return gather_plain(x, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        group = ctx.group
        grad = grad.contiguous()
        if _scatters(group):
            out = grad.new_empty(grad.shape[1:])
            _SCATTER(out.view(-1), grad.view(-1), group=group)
        else:
            total = grad.clone()
            dist.all_reduce(total, group=group)
            out = total[dist.get_rank(group)]
        return out, None


class _Sum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        out = x.detach().clone(memory_format=torch.contiguous_format)
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        out = grad.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(out, group=ctx.group)
        return out, None


class _Tie(torch.autograd.Function):
    """x unchanged, depending on `other` for autograd alone: backward reaches `other` (with a zero gradient) only
    after x's gradient is known."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        ctx.other = (other.shape, other.dtype, other.device)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        shape, dtype, device = ctx.other
        return grad, torch.zeros(shape, dtype=dtype, device=device)


def tie(x: torch.Tensor, other: torch.Tensor | None) -> torch.Tensor:
    """x, made to depend on `other` when other takes a gradient (see the module docstring)."""
    if other is None or not other.requires_grad:
        return x
    return _Tie.apply(x, other)


class Sequence:
    """The differentiable collectives of one call, in the order they run: each one's input depends on the output
    of the one before, so every rank's backward pass meets them in reverse order (see the module docstring).

    grad: whether the call takes gradients, agreed by every rank: all of them then run every collective through
    autograd (a rank whose own inputs need none included), or none does."""

    def __init__(self, group, grad: bool):
        self.group, self.grad = group, grad
        self.last: torch.Tensor | None = None

    def _input(self, x: torch.Tensor) -> torch.Tensor:
        x = x if x.requires_grad else x.detach().requires_grad_()
        return tie(x, self.last)

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """[world, *x.shape]: every rank's x in rank order; gradients go back to the rank each slot came from."""
        if not self.grad:
            return gather_plain(x, self.group)
        self.last = _Gather.apply(self._input(x), self.group)
        return self.last

    def sum(self, x: torch.Tensor) -> torch.Tensor:
        """x summed over the ranks (every rank gets the sum); its gradient is the sum of every rank's."""
        if not self.grad:
            out = x.detach().clone(memory_format=torch.contiguous_format)
            dist.all_reduce(out, group=self.group)
            return out
        self.last = _Sum.apply(self._input(x), self.group)
        return self.last

    def settle(self, x: torch.Tensor) -> torch.Tensor:
        """x (a call's output), depending on every collective of the call: a rank's backward from x runs their
        backward passes, which the other ranks wait on, also where x did not need them."""
        return tie(x, self.last)
