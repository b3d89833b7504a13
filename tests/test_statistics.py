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
