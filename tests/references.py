"""Naive token-by-token float64 references for the lamixer mixers.

Independent of ``lamixer``: every function is written straight from the
published recurrence, loops over time, and uses only differentiable,
out-of-place torch ops (so plain autograd gives reference gradients).

Layouts: per-token vectors ``[B, T, H, D]``, per-token scalars ``[B, T, H]``,
per-head params ``[H, D]`` / ``[H]``.  Output ``o``: ``[B, T, H, V]``.
Matrix states ``[B, H, K, V]``, vector states ``[B, H, K]``.

Every function returns ``(o, final_states)`` with ``final_states`` a tuple
(one tensor per state), and accepts ``initial_state`` as ``None`` (zeros),
a tensor (one-state mixers) or a tuple of tensors.
"""
import torch
import torch.nn.functional as F

__all__ = [
    "linear_attn", "retnet", "simple_gla", "gla", "hgrn2", "metala", "rwkv6",
    "deltanet", "gated_deltanet", "gsa", "lln", "mamba2",
    "REFERENCES", "run_varlen",
]

DT = torch.float64


# ----------------------------------------------------------------- helpers
def _f64(*xs):
    return [x.to(DT) for x in xs]


def _init(initial_state, *shapes):
    """Initial states as float64 (zeros when ``initial_state`` is None)."""
    if initial_state is None:
        return [torch.zeros(s, dtype=DT) for s in shapes]
    if isinstance(initial_state, torch.Tensor):
        initial_state = (initial_state,)
    assert len(initial_state) == len(shapes)
    out = []
    for s, shape in zip(initial_state, shapes):
        assert tuple(s.shape) == tuple(shape), (tuple(s.shape), shape)
        out.append(s.to(DT))
    return out


def _outer(a, b):
    """[B,H,K] x [B,H,V] -> [B,H,K,V]."""
    return a[..., :, None] * b[..., None, :]


def _read(q, S):
    """q^T S : [B,H,K] x [B,H,K,V] -> [B,H,V]."""
    return torch.einsum("bhk,bhkv->bhv", q, S)


def _decayed_outer_recurrence(q, k, v, decay, scale, S0):
    """S_t = diag(decay_t) S_{t-1} + k_t v_t^T ;  o_t = scale * q_t^T S_t.

    decay: [B, T, H, K] (multiplicative, already exponentiated).
    """
    S, outs = S0, []
    for t in range(q.shape[1]):
        S = decay[:, t, :, :, None] * S + _outer(k[:, t], v[:, t])
        outs.append(scale * _read(q[:, t], S))
    return torch.stack(outs, 1), S


def _default_scale(scale, K):
    return K ** -0.5 if scale is None else float(scale)


# ---------------------------------------------------------------- mixers
def linear_attn(q, k, v, scale=None, initial_state=None):
    """S_t = S_{t-1} + k_t v_t^T ;  o_t = scale q_t^T S_t   (scale = K^-0.5)."""
    q, k, v = _f64(q, k, v)
    B, T, H, K = q.shape
    (S0,) = _init(initial_state, (B, H, K, v.shape[-1]))
    ones = torch.ones(B, T, H, K, dtype=DT)
    o, S = _decayed_outer_recurrence(q, k, v, ones, _default_scale(scale, K), S0)
    return o, (S,)


def retnet(q, k, v, scale=None, initial_state=None):
    """S_t = gamma_h S_{t-1} + k_t v_t^T, gamma_h = 1 - 2^(-5-h) ; o_t = scale q_t^T S_t."""
    q, k, v = _f64(q, k, v)
    B, T, H, K = q.shape
    (S0,) = _init(initial_state, (B, H, K, v.shape[-1]))
    gamma = 1.0 - 2.0 ** (-5.0 - torch.arange(H, dtype=DT))
    decay = gamma[None, None, :, None].expand(B, T, H, K)
    o, S = _decayed_outer_recurrence(q, k, v, decay, _default_scale(scale, K), S0)
    return o, (S,)


def simple_gla(q, k, v, g, scale=None, initial_state=None):
    """S_t = exp(g_t) S_{t-1} + k_t v_t^T (g_t scalar per head) ; o_t = scale q_t^T S_t."""
    q, k, v, g = _f64(q, k, v, g)
    B, T, H, K = q.shape
    (S0,) = _init(initial_state, (B, H, K, v.shape[-1]))
    decay = torch.exp(g)[..., None].expand(B, T, H, K)
    o, S = _decayed_outer_recurrence(q, k, v, decay, _default_scale(scale, K), S0)
    return o, (S,)


def gla(q, k, v, g, scale=None, initial_state=None):
    """S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T (g_t in R^K) ; o_t = scale q_t^T S_t."""
    q, k, v, g = _f64(q, k, v, g)
    B, T, H, K = q.shape
    (S0,) = _init(initial_state, (B, H, K, v.shape[-1]))
    o, S = _decayed_outer_recurrence(q, k, v, torch.exp(g), _default_scale(scale, K), S0)
    return o, (S,)


def hgrn2(q, g, v, scale=None, initial_state=None):
    """k_t = 1 - exp(g_t) ; S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T ; o_t = scale q_t^T S_t."""
    q, g, v = _f64(q, g, v)
    B, T, H, K = q.shape
    (S0,) = _init(initial_state, (B, H, K, v.shape[-1]))
    k = 1.0 - torch.exp(g)
    o, S = _decayed_outer_recurrence(q, k, v, torch.exp(g), _default_scale(scale, K), S0)
    return o, (S,)


def metala(q, g, v, w_aug, scale=None, initial_state=None):
    """HGRN2 core plus self-augmentation:
    k_t = 1 - exp(g_t) ; S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T ;
    o_t = scale q_t^T S_t + sigmoid((q_t . (w_aug_h * k_t)) v_t).
    """
    q, g, v, w_aug = _f64(q, g, v, w_aug)
    B, T, H, K = q.shape
    (S0,) = _init(initial_state, (B, H, K, v.shape[-1]))
    k = 1.0 - torch.exp(g)
    o, S = _decayed_outer_recurrence(q, k, v, torch.exp(g), _default_scale(scale, K), S0)
    aug = (q * w_aug[None, None] * k).sum(-1, keepdim=True)   # [B,T,H,1], q unscaled
    return o + torch.sigmoid(aug * v), (S,)


def rwkv6(r, k, w, v, u, scale=None, initial_state=None):
    """o_t = scale r_t^T (S_{t-1} + diag(u_h) k_t v_t^T)   (read before update, bonus u) ;
    S_t = diag(exp(w_t)) S_{t-1} + k_t v_t^T.
    """
    r, k, w, v, u = _f64(r, k, w, v, u)
    B, T, H, K = r.shape
    (S,) = _init(initial_state, (B, H, K, v.shape[-1]))
    scale = _default_scale(scale, K)
    outs = []
    for t in range(T):
        kv = _outer(k[:, t], v[:, t])
        outs.append(scale * _read(r[:, t], S + u[None, :, :, None] * kv))
        S = torch.exp(w[:, t])[..., None] * S + kv
    return torch.stack(outs, 1), (S,)


def deltanet(q, k, v, beta, scale=None, initial_state=None):
    """q, k <- q/||q||, k/||k|| ;
    S_t = S_{t-1} + beta_t k_t (v_t - S_{t-1}^T k_t)^T ; o_t = scale q_t^T S_t.
    """
    q, k, v, beta = _f64(q, k, v, beta)
    B, T, H, K = q.shape
    (S,) = _init(initial_state, (B, H, K, v.shape[-1]))
    scale = _default_scale(scale, K)
    q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    outs = []
    for t in range(T):
        kt, bt = k[:, t], beta[:, t, :, None]
        v_old = _read(kt, S)                               # S^T k : [B,H,V]
        S = S + _outer(kt, bt * (v[:, t] - v_old))
        outs.append(scale * _read(q[:, t], S))
    return torch.stack(outs, 1), (S,)


def gated_deltanet(q, k, v, g, beta, scale=None, initial_state=None):
    """q, k <- q/||q||, k/||k|| ;
    S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T ; o_t = scale q_t^T S_t.
    """
    q, k, v, g, beta = _f64(q, k, v, g, beta)
    B, T, H, K = q.shape
    (S,) = _init(initial_state, (B, H, K, v.shape[-1]))
    scale = _default_scale(scale, K)
    q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    outs = []
    for t in range(T):
        kt, bt, at = k[:, t], beta[:, t, :, None, None], torch.exp(g[:, t])[..., None, None]
        S = at * (S - bt * _outer(kt, _read(kt, S))) + bt * _outer(kt, v[:, t])
        outs.append(scale * _read(q[:, t], S))
    return torch.stack(outs, 1), (S,)


def gsa(q, k, v, s, g, scale=None, initial_state=None):
    """Gated slot attention, states Kt [K,M], Vt [M,V]:
    Kt_t = Kt_{t-1} diag(exp g_t) + k_t s_t^T ; p_t = softmax_M(scale q_t^T Kt_t) ;
    Vt_t = diag(exp g_t) Vt_{t-1} + s_t v_t^T ; o_t = p_t^T Vt_t.
    """
    q, k, v, s, g = _f64(q, k, v, s, g)
    B, T, H, K = q.shape
    M, V = s.shape[-1], v.shape[-1]
    Kt, Vt = _init(initial_state, (B, H, K, M), (B, H, M, V))
    scale = _default_scale(scale, K)
    outs = []
    for t in range(T):
        a = torch.exp(g[:, t])                               # [B,H,M]
        Kt = Kt * a[:, :, None, :] + _outer(k[:, t], s[:, t])
        p = torch.softmax(scale * _read(q[:, t], Kt), dim=-1)   # [B,H,M]
        Vt = a[..., None] * Vt + _outer(s[:, t], v[:, t])
        outs.append(_read(p, Vt))
    return torch.stack(outs, 1), (Kt, Vt)


LLN_A = 0.14855178144710912
LLN_B = -0.35487039130661086


def lln(q, k, v, scale=None, initial_state=None):
    """Linear log-normal attention (+ block-diagonal softmax), states S [K,V], z [K].

    sigma_q = std(q), sigma_k = std(k) over the whole tensor (Bessel) ;
    sigma~^2 = (sigma_q^2 sigma_k^2 - b) / (2a) ; alpha = sigma~/sigma_q, beta = sigma~/sigma_k (detached) ;
    phi_q = exp(alpha q - max_K(alpha q)) ; phi_k = exp(beta k - c), c = max_{t,K}(beta k) per (b,h), detached ;
    S_t = S_{t-1} + phi_k v^T ; z_t = z_{t-1} + phi_k ; o_lln = phi_q^T S_t / (phi_q^T z_t + 1e-5) ;
    o_diag = softmax attention (scale q.k) restricted to j <= t, floor(j/K) == floor(t/K) ;
    o = (o_lln + o_diag) / 2.
    """
    q, k, v = _f64(q, k, v)
    B, T, H, K = q.shape
    S, z = _init(initial_state, (B, H, K, v.shape[-1]), (B, H, K))
    scale = _default_scale(scale, K)

    sq, sk = q.std(), k.std()
    sig = torch.sqrt((sq ** 2 * sk ** 2 - LLN_B) / (2 * LLN_A))
    alpha, beta = (sig / sq).detach(), (sig / sk).detach()
    aq = alpha * q
    phi_q = torch.exp(aq - aq.amax(-1, keepdim=True))
    bk = beta * k
    phi_k = torch.exp(bk - bk.amax(dim=(1, 3), keepdim=True).detach())

    outs = []
    for t in range(T):
        S = S + _outer(phi_k[:, t], v[:, t])
        z = z + phi_k[:, t]
        pq = phi_q[:, t]
        o_lln = _read(pq, S) / ((pq * z).sum(-1, keepdim=True) + 1e-5)
        j0 = (t // K) * K                                       # block start
        sc = scale * torch.einsum("bhk,bjhk->bhj", q[:, t], k[:, j0:t + 1])
        p = torch.softmax(sc, dim=-1)
        o_diag = torch.einsum("bhj,bjhv->bhv", p, v[:, j0:t + 1])
        outs.append((o_lln + o_diag) / 2)
    return torch.stack(outs, 1), (S, z)


def mamba2(x, B_, C, dt, A_log, D, dt_bias, scale=None, initial_state=None):
    """Mamba-2 SSD, state S [N,P]:
    delta_t = softplus(dt_t + dt_bias_h) ; S_t = exp(-exp(A_log_h) delta_t) S_{t-1} + delta_t B_t x_t^T ;
    y_t = scale C_t^T S_t + D_h x_t   (scale = 1.0).
    """
    x, B_, C, dt, A_log, D, dt_bias = _f64(x, B_, C, dt, A_log, D, dt_bias)
    Bsz, T, H, P = x.shape
    N = B_.shape[-1]
    (S,) = _init(initial_state, (Bsz, H, N, P))
    scale = 1.0 if scale is None else float(scale)
    delta = F.softplus(dt + dt_bias)                            # [B,T,H]
    decay = torch.exp(-torch.exp(A_log) * delta)                # [B,T,H]
    outs = []
    for t in range(T):
        S = decay[:, t, :, None, None] * S + _outer(delta[:, t, :, None] * B_[:, t], x[:, t])
        outs.append(scale * _read(C[:, t], S) + D[None, :, None] * x[:, t])
    return torch.stack(outs, 1), (S,)


REFERENCES = {
    "linear_attn": linear_attn, "retnet": retnet, "simple_gla": simple_gla,
    "gla": gla, "hgrn2": hgrn2, "metala": metala, "rwkv6": rwkv6,
    "deltanet": deltanet, "gated_deltanet": gated_deltanet, "gsa": gsa,
    "lln": lln, "mamba2": mamba2,
}


# ----------------------------------------------------------------- varlen
def run_varlen(ref_fn, cu_seqlens, *tensors, initial_state=None, **kwargs):
    """Run ``ref_fn`` on each packed sequence of a ``B == 1`` batch separately.

    Tensors with >= 3 dims are per-token ``[1, T, ...]`` and get sliced along
    time; tensors with <= 2 dims are per-head params and are passed whole.
    ``initial_state`` (tensor or tuple) has one row per sequence: ``[N, ...]``.
    Returns ``o`` ``[1, T, H, V]`` (concatenated) and final states ``[N, ...]``.
    """
    cu = [int(c) for c in cu_seqlens]
    for x in tensors:
        if x.dim() >= 3:
            assert x.shape[0] == 1, "varlen needs B == 1"
    if isinstance(initial_state, torch.Tensor):
        initial_state = (initial_state,)
    outs, finals = [], []
    for i, (a, b) in enumerate(zip(cu[:-1], cu[1:])):
        args = [x[:, a:b] if x.dim() >= 3 else x for x in tensors]
        init = None if initial_state is None else tuple(s[i:i + 1] for s in initial_state)
        o, fs = ref_fn(*args, initial_state=init, **kwargs)
        outs.append(o)
        finals.append(fs)
    states = tuple(torch.cat([f[j] for f in finals], 0) for j in range(len(finals[0])))
    return torch.cat(outs, 1), states
