"""Generated Triton kernels: each scan the templates cover runs as rendered kernels, the rest of
the plan (per-token work, statistics, side branches) as in the torch backend.

A scan's kernels are rendered from templates/<family>.py.jinja for its classification (decay
kind, read position), written once to a cache folder keyed by the source's hash, and imported
from there (Triton's JIT reads kernel source from files).
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import math
import os
import tempfile
from importlib import resources
from pathlib import Path

import jinja2
import torch

from ..passes.pipeline import Compiled
from ..runtime import fuse
from ..tuning.autotune import Config, _pow2, default_config, device_name, entry_key, lookup, shape_bucket
from . import evaluate as torch_backend
from .binding import Call, remember
from .evaluate import Direct, ScanOperands

TEMPLATE_VERSION = 1
_ACC = {torch.float32: "float32", torch.float64: "float64"}  # state and accumulator precision


MAX_HEAD_DIM = 256  # a whole key (or value) row of the state sits in one program's registers


def unsupported(compiled: Compiled, sizes: dict[str, int] | None = None) -> list[str]:
    """Why a spec's scans cannot all run on the templates (empty when they can); with the call's dim sizes, also
    why this call cannot."""
    reasons = []
    for s in compiled.classification.scans:
        if not s.reads:
            reasons.append(f"state {s.state}: a scan without reads (final state only) has no Triton template yet")
        elif len(s.reads) > 1:
            reasons.append(f"state {s.state}: more than one read of one state has no Triton template yet")
        for d in (s.key_dim, s.value_dim):
            if sizes is not None and d is not None and sizes[d] > MAX_HEAD_DIM:
                reasons.append(f"state {s.state}: {d} = {sizes[d]} is above the kernels' {MAX_HEAD_DIM}")
    return reasons


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


def floored(log_decay: str, acc: str) -> str:
    """The templates' load of a log decay (an expression) in the accumulator's dtype, at least the log of its smallest
    normal number. The kernels difference cumulative log decays, and a decay of exactly 0 (log -inf: a gate that
    reaches 0) made -inf - -inf NaN; floored, its factor is 0 to float precision and the differences stay finite."""
    return f"tl.maximum({log_decay}.to(tl.{acc}), {math.log(torch.finfo(getattr(torch, acc)).tiny)!r})"


@functools.cache
def _environment() -> jinja2.Environment:
    root = resources.files("lamixer").joinpath("kernels/templates")
    env = jinja2.Environment(loader=jinja2.FunctionLoader(lambda name: root.joinpath(name).read_text()),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True)  # fmt: skip
    env.globals["floored"] = floored
    return env


def cache_dir() -> Path:
    path = Path(os.environ.get("LAMIXER_CACHE", Path.home() / ".cache" / "lamixer")) / "kernels"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _digest(source: str) -> str:
    return hashlib.sha256(f"{TEMPLATE_VERSION}\n{source}".encode()).hexdigest()[:16]


def config_name(family: str, config: dict) -> str:
    """<family>_<config values>, a flag set to True by its name (ones): the kernels' names, and their module's."""
    return "_".join([family, *(k if v is True else str(v) for k, v in config.items())])


def template_args(decay: str, read: str, acc: str, ones: bool = False) -> dict:
    """A chunk template's render arguments, in the order that names its kernels; ones: chunk_additive's form carrying
    a normaliser."""
    return dict(decay=decay, read=read, **({"ones": True} if ones else {}), acc=acc)


def render(family: str, **config) -> str:
    return _environment().get_template(f"{family}.py.jinja").render(name=config_name(family, config), **config)


@functools.cache
def kernels(family: str, **config):
    """The module of rendered kernels for one configuration (written atomically, imported once)."""
    source = render(family, **config)
    digest = _digest(source)
    path = cache_dir() / f"{family}_{digest}.py"
    if not path.exists() or path.read_text() != source:
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(source)
        os.replace(tmp, path)
    spec = importlib.util.spec_from_file_location(f"lamixer_kernels_{family}_{digest}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.NAME = config_name(family, config)
    return module


def _read_mode(decayed: bool, written: bool) -> str:
    return "after" if written else ("mid" if decayed else "before")


def template_config(scan) -> tuple[str, str]:
    """The (decay, read) an additive scan renders its template with (a constant decay runs as a scalar one)."""
    return scan.kernel_decay, _read_mode(scan.reads[0].decayed, scan.reads[0].written)


FAMILY = "chunk_additive"  # the additive rule's template, every decay: none, scalar, along the key or the value dim
STRIP_DECAYS = ("key", "value")  # decays whose chunk scores are built in strips
# the chunk kernels' float32 dots, those d(log decay) is built from (the backward strips' intra-chunk parts, and
# under a decay along the value dim its states, walk tiles, output and db: the template's header): three bfloat16
# products, about 16 bits, far inside what d(log decay) needs; tf32x3 held twice the shared memory and spilled
# (sm_90, gsa bf16 D = 128: the value-dim gradient kernel 196608 bytes and 1432 spilled against 139264 and 568)
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


def kernel_names(decay: str) -> list[str]:
    """The kernels an additive scan with this decay renders, in launch order."""
    if decay == "key":
        return ["state_fwd", "cumsum_fwd", "scores_fwd", "output_fwd", "state_bwd", "grads_bwd", "strips_bwd", "decay_bwd"]
    if decay == "value":
        return ["state_fwd", "output_fwd", "cumsum_fwd", "strips_bwd", "state_bwd", "scores_fwd", "grads_bwd", "decay_bwd"]
    return ["state_fwd", "output_fwd", "state_bwd", "grads_bwd"]


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


chunk_scan = torch.library.custom_op("lamixer::chunk_scan", _chunk_forward, mutates_args=())


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


chunk_scan_backward = torch.library.custom_op("lamixer::chunk_scan_backward", _chunk_backward_impl, mutates_args=())


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


triton_scan.normaliser = True  # takes ScanOperands.z0 (runtime.scan.scan_group)


# configurations chosen in this process, so a call pays for the cache lookup once per shape
_chosen: dict[tuple, Config] = {}
# the last configuration eager calls chose per kernel and head dims: what torch.compile traces (see choose_config)
_traced: dict[tuple, Config] = {}
CONFIG_OVERRIDE: Config | None = None  # set by the autotuner while it times a candidate
OVERRIDE_FAMILY: str | None = None  # the template family the override is for (None: every family)


def kernel_hash(decay: str, read: str, acc: str, ones: bool = False) -> str:
    """The hash of the chunk kernels' source (ones: the form carrying a normaliser), on which tuned entries key."""
    return _digest(render(FAMILY, **template_args(decay, read, acc, ones)))


def choose_config(fam: str, decay, read, acc, dtype, B, T, H, K, V, device, default, hash_of, usable=lambda c: True,
                  variant: tuple = ()) -> Config:  # fmt: skip
    """The tuned configuration of family `fam`'s kernels for this GPU, dtype and shape bucket, else default(decay,
    K, V); never a search. The autotuner's override applies to its family when usable(override).

    While torch.compile traces, no cache file is read and no template rendered (neither can be traced): the
    configuration is the one an eager call chose for this shape bucket (runtime/fuse.py runs a signature's first
    call eagerly for this), else, when the length or batch is symbolic or no eager call came first, the one eager
    calls last chose for these head dims, else the default."""
    if CONFIG_OVERRIDE is not None and OVERRIDE_FAMILY in (None, fam) and usable(CONFIG_OVERRIDE):
        return CONFIG_OVERRIDE
    dims = (fam, decay, read, acc, dtype, K, V, str(device), *variant)
    bucket = shape_bucket(B, T, H, K, V) if all(isinstance(n, int) for n in (B, T, H, K, V)) else None  # None: symbolic
    if torch.compiler.is_compiling():
        found = _chosen.get((*dims, bucket)) if bucket is not None else None
        found = found if found is not None else _traced.get(dims)
        return found if found is not None else default(decay, K, V)
    key = (*dims, bucket)
    if key not in _chosen:
        hashes = hash_of(decay, read, acc)  # a kernel source's hash, or several to try in order
        found = None
        for h in [hashes] if isinstance(hashes, str) else hashes:
            found = lookup(entry_key(device_name(device), h, dtype, bucket))
            if found is not None:
                break
        _chosen[key] = found if found is not None and usable(found) else default(decay, K, V)
    _traced[dims] = _chosen[key]
    return _chosen[key]


ONES_BLOCK = 64  # the narrowest output block of the kernels carrying a normaliser (below)


def scan_config(decay, read, acc, dtype, B, T, H, K, V, device, ones: bool = False) -> Config:
    """The additive kernels' configuration (choose_config); ones: of their form carrying a normaliser, whose entries
    fall back to the plain form's (the same kernels but for a [K] vector per chunk). Their output kernel takes blocks
    of at least ONES_BLOCK: at 32 wide it raised an illegal memory access on the H200 (lln, bf16, autotune,
    h200_2026-11-30/s10_call19), where under the interpreter's bounds check every access of it stays inside its
    tensors (emulate.check_bounds, lln at K = V = 64 with 16- and 32-wide blocks): the compiled code's, as the delta
    rule's narrow blocks were (triton_delta.CHUNK_BLOCK). The autotuner's space for such a spec has no narrower ones."""
    if not ones:
        return choose_config(FAMILY, decay, read, acc, dtype, B, T, H, K, V, device, default_config, kernel_hash)
    return choose_config(FAMILY, decay, read, acc, dtype, B, T, H, K, V, device, default_config,
                         lambda d, r, a: (kernel_hash(d, r, a, True), kernel_hash(d, r, a)), lambda c: c.BV >= min(ONES_BLOCK, _pow2(V)),
                         variant=("ones",))  # fmt: skip


def direct_operands(compiled: Compiled, call: Call, finished: bool = False) -> dict[int, Direct]:
    """Scan operands the kernels can read straight from the caller's tensors, with no pass over them in torch: an
    input itself, or (for a query) an input times a per-head constant such as the read-out scale. With `finished`
    (the recurrent kernel's, which holds whole key rows) also a key-side operand (write key, erase key, query) of
    the form +-factor_h * token_t * l2norm(input), any part optional (Direct): Gated DeltaNet's beta * l2norm(k),
    -l2norm(k) and scale * l2norm(q), so a decode step runs no torch op before its kernel."""
    nodes = compiled.plan.nodes
    constant = ("const", "dim", "head", "scale")

    def per_head_constant(n: int) -> bool:
        d = nodes[n]
        if d["dims"]:
            return False
        if d["op"] == "param":
            return not call.inputs[d["name"]].requires_grad
        return d["op"] in constant or (d["op"] in ("unary", "binary") and all(per_head_constant(a) for a in d["args"]))

    def plain_input(n: int) -> str | None:
        return nodes[n]["name"] if nodes[n]["op"] == "input" else None

    def form(n: int) -> Direct | None:
        """n as a Direct of any form, or None."""
        d = nodes[n]
        if plain_input(n):
            return Direct(plain_input(n))
        if d["op"] == "normalize" and d["fn"] == "l2norm" and plain_input(d["args"][0]):
            return Direct(plain_input(d["args"][0]), norm=True)
        if d["op"] == "binary" and d["fn"] == "sub" and nodes[d["args"][0]]["op"] == "const" and nodes[d["args"][0]]["value"] == 0:
            inner = form(d["args"][1])
            return inner._replace(negate=not inner.negate) if inner is not None else None
        if d["op"] == "binary" and d["fn"] == "mul":
            for x, f in (d["args"], reversed(d["args"])):
                inner = form(x)
                if inner is None:
                    continue
                if inner.factor is None and per_head_constant(f):
                    return inner._replace(factor=f)
                if inner.token is None and plain_input(f) and not nodes[f]["dims"]:
                    return inner._replace(token=plain_input(f))
        return None

    def key_side(n: int | None, query: bool) -> Direct | None:
        found = form(n) if n is not None else None
        if found is None or (query and found.token is not None):
            return None
        if finished:
            return found
        plain = not (found.norm or found.token is not None or found.negate)  # the chunk kernels take a query's factor only
        return found if plain and (found.factor is None or query) else None

    direct = {}
    for s in compiled.classification.scans:
        for n in (s.write_value, s.log_decay):
            if n is not None and plain_input(n):
                direct[n] = Direct(plain_input(n))
        for n, query in ((s.write_key, False), *(((s.erase_key, False),) if finished else ()), *((r.query, True) for r in s.reads)):
            found = key_side(n, query)
            if found is not None:
                direct[n] = found
    return direct


def run(compiled: Compiled, call: Call) -> tuple[torch.Tensor, list[torch.Tensor]]:
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    if call.memo is None:
        return torch_backend.run(compiled, call, *_choices(compiled, call, interpreted))
    from . import recurrent

    # the choices depend on nothing but the signature, the grad mode and whether the recurrent kernel takes the length
    key = ("triton", torch.is_grad_enabled(), call.longest <= recurrent.MAX_T, interpreted)
    choices = call.memo.get(key)
    if choices is None:
        choices = remember(call.memo, key, _choices(compiled, call, interpreted))
    # fused: chunked scans with per-token work around them (with none, torch.compile's dispatch only adds host time:
    # linear_attn's forward 64 -> 189 us on a 2-core CPU, launches stubbed); the autotuner times kernels unfused
    fusable = CONFIG_OVERRIDE is None and choices[0].func is triton_scan and choices[2].per_token_work
    return fuse.run(_evaluate, compiled.name, call, compiled, *choices, when=fusable)


def _evaluate(call: Call, compiled: Compiled, scan_impl, direct, prog) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The evaluation fuse.run compiles, o already in the caller's dtype: the cast then fuses into the last per-token
    kernel, where after it was a pass of its own each way (lln on the H200: 95 us of a 2.1 ms forward)."""
    o, finals = torch_backend.run(compiled, call, scan_impl, direct, prog)
    return o.to(call.out_dtype), finals


def _choices(compiled: Compiled, call: Call, interpreted: bool) -> tuple:
    """(scan implementation, direct operands, evaluation program) for this call."""
    dtype = call.out_dtype if call.out_dtype in (torch.bfloat16, torch.float16) else call.compute_dtype
    if dtype == torch.bfloat16 and interpreted and not bf16_interpreted():
        dtype = torch.float32  # Triton 3.6's CPU interpreter multiplies bf16 dot operands as raw bits (lamixer.emulate)
    from . import recurrent  # inference on short sequences: the recurrent kernel (see its module)

    serves = recurrent.serves(compiled, call)
    direct = direct_operands(compiled, call, finished=serves)
    scan_impl = functools.partial(recurrent.scan if serves else triton_scan, dtype=dtype)
    return scan_impl, direct, torch_backend.program(compiled, direct)


from . import triton_delta  # noqa: E402  (the delta rule's kernels; it uses the helpers above)
