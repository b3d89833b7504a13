"""The triton backend: each scan group runs on the kernels its kernel plan names, the rest of the plan
(per-token work, statistics, side branches) as in the torch backend (backends/evaluate.py).

Training and long sequences run the group's chunk kernels (plan.groups[i].train), launched with the
tuned configuration for this GPU and shape (lamixer.tuning.choose) or the family's default;
inference on short sequences runs every group on the recurrent kernel (plan.groups[i].decode). Block
attention runs on its own kernels (kernels/block_attention.py) unless a call continues a window. The
kernels' host code is lamixer/kernels/; what is decided per call here is only what depends on the
call: whether gradients are needed, the sequence length, the dtype and the configuration.
"""
from __future__ import annotations

import functools
import os

import torch

from ..kernels import additive, delta, recurrent
from ..kernels.block_attention import block_attention
from ..kernels.config import Config
from ..kernels.launch import MAX_HEAD_DIM, bf16_interpreted, launch_problems
from ..passes.kernel_plan import Form, ScanGroup
from ..passes.pipeline import Compiled
from ..runtime import fuse
from ..runtime.scan import STATES_IN_PLACE
from ..tuning import choose
from . import evaluate
from .binding import Call, remember

__all__ = ["launch_problems", "run", "serves", "unsupported"]

CHUNK_SCANS = {additive.FAMILY: additive.scan, delta.FAMILY: delta.scan}  # a chunk template's host entry point


def unsupported(compiled: Compiled, sizes: dict[str, int] | None = None) -> list[str]:
    """Why the chunk kernels cannot run all of a spec's scans (empty when they can): the plan's reasons, and with the
    call's dim sizes, also why this call cannot."""
    reasons = [r for g in compiled.plan.groups for r in g.missing]
    for g in compiled.plan.groups if sizes is not None else ():
        for d in dict.fromkeys((g.key_dim, *g.value_dims)):
            if d is not None and sizes[d] > MAX_HEAD_DIM:
                reasons.append(f"state {g.states[0]}: {d} = {sizes[d]} is above the kernels' {MAX_HEAD_DIM}")
    return reasons


def needs_grad(call: Call) -> bool:
    return torch.is_grad_enabled() and (any(t.requires_grad for t in call.inputs.values())
                                        or any(s.requires_grad for s in call.initial_state.values()))  # fmt: skip


def serves(compiled: Compiled, call: Call) -> bool:
    """Whether this call's scans run on the recurrent kernel: no gradient is asked for, no sequence is longer than
    recurrent.MAX_T, every group has a decode kernel and every key dim fits a program's registers."""
    if call.longest > recurrent.MAX_T or needs_grad(call):
        return False
    return all(g.decode is not None and call.sizes[g.key_dim] <= MAX_HEAD_DIM for g in compiled.plan.groups)


def direct_operands(compiled: Compiled, call: Call, finished: bool = False) -> dict[int, Form]:
    """The plan's operands the kernels read from the caller's tensors (finished: the recurrent kernel's forms, else the
    chunk kernels'), less those whose per-head factor reads a param that needs a gradient: the kernels give none."""
    out = {}
    for g in compiled.plan.groups:
        for n, form in g.finished_decode if finished else g.finished_train:
            if not any(call.inputs[p].requires_grad for p in form.params):
                out[n] = form
    return out


def kernel_dtype(call: Call, interpreted: bool) -> torch.dtype:
    """The dtype the kernels take their operands in: the inputs' half type, else the compute dtype."""
    dtype = call.out_dtype if call.out_dtype in (torch.bfloat16, torch.float16) else call.compute_dtype
    if dtype == torch.bfloat16 and interpreted and not bf16_interpreted():
        dtype = torch.float32  # Triton 3.6's CPU interpreter multiplies bf16 dot operands as raw bits (lamixer.tools.emulate)
    return dtype


def chunk_config(group: ScanGroup, call: Call, dtype: torch.dtype, configs: dict[str, Config] | None = None) -> Config:
    """The configuration the group's chunk kernels launch with: configs[template] when given (the autotuner's
    candidate) and usable, else the tuned or default one (lamixer.tuning.choose)."""
    sizes = call.sizes
    K = sizes[group.key_dim]
    V = sum(1 if d is None else sizes[d] for st, d in zip(group.states, group.value_dims) if st != group.normaliser)
    given = (configs or {}).get(group.train.template)
    if given is not None and choose.usable(group, given, V):
        return given
    return choose.choose(group, dtype, call.batch, call.length, call.heads, K, V, call.device)


def chunk_scan(group: ScanGroup, dtype: torch.dtype, config: Config):
    """The group's chunk kernels as a scan implementation (ScanOperands -> results): its template's host entry, told the
    decay its kernels were rendered for where that is not the operands' kind (a per-head constant on chunk_additive's
    "constant" kernels)."""
    run = functools.partial(CHUNK_SCANS[group.train.template], dtype=dtype, config=config)
    return run if group.rendered_decay is None else functools.partial(run, decay=group.rendered_decay)


def run(compiled: Compiled, call: Call, configs: dict[str, Config] | None = None) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """o and the final states (evaluate.run's), every scan group on its kernels. configs: a configuration per chunk
    template that overrides the tuned ones (the autotuner's candidates; such calls run unfused)."""
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    if call.memo is None:
        return evaluate.run(compiled, call, *_choices(compiled, call, interpreted, configs)[:3], attention=block_attention)
    # the choices depend on nothing but the signature, the grad mode, whether the recurrent kernel takes the length,
    # the configurations asked for and the tuning cache's state (choose.generation: a configuration stored since)
    # and whether states are updated in place (a graphed decoder's, read here: tracing reads no context variable)
    in_place = STATES_IN_PLACE.get()
    key = ("triton", torch.is_grad_enabled(), call.longest <= recurrent.MAX_T, interpreted, tuple(sorted((configs or {}).items())),
           choose.generation(), in_place)
    choices = call.memo.get(key)
    if choices is None:
        choices = remember(call.memo, key, _choices(compiled, call, interpreted, configs, in_place))
    scans, direct, prog, chunked = choices
    # fused: chunked scans, or a one-token decoding step, with per-token work around them (with none, torch.compile's
    # dispatch only adds host time; a decoding step's work unfused is one small kernel per operation, most of a graphed
    # step's time); the autotuner times kernels unfused, and a context-parallel call's collectives stay outside a
    # compiled graph
    fused = (chunked or call.longest == 1) and not configs and prog.per_token_work and call.context_parallel is None
    constants = evaluate.call_constants(compiled, call, prog)
    return fuse.run(_evaluate, compiled.name, call, compiled, scans, direct, prog, constants, when=fused,
                    version=(choose.generation(), in_place))  # fmt: skip


def _evaluate(call: Call, compiled: Compiled, scans, direct, prog, constants: dict) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The evaluation fuse.run compiles, o already in the caller's dtype: the cast then fuses into the last per-token
    kernel, where after it is a pass of its own each way. constants: the call's, made outside the compiled graph
    (its inputs then, not kernels)."""
    o, finals = evaluate.run(compiled, call, scans, direct, prog, attention=block_attention, constants=constants)
    return o.to(call.out_dtype), finals


def _choices(compiled: Compiled, call: Call, interpreted: bool, configs: dict[str, Config] | None, in_place: bool = False) -> tuple:
    """(scan implementation per group, direct operands, evaluation program, whether the chunk kernels run) for this
    call: the recurrent kernel for inference on short sequences, else each group's chunk kernels. Each group's entry
    also names the operand dtype per-token work making an operand returns (evaluate.py: prologue): the chunk kernels',
    None for the recurrent kernel. in_place: the recurrent kernel writes the final states over the initial ones."""
    dtype = kernel_dtype(call, interpreted)
    decoding = serves(compiled, call)
    direct = direct_operands(compiled, call, finished=decoding)
    scans = {}
    for g in compiled.plan.groups:
        if decoding:  # the recurrent kernel writes a group's vector states as value columns of ones
            scans[g.states] = (functools.partial(recurrent.scan, dtype=dtype, in_place=in_place), False, None)  # it converts as it loads
        else:
            config = chunk_config(g, call, dtype, configs)
            scans[g.states] = (chunk_scan(g, dtype, config), g.normaliser is not None, dtype)
    return scans, direct, evaluate.program(compiled, direct, decoding), not decoding
