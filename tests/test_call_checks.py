"""What a call used to accept silently: mixed input dtypes, inputs outside their declared domains, head-first
layouts, a quiet fallback from the kernels, and a layer's unknown keyword arguments."""
import dataclasses
import warnings

import pytest
import torch
import torch.nn.functional as F

import lamixer
from lamixer.backends.binding import bind
from lamixer.runtime import call as runtime_call

B, T, H, K, V = 1, 6, 2, 4, 3
TWO_READS = "mixer two_reads\ndims K, V\ninput q[K], k[K], v[V]\nstate S[K, V]\nS = S + outer(k, v)\nout o = q @ S + k @ S\n"


def _gla_args(dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(B, T, H, K, generator=g), torch.randn(B, T, H, K, generator=g)
    v, gate = torch.randn(B, T, H, V, generator=g), F.logsigmoid(torch.randn(B, T, H, K, generator=g))
    return [x.to(dtype) for x in (q, k, v, gate)]


def _deltanet_args():
    q, k, v, _ = _gla_args()
    return q, k, v, torch.rand(B, T, H)


def _argument_error(name: str, fn) -> str:
    with pytest.raises(lamixer.ArgumentError) as info:
        fn()
    assert info.value.argument == name, str(info.value)
    return str(info.value)


# ---------------------------------------------------------------- dtypes

def test_an_input_narrower_than_the_first_is_named():
    """Found: the output took the first input's dtype, so the result's dtype depended on which input was bf16."""
    q, k, v, g = _gla_args()
    text = _argument_error("v", lambda: lamixer.load("gla")(q, k, v.to(torch.bfloat16), g))
    assert "torch.bfloat16" in text and "first input 'q' is torch.float32" in text
    _argument_error("g", lambda: lamixer.load("gla")(q.half(), k.half(), v.half(), g.bfloat16()))  # the other half type


def test_a_wider_gate_beside_half_data_keeps_the_data_dtype():
    """As FLA's users call it: bf16 q, k, v and a float32 gate give a bf16 output."""
    q, k, v, g = _gla_args()
    o, _ = lamixer.load("gla")(q.bfloat16(), k.bfloat16(), v.bfloat16(), g, backend="torch")
    assert o.dtype == torch.bfloat16


def test_params_may_keep_their_own_dtype():
    m = lamixer.load("rwkv6")
    r, k, v, _ = _gla_args(torch.bfloat16)
    o, _ = m(r, k, -torch.rand(B, T, H, K).to(torch.bfloat16), v, torch.zeros(H, K), backend="torch")
    assert o.dtype == torch.bfloat16


def test_a_layer_under_autocast_gives_its_mixer_one_dtype():
    """rwkv6's map w = -exp(w0 + w) is float32 (w0 a float32 param) beside bf16 projections under autocast."""
    layer = lamixer.Layer("rwkv6", 16, 2, decay_rank=4, mix_rank=4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(torch.randn(2, 5, 16))
    assert torch.isfinite(y).all()


# ---------------------------------------------------------------- domains

@pytest.mark.parametrize("backend", ["torch", "interpret", "triton"])
def test_an_input_outside_its_domain_is_named(backend):
    """Found: g[K] in (-inf, 0) given positive values ran, and grew the state without bound."""
    q, k, v, g = _gla_args()
    text = _argument_error("g", lambda: lamixer.load("gla")(q, k, v, g.abs() + 0.5, backend=backend))
    assert "(-inf, 0)" in text


def test_a_bounded_domain_is_checked_at_both_ends():
    m = lamixer.load("deltanet")
    q, k, v, beta = _deltanet_args()
    _argument_error("beta", lambda: m(q, k, v, beta + 1.5))
    _argument_error("beta", lambda: m(q, k, v, beta - 1.5))


def test_bounds_and_nan_are_inside():
    """A gate computed in float32 can round onto its bound; NaN has no place, and stays a value (causality tests use it)."""
    m = lamixer.load("deltanet")
    q, k, v, beta = _deltanet_args()
    m(q, k, v, torch.zeros_like(beta))
    m(q, k, v, torch.ones_like(beta))
    beta = beta.clone()
    beta[0, 2, 1] = float("nan")
    m(q, k, v, beta)
    q, k, v, g = _gla_args()
    lamixer.load("gla")(q, k, v, torch.zeros_like(g))


def test_a_call_of_a_known_signature_is_checked_again():
    """The second call of a signature skips the metadata checks, not the values'."""
    m = lamixer.load("gla")
    q, k, v, g = _gla_args()
    m(q, k, v, g)
    _argument_error("g", lambda: m(q, k, v, -g))


def test_the_domain_check_can_be_turned_off(monkeypatch):
    monkeypatch.setattr(runtime_call, "CHECK_DOMAINS", "none")
    q, k, v, g = _gla_args()
    lamixer.load("gla")(q, k, v, -g)


def test_the_domain_check_is_a_device_assertion_while_traced():
    def checked(g):
        runtime_call.check_domains([("g", None, 0.0, "(-inf, 0)")], {"g": g})
        return g * 2

    traced = torch.compile(checked, backend="aot_eager", fullgraph=True)
    traced(-torch.rand(3))
    with pytest.raises(RuntimeError, match="argument 'g'"):
        traced(torch.rand(3))


# ---------------------------------------------------------------- layout, backend choice

def test_fewer_tokens_than_heads_warns_of_a_head_first_layout():
    q = torch.randn(1, 3, 8, K)
    m = lamixer.load("gla")
    with pytest.warns(UserWarning, match="head first") as record:
        m(q, q, q[..., :V], -q.abs())
    assert record[0].filename == __file__  # attributed to the caller's line, not lamixer's
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m(q[:, :1], q[:, :1], q[:, :1, :, :V], -q[:, :1].abs())  # one token: a decoding step
        m(q[:, :, :2], q[:, :, :2], q[:, :, :2, :V], -q[:, :, :2].abs())


def test_auto_says_once_why_a_cuda_call_runs_on_torch():
    m = lamixer.loads(TWO_READS, "two_reads_fallback.lam")
    q = torch.randn(1, 70, 2, K, requires_grad=True)
    call = dataclasses.replace(bind(m.compiled, (q, q, q), {}, None, None, None), device=torch.device("cuda"))
    with pytest.warns(UserWarning, match="more than one read of one state"):
        assert m._backend(call, "auto").__name__.endswith("evaluate")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m._backend(call, "auto")
        m._backend(dataclasses.replace(call, device=torch.device("cpu")), "auto")  # on the CPU torch is the choice itself


# ---------------------------------------------------------------- layers

def test_a_layer_call_with_an_unknown_keyword_names_it():
    """Found: Layer.forward raised Python's TypeError."""
    layer = lamixer.Layer("gla", 16, 2, gate_rank=4)
    x = torch.randn(2, 5, 16)
    assert "has no argument 'mask'" in _argument_error("mask", lambda: layer(x, mask=None))
    _argument_error("#5", lambda: layer(x, None, None, False, 1))
    _argument_error("x", lambda: layer())
    _argument_error("position", lambda: layer.step(x[:, 0], position=3))


def test_a_layer_input_of_another_dtype_than_the_layer_is_named():
    """Found by fuzzing: a bf16 x into a float32 layer raised torch's RuntimeError from inside a projection."""
    layer = lamixer.Layer("gla", 16, 2, gate_rank=4)
    assert "torch.float32" in _argument_error("x", lambda: layer(torch.randn(2, 5, 16, dtype=torch.bfloat16)))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        layer(torch.randn(2, 5, 16, dtype=torch.bfloat16))
