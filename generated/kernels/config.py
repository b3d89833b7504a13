"""Launch configurations of the chunk kernels, and each family's default (what runs without tuning)."""
from __future__ import annotations

from dataclasses import dataclass

from .launch import pow2


@dataclass(frozen=True)
class Config:
    """A launch configuration. chunk_additive (the additive rule) uses BT, BV (value block of the chunk-parallel
    kernels), BW and BK (value block and key rows of a program of the two sequential state walks: BK < K splits
    the key dim over programs), num_warps (of the chunk-parallel kernels), num_stages (theirs but the dense output
    kernel's, whose key loop runs at its own: additive.OUTPUT_STAGES), and BG / warps_grad for its gradient kernel
    (0: BV / num_warps); scan_delta (the delta rule) the same but for BK, the key block of its
    per-chunk kernels (its two sequential passes hold whole key rows)."""

    BT: int  # chunk length
    BV: int
    BK: int
    num_warps: int
    num_stages: int
    BW: int = 32  # chunk_additive: value block of the state walks
    BG: int = 0  # chunk_additive: value block of the gradient kernel (0: BV)
    warps_grad: int = 0  # the gradient kernel's warps (0: num_warps)

    def as_list(self) -> list[int]:
        return [self.BT, self.BV, self.BK, self.num_warps, self.num_stages, self.BW, self.BG, self.warps_grad]

    @staticmethod
    def from_list(values) -> Config:
        return Config(*(int(v) for v in values))


def default_config(decay: str, K: int, V: int) -> Config:
    """chunk_additive's default (the measurements behind each choice: bench/results/NOTES.md, "Where the kernels'
    defaults come from"). A whole key row per program; without a decay along the key dim the gradient kernel takes
    32-wide value blocks (64 under a scalar decay) on 8 warps (4 without a decay) and the output kernel wider ones on
    4: each kernel at its own best. Above K = 128 the chunk-parallel kernels' tiles outgrow a Hopper block's shared
    memory at 64-token chunks and two stages: 32-token chunks, one stage, 32-wide value blocks in the gradient
    kernel. A decay along the key dim: the walks split the key dim, so each key's decay is computed once rather than
    once per value block; the chunk-parallel kernels on 64-wide blocks of both dims, 4 warps and two stages, the
    gradient kernel on 8."""
    if K > 128:
        walk = (min(32, pow2(K)), min(128, pow2(V))) if decay == "key" else (pow2(K), min(32, pow2(V)))
        return Config(32, min(64, pow2(V)), walk[0], 8, 1, walk[1], min(32, pow2(V)), 8)
    if decay == "key":
        return Config(64, min(64, pow2(V)), min(64, pow2(K)), 4, 2, min(128, pow2(V)), 0, 8)
    # the output kernel of a scalar decay (or none) reads q and a once per value block: whole 128-wide rows read them
    # once; a decay along the value dim holds float32 states there, which spill at 128 wide: 64
    BV = min(64 if decay == "value" else 128, pow2(V))
    # 64-wide walk blocks (32 under a decay along the value dim, whose states are float32); three stages, 1-4 %
    # faster at bf16, overflow float32's shared memory
    if decay == "scalar":  # 64-wide gradient blocks on 8 warps
        return Config(64, BV, pow2(K), 4, 2, min(64, pow2(V)), min(64, pow2(V)), 8)
    if decay == "none":  # a gradient kernel without decay terms: 32-wide value blocks on 4 warps
        return Config(64, BV, pow2(K), 4, 2, min(64, pow2(V)), min(32, pow2(V)), 4)
    return Config(64, BV, pow2(K), 4, 2, min(32, pow2(V)), min(32, pow2(V)), 8)


def delta_default_config(decay: str, K: int, V: int) -> Config:
    """scan_delta's default (measurements: bench/results/NOTES.md, "Where the kernels' defaults come from"): 64-token
    chunks, 64-wide key blocks, 4 warps, which beat the configurations that spill least. The value blocks, as
    chunk_additive's: BV of the per-chunk kernels (prepare, output, dv), whole value rows, so that the output kernel
    builds its scores once, not once per block (at least CHUNK_BLOCK); BW of the two sequential passes, which hold the state (wider keys take narrower blocks); BG of the
    gradient kernel, which holds the most. BK is the key block of the per-chunk kernels; the sequential passes hold
    the whole state (in blocks of state_key_block rows). A per-key decay takes 32-token chunks on two stages: its
    chunk's pair terms, built in 16-row strips of dots (decay/key.jinja), cost BT per token and key."""
    BW = min(64 if K <= 128 else 32, pow2(V))
    if decay == "key":
        return Config(32, min(128, pow2(V)), min(64, pow2(K)), 4, 2, BW=BW, BG=BW, warps_grad=8)
    return Config(64, min(128, pow2(V)), min(64, pow2(K)), 4, 1, BW=BW, BG=BW, warps_grad=8)
