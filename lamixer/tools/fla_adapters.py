"""FLA's kernels called on a spec's inputs where FLA's arguments are not those inputs as they are (competitors.json
names these functions as its peers; each imports FLA when called, so nothing here needs FLA to import).

- Gated DeltaProduct: FLA takes the n Householder steps' keys, values and write strengths interleaved along time
  ([B, T * n, H, *]: step i of token t at t * n + i), q and the decay per token; its decode (as its layer decodes)
  runs the gated delta rule over those n * T sub-tokens with the decay at each token's first and the query at its
  last, the output taken there.
- RWKV-7: FLA's diagonal-plus-low-rank update is S_t = diag(exp(w_t)) S_{t-1} + b_t (a_t^T S_{t-1}) + k_t v_t^T,
  o_t = scale r_t^T S_t; lamixer's spec writes outer(-(alpha * kh), kh @ S) with kh = l2norm(kappa), so a = -kh and
  b = kh * alpha (RWKV-7's own convention). FLA's op leaves the bonus (r . (r_k * k)) v to its layer: it is added
  here, as the spec's output has it.
- Mamba-2 (SSD): FLA's scalar-decay op, simple GLA, with q = C, k = delta B, v = x and the log decay
  -exp(A_log) delta, delta = softplus(dt + dt_bias), scale 1; the D skip is added here, as the spec's output has it.
- HGRN2: FLA runs it as its layer does, gated linear attention with the key tied to the forget gate, k = 1 - exp(g)
  (the spec's `let k`), made here from g.

Every step is a torch operation on the inputs, so the bench's gradient check reaches each of them.
"""
from __future__ import annotations

import importlib

import torch
import torch.nn.functional as F


def _fla(module: str, name: str):
    return getattr(importlib.import_module(module), name)


def _interleave(xs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """[B, T, H, ...] per step -> [B, T * n, H, ...], step i of token t at t * n + i."""
    x = torch.stack(xs, 2)
    return x.reshape(x.shape[0], x.shape[1] * x.shape[2], *x.shape[3:])


def _householder_steps(steps: tuple[torch.Tensor, ...]) -> tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(n, k, v, beta) interleaved from (k_1, v_1, beta_1, .., k_n, v_n, beta_n)."""
    if len(steps) % 3:
        raise ValueError(f"expected (k, v, beta) per Householder step, got {len(steps)} tensors")
    return len(steps) // 3, *(_interleave(steps[i::3]) for i in range(3))


def gated_delta_product_chunk(q: torch.Tensor, *steps_and_g: torch.Tensor, **kwargs):
    """fla.ops.gated_delta_product.chunk_gated_delta_product on (q, k_1, v_1, beta_1, .., k_n, v_n, beta_n, g): q and
    the keys l2-normalised in FLA's kernel, FLA's default scale K^-0.5."""
    *steps, g = steps_and_g
    n, k, v, beta = _householder_steps(tuple(steps))
    fn = _fla("fla.ops.gated_delta_product", "chunk_gated_delta_product")
    return fn(q, k, v, g, beta, num_householder=n, use_qk_l2norm_in_kernel=True, **kwargs)


def gated_delta_product_recurrent(q: torch.Tensor, *steps_and_g: torch.Tensor, **kwargs):
    """fla.ops.gated_delta_rule.fused_recurrent_gated_delta_rule over the n * T sub-tokens of the same arguments as
    gated_delta_product_chunk: (o at each token's last sub-token, final state)."""
    *steps, g = steps_and_g
    n, k, v, beta = _householder_steps(tuple(steps))
    zero_g, zero_q = torch.zeros_like(g), torch.zeros_like(q)
    g_sub = _interleave((g, *[zero_g] * (n - 1)))
    q_sub = _interleave((*[zero_q] * (n - 1), q))
    fn = _fla("fla.ops.gated_delta_rule", "fused_recurrent_gated_delta_rule")
    cu = kwargs.pop("cu_seqlens", None)
    o, state = fn(q_sub, k, v, g_sub, beta, use_qk_l2norm_in_kernel=True, cu_seqlens=None if cu is None else cu * n, **kwargs)
    return o[:, n - 1 :: n], state


def _rwkv7(fn, r, w, k, v, kappa, alpha, r_k, **kwargs):
    kh = F.normalize(kappa, dim=-1)
    o, state = fn(r, w, k, v, -kh, kh * alpha, **kwargs)
    bonus = (r * r_k * k).sum(-1, keepdim=True) * v  # r_k: [H, K], the spec's param
    return o + bonus.to(o.dtype), state


def rwkv7_chunk(r, w, k, v, kappa, alpha, r_k, **kwargs):
    """fla.ops.rwkv7.chunk_rwkv7 (w a log decay) on the rwkv7 spec's inputs, with its bonus: (o, final state)."""
    return _rwkv7(_fla("fla.ops.rwkv7", "chunk_rwkv7"), r, w, k, v, kappa, alpha, r_k, **kwargs)


def rwkv7_recurrent(r, w, k, v, kappa, alpha, r_k, **kwargs):
    """fla.ops.rwkv7.fused_recurrent_rwkv7 on the same arguments as rwkv7_chunk (whose scale defaults to K^-0.5,
    chunk_rwkv7's to 1: the entry gives it)."""
    return _rwkv7(_fla("fla.ops.rwkv7", "fused_recurrent_rwkv7"), r, w, k, v, kappa, alpha, r_k, **kwargs)


def _hgrn2(fn, q, g, v, **kwargs):
    return fn(q, 1 - torch.exp(g), v, g, **kwargs)


def hgrn2_chunk(q, g, v, **kwargs):
    """fla.ops.gla.chunk_gla on the hgrn2 spec's inputs, its key made from the forget gate: (o, final state)."""
    return _hgrn2(_fla("fla.ops.gla", "chunk_gla"), q, g, v, **kwargs)


def hgrn2_recurrent(q, g, v, **kwargs):
    """fla.ops.gla.fused_recurrent_gla (its log decay along the keys, gk) on the same arguments as hgrn2_chunk."""
    fn = _fla("fla.ops.gla", "fused_recurrent_gla")
    return _hgrn2(lambda q, k, v, g, **kw: fn(q, k, v, gk=g, **kw), q, g, v, **kwargs)


def _mamba2(fn, x, B, C, dt, A_log, D, dt_bias, **kwargs):
    delta = F.softplus(dt.float() + dt_bias.float())  # [B, T, H]; dt_bias, A_log, D: [H], the spec's params
    g = -torch.exp(A_log.float()) * delta
    o, state = fn(C, (B * delta[..., None]).to(B.dtype), x, g, scale=1.0, **kwargs)
    return o + (D[:, None] * x).to(o.dtype), state


def mamba2_chunk(x, B, C, dt, A_log, D, dt_bias, **kwargs):
    """fla.ops.simple_gla.chunk_simple_gla on the mamba2 spec's inputs, with its D skip: (o, final state)."""
    return _mamba2(_fla("fla.ops.simple_gla", "chunk_simple_gla"), x, B, C, dt, A_log, D, dt_bias, **kwargs)


def mamba2_recurrent(x, B, C, dt, A_log, D, dt_bias, **kwargs):
    """fla.ops.simple_gla.fused_recurrent_simple_gla on the same arguments as mamba2_chunk."""
    return _mamba2(_fla("fla.ops.simple_gla", "fused_recurrent_simple_gla"), x, B, C, dt, A_log, D, dt_bias, **kwargs)
