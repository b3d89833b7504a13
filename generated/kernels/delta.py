"""The delta rule on generated Triton kernels (templates/scan_delta.py.jinja).

S_t = diag(exp(g_t)) S_{t-1}, then S_t += a_t (b_t + S_t^T c_t)^T, read o_t = q_t^T S_read(t), for any write key
a, value b and erase key c the classifier found (DeltaNet's is a = beta k, c = -k). The forward runs chunkwise
in three kernels: per chunk in parallel the triangular solve T = (I - M)^-1 with W = T (c e^B), U0 = T b; one
sequential pass over chunks per (value block, sequence x head) for the state entering every chunk and the
corrected values U = U0 + W S0; the outputs per chunk in parallel. The backward recomputes the first two, then
runs A^T dO per chunk, a reverse pass for dS at every chunk end, and the gradients per chunk. The scan and its
backward are torch.library custom ops with fake implementations, like the additive family's.
"""
from __future__ import annotations

import torch

from ..runtime import fuse
from ..runtime.ops import NORM_FLOOR
from ..runtime.scan import ScanOperands, sub_token_rows
from .config import Config
from .launch import ACC_NAMES, NAMESPACE, acc_precision, cdiv, chunks, diagonal_span, launch_args, pow2, run_scan_op, state_key_block, state_stages, state_value_block
from .loader import kernels

FAMILY = "scan_delta"

# the kernels l2-normalise a query themselves (a read is linear in each query row: the output kernel scales o's rows
# after its dots, the backward the read's terms): the kernel plan lets a query's l2norm through to them
# (kernel_plan.ScanGroup.finished_train)
QUERY_NORM = True
# the forward's first kernel l2-normalises the erase keys (with their sign or per-head factor) as it loads them and
# stores them finished for the kernels after it, in place of a pass of their own before the kernels
KEY_NORM = True


KERNELS = ("solve_kernel", "prepare_kernel", "state_kernel", "output_kernel", "bwd_dv_kernel", "bwd_dh_kernel", "bwd_grad_kernel")


def kernel_names(decay: str) -> list[str]:
    """The kernels a delta scan with this decay renders, in launch order (a solve kernel only where the read's scores
    are kept, under a decay along the key dim: decay/key.jinja)."""
    return [k for k in KERNELS if decay == "key" or k != "solve_kernel"]


CHUNKS = (16, 32, 64)  # the in-kernel solve handles chunks of 16-token blocks, at most four of them


# the solve's float32 products when every use of T rounds it to the inputs' half type (templates/scan_delta.py.jinja)
SOLVE_HALF = "tf32"


# the per-chunk kernels' narrowest value block (prepare, output, A^T dO): Triton 3.6's code for narrower ones faulted on
# the H200 (illegal memory accesses the interpreter's bounds check does not find: bench/results/NOTES.md)
CHUNK_BLOCK = 64


def _prepare(mod, q, qs, a, b, c, g, acc: torch.dtype, cu, decay: str, c_cfg: Config, precision: str, tm: torch.Tensor | None = None,
             qn: int = 1, strength: bool = False, rows: dict | None = None, keys: tuple | None = None):  # fmt: skip
    """The solve and prepare kernels: (T, the read's scores where the kernels keep them (else an empty tensor), W, U0,
    what the sequential passes read of the decay (else Nones): a per-key decay's weighed write keys, the chunks' log
    decays, a scalar decay's per-token terms and, in the backward, the weighed queries, then the number of chunks, and
    the chunk layout with the launch shapes).

    tm: the chunks' T = (I - M)^-1 as an earlier call on the same inputs left them (the backward's): then neither T
    nor the scores are made again (the scores come back empty), and the queries are weighed where the kernels read them
    so (READS_WEIGHED). qn: q's rows per query row (query_rows). strength: a holds the writes' strengths s [B, T, H],
    the write key being -s c. rows: the log decays' rows (decay_rows). keys: (cs, rc, cn) where the forward finishes
    the erase keys (_key_buffers): c holds raw keys, and the kernels store the finished ones into cn and their rows'
    1 / max(||k||, 1e-12) into rc."""
    rows = rows or decay_rows(1, -1)
    B, T, H, K = c.shape
    V = b.shape[-1]
    BT, BV = c_cfg.BT, max(CHUNK_BLOCK, min(c_cfg.BV, pow2(V)))
    BK = min(c_cfg.BK, pow2(K))  # the key block of the per-chunk kernels (the state pass: state_key_block)
    varlen = cu is not None
    NC, indices, offsets = chunks(cu, B, T, BT)
    grid_chunks = (cdiv(T, BT), B * H) if not varlen else (NC, H)
    forward = tm is None
    sc = c.new_empty(0)
    shapes = dict(H=H, K=K, V=V, BT=BT, BV=BV, IS_VARLEN=varlen, **launch_args(c_cfg))
    cs, rc, cn = keys or (None, None, None)
    finishing = dict(KNORM=keys is not None, USE_CS=cs is not None)
    solving = dict(SPAN=diagonal_span(c.dtype), PRECISION="ieee", ACC_PRECISION=precision, STRENGTH=strength,
                   SOLVE_PRECISION=precision if c.dtype == acc else acc_precision(acc, SOLVE_HALF))  # fmt: skip
    if forward:  # T in the inputs' dtype: every use of it (and of the scores) rounds it to that (the template's `mm`)
        tm = torch.empty(B, T, H, BT, dtype=c.dtype, device=c.device)
    # the prepare kernel solves for T itself unless the solve kernel does (making the read's scores beside T) or the
    # forward did
    solve = forward and not mod.SCORES_KEPT
    if forward and mod.SCORES_KEPT:
        sc = torch.empty_like(tm)
        getattr(mod, f"{mod.NAME}_solve_kernel")[grid_chunks](
            q, qs, a, c, cs, rc, g, tm, sc, cu, indices, T, H=H, K=K, BT=BT, BK=BK, QN=qn, USE_QS=qs is not None, IS_VARLEN=varlen,
            **finishing, **solving, **rows, **launch_args(c_cfg),
        )  # fmt: skip
    w = torch.empty(B, T, H, K, dtype=c.dtype, device=c.device)
    u0 = torch.empty(B, T, H, V, dtype=c.dtype, device=c.device)
    # a per-key decay's write keys weighed to the chunk's end (in the inputs' dtype, as W), the chunks' log decays and
    # for the reverse pass the queries weighed from the chunk's start; a scalar decay's per-token terms (R, B, E) and the
    # chunks' log decays, which the sequential passes read rather than make (decay/scalar.jinja)
    ad, gl, gt, qd = None, None, None, None
    if decay == "key":
        ad, gl = torch.empty_like(w), torch.empty(NC, H, K, dtype=acc, device=c.device)
    elif decay == "scalar":
        gt, gl = torch.empty(B, T, H, 3, dtype=acc, device=c.device), torch.empty(NC, H, dtype=acc, device=c.device)
    weigh_reads = not forward and mod.READS_WEIGHED
    if weigh_reads:  # a row per row of the scan: each weighed from its own chunk's start
        qd = torch.empty_like(c)
    # a per-key decay's blocks each make their own decay terms (cumsums and exps along the key block): one program per
    # block; the other decays' blocks are a product each, sharing the chunk's terms, so one program takes a chunk's
    # blocks in turn (one per block was 25 us slower in gated_deltanet's and deltanet's backward: bench/results/NOTES.md)
    split = decay == "key" and not solve
    parts = cdiv(K, BK) + cdiv(V, BV) if split else 1
    # where one program takes a chunk's blocks, the forward's products as if every value were finite, then again with
    # the causal selects for the chunks whose stores were not (the template's CHECK_STORES and RERUN)
    check_stores = forward and not split
    flags = torch.empty(NC * H, dtype=torch.int32, device=c.device) if check_stores else None
    for rerun in (False, True) if check_stores else (False,):
        getattr(mod, f"{mod.NAME}_prepare_kernel")[(parts, *grid_chunks)](
            a, c, cs, rc, cn, b, g, q, qs, tm, w, u0, ad, gl, gt, qd, flags, cu, indices, T, BK=BK, SOLVE=solve, SPLIT=split,
            CAUSAL=forward, CHECK_STORES=check_stores and not rerun, RERUN=rerun, WEIGH_READS=weigh_reads, QN=qn,
            USE_QS=qs is not None, **finishing, **solving, **rows, **shapes,
        )  # fmt: skip
    return tm, sc, w, u0, (ad, gl, gt, qd), NC, (grid_chunks, indices, offsets, dict(shapes, BK=BK))


def _forward(mod, q, qs, a, b, c, g, h0, cu, decay: str, c_cfg: Config, store_ht: bool, precision: str, tm: torch.Tensor | None = None,
             qn: int = 1, strength: bool = False, rows: dict | None = None, keys: tuple | None = None):  # fmt: skip
    """The solve and prepare kernels (_prepare) and the state pass: (T, the scores, W, U, what the sequential passes
    read of the decay (_prepare's), states at chunk starts, final state, chunk layout). keys: _prepare's (the state
    pass then reads the finished erase keys)."""
    tm, sc, w, u, reach, NC, layout = _prepare(mod, q, qs, a, b, c, g, h0.dtype, cu, decay, c_cfg, precision, tm, qn, strength, rows, keys)
    c = c if keys is None else keys[2]
    ad, gl, gt, _ = reach
    B, T, H, K = c.shape
    V = b.shape[-1]
    N = B if cu is None else len(cu) - 1
    BW = state_value_block(c_cfg.BW, V, N * H, c.device)
    acc = h0.dtype
    _, _, offsets, shapes = layout
    h = torch.empty(NC, H, K, V, dtype=c.dtype, device=c.device)
    ht = torch.empty(N, H, K, V, dtype=acc, device=c.device)
    # U0 is overwritten by U in place: each program reads a row block of U0 just before writing it
    getattr(mod, f"{mod.NAME}_state_kernel")[(cdiv(V, BW), N * H)](
        a, c, ad, g, gl, gt, w, u, h0, h, u, ht, cu, offsets, T, STORE_HT=store_ht, STRENGTH=strength, ACC_PRECISION=precision,
        **dict(shapes, BK=state_key_block(K), BV=BW, num_stages=state_stages(c.dtype, K)),
    )  # fmt: skip
    return tm, sc, w, u, reach, h, ht, layout


def _module(decay: str, read: str, erase_before: bool, acc: torch.dtype):
    """The rendered kernels, with the kernel plan's render arguments in its order (kernel_plan._train)."""
    return kernels(FAMILY, decay=decay, read=read, **({"erase_before": True} if erase_before else {}), acc=ACC_NAMES[acc])


def _delta_forward(q: torch.Tensor, qs: torch.Tensor | None, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, g: torch.Tensor | None,
                   h0: torch.Tensor, cu_seqlens: torch.Tensor | None, decay: str, read: str, cfg: list[int],
                   erase_before: bool = False, sub_steps: int = 1, step: int = 0, qn: int = 1, strength: bool = False,
                   decay_step: int = -1, qnorm: bool = False, knorm: bool = False,
                   cs: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """S_t = diag(exp(g_t)) S_{t-1}; S_t += a_t (b_t + S_t^T c_t)^T; o_t = (qs_h q_t)^T S_read(t): (o, final state,
    the chunks' T = (I - M)^-1 [B, T, H, BT] and the read's scores [B, T, H, BT] where the kernels keep them (else
    empty), both kept for the backward so that it does not make them again). erase_before:
    the erase reads S_{t-1} instead (S_{t-1}^T c_t, the generalized delta rule). sub_steps, step: o is used at rows
    t with t % sub_steps == step only (ScanOperands' hint), and the output kernel computes those rows alone where
    sub_steps divides its chunks (read_rows), leaving the others unwritten. qn: rows per row of q (1, or sub_steps
    where q holds a row per token: ScanOperands.reads_per_token), which the kernels read for each of those rows.
    strength: a is the writes' strengths s [B, T, H] and the write key -s_t c_t: the kernels scale their products
    with the erase keys by -s, so that no write key tensor is written, read or kept. decay_step: g holds a
    row per token of sub_steps rows, its log decay at that sub-step and 0 at the others (ScanOperands.decay_step; -1:
    a row per row), which the kernels read so. qnorm: the kernels read q l2-normalised over the key dim (as
    lamixer.runtime.ops.normalize), its scales 1 / max(||q||, 1e-12) [B, T / qn, H] returned fifth (else empty) for
    the backward. knorm: c holds raw keys k and the erase keys are cs_h k / max(||k||, 1e-12) (cs [H] a per-head
    factor, its sign included, or None: 1), which the forward's first kernel makes: the finished keys [B, T, H, K] and
    their rows' 1 / max(||k||, 1e-12) [B, T, H] are returned last (else empty) for the backward.

    qs: an optional per-head factor of the query [H] (not differentiated); cfg: an autotune.Config as a list."""
    mod = _module(decay, read, erase_before, h0.dtype)
    cfg = Config.from_list(cfg)
    qn = query_rows(q, c, qn)
    rows = decay_rows(sub_steps, decay_step)
    cn, rc = _key_buffers(c, h0.dtype, knorm)
    keys = (cs, rc, cn) if knorm else None
    tm, sc, _, u, _, h, ht, (grid_chunks, indices, _, shapes) = _forward(mod, q, qs, a, b, c, g, h0, cu_seqlens, decay, cfg, True,
                                                                         acc_precision(h0.dtype), qn=qn, strength=strength, rows=rows,
                                                                         keys=keys)  # fmt: skip
    c = cn if knorm else c
    B, T, H, _ = c.shape
    V = b.shape[-1]
    o = torch.empty(B, T, H, V, dtype=b.dtype, device=b.device)
    nsub, step = read_rows(sub_steps, step, shapes["BT"])
    rq = _scales_buffer(q, h0.dtype, qnorm, nsub > qn)
    getattr(mod, f"{mod.NAME}_output_kernel")[(cdiv(V, shapes["BV"]), *grid_chunks)](
        q, qs, a, c, g, h, u, sc, o, rq, cu_seqlens, indices, T, NSUB=nsub, STEP=step, QN=qn, USE_QS=qs is not None, QNORM=qnorm,
        STRENGTH=strength, SPAN=diagonal_span(c.dtype), PRECISION="ieee", **rows,
        **dict(shapes, num_stages=output_stages(c.dtype, shapes["num_stages"])),
    )  # fmt: skip
    return o, ht, tm, sc, rq, cn, rc


def _key_buffers(c: torch.Tensor, acc: torch.dtype, knorm: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The finished erase keys [B, T, H, K] in c's dtype and their rows' 1 / max(||k||, 1e-12) [B, T, H] in the
    accumulator's (empty without knorm)."""
    if not knorm:
        return c.new_empty(0), c.new_empty(0, dtype=acc)
    return torch.empty_like(c), c.new_empty(c.shape[:3], dtype=acc)


def _scales_buffer(q: torch.Tensor, acc: torch.dtype, qnorm: bool, some_rows: bool) -> torch.Tensor:
    """The output kernel's buffer for the queries' l2norm scales [B, T / qn, H] (empty without qnorm): zeros where it
    computes some rows alone (some_rows: the read's sub-token rows of a query per row), so that the backward's
    products with the others' dO (0) stay 0."""
    if not qnorm:
        return q.new_empty(0, dtype=acc)
    return (torch.zeros if some_rows else torch.empty)(q.shape[:3], dtype=acc, device=q.device)


def _projected(q: torch.Tensor, rq: torch.Tensor, dq: torch.Tensor) -> torch.Tensor:
    """The gradient of q where the kernels read q / max(||q||, NORM_FLOOR) = rq q and gave dq holding rq fixed:
    dq - rq^2 q (q . dq) where the norm is above the floor (below it the clamp passes no gradient to the norm)."""
    r = rq.unsqueeze(-1)
    x, dx = q.to(rq.dtype), dq.to(rq.dtype)
    clamped = r >= 1. / torch.tensor(NORM_FLOOR, dtype=rq.dtype)  # the kernel's scale at the floor, rounded as it is
    along = torch.where(clamped, 0., r * r * (x * dx).sum(-1, keepdim=True))
    return (dx - x * along).to(dq.dtype)


def _key_grad(k: torch.Tensor, rc: torch.Tensor, dc: torch.Tensor, cs: torch.Tensor | None) -> torch.Tensor:
    """The raw keys' gradient from dc, that of the finished erase keys cs_h rc k: the gradient of rc k is cs_h dc,
    projected as a query's (_projected)."""
    f = rc.unsqueeze(-1) if cs is None else rc.unsqueeze(-1) * cs.to(rc.dtype).view(-1, 1)
    return _projected(k, rc, dc.to(rc.dtype) * f).to(dc.dtype)


def query_rows(q: torch.Tensor, c: torch.Tensor, qn: int) -> int:
    """qn, the scan's rows per row of q, once q's rows are checked against it."""
    if q.shape[1] * qn != c.shape[1]:
        raise ValueError(f"delta_scan: q has {q.shape[1]} rows for the scan's {c.shape[1]} at {qn} per query row")
    return qn


def decay_rows(sub_steps: int, decay_step: int) -> dict:
    """The kernels' GN, GSTEP: g has a row per GN rows of the scan, its log decay at rows t with t % GN == GSTEP and 0
    at the others (1, 0: a row per row)."""
    return dict(GN=sub_steps, GSTEP=decay_step) if decay_step >= 0 else dict(GN=1, GSTEP=0)


def dv_key_block(dtype: torch.dtype, K: int, BK: int) -> int:
    """The key block of the backward's A^T dO: whole key rows up to 128 for 2-byte inputs, so that its scores are one
    dot rather than a loop whose loads wait on the previous block's dots (gated_deltanet's, alone on the H200: 200 us
    at 64, 146 at 128; bench/results/NOTES.md); float32 tiles keep the configuration's."""
    return max(BK, min(128, pow2(K))) if dtype.itemsize == 2 else BK


def output_stages(dtype: torch.dtype, stages: int) -> int:
    """The output kernel's pipeline stages: at least three for 2-byte inputs, so that its key loop's loads (q, a, S0)
    overlap the previous blocks' dots (timed alone on the H200 at 64-wide key blocks, one to three writes per token, no
    or a scalar decay: three stages 7 to 14 % faster than two, four slower than three: bench/results/NOTES.md); float32
    tiles at two stages spill by the tens of KB."""
    return max(3, stages) if dtype.itemsize == 2 else stages


def grad_stages(dtype: torch.dtype, stages: int) -> int:
    """The gradient kernel's pipeline stages: at least two for 2-byte inputs, so that its value loop's loads (the state
    tiles, U, dU, dO) overlap the previous block's dots (gated_deltanet's alone on the H200: 1589 -> 1489 us at two,
    bench/results/NOTES.md); float32 tiles keep the configuration's."""
    return max(2, stages) if dtype.itemsize == 2 else stages


def read_rows(sub_steps: int, step: int, BT: int) -> tuple[int, int]:
    """(NSUB, STEP) of the output kernel: its chunks' rows at sub-step `step` of every `sub_steps` alone where that
    many divide a chunk into a power of two of at least 16 tokens (Triton's ranges and dots), else (1, 0): every row."""
    R = BT // sub_steps
    if sub_steps > 1 and BT % sub_steps == 0 and R >= 16 and pow2(R) == R:
        return sub_steps, step
    return 1, 0


delta_scan = torch.library.custom_op(f"{NAMESPACE}::delta_scan", _delta_forward, mutates_args=())


@delta_scan.register_fake
def _(q, qs, a, b, c, g, h0, cu_seqlens, decay, read, cfg, erase_before=False, sub_steps=1, step=0, qn=1, strength=False, decay_step=-1,
      qnorm=False, knorm=False, cs=None):  # fmt: skip
    B, T, H, K = c.shape
    N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    tm = c.new_empty(B, T, H, Config.from_list(cfg).BT)
    sc = torch.empty_like(tm) if _module(decay, read, erase_before, h0.dtype).SCORES_KEPT else c.new_empty(0)
    rq = q.new_empty(q.shape[:3] if qnorm else (0,), dtype=h0.dtype)
    return b.new_empty(B, T, H, b.shape[-1]), h0.new_empty(N, H, K, b.shape[-1]), tm, sc, rq, *_key_buffers(c, h0.dtype, knorm)


def _delta_backward(q: torch.Tensor, qs: torch.Tensor | None, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, g: torch.Tensor | None,
                    h0: torch.Tensor, cu_seqlens: torch.Tensor | None, tm: torch.Tensor, sc: torch.Tensor, rq: torch.Tensor, cn: torch.Tensor,
                    rc: torch.Tensor, do: torch.Tensor, dht: torch.Tensor, decay: str, read: str, cfg: list[int], erase_before: bool = False,
                    sub_steps: int = 1, step: int = 0, qn: int = 1, strength: bool = False, decay_step: int = -1, qnorm: bool = False,
                    knorm: bool = False, cs: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """(dq, da, db, dc, dg, dh0) of delta_scan; dg is empty without a decay. sub_steps, step, qn: the forward's (dO is
    0 but at the rows its output kernel computed, and A^T dO takes those alone). A q of a row per token is read at
    each of its sub-tokens' rows (the reverse pass gathers them), and dq's row is the read's sub-token's (dq is 0 at
    the others, as dO is). strength (a the strengths): every kernel takes them as the forward's do, and the gradient
    kernel gives d(strengths) in da's place and -s da within dc. decay_step: the forward's (g and dg a row per
    token). qnorm: the forward's, rq its scales: the kernels scale the read's terms by them row by row, and dq is
    projected here (_projected). knorm, cs: the forward's, cn and rc what it returned for them: the kernels read the
    finished erase keys, and dc (of the raw keys) is projected here."""
    mod = _module(decay, read, erase_before, h0.dtype)
    qn = query_rows(q, c, qn)
    cfg = Config.from_list(cfg)
    acc = h0.dtype
    k, c = c, cn if knorm else c  # the kernels read the erase keys as the forward finished them
    precision = acc_precision(acc)
    rows = decay_rows(sub_steps, decay_step)
    _, _, w, u, (ad, gl, gt, qd), h, _, (grid_chunks, indices, offsets, shapes) = _forward(mod, q, qs, a, b, c, g, h0, cu_seqlens, decay, cfg, False,
                                                                                       precision, tm, qn, strength, rows)  # fmt: skip
    B, T, H, K = c.shape
    V = b.shape[-1]
    N = B if cu_seqlens is None else len(cu_seqlens) - 1
    # the reverse pass's and the gradient kernel's value blocks
    BW, BG = state_value_block(cfg.BW, V, N * H, c.device), min(cfg.BG or cfg.BV, pow2(V))
    NV = cdiv(V, BW)
    do, dht = do.contiguous(), dht.contiguous()
    common = dict(USE_QS=qs is not None, QNORM=qnorm, PRECISION="ieee", ACC_PRECISION=precision, **shapes)
    # dU in the inputs' dtype, as the other intermediates (the template's header)
    du = torch.empty(B, T, H, V, dtype=c.dtype, device=c.device)
    nsub, rows_step = read_rows(sub_steps, step, shapes["BT"])
    getattr(mod, f"{mod.NAME}_bwd_dv_kernel")[grid_chunks](
        q, qs, a, c, g, sc, rq, do, du, cu_seqlens, indices, T, NSUB=nsub, STEP=rows_step, QN=qn, STRENGTH=strength,
        SPAN=diagonal_span(c.dtype), **rows, **dict(common, BK=dv_key_block(c.dtype, K, shapes["BK"])),
    )  # fmt: skip
    dh = torch.empty_like(h)
    dh0 = torch.empty_like(h0)
    # the reverse pass reads the queries weighed as the prepare kernel left them (a row per row), qs applied, where it
    # made them
    wq, wqs, wqn = (qd, None, 1) if qd is not None else (q, qs, qn)
    wrq = sub_token_rows(rq, qn) if qnorm and wqn != qn else rq  # the scales of its query rows
    getattr(mod, f"{mod.NAME}_bwd_dh_kernel")[(NV, N * H)](
        wq, wqs, a, c, ad, g, gl, gt, w, wrq, do, du, dht, dh, dh0, cu_seqlens, offsets, T,
        QN=wqn, USE_DHT=True, STRENGTH=strength, **dict(common, USE_QS=wqs is not None, BV=BW, BK=state_key_block(K), num_stages=state_stages(w.dtype, K)),
    )  # fmt: skip
    # a scalar decay's whole-decay terms per chunk and key, exp(B_last) sum_v dS_end * S0, for the host's sums (the
    # gradient kernel makes them from the state tiles it loads; a per-key decay's it adds itself)
    dgs = torch.empty(h.shape[0], H, K, dtype=acc, device=c.device) if decay == "scalar" else None
    dq, dc, db = torch.empty_like(q), torch.empty_like(c), torch.empty_like(b)
    NK = cdiv(K, shapes["BK"])
    # a strength's gradient summed per key block (as a scalar decay's terms), else the write keys'
    dsp, da = (torch.empty(NK, B, T, H, dtype=acc, device=c.device), None) if strength else (None, torch.empty_like(a))
    if decay == "key":  # the kernel finishes d(log decay) (the kernel's docstring)
        xq, xr = torch.empty_like(g), None
    else:  # its terms, summed over each key block
        xq, xr = (torch.empty(NK, B, T, H, dtype=acc, device=c.device) if g is not None else None for _ in range(2))
    getattr(mod, f"{mod.NAME}_bwd_grad_kernel")[(NK, *grid_chunks)](
        q, qs, a, c, g, gl, gt, tm, h, dh, u, du, do, rq, dq, da, dc, db, xq, xr, dgs, dsp, cu_seqlens, indices, T,
        B * T * H, QN=qn, STEP=step if qn > 1 else 0, STRENGTH=strength, SPAN=diagonal_span(c.dtype), **rows,
        **dict(common, BV=BG, num_warps=cfg.warps_grad or cfg.num_warps, num_stages=grad_stages(c.dtype, cfg.num_stages)),
    )  # fmt: skip
    if strength:  # da's place: the strengths' gradient
        da = dsp.sum(0).to(a.dtype)
    if qnorm:
        dq = fuse.function(_projected, q.device, q, rq, dq)
    if knorm:
        dc = fuse.function(_key_grad, k.device, k, rc, dc, cs)
    if g is None:
        return dq, da, db, dc, q.new_empty(0), dh0
    if decay == "key":
        return dq, da, db, dc, xq, dh0
    shifted = read == "before" or erase_before
    dg = fuse.function(_decay_grad, q.device, xq, xr, dgs, cu_seqlens, offsets, shapes["BT"], shifted, g.dtype, when=cu_seqlens is None)
    return dq, da, db, dc, dg, dh0


def _chunk_suffix_sums(x: torch.Tensor, cu, BT: int) -> torch.Tensor:
    """Suffix sums along time within each chunk of BT tokens (chunks restart at every sequence)."""
    def within(y):  # y: [B, L, H, D]
        B, L = y.shape[:2]
        pad = (-L) % BT
        y = torch.nn.functional.pad(y, (0, 0, 0, 0, 0, pad)).reshape(B, -1, BT, *y.shape[2:])
        return y.flip(2).cumsum(2).flip(2).reshape(B, -1, *y.shape[3:])[:, :L]

    if cu is None:
        return within(x)
    offsets = cu.tolist()
    return torch.cat([within(x[:, s:e]) for s, e in zip(offsets[:-1], offsets[1:])], 1)


def _decay_grad(xq, xr, dgs, cu, chunk_offsets, BT: int, shifted: bool, out_dtype) -> torch.Tensor:
    """A scalar decay's d(log decay) [B, T, H] in out_dtype from the gradient kernel's terms xq = q * dq and
    xr = c * dc - a * da (float32, before dq, da, dc were rounded; c the erase key, which sees the decay as a query
    after it does), each summed per key block ([NK, B, T, H]): within the token's chunk, the suffix sum of xq + xr,
    xq from the next token on when `shifted` (a read before the decay; under erase_before the kernel puts c * dc in xq,
    and q * dq in xr where the read is after the decay), plus the chunk's whole-decay term sum dS_end * S_end over the
    value dim and the keys (dgs [chunks, H, K]).

    Summing only within chunks keeps the rounding of dq and da from accumulating over the sequence. On a GPU the
    backward op runs this under torch.compile (runtime/fuse.py: function) for unpacked sequences.
    """
    xq, xr, dgs = xq.sum(0), xr.sum(0), dgs.sum(-1)
    B, T = xq.shape[:2]
    pos = torch.arange(T, device=xq.device)
    if cu is not None:
        starts = torch.repeat_interleave(cu[:-1], cu[1:] - cu[:-1])
        pos = pos - starts
    if shifted:  # the read (or erase) at i sees the decay through i - 1, of its own chunk only
        shifted = torch.cat([xq[:, 1:], torch.zeros_like(xq[:, :1])], 1)
        keep = torch.cat([(pos[1:] % BT) != 0, torch.zeros(1, dtype=torch.bool, device=xq.device)])
        xq = shifted * keep.view(1, T, 1)
    x = _chunk_suffix_sums((xq + xr).unsqueeze(-1), cu, BT)[..., 0]
    chunk = pos // BT
    if cu is None:
        x = x + dgs.view(B, -1, dgs.shape[-1]).gather(1, chunk.expand(B, T).unsqueeze(-1).expand(B, T, dgs.shape[-1]))
    else:
        seq = torch.repeat_interleave(torch.arange(len(cu) - 1, device=xq.device), cu[1:] - cu[:-1])
        x = x + dgs[chunk_offsets[seq].long() + chunk].unsqueeze(0)
    return x.to(out_dtype)


delta_scan_backward = torch.library.custom_op(f"{NAMESPACE}::delta_scan_backward", _delta_backward, mutates_args=())


@delta_scan_backward.register_fake
def _(q, qs, a, b, c, g, h0, cu_seqlens, tm, sc, rq, cn, rc, do, dht, decay, read, cfg, erase_before=False, sub_steps=1, step=0, qn=1,
      strength=False, decay_step=-1, qnorm=False, knorm=False, cs=None):  # fmt: skip
    dg = torch.empty_like(g) if g is not None else q.new_empty(0)
    return torch.empty_like(q), torch.empty_like(a), torch.empty_like(b), torch.empty_like(c), dg, torch.empty_like(h0)


def _setup_context(ctx, inputs, output):
    q, qs, a, b, c, g, h0, cu_seqlens, decay, read, cfg, erase_before, sub_steps, step, qn, strength, decay_step, qnorm, knorm, cs = inputs
    ctx.save_for_backward(q, qs, a, b, c, g, h0, cu_seqlens, cs, *output[2:7])
    ctx.config = (decay, read, cfg, erase_before, sub_steps, step, qn, strength, decay_step, qnorm, knorm)


def _grads(ctx, do, dht, backward):
    """The inputs' gradients from the saved context, through `backward` (the custom op or its implementation)."""
    q, qs, a, b, c, g, h0, cu_seqlens, cs, tm, sc, rq, cn, rc = ctx.saved_tensors
    dq, da, db, dc, dg, dh0 = backward(q, qs, a, b, c, g, h0, cu_seqlens, tm, sc, rq, cn, rc, do, dht, *ctx.config, cs)
    return dq, None, da, db, dc, dg if g is not None else None, dh0, *[None] * 13


def _backward(ctx, do, dht, _dtm, _dsc, _drq, _dcn, _drc):
    return _grads(ctx, do, dht, delta_scan_backward)


delta_scan.register_autograd(_backward, setup_context=_setup_context)


class _EagerDeltaScan(torch.autograd.Function):
    """The same as the custom op, without its dispatch outside torch.compile (the dispatch was a third of the host time
    of a forward+backward: bench/results/NOTES.md)."""

    @staticmethod
    def forward(ctx, *inputs):
        outputs = _delta_forward(*inputs)
        _setup_context(ctx, inputs, outputs)
        return outputs[:2]

    @staticmethod
    def backward(ctx, do, dht):
        return _grads(ctx, do, dht, _delta_backward)


def scan(ops: ScanOperands, dtype: torch.dtype, config: Config) -> tuple[list[torch.Tensor], torch.Tensor]:
    """One delta-rule scan on scan_delta's kernels, launched with `config`: q, a, b, c contiguous [B, T, H, D] in
    `dtype` (a given as strengths, ScanOperands.strength: those [B, T, H]); decay and state in float32 (float64 when the
    inputs are). A scan given ops.c_before runs with every erase
    reading the state before its sub-token's decay (the template's erase_before: the kernel plan gives these kernels
    no scan where that differs between sub-tokens that decay and erase)."""
    if ops.decay_step is not None and ops.decay != "key":  # the kernels read a per-key decay's rows so, no other's
        ops = ops.sub_token_decays()
    ((q, read),) = ops.reads
    (qs,) = ops.query_factors
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    g = None if ops.g is None else ops.g[..., 0].contiguous() if ops.decay == "scalar" else ops.g.contiguous()
    b, c, q = (x.to(dtype).contiguous() for x in (ops.b, ops.c, q))
    strength = ops.strength is not None  # then a holds the strengths (in `dtype`: the kernels' products take a's)
    a = (ops.strength[..., 0] if strength else ops.a).to(dtype).contiguous()
    h0 = ops.h0.to(acc).contiguous()
    qs = qs.to(acc).contiguous() if qs is not None else None
    erase_before = ops.c_before is not None and ops.decay != "none"  # without a decay, before and after are one state
    sub_steps, step = (ops.sub_steps, ops.read_steps[0]) if ops.sub_steps > 1 else (1, 0)  # the read's rows (its hint)
    qn = ops.sub_steps if ops.reads_per_token else 1
    decay_step = -1 if ops.decay_step is None else ops.decay_step
    qnorm, knorm, cs = _norms(ops, acc)
    args = (q, qs, a, b, c, g, h0, ops.cu_seqlens, ops.decay, read, config.as_list(), erase_before, sub_steps, step, qn, strength, decay_step,
            qnorm, knorm, cs)  # fmt: skip
    o, ht = run_scan_op(delta_scan, _EagerDeltaScan, _delta_forward, args, (q, a, b, c, g, h0))
    return [o], ht


def _norms(ops: ScanOperands, acc: torch.dtype) -> tuple[bool, bool, torch.Tensor | None]:
    """What the kernels finish (the operands' KeyForms): whether they l2-normalise the query, whether they l2-normalise
    the erase keys, and the erase keys' per-head factor [H] in `acc` (its sign included; None: 1). The kernel plan
    gives these kernels no other form."""
    query, key = ops.forms.get("q0"), ops.forms.get("c")
    query_ok = query is None or (query.token is None and query.factor is None)  # its factor is a query_factor
    key_ok = key is None or (key.norm and key.token is None)
    if set(ops.forms) - {"q0", "c"} or not query_ok or not key_ok:
        raise ValueError(f"delta_scan: the chunk kernels finish a query's l2norm and an erase key's, not {sorted(ops.forms)}")
    factor = None if key is None or key.factor is None else key.factor.to(acc).contiguous()
    return query is not None and query.norm, key is not None, factor
