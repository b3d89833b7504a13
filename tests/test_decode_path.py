"""The lean call path: work done once per call signature is reused, and nothing a check would catch slips through.

A call whose arguments have the metadata of an earlier valid call skips the metadata checks and
the backend's per-signature choices; the value checks (cu_seqlens, scale) run on every call, and
any other signature, a bad one included, goes through every check.
"""
import math

import pytest
import torch

import lamixer
from lamixer.backends import binding as call_module
from lamixer.runtime import call as runtime_call
from lamixer.tools.check import random_call


@pytest.fixture
def gla():
    m = lamixer.load("gla")
    m.compiled.cache.clear()
    return m


def _full_binds(monkeypatch) -> list:
    seen = []
    full = call_module._bind
    monkeypatch.setattr(call_module, "_bind", lambda *a, **k: seen.append(1) or full(*a, **k))
    return seen


def test_a_repeated_signature_binds_once(gla, monkeypatch):
    binds = _full_binds(monkeypatch)
    tensors, states = random_call(gla, T=3, seed=0)
    first = gla(**tensors, initial_state=states[0], output_final_state=True, backend="torch")
    again = gla(**tensors, initial_state=states[0], output_final_state=True, backend="torch")
    assert len(binds) == 1
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    gla(*tensors.values(), initial_state=states[0], backend="torch")  # positional: another signature
    gla(**tensors, backend="torch")  # no initial state: another signature, zeros made every call
    gla(**tensors, backend="torch")
    assert len(binds) == 3


def test_values_are_checked_on_every_call(gla):
    tensors, _ = random_call(gla, T=7, seed=0, initial_state=False)
    tensors = {k: v[:1] for k, v in tensors.items()}
    gla(**tensors, cu_seqlens=torch.tensor([0, 3, 7]), scale=0.5)
    for cu in ([0, 5, 3], [0, 3, 8], [1, 3, 7], [0, 7, 7]):  # the signature of the valid call, bad offsets
        with pytest.raises(lamixer.ArgumentError, match="cu_seqlens"):
            gla(**tensors, cu_seqlens=torch.tensor(cu), scale=0.5)
    for scale in (math.nan, math.inf, True, "0.5", 10**400):
        with pytest.raises(lamixer.ArgumentError, match="scale"):
            gla(**tensors, cu_seqlens=torch.tensor([0, 3, 7]), scale=scale)


@pytest.mark.parametrize("bad", ["rank", "dim", "dtype", "missing", "extra", "not a tensor", "state shape", "state dtype",
                                 "states", "param heads"])  # fmt: skip
def test_metadata_errors_after_a_valid_call(bad):
    m = lamixer.load("rwkv6")  # inputs and a per-head param
    tensors, states = random_call(m, T=3, seed=0)
    m(**tensors, initial_state=states[0])
    m(*tensors.values(), initial_state=states[0])
    args, kwargs, h0 = list(tensors.values()), {}, states[0]
    if bad == "rank":
        args[0] = args[0][0]
    elif bad == "dim":
        args[1] = args[1][..., :-1]
    elif bad == "dtype":
        args[2] = args[2].long()
    elif bad == "missing":
        args.pop()
    elif bad == "extra":
        args.append(args[0])
    elif bad == "not a tensor":
        args[3] = args[3].tolist()
    elif bad == "state shape":
        h0 = h0[:, :, :-1]
    elif bad == "state dtype":
        h0 = h0.long()
    elif bad == "states":
        h0 = (h0, h0)
    elif bad == "param heads":
        args[-1] = args[-1][:1]
    with pytest.raises(lamixer.ArgumentError):
        m(*args, initial_state=h0, **kwargs)


def test_scale_grad_mode_and_requires_grad_are_followed(gla):
    tensors, states = random_call(gla, T=3, seed=1, dtype=torch.float32)
    o1, _ = gla(**tensors, scale=0.5, backend="torch")
    o2, _ = gla(**tensors, scale=0.25, backend="torch")  # one signature, two scales: o is linear in the scale
    assert torch.allclose(o1, 2 * o2, rtol=1e-5, atol=1e-7)
    leaves = {k: v.clone().requires_grad_() for k, v in tensors.items()}
    with torch.no_grad():
        assert not gla(**leaves, backend="torch")[0].requires_grad
    o, _ = gla(**leaves, backend="torch")
    o.sum().backward()
    assert all(x.grad is not None for x in leaves.values())


def test_the_memo_is_bounded(gla, monkeypatch):
    monkeypatch.setattr(runtime_call, "MEMO_ENTRIES", 4)
    for T in range(1, 10):
        tensors, _ = random_call(gla, T=T, seed=0, initial_state=False)
        gla(**tensors, backend="torch")
        assert len(gla.compiled.cache) <= 4


def test_nothing_is_cached_for_arguments_that_are_not_tensors():
    assert runtime_call.signature((torch.zeros(1), [1.0]), {}, None, None, None, None) is None
    assert runtime_call.signature((torch.zeros(1),), {}, "zeros", None, None, None) is None
    assert runtime_call.signature((torch.zeros(1),), {}, None, [0, 1], None, None) is None
    assert runtime_call.signature((torch.zeros(1),), {"k": torch.zeros(2)}, (torch.zeros(1), None), None, 0.5, None) is not None


def test_layer_state_checks_after_steps():
    layer = lamixer.Layer("gla", 16, 2, gate_rank=4)
    x = torch.randn(2, 16)
    _, state = layer.step(x)
    _, state = layer.step(x, state)
    other = lamixer.Layer("gla", 32, 2, gate_rank=4).initial_state(2)
    other.spec = state.spec
    with pytest.raises(lamixer.ArgumentError, match="other sizes"):
        layer.step(x, other)
    with pytest.raises(lamixer.ArgumentError, match="2 sequences"):
        layer.step(x[:1], state)


def test_bench_decode_rows_without_a_gpu():
    """The decode benchmark's arithmetic and timer, with stand-ins for the GPU's parts."""
    from lamixer.tools import bench

    row = bench.decode_row("x", 4, state_bytes=2 * 10**6, bandwidth=1e12, step=lambda: None, replay=lambda: None, wall=lambda fn: 8.0)
    assert row == dict(op="x", B=4, state_MB=1.91, state_floor_us=4.0, us=8.0, state_GBps=500.0, vs_floor=2.0,
                       graph_us=8.0, graph_state_GBps=500.0, graph_vs_floor=2.0)  # fmt: skip
    calls = []
    assert bench.wall_us(lambda: calls.append(1), n=5, sync=lambda: None) >= 0 and len(calls) == 15
    # the layer rows decode only what a layer can carry in a state (whole-input statistics cannot)
    assert lamixer.load("gla").compiled.graph.carries_state() and not lamixer.load("lln").compiled.graph.carries_state()
