"""Whole-input statistics (runtime/ops.stat), which the interpreter shares with the backends: checked here against
torch's own reductions over the same entries, for every function and grouping."""
import pytest
import torch

from lamixer.runtime import ops

GROUPS = [(), ("batch",), ("head",), ("batch", "head")]


def expected(fn: str, x: torch.Tensor, groups: tuple[str, ...]) -> torch.Tensor:
    """fn of x [B, T, H, D] over each group's entries, one group at a time: [B|1, H|1]."""
    B, _, H, _ = x.shape
    batches = range(B) if "batch" in groups else [slice(None)]
    heads = range(H) if "head" in groups else [slice(None)]
    reduce = {"mean": torch.mean, "std": torch.std, "var": torch.var, "max": torch.amax, "min": torch.amin}[fn]
    return torch.stack([torch.stack([reduce(x[b, :, h].flatten()) for h in heads]) for b in batches])


@pytest.mark.parametrize("groups", GROUPS)
@pytest.mark.parametrize("fn", ["mean", "std", "var", "max", "min"])
def test_each_statistic_per_grouping_is_torchs(fn, groups):
    x = torch.randn(3, 17, 2, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    x = x * torch.tensor([1.0, 3.0]).view(1, 1, 2, 1) + torch.arange(3.0).view(3, 1, 1, 1)  # groups that differ
    got = ops.stat(fn, x, groups)
    want = expected(fn, x, groups)
    assert got.shape == want.shape
    assert torch.allclose(got, want, rtol=1e-12, atol=0)


@pytest.mark.parametrize("groups", GROUPS)
def test_a_spread_far_smaller_than_the_mean_keeps_float32_accuracy(groups):
    """A sum of squares less its squared sum would lose every digit here; the reductions keep float32's."""
    gen = torch.Generator().manual_seed(1)
    x = 1000.0 + 0.01 * torch.randn(2, 64, 2, 32, dtype=torch.float64, generator=gen)
    got = ops.stat("std", x.float(), groups).double()
    want = expected("std", x, groups)
    assert ((got - want).abs() / want).max() < 1e-3


SPREAD = """mixer spread "a read scaled by the spread of a per-token gate, per sequence and head"
dims K, V
input q[K], k[K], v[V], s[]
state S[K, V]
stat sd = std(s) per batch, head
S = S + outer(k, v)
out o = (q @ S) * sd
"""


@pytest.mark.parametrize("backend", ["interpret", "torch", "triton"])
@pytest.mark.parametrize("T,cu", [(1, None), (6, [0, 1, 6])])
def test_a_spread_of_a_single_value_is_an_error_naming_the_statistic(backend, T, cu):
    """A std per batch and head of a per-token scalar, on a one-token call or a packed one-token sequence: 0 / 0,
    which was a NaN output without a word."""
    import lamixer
    from lamixer.runtime.errors import ArgumentError
    from lamixer.tools.check import random_call

    m = lamixer.loads(SPREAD, "spread")
    tensors, _ = random_call(m, B=1, T=T, H=2, size=4, cu_seqlens=cu, initial_state=False)
    cu_seqlens = None if cu is None else torch.tensor(cu)
    with pytest.raises(ArgumentError, match=r"statistic 'sd', a std per batch, head, has a single value"):
        m(**tensors, cu_seqlens=cu_seqlens, backend=backend)
    o, _ = m(**tensors, cu_seqlens=cu_seqlens, backend=backend, stats={"sd": torch.ones(2, dtype=torch.float64)})
    assert torch.isfinite(o).all()  # its value given, the call runs
    longer, _ = random_call(m, B=1, T=T + 1, H=2, size=4, cu_seqlens=None if cu is None else [0, 2, 7], initial_state=False)
    o, _ = m(**longer, cu_seqlens=None if cu is None else torch.tensor([0, 2, 7]), backend=backend)
    assert torch.isfinite(o).all()
