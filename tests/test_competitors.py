"""The benchmark's table of peers (lamixer/tools/competitors.json): data that names real inputs, called as it says."""
import sys
import types

import pytest
import torch

import lamixer
from lamixer.tools import bench
from lamixer.tools.check import random_call, rel_rms


def test_every_peer_names_a_shipped_spec_and_its_inputs():
    assert bench.COMPETITORS
    for name, entry in bench.COMPETITORS.items():
        inputs = set(lamixer.load(name).inputs)
        for when in ("chunk", "decode"):
            call = entry[when]
            assert ":" in call["fn"], (name, when)
            named = [a for a in call["args"]] + [v for v in call.get("kwargs", {}).values() if isinstance(v, str)]
            assert {a.partition(":")[0] for a in named} <= inputs, (name, when, named)


def test_a_peer_is_called_with_the_tensors_its_entry_names(monkeypatch):
    module = types.ModuleType("peer_module")
    module.op = lambda *args, **kwargs: (args, kwargs)
    monkeypatch.setitem(sys.modules, "peer_module", module)
    t = {"q": torch.ones(2), "g": torch.ones(2, dtype=torch.bfloat16)}
    args, kwargs = bench.peer_call({"fn": "peer_module:op", "args": ["q", "g:float32"], "kwargs": {"flag": True, "gk": "g"}}, t, h0="h0")
    assert args[0] is t["q"] and args[1].dtype == torch.float32
    assert kwargs == {"flag": True, "gk": t["g"], "initial_state": "h0", "output_final_state": True}


# ---- the entries' mappings (adapters in lamixer/tools/fla_adapters.py or FLA's ops as they are) against the
# interpreter, FLA's ops stood in for ----
# Each stand-in is the op as FLA documents it, token by token in float64 (FLA itself needs a GPU): the test finds a
# wrong interleaving, sign, a and b swapped, a missing l2norm or bonus, or a wrong scale in an entry.


def _l2(x):
    return x / x.norm(dim=-1, keepdim=True).clamp_min(1e-12)


def _tokens(step, state, *xs):
    """Run step(state, x_t per tensor, per head) -> (o_t, state) over [B, T, H, *] tensors: (o [B, T, H, V], state)."""
    outs = []
    for t in range(xs[0].shape[1]):
        o, state = step(state, *(x[:, t] for x in xs))
        outs.append(o)
    return torch.stack(outs, 1), state


def _zero_state(k, v):
    return k.new_zeros(k.shape[0], k.shape[2], k.shape[3], v.shape[-1])


def _delta_step(S, k, v, beta):
    """S + beta k (v - S^T k)^T per head: S [B, H, K, V], k [B, H, K], v [B, H, V], beta [B, H]."""
    return S + beta[..., None, None] * k[..., :, None] * (v - torch.einsum("bhkv,bhk->bhv", S, k))[..., None, :]


def chunk_gated_delta_product(q, k, v, g, beta, num_householder, scale=None, initial_state=None, output_final_state=False,
                              use_qk_l2norm_in_kernel=False, cu_seqlens=None):  # fmt: skip
    """FLA's: k, v, beta [B, T * n, H, *] with step i of token t at t * n + i; per token S <- exp(g_t) S, then the n
    delta steps, o_t = scale q_t^T S."""
    n, scale = num_householder, q.shape[-1] ** -0.5 if scale is None else scale
    norm = _l2 if use_qk_l2norm_in_kernel else (lambda x: x)
    steps = [(norm(k[:, i::n]), v[:, i::n], beta[:, i::n]) for i in range(n)]

    def step(S, q, g, *ks):
        S = torch.exp(g)[..., None, None] * S
        for i in range(n):
            S = _delta_step(S, *ks[3 * i : 3 * i + 3])
        return scale * torch.einsum("bhkv,bhk->bhv", S, norm(q)), S

    h0 = _zero_state(k, v) if initial_state is None else initial_state
    return _tokens(step, h0, q, g, *[x for s in steps for x in s])


def fused_recurrent_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None,
                                     use_qk_l2norm_in_kernel=False):  # fmt: skip
    """FLA's: per token S <- exp(g_t) S; S <- S + beta k (v - S^T k)^T; o_t = scale q_t^T S."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    norm = _l2 if use_qk_l2norm_in_kernel else (lambda x: x)

    def step(S, q, k, v, g, beta):
        S = _delta_step(torch.exp(g)[..., None, None] * S, norm(k), v, beta)
        return scale * torch.einsum("bhkv,bhk->bhv", S, norm(q)), S

    return _tokens(step, _zero_state(k, v) if initial_state is None else initial_state, q, k, v, g, beta)


def _dplr(r, w, k, v, a, b, scale, initial_state):
    """FLA's diagonal plus low rank: S_t = diag(exp(w_t)) S_{t-1} + b_t (a_t^T S_{t-1}) + k_t v_t^T, o_t = scale r_t^T S_t."""

    def step(S, r, w, k, v, a, b):
        read = torch.einsum("bhkv,bhk->bhv", S, a)
        S = torch.exp(w)[..., None] * S + b[..., None] * read[..., None, :] + k[..., None] * v[..., None, :]
        return scale * torch.einsum("bhkv,bhk->bhv", S, r), S

    return _tokens(step, _zero_state(k, v) if initial_state is None else initial_state, r, w, k, v, a, b)


def chunk_rwkv7(r, w, k, v, a, b, scale=1.0, initial_state=None, output_final_state=False, cu_seqlens=None):
    return _dplr(r, w, k, v, a, b, scale, initial_state)


def fused_recurrent_rwkv7(r, w, k, v, a, b, scale=None, initial_state=None, output_final_state=True, cu_seqlens=None):
    return _dplr(r, w, k, v, a, b, r.shape[-1] ** -0.5 if scale is None else scale, initial_state)


def _gated(q, k, v, g, scale, initial_state, bonus=None):
    """Gated linear attention: S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T, o_t = scale q_t^T S_t; with a bonus u [H, K]
    (RWKV-6) the state read is the one before the token's update, plus (q_t . (u k_t)) v_t."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale

    def step(S, q, k, v, g):
        write = k[..., None] * v[..., None, :]
        after = torch.exp(g)[..., None] * S + write
        read = after if bonus is None else S + bonus[..., None] * write
        return scale * torch.einsum("bhkv,bhk->bhv", read, q), after

    return _tokens(step, _zero_state(k, v) if initial_state is None else initial_state, q, k, v, g)


def chunk_gla(q, k, v, g, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
    return _gated(q, k, v, g, scale, initial_state)


def fused_recurrent_gla(q, k, v, gk=None, gv=None, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
    return _gated(q, k, v, gk, scale, initial_state)


def chunk_rwkv6(r, k, v, w, u, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
    return _gated(r, k, v, w, scale, initial_state, bonus=u)


def fused_recurrent_rwkv6(r, k, v, w, u, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
    return _gated(r, k, v, w, scale, initial_state, bonus=u)


def chunk_simple_gla(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
    return _gated(q, k, v, g[..., None].expand_as(k), scale, initial_state)  # one log decay per token and head


def fused_recurrent_simple_gla(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
    return chunk_simple_gla(q, k, v, g, g_gamma, scale, initial_state)


@pytest.fixture
def fla_stand_ins(monkeypatch):
    for name, fns in {"fla.ops.gated_delta_product": [chunk_gated_delta_product], "fla.ops.gated_delta_rule": [fused_recurrent_gated_delta_rule],
                      "fla.ops.rwkv7": [chunk_rwkv7, fused_recurrent_rwkv7], "fla.ops.gla": [chunk_gla, fused_recurrent_gla],
                      "fla.ops.rwkv6": [chunk_rwkv6, fused_recurrent_rwkv6],
                      "fla.ops.simple_gla": [chunk_simple_gla, fused_recurrent_simple_gla]}.items():  # fmt: skip
        module = types.ModuleType(name)
        for fn in fns:
            setattr(module, fn.__name__, fn)
        monkeypatch.setitem(sys.modules, name, module)


@pytest.mark.parametrize("name", ["gated_deltaproduct", "rwkv7", "hgrn2", "rwkv6", "gla", "mamba2", "simple_gla"])
@pytest.mark.parametrize("when", ["chunk", "decode"])
def test_an_adapted_peer_computes_the_spec(name, when, fla_stand_ins):
    m = lamixer.load(name)
    tensors, states = random_call(m, B=2, T=9, H=2, size=8, seed=3, gate="strong")
    o, state = m(**tensors, initial_state=states[0], output_final_state=True, backend="interpret")
    got_o, got_state = bench.peer_call(bench.COMPETITORS[name][when], tensors, h0=states[0])
    # float64 but for a decay an entry converts to float32 (about 1e-8): a wrong mapping is off by order 1
    assert rel_rms(got_o, o) < 1e-6 and rel_rms(got_state, state) < 1e-6
