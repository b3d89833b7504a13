"""Strong decays in float32: the Triton chunk kernels' d(log decay) and final state against the float64 torch backend.

At a log decay of -20 per token d(log decay) is of the size of e^-20, while a token's own write read by its own query
is O(1): formed as differences of sums that hold such terms, it was rounding alone (relative errors 50 to 180, and
1e28 at -88); the kernels leave those terms out of it (kernels/templates/free_pairs.jinja). Log decays below the log
of float32's smallest normal number are floored there (render.templates.floored), so at -88 (U(0.9, 1.1) times the
level) the reference takes the floored decays: the kernels' definition, which float32 cannot do better than (the true
d(log decay) of such tokens is below float32's normal range).
"""
from __future__ import annotations

import math

import pytest
import torch

import lamixer
from lamixer.tools.check import compare, random_call, rel_rms

SPECS = ["gla", "simple_gla", "gated_deltanet", "kda"]  # per-key and scalar decays, the additive and the delta rule
FLOOR = math.log(torch.finfo(torch.float32).tiny)


def _strong(m, tensors: dict, level: float) -> dict:
    """The call's log decay inputs at level * U(0.9, 1.1), floored as the kernels floor them."""
    gen = torch.Generator().manual_seed(1)
    out = dict(tensors)
    for op in m.compiled.graph.operands:
        if op.kind == "input" and op.domain == (-math.inf, 0.0):
            x = tensors[op.name]
            out[op.name] = (level * (0.9 + 0.2 * torch.rand(x.shape, generator=gen, dtype=torch.float64))).clamp(min=FLOOR).to(x.dtype)
    return out


def _run(m, tensors: dict, h0: torch.Tensor, backend: str, do: torch.Tensor, dht: torch.Tensor):
    leaves = {k: v.detach().clone().requires_grad_() for k, v in tensors.items()}
    o, ht = m(**leaves, initial_state=h0, output_final_state=True, backend=backend)
    (o * do.to(o.dtype)).sum().add_((ht * dht.to(ht.dtype)).sum()).backward()
    return leaves["g"].grad, ht.detach()


@pytest.mark.parametrize("name", SPECS)
def test_log_decay_gradient_and_final_state_under_strong_decay(name):
    m = lamixer.load(name)
    base, (h0,) = random_call(m, B=1, T=70, H=1, size=16, dtype=torch.float32, seed=3, distinct=False)  # a chunk and a part
    gen = torch.Generator().manual_seed(2)
    do = torch.randn(1, 70, 1, 16, generator=gen, dtype=torch.float64)
    dht = torch.randn(h0.shape, generator=gen, dtype=torch.float64)
    for level in (-20.0, -88.0):
        tensors = _strong(m, base, level)
        dg_ref, ht_ref = _run(m, {k: v.double() for k, v in tensors.items()}, h0.double(), "torch", do, dht)
        dg, ht = _run(m, tensors, h0, "triton", do, dht)
        # what limits d(log decay) now: the pair weights exp(E_i - B_j), differences of two within-chunk sums of up to
        # 64 log decays, each rounded to its size's precision (ulp(64 * 88) / 2 = 2.4e-4 at -88); measured 1.1e-5 to
        # 1.8e-5 at -20, 2e-5 (scalar) to 1.2e-4 (per key) at -88
        assert rel_rms(dg, dg_ref) < (1e-4 if level == -20.0 else 5e-4), (name, level, rel_rms(dg, dg_ref))
        assert rel_rms(ht, ht_ref) < 1e-6, (name, level, rel_rms(ht, ht_ref))


def _decays(m) -> list[str]:
    return [op.name for op in m.compiled.graph.operands if op.kind == "input" and op.domain == (-math.inf, 0.0)]


def _run_states(m, tensors: dict, h0: tuple, backend: str, do: torch.Tensor, dht: tuple):
    leaves = {k: v.detach().clone().requires_grad_() for k, v in tensors.items()}
    o, ht = m(**leaves, initial_state=h0, output_final_state=True, backend=backend)
    loss = (o * do.to(o.dtype)).sum()
    for h, dh in zip(ht, dht):
        loss = loss + (h * dh.to(h.dtype)).sum()
    loss.backward()
    return [leaves[n].grad for n in _decays(m)], [h.detach() for h in ht]


def _strong_levels(m, reference: str):
    """For log decays of -20 and -88: (level, d(log decay)s, their reference, final states, their reference), the Triton
    kernels in float32 against `reference` in float64 (B = 1, T = 70: a chunk and a part, H = 1, D = 16)."""
    base, h0 = random_call(m, B=1, T=70, H=1, size=16, dtype=torch.float32, seed=3, distinct=False)
    gen = torch.Generator().manual_seed(2)
    do = torch.randn(1, 70, 1, 16, generator=gen, dtype=torch.float64)
    dht = tuple(torch.randn(h.shape, generator=gen, dtype=torch.float64) for h in h0)
    for level in (-20.0, -88.0):
        tensors = _strong(m, base, level)
        dg_ref, ht_ref = _run_states(m, {k: v.double() for k, v in tensors.items()}, tuple(h.double() for h in h0), reference, do, dht)
        dg, ht = _run_states(m, tensors, h0, "triton", do, dht)
        yield level, dg, dg_ref, ht, ht_ref


@pytest.mark.parametrize("name", ["gsa", "examples/specs/value_gated.lam"])
def test_value_dim_decay_under_strong_decay(name):
    """The decay along the value dim (additive/value.jinja, the strip kernels with the roles turned): the same free
    pairs left out of d(log decay) (its own write read by a token's query, the last write's reach to the chunk's end);
    gsa's second state, decayed along its key dim, takes the strip form beside it."""
    for level, dg, dg_ref, ht, ht_ref in _strong_levels(lamixer.load(name), "torch"):
        for x, ref in zip(dg, dg_ref):
            assert rel_rms(x, ref) < (1e-4 if level == -20.0 else 5e-4), (name, level, rel_rms(x, ref))
        for x, ref in zip(ht, ht_ref):
            assert rel_rms(x, ref) < 1e-6, (name, level, rel_rms(x, ref))


def test_key_dim_decay_read_between_decay_and_write():
    """A decay along the key dim read after it and before the write: the last write's reach to the chunk's end, which
    no decay weighs, is left out of both the end term and the suffix sums of d(log decay) (d(log decay) was 13
    relative off with it in one of them only)."""
    m = lamixer.loads("mixer key_mid\ndims K, V\ninput q[K], k[K], v[V], g[K] in (-inf, 0)\nstate S[K, V]\n"
                      "S = exp(g) * S\nout o = scale * q @ S\nS = S + outer(k, v)\n")  # fmt: skip
    assert m.compiled.classification.scans[0].decay == "key"
    cu = [0, 5, 150, 171]  # packed: a short sequence, one of chunks and a part, a last one
    tensors, states = random_call(m, H=2, cu_seqlens=cu, seed=2, gate="strong")
    c = compare(m, "triton", tensors, states, cu_seqlens=cu, seed=2)
    bad = {k: f"{v:.2e}" for k, v in c.errors.items() if not v < 1e-10}
    assert not bad, bad


def test_read_before_the_decay_under_strong_decay():
    """A per-key decay read before it (rwkv6), against the interpreter (the oracle)."""
    for level, dg, dg_ref, ht, ht_ref in _strong_levels(lamixer.load("rwkv6"), "interpret"):
        # measured 1.5e-5 at -20, 1.1e-4 at -88
        assert rel_rms(dg[0], dg_ref[0]) < (1e-4 if level == -20.0 else 5e-4), (level, rel_rms(dg[0], dg_ref[0]))
        assert rel_rms(ht[0], ht_ref[0]) < 1e-6, (level, rel_rms(ht[0], ht_ref[0]))


@pytest.mark.parametrize("level", [-40.0, -88.0])
def test_torch_backend_read_before_the_decay_under_strong_decay(level):
    """Found: the torch backend's d(log decay) of a read before the decay (rwkv6) was 0 at its chunks' first tokens
    under decays of -40 per token and stronger (11% relative over the call): its exclusive cumulative decays were
    Bc - g, whose gradient there is the difference of two O(1) terms. Float64 against the interpreter."""
    m = lamixer.load("rwkv6")
    base, h0 = random_call(m, B=1, T=20, H=1, size=4, seed=3, distinct=False)
    tensors = _strong(m, base, level)
    gen = torch.Generator().manual_seed(2)
    do = torch.randn(1, 20, 1, 4, generator=gen, dtype=torch.float64)
    dht = tuple(torch.randn(h.shape, generator=gen, dtype=torch.float64) for h in h0)
    dg_ref, ht_ref = _run_states(m, tensors, h0, "interpret", do, dht)
    dg, ht = _run_states(m, tensors, h0, "torch", do, dht)
    assert rel_rms(dg[0], dg_ref[0]) < 1e-12, rel_rms(dg[0], dg_ref[0])
    assert rel_rms(ht[0], ht_ref[0]) < 1e-12
