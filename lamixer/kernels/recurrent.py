"""The fused recurrent scan: every classified scan token by token on one rendered kernel, forward only.

It serves inference on short sequences and decoding: the Triton backend runs a call's scans here
when no gradient is asked for and no sequence is longer than MAX_T tokens, for the additive and the
delta rule alike (it also runs scans the chunk templates do not, such as a state read twice). When
autograd needs gradients the chunk kernels run.

Why MAX_T = 64: the recurrent kernel does the O(T K V) work of the state update and nothing else,
in T dependent steps of one multiply-add on a register-resident [K, BV] state block; a chunk
kernel does the same state work plus O(T^2 (K + V)) intra-chunk scores, in one chunk of up to 64
tokens, over several kernel launches. Up to
about one chunk the T short dependent steps cost no more than a chunk does, so below 64 tokens the
recurrent kernel does less work with fewer launches; beyond it the chunk kernels' parallel form wins
as T grows. FLA's layers switch at the same length (fused_recurrent when seq_len <= 64). The
threshold is a reasoned default, not yet timed on a GPU.
"""
from __future__ import annotations

import functools

import torch

from ..runtime.scan import KeyForm, ScanOperands
from .launch import ACC_NAMES, NAMESPACE, multiprocessors, pow2
from .loader import kernels

FAMILY = "recurrent"  # the template
MAX_T = 64  # the longest sequence the recurrent kernel takes (see the module docstring)


# num_warps for a [BK, BV] state block, and the widest value block per BK: from ptxas's register counts for sm_90
# (bench/recurrent_registers.py, no GPU needed), the choices with no spills and at most ~100 registers a thread for
# every rule and decay kind; other shapes of the same size can take 255 registers and spill. Not yet timed.
WARPS = {(16, 16): 2, (16, 32): 2, (16, 64): 2, (32, 16): 2, (32, 32): 4, (32, 64): 2, (64, 16): 4, (64, 32): 2,
         (128, 16): 4, (128, 32): 4, (256, 16): 8}  # fmt: skip


WIDEST = {16: 64, 32: 64, 64: 32, 128: 32, 256: 16}


def blocks(K: int, V: int, programs: int, device: torch.device) -> tuple[int, int, int]:
    """(BK, BV, num_warps): the whole key dim, the widest value block WIDEST allows, narrowed (down to 16) while the
    (value block, sequence x head) programs fill fewer than two waves of the GPU's multiprocessors."""
    BK = pow2(K)
    BV = min(pow2(V), WIDEST[BK])
    while BV > 16 and programs * -(-V // BV) < 2 * multiprocessors(device):
        BV //= 2
    return BK, BV, WARPS[(BK, BV)]


def _strides(x: torch.Tensor | None) -> tuple[int, int, int, int]:
    """(batch, time, head, dim) strides of a [B, T, H, D] operand (D may be 1: a scalar)."""
    return (0, 0, 0, 0) if x is None else tuple(x.stride())


@functools.lru_cache(maxsize=1024)
def _kernel(rule: str, decay: str, reads: str, erase_before: bool, acc: torch.dtype, K: int, V: int, programs: int, device: torch.device):
    """(the jitted kernel, BK, BV, num_warps) for one configuration and shape: looked up once per shape. The render
    arguments in the kernel plan's order (its decode Kernels)."""
    flag = {"erase_before": True} if erase_before else {}
    mod = kernels(FAMILY, rule=rule, decay=decay, reads=reads, **flag, acc=ACC_NAMES[acc])
    return (getattr(mod, f"{mod.NAME}_kernel"), *blocks(K, V, programs, device))


def launch(queries: list[torch.Tensor], qs: torch.Tensor | None, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None,
           g: torch.Tensor | None, h0: torch.Tensor, cu_seqlens: torch.Tensor | None, rule: str, decay: str, reads: str,
           out_dtype: torch.dtype, norms: list[bool] | None = None, at: torch.Tensor | None = None, ct: torch.Tensor | None = None,
           af: torch.Tensor | None = None, cf: torch.Tensor | None = None, erase_before: bool = False, in_place: bool = False) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Run the kernel: o [R, B, T, H, V] in out_dtype (one slab per read) and the final state [N, H, K, V] in h0's dtype.

    The key-side operands' forms (runtime.scan.KeyForm): norms, whether to l2-normalise each query, then a and c; at,
    ct per-token scalars [B, T, H] and af, cf per-head factors [H] of a and c (None: none). erase_before: the delta
    rule's erase reads the state before the token's decay (the template's flag). in_place: the final state is written
    over h0 (float32 and contiguous), which is returned as it."""
    B, T, H, K = a.shape
    V = b.shape[-1]
    N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    device = b.device
    kernel, BK, BV, warps = _kernel(rule, decay, reads, erase_before, h0.dtype, K, V, N * H, device)
    o = torch.empty(len(queries), B, T, H, V, dtype=out_dtype, device=device)
    ht = h0 if in_place else torch.empty(N, H, K, V, dtype=h0.dtype, device=device)
    strides = [s for x in (*queries, a, b, c, g) for s in _strides(x)]
    norms = norms or [False] * (len(queries) + 2)
    tokens = [s for x in (at, ct) for s in (x.expand(B, T, H).stride() if x is not None else (0, 0, 0))]
    kernel[(-(-V // BV), N * H)](
        *queries, qs, a, b, c, g, h0, o, ht, cu_seqlens, T, B * T * H * V, *strides,
        *(x if x is not None else h0 for x in (at, ct, af, cf)), *tokens,  # h0: a pointer never read
        H=H, K=K, V=V, BK=BK, BV=BV, USE_QS=qs is not None, IS_VARLEN=cu_seqlens is not None,
        **{f"NORM_Q{i}": n for i, n in enumerate(norms[:-2])}, NORM_A=norms[-2], NORM_C=norms[-1],
        USE_AT=at is not None, USE_CT=ct is not None, USE_AF=af is not None, USE_CF=cf is not None, num_warps=warps,
    )  # fmt: skip
    return o, ht


@torch.library.custom_op(f"{NAMESPACE}::recurrent_scan", mutates_args=())
def recurrent_scan(queries: list[torch.Tensor], qs: torch.Tensor | None, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None,
                   g: torch.Tensor | None, h0: torch.Tensor, cu_seqlens: torch.Tensor | None, rule: str, decay: str, reads: str,
                   out_dtype: torch.dtype, norms: list[bool] | None = None, at: torch.Tensor | None = None, ct: torch.Tensor | None = None,
                   af: torch.Tensor | None = None, cf: torch.Tensor | None = None, erase_before: bool = False) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """S <- D_t S;  S <- S + a_t (b_t + S^T c_t)^T;  o_t = (qs q_t)^T S at each read's position, token by token
    (erase_before: S^T c_t reads the state before D_t).

    queries: one [B, T, H, K] per read (positions `reads`, joined by "_"); qs: per-head query factors [R, H] or None;
    a, c: [B, T, H, K]; b: [B, T, H, V]; g: [B, T, H, 1] (scalar), [.., K] (key) or [.., V] (value), each in any
    dtype and with any strides (broadcast operands need no copy); the key-side operands' forms as `launch` takes
    them. Forward only: the chunk kernels serve autograd."""
    return launch(queries, qs, a, b, c, g, h0, cu_seqlens, rule, decay, reads, out_dtype, norms, at, ct, af, cf, erase_before)


@recurrent_scan.register_fake
def _(queries, qs, a, b, c, g, h0, cu_seqlens, rule, decay, reads, out_dtype, norms=None, at=None, ct=None, af=None, cf=None, erase_before=False):
    B, T, H, K = a.shape
    N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    return b.new_empty(len(queries), B, T, H, b.shape[-1], dtype=out_dtype), h0.new_empty(N, H, K, b.shape[-1])


@torch.library.custom_op(f"{NAMESPACE}::recurrent_scan_into", mutates_args=("h0",))
def recurrent_scan_into(queries: list[torch.Tensor], qs: torch.Tensor | None, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None,
                        g: torch.Tensor | None, h0: torch.Tensor, cu_seqlens: torch.Tensor | None, rule: str, decay: str, reads: str,
                        out_dtype: torch.dtype, norms: list[bool] | None = None, at: torch.Tensor | None = None, ct: torch.Tensor | None = None,
                        af: torch.Tensor | None = None, cf: torch.Tensor | None = None, erase_before: bool = False) -> torch.Tensor:  # fmt: skip
    """recurrent_scan with its final state written over h0 (float32, contiguous): o alone. A traced call whose states
    are updated in place (runtime.scan.STATES_IN_PLACE, a graphed decoder's) declares so, which the functional op
    cannot."""
    return launch(queries, qs, a, b, c, g, h0, cu_seqlens, rule, decay, reads, out_dtype, norms, at, ct, af, cf, erase_before, in_place=True)[0]


@recurrent_scan_into.register_fake
def _(queries, qs, a, b, c, g, h0, cu_seqlens, rule, decay, reads, out_dtype, norms=None, at=None, ct=None, af=None, cf=None, erase_before=False):
    B, T, H, _ = a.shape
    return b.new_empty(len(queries), B, T, H, b.shape[-1], dtype=out_dtype)


def scan(ops: ScanOperands, dtype: torch.dtype, in_place: bool = False) -> tuple[list[torch.Tensor], torch.Tensor]:
    """One state's scan on the recurrent kernel: ([o per read] in `dtype`, final state in float32, float64 when
    the inputs are). Operands go in as they are, in their dtype and strides: the kernel converts as it loads. A scan
    given ops.c_before runs with every erase reading the state before its sub-token's decay (as kernels/delta.py's).
    in_place: the final state is written over ops.h0 where that is already the state's dtype and contiguous
    (runtime.scan.STATES_IN_PLACE; the caller reads it when it chooses the implementation)."""
    ops = ops.per_row()
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    queries = [q for q, _ in ops.reads]
    factors = ops.query_factors
    if len(factors) == 1:
        qs = factors[0]
        qs = None if qs is None else (qs if qs.dtype == acc else qs.to(acc)).contiguous()
    elif all(f is None for f in factors):
        qs = None
    else:
        qs = torch.stack([f.to(acc) if f is not None else torch.ones(ops.a.shape[2], dtype=acc, device=ops.a.device) for f in factors])
    h0 = (ops.h0 if ops.h0.dtype == acc else ops.h0.to(acc)).contiguous()
    rule = "additive" if ops.c is None else "delta"
    args = (queries, qs, ops.a, ops.b, ops.c, ops.g, h0, ops.cu_seqlens, rule, ops.decay, ops.positions, dtype)
    if ops.forms:  # key-side operands the kernel finishes (runtime.scan.KeyForm)
        none = KeyForm()
        fa, fc = ops.forms.get("a", none), ops.forms.get("c", none)
        norms = [ops.forms.get(f"q{i}", none).norm for i in range(len(queries))] + [fa.norm, fc.norm]
        factors = [None if f.factor is None else (f.factor if f.factor.dtype == acc else f.factor.to(acc)).contiguous() for f in (fa, fc)]
        args += (norms, fa.token, fc.token, *factors)
    # without a decay, before and after it are one state
    flag = {"erase_before": True} if ops.c_before is not None and ops.decay != "none" and ops.c is not None else {}
    in_place = in_place and ops.h0.dtype == acc and ops.h0.is_contiguous()  # else h0 is a copy: written, then returned
    if not torch.compiler.is_compiling():  # eager calls skip the custom ops' dispatch (they serve torch.compile's tracing)
        o, ht = launch(*args, **flag, in_place=in_place)
    elif in_place:
        o, ht = recurrent_scan_into(*args, **flag), h0
    else:
        o, ht = recurrent_scan(*args, **flag)
    return ([o[0]] if len(queries) == 1 else list(o.unbind(0))), ht
