"""Host code of the generated Triton kernels beside this file: launches, torch.library custom ops, autograd.

Copied by lamixer compile, unchanged but for the custom ops' namespace and the imports inside functions,
from lamixer/backends/triton.py: _ACC, MAX_HEAD_DIM, _read_mode, template_args, FAMILY,
STRIP_DECAYS, FLOAT32_DOTS, _strip_args, STRIP, diagonal_span, _chunks, _chunk_cumsum,
_snapshot_dtype, PRECISION, _chunk_forward, chunk_scan, _chunk_backward_impl, chunk_scan_backward,
_chunk_save, _chunk_grads, _chunk_setup_context, _EagerChunkScan, launch_problems, run_scan_op,
run_chunk_scan, state_key_block, walk_key_blocks, state_stages, ACC_PRECISIONS, bf16_interpreted,
_acc_precision, _launch, triton_cdiv, triton_scan; from lamixer/tuning/autotune.py: Config, _pow2,
default_config.
What comes before the copies is this file's own: kernels() imports the rendered modules beside this
file; scan_config gives every call the default configuration (lamixer's tuned ones live in lamixer's
cache, not here); NAMESPACE registers the custom ops under this module's import name.
"""
from __future__ import annotations

import importlib
import os
from dataclasses import dataclass

import torch

from ..runtime.scan import ScanOperands

NAMESPACE = __name__.replace(".", "_")  # custom ops' namespace: this copy's own, whoever else is imported


def kernels(family: str, acc: str, **config):
    """The rendered kernel module of one configuration: <family>_<config values>.py beside this file (float32 only)."""
    if acc != "float32":
        raise ValueError(f"these kernels accumulate in float32, not {acc}")
    name = "_".join([family, *(k if v is True else v for k, v in config.items())])
    module = importlib.import_module(f".{name}", __package__)
    module.NAME = f"{name}_{acc}"
    return module


def scan_config(decay, read, acc, dtype, B, T, H, K, V, device, ones=False):
    """The additive kernels' configuration: the default."""
    return default_config(decay, K, V)


_ACC = {torch.float32: "float32", torch.float64: "float64"}  # state and accumulator precision


MAX_HEAD_DIM = 256  # a whole key (or value) row of the state sits in one program's registers


def launch_problems(device: torch.device) -> list[str]:
    """Why Triton cannot launch kernels on tensors of this device (empty when it can): CUDA tensors; CPU ones under
    TRITON_INTERPRET=1 or a driver set for them (bench/sm90.py's compile-only one)."""
    if device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return []
    from triton.runtime import driver

    try:
        if driver.active.get_active_torch_device().type == device.type:
            return []
    except RuntimeError:  # no driver at all: no GPU
        pass
    return [f"the inputs are on {device}, and the kernels run on CUDA tensors (on the CPU under TRITON_INTERPRET=1)"]


def template_args(decay: str, read: str, acc: str, ones: bool = False) -> dict:
    """A chunk template's render arguments, in the order that names its kernels; ones: chunk_additive's form carrying
    a normaliser."""
    return dict(decay=decay, read=read, **({"ones": True} if ones else {}), acc=acc)


def _read_mode(decayed: bool, written: bool) -> str:
    return "after" if written else ("mid" if decayed else "before")


FAMILY = "chunk_additive"  # the additive rule's template, every decay: none, scalar, along the key or the value dim


STRIP_DECAYS = ("key", "value")  # decays whose chunk scores are built in strips


FLOAT32_DOTS = "bf16x3"


STRIP = 16  # rows per strip of chunk_additive's scores under a decay along the key (or value) dim


def _strip_args(common: dict, acc: torch.dtype, **changes) -> dict:
    """strips_bwd's shape arguments: `common` with `changes`, its float32 dots at FLOAT32_DOTS instead of PRECISION."""
    return {**{k: v for k, v in common.items() if k != "PRECISION"}, **changes, "ACC_PRECISION": _acc_precision(acc, FLOAT32_DOTS)}


def diagonal_span(dtype: torch.dtype) -> float:
    """The most log decay (nats, along any key) a diagonal strip block may hold for its scores to be one dot of
    q exp(E - P) and a exp(P - B) in the inputs' dtype (chunk_additive's scores_fwd, strips_bwd): the factors then
    lie within e^-30..e^30 (1e-13..1e13) of q and a, far inside bfloat16's and float32's normal range; float16's
    (6e-5..65504) leaves about e^4 around inputs of order 1..100. Blocks of stronger decay take the exact per-column
    loop."""
    return 4.0 if dtype == torch.float16 else 30.0


def _chunks(cu_seqlens: torch.Tensor | None, B: int, T: int, BT: int) -> tuple[int, torch.Tensor | None, torch.Tensor | None]:
    """(number of chunks, chunk_indices [chunks, 2] = (sequence, chunk within it), chunk_offsets [N + 1] = each
    sequence's first chunk); the two tensors only for packed sequences."""
    if cu_seqlens is None:
        return B * triton_cdiv(T, BT), None, None
    n = (cu_seqlens[1:] - cu_seqlens[:-1] + BT - 1) // BT
    offsets = torch.cat([n.new_zeros(1), n.cumsum(0)])
    total = int(offsets[-1])
    seq = torch.repeat_interleave(torch.arange(len(n), device=n.device), n, output_size=total)
    within = torch.arange(total, device=n.device) - offsets[:-1][seq]
    return total, torch.stack([seq, within], 1).to(torch.int32).contiguous(), offsets.to(torch.int32)


def _chunk_cumsum(mod, g: torch.Tensor, cu_seqlens, indices, NC: int, BT: int) -> torch.Tensor:
    """The inclusive cumulative log decay within each chunk [B, T, H, K], float32 (float64 for float64 gates)."""
    B, T, H, K = g.shape
    Bc = torch.empty(B, T, H, K, dtype=torch.float64 if g.dtype == torch.float64 else torch.float32, device=g.device)
    getattr(mod, f"{mod.NAME}_cumsum_fwd")[(1, NC, H)](
        g, Bc, cu_seqlens, indices, T, H=H, K=K, V=1, BT=BT, BK=_pow2(K), IS_VARLEN=cu_seqlens is not None, num_warps=4)
    return Bc


def _snapshot_dtype(x: torch.Tensor, acc: torch.dtype, decay: str = "none") -> torch.dtype:
    """States kept per chunk for the parallel kernels: in the inputs' precision when it is a half type (their
    dots read them in it anyway), else in the accumulator's; always the accumulator's under a decay along the
    value dim, whose d(log decay) is a difference of terms built from them (the template's header). A decay along
    the key dim needs no float32 ones: gla's bf16 d(log decay) error came from the backward strips' operands
    (bench/results/NOTES.md)."""
    return x.dtype if x.dtype in (torch.bfloat16, torch.float16) and decay != "value" else acc


PRECISION = "ieee"  # float32 inputs keep float32 dots (tf32 would cost ~3e-4 relative); half types ignore it


def _chunk_forward(q: torch.Tensor, qs: torch.Tensor | None, a: torch.Tensor, b: torch.Tensor, g: torch.Tensor | None,
                   h0: torch.Tensor, cu_seqlens: torch.Tensor | None, decay: str, read: str, cfg: list[int],
                   z0: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """S_t = diag(exp(g_t)) S_{t-1} + a_t b_t^T, o_t = (qs_h q_t)^T S_read(t) on chunk_additive's kernels; with z0
    [N, H, K] also the normaliser z_t = exp(g_t) z_{t-1} + a_t, oz_t = (qs_h q_t) . z_read(t) (the template's ones).

    Returns (o, final state, oz, final z, hs: the state entering each chunk, A: each chunk's scores under a decay
    along the key or value dim, else empty, zs: z entering each chunk); the last three are kept for the backward,
    the normaliser's are empty without z0. cfg: an autotune.Config as a list. Under a decay along the value dim o
    is float32, as the states are (the template's header)."""
    ones = z0 is not None
    mod = kernels(FAMILY, **template_args(decay, read, _ACC[h0.dtype], ones))
    B, T, H, K = a.shape
    V = b.shape[-1]
    N = B if cu_seqlens is None else len(cu_seqlens) - 1
    c = Config.from_list(cfg)
    NC, indices, offsets = _chunks(cu_seqlens, B, T, c.BT)
    per_value = decay == "value"
    o = torch.empty(B, T, H, V, dtype=h0.dtype if per_value else b.dtype, device=b.device)
    ht = torch.empty(N, H, K, V, dtype=h0.dtype, device=b.device)
    hs = torch.empty(NC, H, K, V, dtype=_snapshot_dtype(a, h0.dtype, decay), device=b.device)
    A = torch.empty(B, T, H, c.BT if decay in STRIP_DECAYS else 0, dtype=h0.dtype, device=b.device)
    oz = torch.empty(B, T, H, dtype=b.dtype, device=b.device) if ones else b.new_empty(0)
    zt = torch.empty(N, H, K, dtype=h0.dtype, device=b.device) if ones else h0.new_empty(0)
    zs = torch.empty(NC, H, K, dtype=h0.dtype, device=b.device) if ones else h0.new_empty(0)
    z = (z0, zs, zt) if ones else ()
    common = dict(H=H, K=K, V=V, BT=c.BT, BK=_pow2(K), IS_VARLEN=cu_seqlens is not None, PRECISION=PRECISION)
    precise = dict(ACC_PRECISION=_acc_precision(h0.dtype, FLOAT32_DOTS)) if per_value else {}  # float32 states' dots
    if N * H:
        BK, KB = walk_key_blocks(c, K)
        getattr(mod, f"{mod.NAME}_state_fwd")[(triton_cdiv(V, c.BW), N * H, triton_cdiv(K, KB))](
            a, b, g, h0, hs, ht, *z, cu_seqlens, offsets, T, BV=c.BW, KB=KB, STORE_HT=True, num_warps=4,
            num_stages=state_stages(a.dtype, K), **dict(common, BK=BK), **precise,
        )  # fmt: skip
    if NC * H and per_value:  # the output through the entering states, then the chunk's writes (the template's header)
        getattr(mod, f"{mod.NAME}_output_fwd")[(triton_cdiv(V, c.BV), NC, H)](
            q, qs, a, g, hs, A, o, cu_seqlens, indices, T, BV=c.BV, USE_QS=qs is not None, num_warps=c.num_warps,
            num_stages=c.num_stages, **common, **precise)  # fmt: skip
        Bc = _chunk_cumsum(mod, g, cu_seqlens, indices, NC, c.BT)
        getattr(mod, f"{mod.NAME}_strips_bwd")[(c.BT // STRIP, NC, H)](
            b, None, b, g, Bc, A, o, None, cu_seqlens, indices, T, BC=STRIP, SPAN=diagonal_span(b.dtype), ONLY_DQ=True,
            num_warps=4, **_strip_args(common, h0.dtype, K=V, BK=_pow2(V), USE_QS=False))  # fmt: skip
    elif NC * H:
        Bc = None
        if decay == "key":
            Bc = _chunk_cumsum(mod, g, cu_seqlens, indices, NC, c.BT)
            getattr(mod, f"{mod.NAME}_scores_fwd")[(1, NC, H)](
                q, qs, a, g, Bc, A, cu_seqlens, indices, T, BC=STRIP, SPAN=diagonal_span(a.dtype), USE_QS=qs is not None,
                num_warps=8, num_stages=1, **common)  # fmt: skip
        getattr(mod, f"{mod.NAME}_output_fwd")[(triton_cdiv(V, c.BV), NC, H)](
            q, qs, a, b, g, Bc, A, hs, o, *((zs, oz) if ones else ()), cu_seqlens, indices, T, BV=c.BV, USE_QS=qs is not None,
            num_warps=c.num_warps, num_stages=c.num_stages, **common)  # fmt: skip
    if ones and N * H and NC * H == 0:  # no chunks (T = 0): z passes through
        zt.copy_(z0)
    return o, ht, oz, zt, hs, A, zs


chunk_scan = torch.library.custom_op(f"{NAMESPACE}::chunk_scan", _chunk_forward, mutates_args=())


@chunk_scan.register_fake
def _(q, qs, a, b, g, h0, cu_seqlens, decay, read, cfg, z0=None):
    B, T, H, K = a.shape
    V = b.shape[-1]
    N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    BT = Config.from_list(cfg).BT
    NC = B * triton_cdiv(T, BT) if cu_seqlens is None else torch.library.get_ctx().new_dynamic_size()
    ones = z0 is not None
    return (b.new_empty(B, T, H, V, dtype=h0.dtype if decay == "value" else b.dtype), h0.new_empty(N, H, K, V),
            b.new_empty(B, T, H) if ones else b.new_empty(0), h0.new_empty(N, H, K) if ones else h0.new_empty(0),
            a.new_empty(NC, H, K, V, dtype=_snapshot_dtype(a, h0.dtype, decay)),
            h0.new_empty(B, T, H, BT if decay in STRIP_DECAYS else 0), h0.new_empty(NC, H, K) if ones else h0.new_empty(0))  # fmt: skip


def _chunk_backward_impl(q: torch.Tensor, qs: torch.Tensor | None, a: torch.Tensor, b: torch.Tensor, g: torch.Tensor | None,
                        h0: torch.Tensor, cu_seqlens: torch.Tensor | None, hs: torch.Tensor, A: torch.Tensor, do: torch.Tensor,
                        dht: torch.Tensor, decay: str, read: str, cfg: list[int], zs: torch.Tensor | None = None,
                        doz: torch.Tensor | None = None, dzt: torch.Tensor | None = None,
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """(dq, da, db, dg, dh0, dz0) of chunk_scan; dg is empty without a decay, dz0 without a normaliser (zs, doz, dzt:
    its states entering each chunk, the gradients of its output and final state)."""
    ones = zs is not None
    mod = kernels(FAMILY, **template_args(decay, read, _ACC[h0.dtype], ones))
    B, T, H, K = a.shape
    V = b.shape[-1]
    N = B if cu_seqlens is None else len(cu_seqlens) - 1
    c = Config.from_list(cfg)
    acc = h0.dtype
    NC, indices, offsets = _chunks(cu_seqlens, B, T, c.BT)
    do, dht = do.contiguous(), dht.contiguous()
    dhs = torch.empty_like(hs)
    dh0 = torch.empty_like(h0)
    dq, da, db = torch.empty_like(q), torch.empty_like(a), torch.empty_like(b)
    dg = torch.empty_like(g) if g is not None else q.new_empty(0)
    if ones:
        doz, dzt = doz.contiguous(), dzt.contiguous()
        dzs, dz0 = torch.empty_like(zs), torch.empty_like(dzt)
    else:
        dz0 = h0.new_empty(0)
    common = dict(H=H, K=K, V=V, BT=c.BT, BK=_pow2(K), USE_QS=qs is not None, IS_VARLEN=cu_seqlens is not None, PRECISION=PRECISION)
    precise = dict(ACC_PRECISION=_acc_precision(acc, FLOAT32_DOTS)) if decay == "value" else {}  # float32 states' dots
    if N * H:
        BK, KB = walk_key_blocks(c, K)
        getattr(mod, f"{mod.NAME}_state_bwd")[(triton_cdiv(V, c.BW), N * H, triton_cdiv(K, KB))](
            q, qs, g, do, dht, dhs, dh0, *((doz, dzt, dzs, dz0) if ones else ()), cu_seqlens, offsets, T, BV=c.BW, KB=KB, num_warps=4,
            num_stages=state_stages(q.dtype, K), **dict(common, BK=BK), **precise,
        )  # fmt: skip
    if NC * H == 0:
        if ones and N * H:
            dz0.copy_(dzt)
        return dq.zero_(), da.zero_(), db.zero_(), dg.zero_(), dh0, dz0
    grads = getattr(mod, f"{mod.NAME}_grads_bwd")
    if decay == "value":  # the template's header: the key dim's strip kernels with the roles turned
        Bc = _chunk_cumsum(mod, g, cu_seqlens, indices, NC, c.BT)
        turned = dict(common, K=V, BK=_pow2(V), USE_QS=False)
        dA = torch.empty(B, T, H, c.BT, dtype=acc, device=a.device)
        getattr(mod, f"{mod.NAME}_scores_fwd")[(1, NC, H)](
            do, None, b, g, Bc, dA, cu_seqlens, indices, T, BC=STRIP, SPAN=diagonal_span(b.dtype), num_warps=8, num_stages=1,
            **turned)  # fmt: skip
        o_part, db_part = torch.empty(B, T, H, V, dtype=acc, device=a.device), torch.empty(B, T, H, V, dtype=acc, device=a.device)
        dgs = torch.empty(NC, H, V, dtype=acc, device=a.device)
        grads[(1, NC, H)](q, qs, a, b, g, hs, dhs, do, dA, dq, da, o_part, db_part, dgs, cu_seqlens, indices, T,
                          BV=c.BG or c.BV, num_warps=c.warps_grad or c.num_warps, num_stages=1, **common, **precise)  # fmt: skip
        getattr(mod, f"{mod.NAME}_strips_bwd")[(c.BT // STRIP, NC, H)](
            do, None, b, g, Bc, A, o_part, db_part, cu_seqlens, indices, T, BC=STRIP, SPAN=diagonal_span(b.dtype), ONLY_DQ=False,
            num_warps=4, **_strip_args(turned, acc))  # fmt: skip
        turned.pop("PRECISION")
        getattr(mod, f"{mod.NAME}_decay_bwd")[(1, NC, H)](
            do, None, b, o_part, db_part, dgs, None, db, dg, cu_seqlens, indices, T, num_warps=8, **turned)
    elif decay == "key":  # dq, da through the states, dA and the chunk ends' term, then the strips
        dq_part, da_part = torch.empty(B, T, H, K, dtype=acc, device=a.device), torch.empty(B, T, H, K, dtype=acc, device=a.device)
        dA = torch.empty(B, T, H, c.BT, dtype=acc, device=a.device)
        dgs = torch.empty(NC, H, K, dtype=acc, device=a.device)
        grads[(1, NC, H)](q, qs, a, b, g, A, hs, dhs, do, dq_part, da_part, db, None, dA, dgs, *((zs, dzs, doz) if ones else ()),
                          cu_seqlens, indices, T, BV=c.BG or c.BV, num_warps=c.warps_grad or c.num_warps, num_stages=c.num_stages,
                          **common)  # fmt: skip
        Bc = _chunk_cumsum(mod, g, cu_seqlens, indices, NC, c.BT)
        getattr(mod, f"{mod.NAME}_strips_bwd")[(c.BT // STRIP, NC, H)](
            q, qs, a, g, Bc, dA, dq_part, da_part, cu_seqlens, indices, T, BC=STRIP, SPAN=diagonal_span(a.dtype), num_warps=4,
            **_strip_args(common, acc))  # fmt: skip
        common.pop("PRECISION")
        getattr(mod, f"{mod.NAME}_decay_bwd")[(1, NC, H)](
            q, qs, a, dq_part, da_part, dgs, dq, da, dg, cu_seqlens, indices, T, num_warps=8, **common)
    else:
        grads[(1, NC, H)](q, qs, a, b, g, A, hs, dhs, do, dq, da, db, dg, None, None, *((zs, dzs, doz) if ones else ()),
                          cu_seqlens, indices, T, BV=c.BG or c.BV, num_warps=c.warps_grad or c.num_warps, num_stages=c.num_stages,
                          **common)  # fmt: skip
    return dq, da, db, dg, dh0, dz0


chunk_scan_backward = torch.library.custom_op(f"{NAMESPACE}::chunk_scan_backward", _chunk_backward_impl, mutates_args=())


@chunk_scan_backward.register_fake
def _(q, qs, a, b, g, h0, cu_seqlens, hs, A, do, dht, decay, read, cfg, zs=None, doz=None, dzt=None):
    return (torch.empty_like(q), torch.empty_like(a), torch.empty_like(b), torch.empty_like(g) if g is not None else q.new_empty(0),
            torch.empty_like(h0), torch.empty_like(dzt) if zs is not None else h0.new_empty(0))  # fmt: skip


def _chunk_save(ctx, inputs, hs, A, zs) -> None:
    q, qs, a, b, g, h0, cu_seqlens, decay, read, cfg, z0 = inputs
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(q, qs, a, b, g, h0, cu_seqlens, hs, A, zs if z0 is not None else None)
    ctx.config = (decay, read, cfg)


def _chunk_grads(ctx, do, dht, doz, dzt, backward) -> tuple:
    """The inputs' gradients from the saved context, through `backward` (the custom op or its implementation)."""
    q, qs, a, b, g, h0, cu_seqlens, hs, A, zs = ctx.saved_tensors
    if do is None:  # the output's dtype: float32 under a decay along the value dim
        do = torch.zeros(*a.shape[:3], b.shape[-1], dtype=h0.dtype if ctx.config[0] == "value" else b.dtype, device=b.device)
    if dht is None:
        dht = torch.zeros_like(h0)
    normaliser = ()
    if zs is not None:
        doz = torch.zeros(a.shape[:3], dtype=b.dtype, device=b.device) if doz is None else doz
        dzt = h0.new_zeros(h0.shape[:3]) if dzt is None else dzt
        normaliser = (zs, doz, dzt)
    dq, da, db, dg, dh0, dz0 = backward(q, qs, a, b, g, h0, cu_seqlens, hs, A, do, dht, *ctx.config, *normaliser)
    return dq, None, da, db, dg if g is not None else None, dh0, None, None, None, None, dz0 if zs is not None else None


def _chunk_setup_context(ctx, inputs, output):
    ctx.mark_non_differentiable(*output[4:])
    _chunk_save(ctx, inputs, *output[4:])


chunk_scan.register_autograd(lambda ctx, do, dht, doz, dzt, *_: _chunk_grads(ctx, do, dht, doz, dzt, chunk_scan_backward),
                             setup_context=_chunk_setup_context)  # fmt: skip


class _EagerChunkScan(torch.autograd.Function):
    """The same as the custom op, without its dispatch (tens of microseconds a call) outside torch.compile."""

    @staticmethod
    def forward(ctx, *inputs):
        o, ht, oz, zt, hs, A, zs = _chunk_forward(*inputs)
        _chunk_save(ctx, inputs, hs, A, zs)
        return o, ht, oz, zt

    @staticmethod
    def backward(ctx, do, dht, doz, dzt):
        return _chunk_grads(ctx, do, dht, doz, dzt, _chunk_backward_impl)


def run_scan_op(op, eager, forward, args: tuple, differentiable: tuple, n: int = 2) -> tuple[torch.Tensor, ...]:
    """The first n outputs (o, final state, ..) of a scan's kernels: through the custom op `op` when torch.compile
    traces, through `eager` (an autograd.Function doing the same without the op's dispatch, returning those n) when
    one of `differentiable` needs a gradient, else straight to `forward` (the op's implementation)."""
    if torch.compiler.is_compiling():
        return op(*args)[:n]
    if torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in differentiable):
        return eager.apply(*args)
    return forward(*args)[:n]


def run_chunk_scan(q, qs, a, b, g, h0, cu_seqlens, decay: str, read: str, cfg: list[int],
                   z0: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:  # fmt: skip
    """(o, final state, oz, final z) on chunk_additive's kernels (the last two empty without a normaliser z0)."""
    args = (q, qs, a, b, g, h0, cu_seqlens, decay, read, cfg, z0)
    return run_scan_op(chunk_scan, _EagerChunkScan, _chunk_forward, args, (q, a, b, g, h0, z0), n=4)


def state_key_block(K: int) -> int:
    """The key block of the sequential state passes (chunk_additive's walks, scan_delta's state pass): the state as
    at most four [BK, BV] blocks (K <= 256)."""
    return min(64, _pow2(K))


def walk_key_blocks(c: Config, K: int) -> tuple[int, int]:
    """chunk_additive's walks: (BK, KB), the key block and the key rows one program holds (c.BK, at most the whole
    key dim: fewer split the key dim over programs)."""
    KB = min(c.BK, _pow2(K))
    return min(state_key_block(K), KB), KB


def state_stages(work: torch.dtype, K: int) -> int:
    """The sequential state passes' pipeline stages, whatever the configuration's (H200, K = V = 128, bf16, 4 warps,
    bench/state_probe.py: the delta state pass in the form of templates/state_blocks.jinja 216 us at 3 stages, 313
    at 2, 632 at 1; chunk_additive's walk 159 / 215 / 388 with 32-wide value blocks). Intermediates of 4 bytes (float32
    inputs) take 2; above K = 128 both take one fewer: more would not fit a block's
    shared memory (the reverse pass of deltanet: float32 327680 bytes of 232448 at K = 128 and 3 stages, 245760 at
    K = 256 and 2; bf16 245760 at K = 256 and 3; compiled for sm_90 by bench/sm90.py)."""
    stages = 3 if work.itemsize == 2 else 2
    return stages if K <= 128 else stages - 1


ACC_PRECISIONS = ("tf32x3", "bf16x3", "bf16x6", "tf32", "ieee")  # Triton 3.6's for float32 dots on NVIDIA


def bf16_interpreted() -> bool:
    """Whether kernels run under the CPU interpreter as patched by lamixer.emulate.bf16_like_gpu(): bfloat16 dots
    and casts, and float32 dots' input precision, as on the GPU."""
    import sys

    module = sys.modules.get("triton.runtime.interpreter")
    return module is not None and getattr(module.InterpreterBuilder, "BF16_LIKE_GPU", False)


def _acc_precision(acc: torch.dtype, default: str = "tf32x3") -> str:
    """How float32 intermediates enter the tensor cores: `default` (tf32x3: about float32's precision), unless
    LAMIXER_ACC_PRECISION names another of ACC_PRECISIONS (for measuring, e.g. bf16x3: three bfloat16 products,
    about 16 bits, fewer registers); float64 and the CPU interpreter (unless bf16_interpreted()) take ieee."""
    if acc == torch.float64 or (os.environ.get("TRITON_INTERPRET") == "1" and not bf16_interpreted()):
        return "ieee"
    mode = os.environ.get("LAMIXER_ACC_PRECISION", default)
    if mode not in ACC_PRECISIONS:
        raise ValueError(f"LAMIXER_ACC_PRECISION={mode!r}: expected one of {', '.join(ACC_PRECISIONS)}")
    return mode


def _launch(c: Config) -> dict:
    return dict(num_warps=c.num_warps, num_stages=c.num_stages)


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def triton_scan(ops: ScanOperands, dtype: torch.dtype) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The scan on generated kernels: q, a, b contiguous [B, T, H, D] in `dtype` (the caller's tensors
    pass through untouched when they already are); decay and state in float32 (float64 when the inputs are)."""
    if ops.c is not None:  # the delta rule: its own template and host code
        return triton_delta.triton_delta_scan(ops, dtype)
    ((q, decayed, written),) = ops.reads
    (qs,) = ops.query_factors
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    if ops.g is None:
        decay, g = "none", None
    elif ops.side == "value":
        decay, g = "value", ops.g.contiguous()
    elif ops.g.shape[-1] == 1:
        decay, g = "scalar", ops.g[..., 0].contiguous()
    else:
        decay, g = "key", ops.g.contiguous()
    a, b, q = (x.to(dtype).contiguous() for x in (ops.a, ops.b, q))
    h0 = ops.h0.to(acc).contiguous()
    qs = qs.to(acc).contiguous() if qs is not None else None
    read = _read_mode(decayed, written)
    config = scan_config(decay, read, _ACC[acc], dtype, a.shape[0], a.shape[1], a.shape[2], a.shape[3], b.shape[3], a.device,
                         ones=ops.z0 is not None)  # fmt: skip
    z0 = ops.z0.to(acc).contiguous() if ops.z0 is not None else None
    o, ht, oz, zt = run_chunk_scan(q, qs, a, b, g, h0, ops.cu_seqlens, decay, read, config.as_list(), z0)
    return ([o], ht) if z0 is None else ([o], ht, [oz], zt)


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


def _pow2(n: int, lo: int = 16) -> int:
    """The next power of two at least n and lo (Triton block shapes are powers of two, dots at least 16)."""
    return max(lo, 1 << (max(n, 1) - 1).bit_length())


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
        walk = (min(32, _pow2(K)), min(128, _pow2(V))) if decay == "key" else (_pow2(K), min(32, _pow2(V)))
        return Config(32, min(64, _pow2(V)), walk[0], 8, 1, walk[1], min(32, _pow2(V)), 8)
    if decay == "key":
        return Config(64, min(64, _pow2(V)), min(32, _pow2(K)), 8, 1, min(128, _pow2(V)))
    # The output kernel of a scalar decay (or none) reads q and a once per value block: 128-wide blocks read them once
    # for V = 128 (H200, simple_gla bf16 T = 8192, 4 warps, 2 stages: output_fwd 305 -> 269 us, forward 0.496 ->
    # 0.464 ms; 8 warps 438; h200_2026-11-30/s7_tune/probe_fwd); a decay along the value dim holds float32 states
    # there: 64 wide (128 spills 560 bytes, compiled for sm_90 at bf16, K = V = 128)
    BV = min(64 if decay == "value" else 128, _pow2(V))
    return Config(64, BV, _pow2(K), 4, 2, min(32, _pow2(V)), min(32, _pow2(V)), 8)


triton_scan.normaliser = True  # takes ScanOperands.z0 (runtime.scan.scan_group)

from . import host_delta as triton_delta  # noqa: E402  (the delta rule's host code; it uses the helpers above)
