"""Host code of the additive rule's chunk kernels (templates/chunk_additive.py.jinja): launches, custom ops, autograd."""
from __future__ import annotations

import torch

from ..runtime.scan import ScanOperands
from .config import Config
from .launch import ACC_NAMES, NAMESPACE, PRECISION, acc_precision, cdiv, chunks, diagonal_span, pow2, run_scan_op, state_key_block, state_stages, state_value_block
from .loader import kernels


def template_args(decay: str, read: str, acc: str, ones: bool = False) -> dict:
    """A chunk template's render arguments, in the order that names its kernels; ones: chunk_additive's form carrying
    a normaliser."""
    return dict(decay=decay, read=read, **({"ones": True} if ones else {}), acc=acc)


FAMILY = "chunk_additive"  # the additive rule's template, every decay: none, scalar, constant, along the key or the value dim
QUERY_NORM = False  # a query's l2norm is made before the kernels (delta.QUERY_NORM)
KEY_NORM = False  # and so is a key's (delta.KEY_NORM)


STRIP_DECAYS = ("key", "value")  # decays whose chunk scores are built in strips


# the chunk kernels' float32 dots, those d(log decay) is built from (the backward strips' intra-chunk parts, and
# under a decay along the value dim its states, walk tiles, output and db: the template's header): three bfloat16
# products, about 16 bits, far inside what d(log decay) needs; tf32x3 held twice the shared memory and spilled
# (sm_90, gsa bf16 D = 128: the value-dim gradient kernel 196608 bytes and 1432 spilled against 139264 and 568)
FLOAT32_DOTS = "bf16x3"


STRIP = 16  # rows per strip of chunk_additive's scores under a decay along the key (or value) dim

# the dense output kernel's loop over the key dim: blocks of 64 keys at three stages, the fastest of 32 and 64 at two to
# four on the H200 (whole 128-key rows, no loop, were 10 % slower: bench/results/NOTES.md, 2026-12-05)
OUTPUT_KEYS, OUTPUT_STAGES = 64, 3


def _strip_args(common: dict, acc: torch.dtype, **changes) -> dict:
    """strips_bwd's shape arguments: `common` with `changes`, its float32 dots at FLOAT32_DOTS instead of PRECISION."""
    return {**{k: v for k, v in common.items() if k != "PRECISION"}, **changes, "ACC_PRECISION": acc_precision(acc, FLOAT32_DOTS)}


def kernel_names(decay: str) -> list[str]:
    """The kernels an additive scan with this decay renders, in launch order."""
    if decay == "key":
        return ["state_fwd", "cumsum_fwd", "scores_fwd", "output_fwd", "state_bwd", "grads_bwd", "strips_bwd", "decay_bwd"]
    if decay == "value":
        return ["state_fwd", "output_fwd", "cumsum_fwd", "strips_bwd", "state_bwd", "scores_fwd", "grads_bwd", "decay_bwd"]
    return ["state_fwd", "output_fwd", "state_bwd", "grads_bwd"]


def _chunk_cumsum(mod, g: torch.Tensor, cu_seqlens, indices, NC: int, BT: int) -> torch.Tensor:
    """The inclusive cumulative log decay within each chunk [B, T, H, K], float32 (float64 for float64 gates)."""
    B, T, H, K = g.shape
    Bc = torch.empty(B, T, H, K, dtype=torch.float64 if g.dtype == torch.float64 else torch.float32, device=g.device)
    getattr(mod, f"{mod.NAME}_cumsum_fwd")[(1, NC, H)](
        g, Bc, cu_seqlens, indices, T, H=H, K=K, V=1, BT=BT, BK=pow2(K), IS_VARLEN=cu_seqlens is not None, num_warps=4)
    return Bc


def _snapshot_dtype(x: torch.Tensor, acc: torch.dtype, decay: str = "none") -> torch.dtype:
    """States kept per chunk for the parallel kernels: in the inputs' precision when it is a half type (their
    dots read them in it anyway), else in the accumulator's; always the accumulator's under a decay along the
    value dim, whose d(log decay) is a difference of terms built from them (the template's header). A decay along
    the key dim needs no float32 ones: gla's bf16 d(log decay) error came from the backward strips' operands
    (bench/results/NOTES.md)."""
    return x.dtype if x.dtype in (torch.bfloat16, torch.float16) and decay != "value" else acc


def _chunk_forward(q: torch.Tensor, qs: torch.Tensor | None, a: torch.Tensor, b: torch.Tensor, g: torch.Tensor | None,
                   h0: torch.Tensor, cu_seqlens: torch.Tensor | None, decay: str, read: str, cfg: list[int],
                   z0: torch.Tensor | None = None, divide: float | None = None,
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """S_t = diag(exp(g_t)) S_{t-1} + a_t b_t^T, o_t = (qs_h q_t)^T S_read(t) on chunk_additive's kernels; with z0
    [N, H, K] also the normaliser z_t = exp(g_t) z_{t-1} + a_t, oz_t = (qs_h q_t) . z_read(t) (the template's ones),
    and with divide (a number, z0 given) o_t / (oz_t + divide) in place of o_t, divided as the output kernel stores it.

    Returns (o, final state, oz, final z, hs: the state entering each chunk, A: each chunk's scores under a decay
    along the key or value dim, else empty, zs: z entering each chunk); the last three are kept for the backward,
    the normaliser's are empty without z0. cfg: an autotune.Config as a list. Under a decay along the value dim o
    is float32, as the states are (the template's header)."""
    ones = z0 is not None
    mod = kernels(FAMILY, **template_args(decay, read, ACC_NAMES[h0.dtype], ones))
    B, T, H, K = a.shape
    V = b.shape[-1]
    N = B if cu_seqlens is None else len(cu_seqlens) - 1
    c = Config.from_list(cfg)
    NC, indices, offsets = chunks(cu_seqlens, B, T, c.BT)
    per_value = decay == "value"
    o = torch.empty(B, T, H, V, dtype=h0.dtype if per_value else b.dtype, device=b.device)
    ht = torch.empty(N, H, K, V, dtype=h0.dtype, device=b.device)
    hs = torch.empty(NC, H, K, V, dtype=_snapshot_dtype(a, h0.dtype, decay), device=b.device)
    A = torch.empty(B, T, H, c.BT if decay in STRIP_DECAYS else 0, dtype=h0.dtype, device=b.device)
    # oz in the accumulator's dtype where o is divided by it: only the backward reads it then, as the forward's divisor
    oz = torch.empty(B, T, H, dtype=h0.dtype if divide is not None else b.dtype, device=b.device) if ones else b.new_empty(0)
    zt = torch.empty(N, H, K, dtype=h0.dtype, device=b.device) if ones else h0.new_empty(0)
    zs = torch.empty(NC, H, K, dtype=h0.dtype, device=b.device) if ones else h0.new_empty(0)
    z = (z0, zs, zt) if ones else ()
    common = dict(H=H, K=K, V=V, BT=c.BT, BK=pow2(K), IS_VARLEN=cu_seqlens is not None, PRECISION=PRECISION)
    precise = dict(ACC_PRECISION=acc_precision(h0.dtype, FLOAT32_DOTS)) if per_value else {}  # float32 states' dots
    divided = dict(DIVIDE=divide is not None) if ones else {}
    if N * H:
        BW, BK, KB = walk_blocks(c, K, V, N * H, b.device)
        getattr(mod, f"{mod.NAME}_state_fwd")[(cdiv(V, BW), N * H, cdiv(K, KB))](
            a, b, g, h0, hs, ht, *z, cu_seqlens, offsets, T, BV=BW, KB=KB, STORE_HT=True, num_warps=4,
            num_stages=state_stages(a.dtype, K, token_decay=mod.WALK_TOKEN_DECAY), **dict(common, BK=BK), **precise,
        )  # fmt: skip
    if NC * H and per_value:  # the output through the entering states, then the chunk's writes (the template's header)
        getattr(mod, f"{mod.NAME}_output_fwd")[(cdiv(V, c.BV), NC, H)](
            q, qs, a, g, hs, A, o, cu_seqlens, indices, T, BV=c.BV, USE_QS=qs is not None, num_warps=c.num_warps,
            num_stages=c.num_stages, **common, **precise)  # fmt: skip
        Bc = _chunk_cumsum(mod, g, cu_seqlens, indices, NC, c.BT)
        getattr(mod, f"{mod.NAME}_strips_bwd")[(c.BT // STRIP, NC, H)](
            b, None, b, g, Bc, A, o, None, cu_seqlens, indices, T, BC=STRIP, SPAN=diagonal_span(b.dtype), ONLY_DQ=True,
            num_warps=4, **_strip_args(common, h0.dtype, K=V, BK=pow2(V), USE_QS=False))  # fmt: skip
    elif NC * H:
        Bc = None
        if decay == "key":
            Bc = _chunk_cumsum(mod, g, cu_seqlens, indices, NC, c.BT)
            getattr(mod, f"{mod.NAME}_scores_fwd")[(1, NC, H)](
                q, qs, a, g, Bc, A, cu_seqlens, indices, T, BC=STRIP, SPAN=diagonal_span(a.dtype), USE_QS=qs is not None,
                num_warps=8, num_stages=1, **common)  # fmt: skip
        # the dense output kernel loops over key blocks of OUTPUT_KEYS at OUTPUT_STAGES, whatever the gradient kernel's stages
        dense = dict(KL=min(OUTPUT_KEYS, pow2(K)), num_stages=OUTPUT_STAGES) if decay not in STRIP_DECAYS else dict(num_stages=c.num_stages)
        getattr(mod, f"{mod.NAME}_output_fwd")[(cdiv(V, c.BV), NC, H)](
            q, qs, a, b, g, Bc, A, hs, o, *((zs, oz, divide or 0.0) if ones else ()), cu_seqlens, indices, T, BV=c.BV,
            USE_QS=qs is not None, num_warps=c.num_warps, **dense, **common, **divided)  # fmt: skip
    if ones and N * H and NC * H == 0:  # no chunks (T = 0): z passes through
        zt.copy_(z0)
    return o, ht, oz, zt, hs, A, zs


chunk_scan = torch.library.custom_op(f"{NAMESPACE}::chunk_scan", _chunk_forward, mutates_args=())


@chunk_scan.register_fake
def _(q, qs, a, b, g, h0, cu_seqlens, decay, read, cfg, z0=None, divide=None):
    B, T, H, K = a.shape
    V = b.shape[-1]
    N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    BT = Config.from_list(cfg).BT
    NC = B * cdiv(T, BT) if cu_seqlens is None else torch.library.get_ctx().new_dynamic_size()
    ones = z0 is not None
    return (b.new_empty(B, T, H, V, dtype=h0.dtype if decay == "value" else b.dtype), h0.new_empty(N, H, K, V),
            b.new_empty(B, T, H, dtype=h0.dtype if divide is not None else b.dtype) if ones else b.new_empty(0),
            h0.new_empty(N, H, K) if ones else h0.new_empty(0),
            a.new_empty(NC, H, K, V, dtype=_snapshot_dtype(a, h0.dtype, decay)),
            h0.new_empty(B, T, H, BT if decay in STRIP_DECAYS else 0), h0.new_empty(NC, H, K) if ones else h0.new_empty(0))  # fmt: skip


def _chunk_backward_impl(q: torch.Tensor, qs: torch.Tensor | None, a: torch.Tensor, b: torch.Tensor, g: torch.Tensor | None,
                        h0: torch.Tensor, cu_seqlens: torch.Tensor | None, hs: torch.Tensor, A: torch.Tensor, do: torch.Tensor,
                        dht: torch.Tensor, decay: str, read: str, cfg: list[int], zs: torch.Tensor | None = None,
                        doz: torch.Tensor | None = None, dzt: torch.Tensor | None = None, decay_grad: bool = True,
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """(dq, da, db, dg, dh0, dz0) of chunk_scan; dg is empty without a decay (or, decay_grad false, where the log
    decay needs no gradient: the dense kernels then leave it out), dz0 without a normaliser (zs, doz, dzt: its states
    entering each chunk, the gradients of its output and final state). A constant decay's dg is [N, H], its chunks'
    sums (the gradient kernel's) summed per sequence."""
    ones = zs is not None
    mod = kernels(FAMILY, **template_args(decay, read, ACC_NAMES[h0.dtype], ones))
    B, T, H, K = a.shape
    V = b.shape[-1]
    N = B if cu_seqlens is None else len(cu_seqlens) - 1
    c = Config.from_list(cfg)
    acc = h0.dtype
    NC, indices, offsets = chunks(cu_seqlens, B, T, c.BT)
    do, dht = do.contiguous(), dht.contiguous()
    dhs = torch.empty_like(hs)
    dh0 = torch.empty_like(h0)
    dq, da, db = torch.empty_like(q), torch.empty_like(a), torch.empty_like(b)
    decay_grad = _gives_decay_grad(g, decay, decay_grad)
    dg = torch.empty_like(g) if decay_grad else q.new_empty(0)
    if ones:
        doz, dzt = doz.contiguous(), dzt.contiguous()
        dzs, dz0 = torch.empty_like(zs), torch.empty_like(dzt)
    else:
        dz0 = h0.new_empty(0)
    common = dict(H=H, K=K, V=V, BT=c.BT, BK=pow2(K), USE_QS=qs is not None, IS_VARLEN=cu_seqlens is not None, PRECISION=PRECISION)
    precise = dict(ACC_PRECISION=acc_precision(acc, FLOAT32_DOTS)) if decay == "value" else {}  # float32 states' dots
    if N * H:
        BW, BK, KB = walk_blocks(c, K, V, N * H, q.device)
        getattr(mod, f"{mod.NAME}_state_bwd")[(cdiv(V, BW), N * H, cdiv(K, KB))](
            q, qs, g, do, dht, dhs, dh0, *((doz, dzt, dzs, dz0) if ones else ()), cu_seqlens, offsets, T, BV=BW, KB=KB, num_warps=4,
            num_stages=state_stages(q.dtype, K, token_decay=mod.WALK_TOKEN_DECAY), **dict(common, BK=BK), **precise,
        )  # fmt: skip
    if NC * H == 0:
        if ones and N * H:
            dz0.copy_(dzt)
        return dq.zero_(), da.zero_(), db.zero_(), dg.zero_(), dh0, dz0
    grads = getattr(mod, f"{mod.NAME}_grads_bwd")
    if decay == "value":  # the template's header: the key dim's strip kernels with the roles turned
        Bc = _chunk_cumsum(mod, g, cu_seqlens, indices, NC, c.BT)
        turned = dict(common, K=V, BK=pow2(V), USE_QS=False)
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
            do, None, b, o_part, db_part, dgs, A, None, db, dg, cu_seqlens, indices, T, num_warps=8, **turned)
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
            q, qs, a, dq_part, da_part, dgs, dA, dq, da, dg, cu_seqlens, indices, T, num_warps=8, **common)
    else:
        learn = {"DECAY_GRAD": decay_grad} if g is not None else {}
        dgc = torch.empty(NC, H, dtype=acc, device=a.device) if decay == "constant" and decay_grad else dg  # per chunk
        grads[(1, NC, H)](q, qs, a, b, g, A, hs, dhs, do, dq, da, db, dgc, None, None, *((zs, dzs, doz) if ones else ()),
                          cu_seqlens, indices, T, BV=c.BG or c.BV, num_warps=c.warps_grad or c.num_warps, num_stages=c.num_stages,
                          **common, **learn)  # fmt: skip
        if dgc is not dg:
            dg = _per_sequence_sums(dgc, indices, N).to(g.dtype)
    return dq, da, db, dg, dh0, dz0


def _gives_decay_grad(g: torch.Tensor | None, decay: str, asked: bool) -> bool:
    """Whether the backward gives d(log decay): where one is asked for; the strip and value forms always give it."""
    return g is not None and (asked or decay in STRIP_DECAYS)


def _per_sequence_sums(per_chunk: torch.Tensor, indices: torch.Tensor | None, N: int) -> torch.Tensor:
    """[chunks, H] summed over each sequence's chunks: [N, H] (indices: chunk_indices of packed sequences)."""
    if indices is None:  # N sequences of equally many chunks, in order
        return per_chunk.view(N, -1, per_chunk.shape[-1]).sum(1)
    return per_chunk.new_zeros(N, per_chunk.shape[-1]).index_add_(0, indices[:, 0].long(), per_chunk)


chunk_scan_backward = torch.library.custom_op(f"{NAMESPACE}::chunk_scan_backward", _chunk_backward_impl, mutates_args=())


@chunk_scan_backward.register_fake
def _(q, qs, a, b, g, h0, cu_seqlens, hs, A, do, dht, decay, read, cfg, zs=None, doz=None, dzt=None, decay_grad=True):
    learn = _gives_decay_grad(g, decay, decay_grad)
    return (torch.empty_like(q), torch.empty_like(a), torch.empty_like(b), torch.empty_like(g) if learn else q.new_empty(0),
            torch.empty_like(h0), torch.empty_like(dzt) if zs is not None else h0.new_empty(0))  # fmt: skip


def _chunk_save(ctx, inputs, hs, A, zs, o, oz) -> None:
    q, qs, a, b, g, h0, cu_seqlens, decay, read, cfg, z0, divide = inputs
    ctx.set_materialize_grads(False)
    quotient = (o, oz) if divide is not None and z0 is not None else (None, None)
    ctx.save_for_backward(q, qs, a, b, g, h0, cu_seqlens, hs, A, zs if z0 is not None else None, *quotient)
    ctx.config = (decay, read, cfg)
    ctx.divide = divide


def _chunk_grads(ctx, do, dht, doz, dzt, backward) -> tuple:
    """The inputs' gradients from the saved context, through `backward` (the custom op or its implementation)."""
    q, qs, a, b, g, h0, cu_seqlens, hs, A, zs, o, oz = ctx.saved_tensors
    if o is not None and do is not None:  # o / (oz + eps) as the kernel stored it: the gradients of o and oz before it
        do, doz = _undivided_grads(do, doz, o, oz, ctx.divide)
    if do is None:  # the output's dtype: float32 under a decay along the value dim
        do = torch.zeros(*a.shape[:3], b.shape[-1], dtype=h0.dtype if ctx.config[0] == "value" else b.dtype, device=b.device)
    if dht is None:
        dht = torch.zeros_like(h0)
    normaliser = ()
    if zs is not None:
        doz = torch.zeros(a.shape[:3], dtype=b.dtype, device=b.device) if doz is None else doz
        dzt = h0.new_zeros(h0.shape[:3]) if dzt is None else dzt
        normaliser = (zs, doz, dzt)
    learn = g is not None and ctx.needs_input_grad[4]  # the log decay's: a constant's is often no leaf's
    dq, da, db, dg, dh0, dz0 = backward(q, qs, a, b, g, h0, cu_seqlens, hs, A, do, dht, *ctx.config, *normaliser, decay_grad=learn)
    return dq, None, da, db, dg if learn else None, dh0, None, None, None, None, dz0 if zs is not None else None, None


def _undivided_grads(dy: torch.Tensor, doz: torch.Tensor | None, y: torch.Tensor, oz: torch.Tensor, eps: float) -> tuple:
    """The gradients of o and oz from dy, that of y = o / (oz + eps) (and doz, oz's own, or None): do = dy / d and
    doz - sum_v(dy * y) / d, d = oz + eps, in float32 (the output's dtype where it is wider), returned in dy's and oz's."""
    wide = torch.promote_types(y.dtype, torch.float32)
    d = oz.to(wide).unsqueeze(-1) + eps
    dyw = dy.to(wide)
    dz = -(dyw * y.to(wide) / d).sum(-1)
    if doz is not None:
        dz = dz + doz.to(wide)
    return (dyw / d).to(dy.dtype), dz.to(oz.dtype)


def _chunk_setup_context(ctx, inputs, output):
    ctx.mark_non_differentiable(*output[4:])
    _chunk_save(ctx, inputs, *output[4:], output[0], output[2])


chunk_scan.register_autograd(lambda ctx, do, dht, doz, dzt, *_: _chunk_grads(ctx, do, dht, doz, dzt, chunk_scan_backward),
                             setup_context=_chunk_setup_context)  # fmt: skip


class _EagerChunkScan(torch.autograd.Function):
    """The same as the custom op, without its dispatch (tens of microseconds a call) outside torch.compile."""

    @staticmethod
    def forward(ctx, *inputs):
        o, ht, oz, zt, hs, A, zs = _chunk_forward(*inputs)
        _chunk_save(ctx, inputs, hs, A, zs, o, oz)
        return o, ht, oz, zt

    @staticmethod
    def backward(ctx, do, dht, doz, dzt):
        return _chunk_grads(ctx, do, dht, doz, dzt, _chunk_backward_impl)


def run_chunk_scan(q, qs, a, b, g, h0, cu_seqlens, decay: str, read: str, cfg: list[int],
                   z0: torch.Tensor | None = None, divide: float | None = None) -> tuple[torch.Tensor, ...]:  # fmt: skip
    """(o, final state, oz, final z) on chunk_additive's kernels (the last two empty without a normaliser z0; with
    one and divide, o / (oz + divide) in o's place)."""
    args = (q, qs, a, b, g, h0, cu_seqlens, decay, read, cfg, z0, divide)
    return run_scan_op(chunk_scan, _EagerChunkScan, _chunk_forward, args, (q, a, b, g, h0, z0), n=4)


def walk_blocks(c: Config, K: int, V: int, NH: int, device: torch.device) -> tuple[int, int, int]:
    """chunk_additive's walks over NH sequences x heads: (BW, BK, KB), the value block (c.BW, narrower where the
    grid would leave multiprocessors idle: launch.state_value_block), the key block, and the key rows one program
    holds (c.BK, at most the whole key dim: fewer split the key dim over programs)."""
    KB = min(c.BK, pow2(K))
    return state_value_block(c.BW, V, NH * cdiv(K, KB), device), min(state_key_block(K), KB), KB


def scan(ops: ScanOperands, dtype: torch.dtype, config: Config, decay: str | None = None) -> tuple[list[torch.Tensor], torch.Tensor]:
    """One scan group on chunk_additive's kernels, launched with `config`: q, a, b contiguous [B, T, H, D] in `dtype`
    (the caller's tensors pass through untouched when they already are); decay and state in float32 (float64 when the
    inputs are). Returns ([o], final state), and the normaliser's ([oz], final z) when the group carries one (ops.z0).
    decay: the kind the kernels were rendered for where it is not ops.decay: "constant" (the kernel plan's, for a log
    decay that is one number per sequence and head), read as one per sequence and head, not per token."""
    ops = ops.per_row()
    ((q, read),) = ops.reads
    (qs,) = ops.query_factors
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    decay = decay or ops.decay
    g = _log_decay(ops, decay)
    a, b, q = (x.to(dtype).contiguous() for x in (ops.a, ops.b, q))
    h0 = ops.h0.to(acc).contiguous()
    qs = qs.to(acc).contiguous() if qs is not None else None
    z0 = ops.z0.to(acc).contiguous() if ops.z0 is not None else None
    o, ht, oz, zt = run_chunk_scan(q, qs, a, b, g, h0, ops.cu_seqlens, decay, read, config.as_list(), z0, ops.divide)
    return ([o], ht) if z0 is None else ([o], ht, [oz], zt)


def _log_decay(ops: ScanOperands, decay: str) -> torch.Tensor | None:
    """The log decay as the kernels of `decay` read it: [B, T, H] (scalar), [B, T, H, K or V], or [N, H] (constant)."""
    if ops.g is None:
        return None
    if decay == "constant":
        return _constant_decay(ops.g, ops.cu_seqlens).contiguous()
    return ops.g[..., 0].contiguous() if decay == "scalar" else ops.g.contiguous()


def _constant_decay(g: torch.Tensor, cu_seqlens: torch.Tensor | None) -> torch.Tensor:
    """A log decay constant over each sequence, [B, T, H, 1] (a spec's per-head constant broadcast, or one made of
    statistics, per batch row or packed sequence), as the constant kernels read it: each sequence's first token's,
    [N, H]: N * H values sliced or gathered, no pass over the tokens; autograd takes d(constant) back to the
    expression it came from."""
    if cu_seqlens is None or g.shape[1] == 0:
        first = g[:, :1, :, 0].sum(1)  # token 0 (a sum over at most one token: zeros, still differentiable, when T = 0)
        return first if cu_seqlens is None else first.expand(len(cu_seqlens) - 1, -1)
    return g[0, cu_seqlens[:-1], :, 0]  # each packed sequence's first token (none is empty: runtime.call checks)


ONES_BLOCK = 64  # the narrowest output block of the kernels carrying a normaliser (below)
