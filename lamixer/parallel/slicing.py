"""A mixer call on one rank's slice of the time axis (Mixer.__call__ with context_parallel=group).

The call is bound as one process would bind this rank's tensors; then the ranks agree (shard.agree) on
each rank's length, whether any takes gradients, and what must match (batch, heads, dim sizes, dtypes,
the packed offsets, whether final states are asked for). The bound call is then made this rank's: its
packed offsets the local ones, its initial states those of the pieces that start on the rank (a piece
that continues an earlier rank's sequence starts from zero: the scans add its incoming state,
lamixer/parallel/mixer.py), and the Shard that the evaluator's scans, statistics and block attention
consult.
"""
from __future__ import annotations

import torch

from ..backends.binding import Call, bind
from ..passes.pipeline import Compiled
from ..runtime.call import check_cu_seqlens, check_states
from ..runtime.errors import ArgumentError
from .shard import Local, Shard, agree, fingerprint


def global_offsets(cu, batch: int, device) -> list[int]:
    """The packed sequences' offsets over all ranks, checked as far as one rank can: 1-D integers from 0, increasing."""
    total = int(cu[-1]) if isinstance(cu, torch.Tensor) and cu.dim() == 1 and cu.numel() >= 2 and not cu.is_floating_point() else -1
    return check_cu_seqlens(cu, batch, total, device).tolist()


def bind_slice(compiled: Compiled, args: tuple, kwargs: dict, scale, initial_state, cu_seqlens, compute_dtype, backend: str,
               context_parallel, final: bool, windowed: bool = False) -> Call:  # fmt: skip
    """This rank's call, bound and agreed with the group's other ranks (an error on any rank raises on all).
    context_parallel: a ProcessGroup, or a Shard already agreed on (what a layer passes on with its inputs);
    windowed: whether block attention's window is given or asked for (which a sliced call cannot continue)."""
    if backend == "interpret":
        raise ArgumentError("backend", "the interpreter runs whole sequences: context parallelism runs on the torch and triton backends")
    if windowed:
        raise ArgumentError("window", "block attention under context parallelism runs whole sequences: it takes no window and returns none")
    if isinstance(context_parallel, Shard):
        if cu_seqlens is not None:
            raise ArgumentError("cu_seqlens", "is the Shard's own when context_parallel is a Shard")
        return _localise(compiled, bind(compiled, args, kwargs, scale, None, None, compute_dtype), context_parallel, initial_state)
    found: dict = {}

    def check() -> Local:
        if any(isinstance(x, torch.Tensor) and x.dim() >= 3 and x.shape[1] == 0 for x in [*args, *kwargs.values()]):
            raise ArgumentError("context_parallel", "this rank's slice holds no tokens: every rank needs at least one")
        call = bind(compiled, args, kwargs, scale, None, None, compute_dtype)
        cu = None if cu_seqlens is None else global_offsets(cu_seqlens, call.batch, call.device)
        N = call.batch if cu is None else len(cu) - 1
        found["states"] = check_states(compiled.signature, initial_state, N, call.heads, call.sizes, call.device, call.compute_dtype)
        found["call"] = call
        grad = torch.is_grad_enabled() and any(t.requires_grad for t in [*call.inputs.values(), *found["states"].values()])
        sizes = fingerprint(call.heads, sorted(call.sizes.items()), str(call.compute_dtype), str(call.out_dtype))
        return Local(call.length, call.batch, cu, grad, sizes, final, call.device)

    shard = agree(context_parallel, check)
    return _localise(compiled, found["call"], shard, None, found["states"])


def _localise(compiled: Compiled, call: Call, shard: Shard, initial_state, states: dict | None = None) -> Call:
    """The call made this rank's (see the module docstring)."""
    if call.length != shard.lengths[shard.rank]:
        raise ArgumentError(compiled.signature.operands[0].name, f"has {call.length} tokens, but the Shard gives this rank {shard.lengths[shard.rank]}")
    if states is None:
        states = check_states(compiled.signature, initial_state, shard.sequences_total, call.heads, call.sizes, call.device, call.compute_dtype)
    index = torch.tensor(shard.sequences, dtype=torch.int64, device=call.device)
    local = {}
    for name, h0 in states.items():
        h0 = h0.index_select(0, index) if shard.cu is not None else h0
        if shard.continues[shard.rank]:  # the first piece's state comes from the ranks before (the scans add it)
            h0 = torch.cat([torch.zeros_like(h0[: shard.rows]), h0[shard.rows :]], 0)
        local[name] = h0
    call.initial_state = local
    call.cu_seqlens = shard.local_cu
    call.longest = max(b - a for a, b in zip(shard.pieces, shard.pieces[1:]))
    call.context_parallel = shard
    return call


def layer_slice(layer, x, state, cu_seqlens, return_state, group) -> Shard:
    """The Shard of a layer's call on this rank's slice x [B, T, hidden], agreed with the group's other ranks."""

    def check() -> Local:
        layer._check_x(x, "x", 3)
        if state is not None or return_state is not False:
            raise ArgumentError("state" if state is not None else "return_state", "a layer under context parallelism runs whole sequences "
                                "from a zero state: it takes no state and returns none")  # fmt: skip
        cu = None if cu_seqlens is None else global_offsets(cu_seqlens, x.shape[0], x.device)
        grad = torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in layer.parameters()))
        return Local(x.shape[1], x.shape[0], cu, grad, fingerprint(layer.hidden_size, str(x.dtype)), False, x.device)

    return agree(group, check)
