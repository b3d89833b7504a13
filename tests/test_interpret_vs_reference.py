"""The lamixer interpreter (float64) against the naive references in references.py.

Compares outputs, every final state, and gradients w.r.t. every input, param
and initial state (random cotangents on ``o`` and on each final state) by
relative RMS error ``||a - b|| / max(||b||, tiny) < 1e-7``.
"""
import os
import sys
import zlib

import pytest
import torch
import torch.nn.functional as F

import lamixer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from references import REFERENCES, run_varlen  # noqa: E402

DT = torch.float64
TOL = 1e-7
TINY = torch.finfo(DT).tiny
B, H, K, V = 2, 3, 16, 8
M = 8            # gsa slots
N, P = 16, 8     # mamba2 state / head dims
MIXERS = list(REFERENCES)
# log-gate shift: logsigmoid(randn + shift); "weak" ~ decay near 1, "strong" ~ fast decay
GATE_SHIFT = {"mid": 0.0, "weak": 4.0, "strong": -2.0}
# mamba2 has no log gate input; its decay strength is set through dt instead
DT_SHIFT = {"mid": 0.0, "weak": -4.0, "strong": 2.0}
GATED = ["simple_gla", "gla", "hgrn2", "metala", "rwkv6", "gated_deltanet", "gsa", "mamba2"]

ARG_NAMES = {
    "linear_attn": "q k v", "retnet": "q k v", "simple_gla": "q k v g", "gla": "q k v g",
    "hgrn2": "q g v", "metala": "q g v w_aug", "rwkv6": "r k w v u", "deltanet": "q k v beta",
    "gated_deltanet": "q k v g beta", "gsa": "q k v s g", "lln": "q k v",
    "mamba2": "x B C dt A_log D dt_bias",
}
STATE_NAMES = {"gsa": "Kt Vt", "lln": "S z", "mamba2": "S"}

_MIXERS = {}


def _mixer(name):
    if name not in _MIXERS:
        _MIXERS[name] = lamixer.load(name)
    return _MIXERS[name]


def _gen(*key):
    return torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))


def make_inputs(name, bsz, T, gen, gate="mid"):
    """Inputs in the mixer's argument order (params included), as float64 leaves."""
    rn = lambda *s: torch.randn(*s, dtype=DT, generator=gen)  # noqa: E731
    lg = lambda *s: F.logsigmoid(rn(*s) + GATE_SHIFT[gate])     # noqa: E731
    sg = lambda *s: torch.sigmoid(rn(*s))                       # noqa: E731
    tok = lambda d: (bsz, T, H, d)                              # noqa: E731
    sc = (bsz, T, H)
    if name in ("linear_attn", "retnet", "lln"):
        xs = [rn(*tok(K)), rn(*tok(K)), rn(*tok(V))]
    elif name == "simple_gla":
        xs = [rn(*tok(K)), rn(*tok(K)), rn(*tok(V)), lg(*sc)]
    elif name == "gla":
        xs = [rn(*tok(K)), rn(*tok(K)), rn(*tok(V)), lg(*tok(K))]
    elif name == "hgrn2":
        xs = [rn(*tok(K)), lg(*tok(K)), rn(*tok(V))]
    elif name == "metala":
        xs = [rn(*tok(K)), lg(*tok(K)), rn(*tok(V)), rn(H, K)]
    elif name == "rwkv6":
        xs = [rn(*tok(K)), rn(*tok(K)), lg(*tok(K)), rn(*tok(V)), rn(H, K)]
    elif name == "deltanet":
        xs = [rn(*tok(K)), rn(*tok(K)), rn(*tok(V)), sg(*sc)]
    elif name == "gated_deltanet":
        xs = [rn(*tok(K)), rn(*tok(K)), rn(*tok(V)), lg(*sc), sg(*sc)]
    elif name == "gsa":
        xs = [rn(*tok(K)), rn(*tok(K)), rn(*tok(V)), rn(*tok(M)), lg(*tok(M))]
    elif name == "mamba2":
        xs = [rn(*tok(P)), rn(*tok(N)), rn(*tok(N)), rn(*sc) + DT_SHIFT[gate],
              0.5 * rn(H), rn(H), 0.5 * rn(H)]   # x, B, C, dt, A_log, D, dt_bias
    else:
        raise KeyError(name)
    return [x.detach().requires_grad_() for x in xs]


def make_states(name, n, gen):
    """Random initial states (leading dim n = batch or number of sequences)."""
    rn = lambda *s: torch.randn(*s, dtype=DT, generator=gen)  # noqa: E731
    if name == "gsa":
        ss = [rn(n, H, K, M), rn(n, H, M, V)]
    elif name == "lln":
        ss = [rn(n, H, K, V), rn(n, H, K).abs()]   # z accumulates exp(.) > 0
    elif name == "mamba2":
        ss = [rn(n, H, N, P)]
    else:
        ss = [rn(n, H, K, V)]
    return [s.detach().requires_grad_() for s in ss]


def _pack(states):
    """Package convention: a bare tensor for one-state mixers, else a tuple."""
    if states is None:
        return None
    return states[0] if len(states) == 1 else tuple(states)


def _unpack(fs):
    if fs is None:
        return None
    return (fs,) if isinstance(fs, torch.Tensor) else tuple(fs)


def rel_err(a, b):
    a, b = a.detach().to(DT), b.detach().to(DT)
    assert a.shape == b.shape, (tuple(a.shape), tuple(b.shape))
    return ((a - b).norm() / b.norm().clamp_min(TINY)).item()


def _forward_backward(fn, leaves, gen):
    """Run fn() -> (o, states); backprop a random cotangent (same for both sides via gen seed)."""
    o, states = fn()
    o = o.to(DT)
    states = [s.to(DT) for s in (states or ())]
    cots = [torch.randn(t.shape, dtype=DT, generator=gen) for t in [o, *states]]
    loss = sum((t * c).sum() for t, c in zip([o, *states], cots))
    grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    grads = [torch.zeros_like(x) if g is None else g for x, g in zip(leaves, grads)]
    return o.detach(), [s.detach() for s in states], grads


def compare(name, inputs, states, pkg_fn, ref_fn, seed_key):
    leaves = list(inputs) + list(states)
    ref_o, ref_s, ref_g = _forward_backward(ref_fn, leaves, _gen("cot", *seed_key))
    pkg_o, pkg_s, pkg_g = _forward_backward(pkg_fn, leaves, _gen("cot", *seed_key))
    assert len(pkg_s) == len(ref_s), f"{name}: {len(pkg_s)} final states, expected {len(ref_s)}"
    args, snames = ARG_NAMES[name].split(), STATE_NAMES.get(name, "S").split()
    assert len(args) == len(inputs) and len(snames) == len(ref_s)
    errs = {"o": rel_err(pkg_o, ref_o)}
    errs.update({f"final {n}": rel_err(a, b) for n, a, b in zip(snames, pkg_s, ref_s)})
    errs.update({f"d{n}": rel_err(a, b) for n, a, b in zip(args, pkg_g, ref_g)})
    errs.update({f"d{n}0": rel_err(a, b)
                 for n, a, b in zip(snames, pkg_g[len(inputs):], ref_g[len(inputs):])})
    bad = {k: f"{v:.3e}" for k, v in errs.items() if not v < TOL}
    assert not bad, f"{name} {seed_key}: rel errors above {TOL}: {bad}"


def _check(name, T, gate="mid", scale=None, with_state=True):
    key = (name, T, gate, scale, with_state)
    gen = _gen("in", *key)
    inputs = make_inputs(name, B, T, gen, gate)
    states = make_states(name, B, gen) if with_state else []
    mixer, ref = _mixer(name), REFERENCES[name]

    def pkg():
        o, fs = mixer(*inputs, scale=scale, initial_state=_pack(states) if states else None,
                      output_final_state=True, cu_seqlens=None, backend="interpret")
        assert fs is not None, "output_final_state=True but final_state is None"
        return o, _unpack(fs)

    def refn():
        return ref(*inputs, scale=scale, initial_state=states or None)

    compare(name, inputs, states, pkg, refn, key)


@pytest.mark.parametrize("T", [1, 37, 130])
@pytest.mark.parametrize("name", MIXERS)
def test_matches_reference(name, T):
    _check(name, T)


@pytest.mark.parametrize("gate", ["weak", "strong"])
@pytest.mark.parametrize("name", GATED)
def test_gate_extremes(name, gate):
    _check(name, 37, gate=gate)


@pytest.mark.parametrize("name", MIXERS)
def test_explicit_scale_zero_initial_state(name):
    _check(name, 37, scale=0.37, with_state=False)


@pytest.mark.parametrize("name", MIXERS)
def test_no_final_state_unless_requested(name):
    gen = _gen("nofs", name)
    inputs = make_inputs(name, B, 5, gen)
    states = make_states(name, B, gen)
    with torch.no_grad():
        o, fs = _mixer(name)(*inputs, scale=None, initial_state=_pack(states),
                             output_final_state=False, cu_seqlens=None, backend="interpret")
        ref_o, _ = REFERENCES[name](*inputs, initial_state=states)
    assert fs is None
    assert rel_err(o, ref_o) < TOL


CU_SEQLENS = [0, 5, 37, 60]


@pytest.mark.parametrize("name", [n for n in MIXERS if n != "lln"])  # lln stats span the whole input
def test_varlen_matches_per_sequence_reference(name):
    key = ("varlen", name)
    gen = _gen("in", *key)
    inputs = make_inputs(name, 1, CU_SEQLENS[-1], gen)
    states = make_states(name, len(CU_SEQLENS) - 1, gen)
    mixer, ref = _mixer(name), REFERENCES[name]
    cu = torch.tensor(CU_SEQLENS, dtype=torch.long)

    def pkg():
        o, fs = mixer(*inputs, scale=None, initial_state=_pack(states),
                      output_final_state=True, cu_seqlens=cu, backend="interpret")
        return o, _unpack(fs)

    def refn():
        return run_varlen(ref, CU_SEQLENS, *inputs, initial_state=tuple(states))

    compare(name, inputs, states, pkg, refn, key)


def test_parameter_gradients_in_half_precision_sum_in_the_compute_dtype():
    """A parameter read at every token (rwkv6's bonus u) gets its gradient summed over the tokens in the compute
    dtype: converted per token, autograd summed thousands of float16 terms into the float16 leaf (4.5e-3 here)."""
    from lamixer.tools.check import forward_backward, random_call, rel_rms

    m = lamixer.load("rwkv6")
    tensors, states = random_call(m, B=2, T=600, H=2, size=16, gate="weak", dtype=torch.float16, seed=1)
    states = tuple(s.float() for s in states)
    got = forward_backward(m, tensors, states, "interpret")
    ref = forward_backward(m, {k: v.double() for k, v in tensors.items()}, tuple(s.double() for s in states), "torch")
    assert rel_rms(got["du"], ref["du"]) < 1e-3
