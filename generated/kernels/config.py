"""Launch configurations of the chunk kernels, and each family's default (what runs without tuning)."""
from __future__ import annotations

from dataclasses import dataclass

from .launch import pow2


@dataclass(frozen=True)
class Config:
    """A launch configuration. chunk_additive (the additive rule) uses BT, BV (value block of the chunk-parallel
    kernels), BW and BK (value block and key rows of a program of the two sequential state walks: BK < K splits
    the key dim over programs), num_warps (of the chunk-parallel kernels), num_stages, and BG / warps_grad for its
    gradient kernel (0: BV / num_warps); scan_delta (the delta rule) the same but for BK, the key block of its
    per-chunk kernels (its two sequential passes hold whole key rows)."""

    BT: int  # chunk length (divides the 64-token segment of scan_delta's d(log decay))
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
    # chunk_additive: a whole key row per program; a decay along the key dim adds 16-row strips of work. Without
    # one, the gradient kernel takes 32-wide value blocks on 8 warps and the output kernel 128-wide on 4 (below): measured
    # on the H200 (simple_gla, K = V = 128, bf16) grads 1285 -> 1136 us, while the output kernel at the gradient
    # kernel's setting went 307 -> 733 us
    # Above K = 128 the chunk-parallel kernels' tiles outgrow an H200 block's shared memory (232448 bytes) at 64-token
    # chunks and two stages (grads_bwd: 245760 bytes at bf16, 311296 to 393216 at float32; bench/sm90.py --D 256):
    # 32-token chunks, one stage, 32-wide value blocks in the gradient kernel (at most 176128)
    # A decay along the key dim: the walks split the key dim, each key's decay computed once instead of once per value
    # block (H200, gla bf16 T = 8192, walks forward / reverse: 128 key rows by 32 values 805 / 843 us, 64 by 64 446 /
    # 503, 64 by 128 334 / 408, 32 by 128 361 / 382), and one stage (the gradient kernel 1143 -> 1107 us). At K = 256
    # the unsplit walks spill 11 KB at float32, 32 rows by 128 values none (compiled for sm_90, not timed)
    if K > 128:
        walk = (min(32, pow2(K)), min(128, pow2(V))) if decay == "key" else (pow2(K), min(32, pow2(V)))
        return Config(32, min(64, pow2(V)), walk[0], 8, 1, walk[1], min(32, pow2(V)), 8)
    if decay == "key":
        return Config(64, min(64, pow2(V)), min(32, pow2(K)), 8, 1, min(128, pow2(V)))
    # The output kernel of a scalar decay (or none) reads q and a once per value block: 128-wide blocks read them once
    # for V = 128 (H200, simple_gla bf16 T = 8192, 4 warps, 2 stages: output_fwd 305 -> 269 us, forward 0.496 ->
    # 0.464 ms; 8 warps 438; h200_2026-11-30/s7_tune/probe_fwd); a decay along the value dim holds float32 states
    # there: 64 wide (128 spills 560 bytes, compiled for sm_90 at bf16, K = V = 128)
    BV = min(64 if decay == "value" else 128, pow2(V))
    return Config(64, BV, pow2(K), 4, 2, min(32, pow2(V)), min(32, pow2(V)), 8)


def delta_default_config(decay: str, K: int, V: int) -> Config:
    """64-token chunks, 64-wide key blocks, 4 warps (as measured on the H200, B = 4, T = 8192, H = 16, K = V = 128,
    bf16): fewer register spills (32-token chunks, 8 warps, 16- or 32-wide value blocks, the least spilling by
    ptxas) were slower there: gated_deltanet 13.2 / 47.3 ms against 6.1 / 28.7 forward / +backward. The value
    blocks, as chunk_additive's: BV of the per-chunk kernels (prepare, output, dv), whole value rows, so that the
    output kernel builds its scores once, not once per block (gated_deltanet's: 387 -> 267 us at 128; at least
    CHUNK_BLOCK); BW of the two sequential passes, which hold the state (wider keys take narrower blocks); BG of the
    gradient kernel, which holds the most. A per-key decay holds [BT, BT, BK] weights: 16-token chunks. BK is the key
    block of the per-chunk kernels; the sequential passes hold the whole state (in blocks of state_key_block
    rows)."""
    BW = min(64 if K <= 128 else 32, pow2(V))
    if decay == "key":
        return Config(16, BW, min(64, pow2(K)), 8, 1, BW=BW, BG=BW)
    return Config(64, min(128, pow2(V)), min(64, pow2(K)), 4, 1, BW=BW, BG=BW, warps_grad=8)
