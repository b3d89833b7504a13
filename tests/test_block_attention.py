"""Block attention's Triton kernels (kernels/block_attention.py) against runtime/scan.py's SDPA form under
TRITON_INTERPRET=1: outputs and all three gradients in float64, tiles that straddle blocks, block sizes below, at and
above a tile and the sequence, packed sequences, and where a non-finite key or value reaches. Through the backend
(lln on the chunk kernels and these) against the interpreter: tests/test_triton_backend.py."""
import pytest
import torch

import lamixer
from lamixer.kernels.block_attention import block_attention
from lamixer.runtime.scan import _block_attention, per_sequence
from lamixer.tools.check import compare, random_call


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def sdpa(q, k, v, scale: float, size: int, cu=None) -> torch.Tensor:
    return torch.cat(per_sequence(lambda *x: _block_attention(*x, size, scale), cu, q, k, v), 1)


CASES = [  # B, T, H, K, V, size, cu_seqlens
    (2, 37, 2, 16, 32, 16, None),  # tiles across several blocks
    (2, 130, 1, 32, 16, 100, None),  # a block not a multiple of the tile: tiles straddle two blocks
    (1, 50, 2, 16, 16, 24, [0, 7, 30, 50]),  # packed: blocks counted from each sequence's start
    (1, 9, 1, 16, 16, 200, None),  # a block longer than the sequence
    (1, 20, 2, 16, 16, 1, None),  # each token alone: o = v
    (2, 70, 1, 24, 40, 64, None),  # dims below a power of two
]


@pytest.mark.parametrize("B, T, H, K, V, size, cu", CASES)
def test_outputs_and_gradients_match_sdpa(B, T, H, K, V, size, cu):
    torch.manual_seed(T)
    q, k, v = (torch.randn(B, T, H, d, dtype=torch.float64, requires_grad=True) for d in (K, K, V))
    cu = None if cu is None else torch.tensor(cu)
    o = block_attention(q, k, v, 0.3, size, cu)
    want = sdpa(q, k, v, 0.3, size, cu)
    do = torch.randn_like(want)
    got, expected = torch.autograd.grad(o, (q, k, v), do), torch.autograd.grad(want, (q, k, v), do)
    assert rel(o, want) < 1e-12
    for name, a, b in zip("qkv", got, expected):
        if size == 1 and name != "v":  # a token alone: o = v whatever q and k, their gradients zero
            assert a.abs().max() < 1e-14, f"d{name}"
        else:
            assert rel(a, b) < 1e-12, f"d{name}"
    if size == 1:
        assert torch.equal(o, v)


def test_a_non_finite_key_or_value_reaches_its_own_and_later_rows_of_its_block_only():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 150, 2, 16, dtype=torch.float64) for _ in range(3))
    k[0, 20, 0, 3] = float("inf")  # a key: every column of rows 20.. of block 0 (to 63)
    v[0, 25, 1, 5] = float("nan")  # a value: its column only
    v[0, 70, 1, 2] = float("-inf")  # in the second block (64..127) of a tile that straddles none
    k[1, 149, 1, 0] = float("nan")  # the last token
    q[1, :, 0, 0] = q[1, :, 0, 0].abs() + 0.1
    k[1, 100, 0] = 0.0
    k[1, 100, 0, 0] = float("-inf")  # scores of -inf alone: no NaN of their own, a row's weight 0 for that key
    o, want = block_attention(q, k, v, 0.3, 64), sdpa(q, k, v, 0.3, 64)
    assert torch.equal(o.isnan(), want.isnan())
    assert rel(o.nan_to_num(7.0), want.nan_to_num(7.0)) < 1e-12
    assert o[0, 20:64, 0].isnan().all() and not o[0, :20].isnan().any() and not o[0, 64:, 0].isnan().any()
    assert o[0, 25:64, 1, 5].isnan().all() and o[0, 25:64, 1].isnan().sum() == 39
    assert o[1, 149, 1].isnan().all() and not o[1, :100].isnan().any() and not o[1, :149, 1].isnan().any()
    assert o[1, 100:128, 0].isnan().all() and not o[1, 128:, 0].isnan().any()


def test_packed_sequences_keep_a_non_finite_value_in_its_own_sequence():
    """The careful launch finds its programs' marks under packed sequences' tiles too."""
    torch.manual_seed(1)
    q, k, v = (torch.randn(1, 90, 2, 16, dtype=torch.float64) for _ in range(3))
    cu = torch.tensor([0, 20, 70, 90])
    v[0, 40, 1, 3] = float("inf")  # the second sequence's token 20: its block of 16 is tokens 16..31 (rows 36..51)
    o, want = block_attention(q, k, v, 0.3, 16, cu), sdpa(q, k, v, 0.3, 16, cu)
    assert torch.equal(o.isnan(), want.isnan()) and o[0, 40:52, 1, 3].isnan().all() and o.isnan().sum() == 12
    assert rel(o.nan_to_num(7.0), want.nan_to_num(7.0)) < 1e-12


def test_empty_inputs():
    q = torch.randn(2, 0, 2, 16)
    assert block_attention(q, q, q, 1.0, 16).shape == (2, 0, 2, 16)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_a_scale_per_token_multiplies_q_before_the_kernel(backend):
    """Found: a scale= read from an input (a scalar per token and head) raised KeyError on both backends."""
    spec = "mixer blocks\ndims K, V\ninput q[K], k[K], v[V], s[]\nout o = block_attention(q, k, v, size = 16, scale = s)\n"
    m = lamixer.loads(spec)
    tensors, _ = random_call(m, B=2, T=33, H=2, size=16, seed=3)
    c = compare(m, backend, tensors, None, seed=3)
    bad = {k: f"{v:.2e}" for k, v in c.errors.items() if not v < 1e-12}
    assert not bad, bad


@pytest.mark.parametrize("cu", [None, [0, 7, 30, 50]])
def test_the_epilogue_adds_the_residual_and_scales_in_the_kernel(cu):
    """o = weight * (attention + residual), and the residual's gradient weight * do (the plan's epilogue)."""
    torch.manual_seed(4)
    q, k, v, r = (torch.randn(1, 50, 2, d, dtype=torch.float64, requires_grad=True) for d in (16, 16, 24, 24))
    cu = None if cu is None else torch.tensor(cu)
    o = block_attention(q, k, v, 0.3, 16, cu, r, -0.7)
    want = -0.7 * (sdpa(q, k, v, 0.3, 16, cu) + r)
    do = torch.randn_like(want)
    got, expected = torch.autograd.grad(o, (q, k, v, r), do), torch.autograd.grad(want, (q, k, v, r), do)
    assert rel(o, want) < 1e-12
    for name, a, b in zip(("q", "k", "v", "residual"), got, expected):
        assert rel(a, b) < 1e-12, f"d{name}"


def test_a_residual_of_another_shape_or_dtype_is_an_error_naming_it():
    q = torch.randn(1, 20, 2, 16)
    for r in (torch.randn(1, 20, 2, 8), torch.randn(1, 20, 2, 16, dtype=torch.float64)):
        with pytest.raises(lamixer.ArgumentError, match="residual"):
            block_attention(q, q, q, 0.3, 16, None, r, 0.5)
