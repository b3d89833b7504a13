"""Running estimates of a mixer's statistics, kept by a layer as torch's normalisation layers keep theirs.

In training mode a layer's mixer computes each statistic over the call's whole input, as the spec says, and
the layer moves its estimate towards that value; in eval mode it gives the mixer its estimates instead
(runtime/carry.py), so a token's output depends on earlier tokens alone and a prompt followed by steps
equals the whole sequence. An estimate moves by `max(momentum, 1 / (n + 1))` of the way towards the new
value after n earlier updates: the first replaces the starting value, the first few average the values
seen (as a cumulative average would), and from then on it is an exponential moving average. A statistic
taken per batch is averaged over the call's sequences (its estimate is one value for every sequence).

The estimates are buffers (`running_<name>`, with `num_batches_tracked`), so state_dict carries them.
"""
from __future__ import annotations

import torch
from torch import nn

from .errors import ArgumentError

# where an estimate starts before any update (a layer in eval mode from the start uses these)
START = {"mean": 0.0, "var": 1.0, "std": 1.0, "max": 0.0, "min": 0.0}


def momentum_value(value, option: str | None) -> float:
    """A momentum as a float in (0, 1], or an ArgumentError naming the option that gave it."""
    m = float(value)
    if not 0 < m <= 1:
        raise ArgumentError(option or "momentum", f"a running statistic's momentum must lie in (0, 1], got {m:g}")
    return m


class RunningStats(nn.Module):
    """The running estimates of the named statistics: stats maps each name to (its function, whether it is per head)."""

    def __init__(self, stats: dict[str, tuple[str, bool]], num_heads: int, momentum: float):
        super().__init__()
        self.names = tuple(stats)
        self.momentum = momentum
        for name, (fn, per_head) in stats.items():
            self.register_buffer(f"running_{name}", torch.full((num_heads,) if per_head else (), START[fn]))
        self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))

    def extra_repr(self) -> str:
        return f"{', '.join(self.names)}, momentum={self.momentum:g}"

    def estimates(self) -> dict[str, torch.Tensor]:
        """The estimates by statistic name, as a call's `stats=` takes them."""
        return {name: getattr(self, f"running_{name}") for name in self.names}

    @torch.no_grad()
    def update(self, batch: dict[str, torch.Tensor], per_batch: dict[str, bool]) -> None:
        """Move each estimate towards the statistic a call used (batch: as the call reported them; per_batch: which
        lead with one value per sequence, averaged here)."""
        n = self.num_batches_tracked
        weight = torch.clamp(1.0 / (n + 1).to(torch.float64), min=self.momentum)
        for name in self.names:
            value = batch[name].mean(0) if per_batch[name] else batch[name]
            estimate = getattr(self, f"running_{name}")
            estimate.add_((value.to(estimate.dtype) - estimate) * weight.to(estimate.dtype))
        n.add_(1)
