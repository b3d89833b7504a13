"""Checking a backend against the interpreter on random inputs: outputs, final states, all gradients."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..api import Mixer

GATE_SHIFT = {"weak": 4.0, "normal": 0.0, "strong": -3.0}


def rel_rms(x: torch.Tensor, ref: torch.Tensor) -> float:
    """||x - ref|| / ||ref||, in float64 (inf when shapes differ or x is not finite)."""
    if x is None or ref is None:
        return 0.0 if x is None and ref is None else math.inf
    if x.shape != ref.shape:
        return math.inf
    x, ref = x.double(), ref.double()
    if not torch.isfinite(x).all():
        return math.inf
    den = ref.norm().item()
    num = (x - ref).norm().item()
    return num / den if den > 0 else num


def sample(domain: tuple[float, float], shape, gate: str, gen: torch.Generator, dtype) -> torch.Tensor:
    """Random values inside an input's declared domain; `gate` sets how far half-bounded ones sit from their bound."""
    lo, hi = domain
    x = torch.randn(shape, generator=gen, dtype=torch.float64)
    shift = GATE_SHIFT[gate]
    if math.isinf(lo) and math.isinf(hi):
        out = x
    elif math.isinf(lo):
        out = hi - F.softplus(-(x + shift))  # log-sigmoid shaped: near hi for weak gates
    elif math.isinf(hi):
        out = lo + F.softplus(x - shift)
    else:
        out = lo + (hi - lo) * torch.sigmoid(x)
    return out.to(dtype)


def random_call(mixer: Mixer, B: int = 2, T: int = 37, H: int = 2, size: int = 8, gate: str = "normal", seed: int = 0,
                dtype=torch.float64, initial_state: bool = True, cu_seqlens: list[int] | None = None, device="cpu",
                distinct: bool = True):  # fmt: skip
    """Random tensors (by name) and initial states for a mixer. Every declared dim gets `size`, plus its index
    when `distinct` (different sizes catch transposed dims)."""
    g = mixer.compiled.graph
    gen = torch.Generator().manual_seed(seed)
    sizes = {d: size + (i if distinct else 0) for i, d in enumerate(g.dims)}
    if cu_seqlens is not None:
        B, T = 1, cu_seqlens[-1]
    tensors = {}
    for op in g.operands:
        feat = [sizes[d] for d in op.dims]
        shape = [B, T, H, *feat] if op.kind == "input" else ([H] if op.per_head else []) + feat
        scale = 1.0 if op.kind == "input" else 0.5
        tensors[op.name] = (sample(op.domain, shape, gate, gen, torch.float64) * scale).to(dtype=dtype, device=device)
    states = None
    if initial_state:
        N = B if cu_seqlens is None else len(cu_seqlens) - 1
        states = tuple(sample(s.domain, (N, H, *[sizes[d] for d in s.dims]), "normal", gen, torch.float64).to(dtype=dtype, device=device)
                       for s in g.states.values())  # fmt: skip
    return tensors, states


@dataclass
class Comparison:
    errors: dict[str, float]  # "o", "state S", "d q", ... -> relative RMS error

    @property
    def worst(self) -> float:
        return max(self.errors.values())


def forward_backward(mixer: Mixer, tensors, states, backend: str, cu_seqlens=None, scale=None, seed: int = 0, call=None) -> dict[str, torch.Tensor]:
    """One forward and backward of `mixer` on `backend` against random float64 cotangents (drawn on the output's
    device from `seed`) for the output and every final state: {"o", "state <name>" for each state, "d<input>" and
    "dh0 <name>" for each gradient} (a gradient is None where the loss does not reach its input). call: what runs
    instead of the mixer's own call (the autotuner's, launching a candidate configuration)."""
    leaves = {k: v.detach().clone().requires_grad_() for k, v in tensors.items()}
    h0 = tuple(s.detach().clone().requires_grad_() for s in states) if states is not None else ()
    o, finals = (call or mixer)(**leaves, initial_state=(h0[0] if len(h0) == 1 else h0 or None), output_final_state=True,
                      cu_seqlens=cu_seqlens, backend=backend, scale=scale)  # fmt: skip
    finals = finals if isinstance(finals, tuple) else (finals,)
    gen = torch.Generator(device=o.device).manual_seed(seed)
    loss = (o.double() * torch.randn(o.shape, generator=gen, dtype=torch.float64, device=o.device)).sum()
    for f in finals:
        loss = loss + (f.double() * torch.randn(f.shape, generator=gen, dtype=torch.float64, device=f.device)).sum()
    grads = torch.autograd.grad(loss, [*leaves.values(), *h0], allow_unused=True)
    out = {"o": o.detach(), **{f"state {n}": f.detach() for n, f in zip(mixer.states, finals)}}
    out.update(zip([f"d{k}" for k in leaves] + [f"dh0 {n}" for n in mixer.states][: len(h0)], grads))
    return out


def compare(mixer: Mixer, backend: str, tensors, states, cu_seqlens=None, scale=None, seed: int = 0, call=None) -> Comparison:
    """Relative RMS errors of `backend` against the interpreter: output, final states, every gradient (call: as
    forward_backward takes it, for the backend's side)."""
    cu = torch.tensor(cu_seqlens, dtype=torch.int64) if cu_seqlens is not None else None
    ref = forward_backward(mixer, tensors, states, "interpret", cu, scale, seed)
    device = next(iter(tensors.values())).device
    got = forward_backward(mixer, tensors, states, backend, cu.to(device) if cu is not None else None, scale, seed, call)
    return Comparison({k: rel_rms(got[k], ref[k]) for k in ref})


def compare_inference(mixer: Mixer, backend: str, tensors, states, cu_seqlens=None, scale=None) -> Comparison:
    """Relative RMS errors of `backend` against the interpreter without gradients (output and final states):
    on the Triton backend, sequences of at most recurrent.MAX_T (64) tokens run on the recurrent kernel."""
    cu = torch.tensor(cu_seqlens, dtype=torch.int64) if cu_seqlens is not None else None

    def run(backend, cu):
        h0 = states[0] if states is not None and len(states) == 1 else states
        with torch.no_grad():
            o, finals = mixer(**tensors, initial_state=h0, output_final_state=True, cu_seqlens=cu, backend=backend, scale=scale)
        return o, finals if isinstance(finals, tuple) else (finals,)

    ref = run("interpret", cu)
    got = run(backend, cu.to(next(iter(tensors.values())).device) if cu is not None else None)
    errors = {"o": rel_rms(got[0], ref[0])}
    for name, a, b in zip(mixer.states, got[1], ref[1]):
        errors[f"state {name}"] = rel_rms(a, b)
    return Comparison(errors)
