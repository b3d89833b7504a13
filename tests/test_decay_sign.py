"""A decay factor whose log the scans take must be positive.

The chunked scans run a general decay factor f as log(f): NaN for f < 0, -inf for f = 0, which the
chunked forms turn into NaN outputs, while the interpreter, multiplying by f, gives numbers. Where the
spec alone decides the sign (a constant, a per-head constant, a declared domain), compiling it is a
located SpecError (tests/broken/decay_negative_*.lam); where the data decides it, the call is an
ArgumentError naming the arguments, the state and the spec line.
"""
import pytest
import torch
import torch.nn.functional as F

import lamixer
from lamixer.runtime import ops

HEAD = "mixer m\ndims K, V\ninput q[K], k[K], v[V], beta[] in (0, 1)\nparam c[H]\nstate S[K, V]\n"
USE = "out o = q @ S + 0 * (beta + c)\n"
B, T, H, K, V = 1, 9, 3, 4, 3


def _mixer(decay: str) -> lamixer.Mixer:
    return lamixer.loads(HEAD + f"S = {decay} + outer(k, v)\n" + USE, "d.lam")


def _args(k_scale: float, c=None, dtype=torch.float64):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, T, H, K, generator=g, dtype=dtype)
    k = F.normalize(torch.randn(B, T, H, K, generator=g, dtype=dtype), dim=-1) * k_scale
    v = torch.randn(B, T, H, V, generator=g, dtype=dtype)
    beta = torch.rand(B, T, H, generator=g, dtype=dtype)
    return q, k, v, beta, torch.ones(H, dtype=dtype) if c is None else c


@pytest.mark.parametrize("decay", ["(1 - beta * k * k) * S", "exp(-beta) * 0.5 * S", "(1 - 2 ^ (-5 - h)) * S", "sigmoid(beta) * S",
                                   "(beta + 0.5) * S", "relu(1 - beta) * S"])  # fmt: skip
def test_factors_positive_or_decided_by_the_data_compile(decay):
    _mixer(decay)


@pytest.mark.parametrize("backend", ["torch", "triton", "interpret"])
def test_a_factor_the_data_makes_negative_is_an_error_naming_the_state_and_line(backend):
    """Found: (1 - beta * k * k) * S with unnormalised keys gave NaN on the torch and Triton backends."""
    mixer = _mixer("(1 - beta * k * k) * S")
    dtype = torch.float32 if backend == "triton" else torch.float64
    with pytest.raises(lamixer.ArgumentError) as info:
        mixer(*_args(3.0, dtype=dtype), backend=backend)
    text = str(info.value)
    assert info.value.argument == "k, beta", text
    assert "state 'S'" in text and "d.lam:6:6" in text and "(1 - beta * k * k) * S" in text, text


def test_a_factor_the_data_keeps_positive_runs_and_agrees_with_the_interpreter():
    mixer = _mixer("(1 - beta * k * k) * S")
    args = _args(0.9)
    ref, ref_state = mixer(*args, backend="interpret", output_final_state=True)
    o, state = mixer(*args, backend="torch", output_final_state=True)
    torch.testing.assert_close(o, ref)
    torch.testing.assert_close(state, ref_state)


def test_a_param_that_makes_a_head_decay_negative_is_named():
    mixer = _mixer("(c * 0.5) * S")
    with pytest.raises(lamixer.ArgumentError) as info:
        mixer(*_args(1.0, c=torch.tensor([1.0, -1.0, 1.0], dtype=torch.float64)), backend="torch")
    assert info.value.argument == "c"
    mixer(*_args(1.0, c=torch.tensor([1.0, 0.5, 1.0], dtype=torch.float64)), backend="torch")


def test_the_check_is_a_device_assertion_while_traced():
    """No host sync where one would cost (a GPU) or break a graph (torch.compile): torch._assert_async there."""
    note = ("S", "d.lam:7:6", ("k",))

    def log_decay(f):
        ops.check_decay(f, note)
        return f.log()

    traced = torch.compile(log_decay, backend="aot_eager", fullgraph=True)
    assert torch.equal(traced(torch.ones(3)), torch.zeros(3))
    with pytest.raises(RuntimeError, match="decay factor of state 'S'"):
        traced(-torch.ones(3))


def test_nan_is_not_taken_for_a_negative_factor():
    ops.check_decay(torch.tensor([0.5, float("nan")]), ("S", "d.lam:7:6", ("k",)))
    with pytest.raises(lamixer.ArgumentError, match="is <= 0"):
        ops.check_decay(torch.tensor([0.5, 0.0]), ("S", "d.lam:7:6", ("k",)))
