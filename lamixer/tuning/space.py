"""The autotuner's search spaces: each chunk family's candidate configurations, its default first."""
from __future__ import annotations

from ..kernels import additive, delta
from ..kernels.config import Config, default_config, delta_default_config
from ..kernels.delta import CHUNK_BLOCK
from ..kernels.launch import pow2


def candidates(decay: str, K: int, V: int) -> list[Config]:
    """chunk_additive's search space, default first: the chunk-parallel kernels' value block and warps, the walks'
    value block and key rows, pipeline stages, and the gradient kernel's value block and warps."""
    out = [default_config(decay, K, V)]
    wide = K > 128  # 32-token chunks and one stage, as the default: more overflows an H200 block's shared memory
    # the walks' key rows per program: a decay along the key dim is computed once per key row and program
    # and value block (wider when the key dim is split)
    walk_keys = sorted({min(32, pow2(K)), min(64, pow2(K)), pow2(K)}) if decay == "key" else [pow2(K)]
    walk_values = sorted({min(w, pow2(V)) for w in ((32, 64, 128) if decay == "key" else (16, 32, 64))})
    for BV in sorted({min(32, pow2(V)), min(64, pow2(V)), min(128, pow2(V))}):
        for warps in (4, 8):
            for BK in walk_keys:
                for BW in walk_values:
                    for stages in (1,) if wide else (1, 2, 3):
                        # the gradient kernel's own value block and warps (0: the chunk-parallel kernels')
                        for BG in sorted({0, min(32, pow2(V)), min(64, pow2(V))}):
                            for warps_grad in (0, 4, 8):
                                c = Config(32 if wide else 64, BV, BK, warps, stages, BW, BG, warps_grad)
                                if c not in out:
                                    out.append(c)
    return nearest_first(out)


def nearest_first(space: list[Config]) -> list[Config]:
    """The default first, then the others by how many settings they change from it (the order `tune` tries each
    configuration's one-setting changes in)."""
    base = space[0].as_list()
    return space[:1] + sorted(space[1:], key=lambda c: sum(a != b for a, b in zip(c.as_list(), base)))


def delta_candidates(decay: str, K: int, V: int) -> list[Config]:
    """The autotuner's search space, default first: chunk length, the three value blocks, the per-chunk kernels' key
    block, warps and pipeline stages."""
    out = [delta_default_config(decay, K, V)]
    widths = sorted({min(b, pow2(V)) for b in (32, 64)})  # the sequential passes hold the state: at most 64 wide
    for BT in ((16, 32, 64) if decay == "key" else (32, 64)):
        for BV in sorted({max(CHUNK_BLOCK, min(b, pow2(V))) for b in (64, 128)}):
            for BW in widths:
                for BG in widths:
                    for BK in sorted({min(b, pow2(K)) for b in (32, 64)}):
                        for warps in (4, 8):
                            for stages in (1, 2):
                                for warps_grad in (4, 8):
                                    c = Config(BT, BV, BK, warps, stages, BW=BW, BG=BG, warps_grad=warps_grad)
                                    if c not in out:
                                        out.append(c)
    return nearest_first(out)


SPACES = {additive.FAMILY: candidates, delta.FAMILY: delta_candidates}  # each chunk template's search space
