"""Several writes per token, the generalized delta rule, vector states read whole and matrix params.

Each form: the interpreter against a per-token reference written here from the paper's equations (so
the oracle itself is checked), the torch backend against the interpreter in float64 (outputs, final
states, every gradient, params and initial states included; odd lengths, strong and weak decays,
packed sequences), the Triton backend refusing what it has no kernel for (tests/test_triton_multi_write.py checks
what it runs), and the errors for what stays outside the language.
"""
import pytest
import torch

import lamixer
from lamixer.tools.check import compare, forward_backward, random_call, rel_rms

TOL = 1e-9

# the table, row by row: each was refused, each is now in the language
GENERALIZED = """mixer generalized
dims K, V
input r[K], w[K] in (-inf, 0), k[K], v[V], a[K], b[K]
state S[K, V]
S = {decay}S + outer(b, a @ S) + outer(k, v)
out o = scale * r @ S
"""
TWO_STATEMENTS = """mixer two_statements
dims K, V
input r[K], w[] in (-inf, 0), k[K], v[V], a[K], b[K]
state S[K, V]
S = exp(w) * S
S = S + outer(b, a @ S) + outer(k, v)
out o = scale * r @ S
"""
DELTA_PRODUCT = """mixer delta_product
dims K, V
input q[K], k1[K], v1[V], b1[] in (0, 1), k2[K], v2[V], b2[] in (0, 1), k3[K], v3[V], b3[] in (0, 1), g[K] in (-inf, 0)
state S[K, V]
let kn1 = l2norm(k1)
let kn2 = l2norm(k2)
let kn3 = l2norm(k3)
S = exp(g) * S
S = S + outer(b1 * kn1, v1 - kn1 @ S)
let mid = q @ S
S = S + outer(b2 * kn2, v2 - kn2 @ S)
S = S + outer(b3 * kn3, v3 - kn3 @ S)
out o = scale * q @ S + mid
"""
HGRN = """mixer hgrn
dims V
input i[V], g[V] in (-inf, 0)
state hs[V]
hs = exp(g) * hs + (1 - exp(g)) * i
out o = hs
"""
HEDGEHOG = """mixer hedgehog
dims K, V, M
input q[K], k[K], v[V]
param W[H, K, M]
state S[M, V]
let pk = softmax(k @ W)
S = S + outer(pk, v)
out o = scale * softmax(q @ W) @ S
"""
# a decay between two writes, and a vector normaliser written twice
INTERLEAVED = """mixer interleaved
dims K, V
input q[K], k[K], v[V], u[V], g[] in (-inf, 0), beta[] in (0, 1)
state S[K, V], z[K]
S = S + outer(k, v)
S = exp(g) * S
S = S + outer(beta * k, u - k @ S)
z = z + k
z = exp(g) * z + q
out o = (q @ S) / (1 + q @ z)
"""


def _assert_close(c, what):
    bad = {k: f"{v:.2e}" for k, v in c.errors.items() if not v < TOL}
    assert not bad, f"{what}: {bad}"


# ---- per-token references, from the papers' equations ----
def _sequences(tensors, cu):
    """(batch row, start, end) of every sequence."""
    B, T = next(iter(tensors.values())).shape[:2]
    return [(b, 0, T) for b in range(B)] if cu is None else [(0, s, e) for s, e in zip(cu[:-1], cu[1:])]


def _l2(x):
    return x / x.norm(dim=-1, keepdim=True).clamp_min(1e-12)


def _run(step, tensors, h0, cu=None, params=()):
    """o [B, T, H, *] and the final states [N, H, *]: step(token t's inputs and the params, per head; state) -> (o_t,
    state)."""
    outs, finals = {}, []
    for n, (b, s, e) in enumerate(_sequences(tensors, cu)):
        state = h0[n]
        for t in range(s, e):
            x = {k: v if k in params else v[b, t] for k, v in tensors.items()}
            outs[(b, t)], state = step(x, state)
        finals.append(state)
    B, T = next(iter(tensors.values())).shape[:2]
    o = torch.stack([torch.stack([outs[(b, t)] for t in range(T)]) for b in range(B)])
    return o, torch.stack(finals)


def rwkv7_step(scale):
    """RWKV-7 (Peng et al., 2025) in its own layout, state [V, K]: wkv_t = wkv_{t-1} (diag(w_t) - kh^T (a kh)) + v^T k,
    o = wkv_t r + (r . (r_k k)) v, per head."""

    def step(x, wkv):
        kh = _l2(x["kappa"])
        trans = torch.diag_embed(torch.exp(x["w"])) - kh.unsqueeze(-1) * (x["alpha"] * kh).unsqueeze(-2)  # [H, K, K]
        wkv = wkv.transpose(-1, -2) @ trans + x["v"].unsqueeze(-1) * x["k"].unsqueeze(-2)  # [H, V, K]
        o = scale * (wkv @ x["r"].unsqueeze(-1)).squeeze(-1) + (x["r"] * x["r_k"] * x["k"]).sum(-1, keepdim=True) * x["v"]
        return o, wkv.transpose(-1, -2)

    return step


def deltaproduct_step(scale, n_h):
    """Gated DeltaProduct (Siems et al., 2025): S <- exp(g) S, then per Householder step i
    S <- (I - beta_i k_i k_i^T) S + beta_i k_i v_i^T; o = scale * l2norm(q)^T S."""

    def step(x, S):
        S = torch.exp(x["g"])[:, None, None] * S
        for i in range(1, n_h + 1):
            k = _l2(x[f"k{i}"])
            beta = x[f"beta{i}"][:, None, None]
            S = S - beta * k.unsqueeze(-1) * (k.unsqueeze(-1) * S).sum(-2, keepdim=True) + beta * k.unsqueeze(-1) * x[f"v{i}"].unsqueeze(-2)
        return scale * (_l2(x["q"]).unsqueeze(-1) * S).sum(-2), S

    return step


def generalized_step(scale, decay_first):
    """The diagonal-plus-low-rank transition S_t = (D + b a^T) S_{t-1} + k v^T (decay_first: a reads the decayed
    state, S_t = (I + b a^T) D S_{t-1} + k v^T)."""

    def step(x, S):
        D = torch.exp(x["w"]).reshape(x["w"].shape[0], -1, 1)
        read = D * S if decay_first else S
        S = D * S + x["b"].unsqueeze(-1) * (x["a"].unsqueeze(-1) * read).sum(-2, keepdim=True) + x["k"].unsqueeze(-1) * x["v"].unsqueeze(-2)
        return scale * (x["r"].unsqueeze(-1) * S).sum(-2), S

    return step


def hgrn_step(x, h):
    """HGRN (Qin et al., 2023): h_t = f_t h_{t-1} + (1 - f_t) i_t, o_t = h_t."""
    f = torch.exp(x["g"])
    h = f * h + (1 - f) * x["i"]
    return h, h


def hedgehog_step(scale, W):
    """Hedgehog's learned feature map (Zhang et al., 2024), phi(x) = softmax(x W) per head, in linear attention."""

    def step(x, S):
        pk, pq = (torch.softmax(torch.einsum("hk,hkm->hm", x[n], W), -1) for n in ("k", "q"))
        S = S + pk.unsqueeze(-1) * x["v"].unsqueeze(-2)
        return scale * (pq.unsqueeze(-1) * S).sum(-2), S

    return step


def _interpreter(m, tensors, states, cu=None):
    o, f = m(**tensors, initial_state=states[0], output_final_state=True, backend="interpret",
             cu_seqlens=None if cu is None else torch.tensor(cu))  # fmt: skip
    return o, f


@pytest.mark.parametrize("cu", [None, [0, 5, 6, 30]])
def test_rwkv7_interpreter_matches_the_paper(cu):
    m = lamixer.load("rwkv7")
    tensors, states = random_call(m, B=2, T=23, H=2, seed=11, cu_seqlens=cu)
    o, f = _interpreter(m, tensors, states, cu)
    ro, rf = _run(rwkv7_step(1.0), tensors, states[0], cu, params=("r_k",))
    assert rel_rms(o, ro) < 1e-12 and rel_rms(f, rf) < 1e-12


def test_gated_deltaproduct_interpreter_matches_the_paper():
    m = lamixer.load("gated_deltaproduct")
    tensors, states = random_call(m, B=2, T=19, H=2, seed=12)
    o, f = _interpreter(m, tensors, states)
    ro, rf = _run(deltaproduct_step(tensors["q"].shape[-1] ** -0.5, 2), tensors, states[0])
    assert rel_rms(o, ro) < 1e-12 and rel_rms(f, rf) < 1e-12


@pytest.mark.parametrize("text,decay_first", [(GENERALIZED.format(decay="exp(w) * "), False), (TWO_STATEMENTS, True)])
def test_generalized_delta_interpreter_matches_the_transition(text, decay_first):
    m = lamixer.loads(text)
    tensors, states = random_call(m, B=2, T=17, H=2, seed=13)
    tensors["a"], tensors["b"] = tensors["a"] * 0.3, tensors["b"] * 0.3  # a transition of norm about 1
    o, f = _interpreter(m, tensors, states)
    ro, rf = _run(generalized_step(tensors["r"].shape[-1] ** -0.5, decay_first), tensors, states[0])
    assert rel_rms(o, ro) < 1e-12 and rel_rms(f, rf) < 1e-12


def test_hgrn_and_hedgehog_interpreters_match_the_papers():
    m = lamixer.loads(HGRN)
    tensors, states = random_call(m, B=2, T=15, H=2, seed=14)
    o, f = _interpreter(m, tensors, states)
    ro, rf = _run(hgrn_step, tensors, states[0])
    assert rel_rms(o, ro) < 1e-12 and rel_rms(f, rf) < 1e-12
    m = lamixer.loads(HEDGEHOG)
    tensors, states = random_call(m, B=2, T=15, H=2, seed=15)
    o, f = _interpreter(m, tensors, states)
    ro, rf = _run(hedgehog_step(tensors["W"].shape[-1] ** -0.5, tensors["W"]), tensors, states[0], params=("W",))
    assert rel_rms(o, ro) < 1e-12 and rel_rms(f, rf) < 1e-12


# ---- the torch backend against the interpreter ----
SPECS = {
    "rwkv7": "rwkv7",
    "gated_deltaproduct": "gated_deltaproduct",
    "generalized_none": GENERALIZED.format(decay="").replace(", w[K] in (-inf, 0)", ""),
    "two_statements": TWO_STATEMENTS,
    "delta_product_3": DELTA_PRODUCT,
    "hgrn": HGRN,
    "hedgehog": HEDGEHOG,
    "interleaved": INTERLEAVED,
}


def _load(name):
    text = SPECS[name]
    return lamixer.load(text) if text in lamixer.shipped_specs() else lamixer.loads(text)


def _bounded(tensors):
    """Low-rank terms of a generalized transition scaled so the transition has norm about 1 (as RWKV-7's has)."""
    return {k: v * 0.3 if k in ("a", "b") else v for k, v in tensors.items()}


@pytest.mark.parametrize("name", sorted(SPECS))
@pytest.mark.parametrize("T,gate", [(1, "normal"), (37, "strong"), (70, "weak")])
def test_torch_matches_interpreter(name, T, gate):
    m = _load(name)
    tensors, states = random_call(m, B=2, T=T, H=2, gate=gate, seed=T)
    _assert_close(compare(m, "torch", _bounded(tensors), states, seed=T), f"{name} T={T} {gate}")


@pytest.mark.parametrize("name", sorted(SPECS))
def test_torch_packed_matches_interpreter(name):
    m = _load(name)
    cu = [0, 1, 18, 53]
    tensors, states = random_call(m, H=2, cu_seqlens=cu, seed=3)
    _assert_close(compare(m, "torch", _bounded(tensors), states, cu_seqlens=cu, seed=3), f"{name} packed")


def test_every_gradient_is_reached():
    """A comparison of gradients that are None on both sides would pass: they exist, inputs, params and h0."""
    for name in ("rwkv7", "hedgehog", "hgrn"):
        m = _load(name)
        tensors, states = random_call(m, T=9, H=2, seed=1)
        got = forward_backward(m, tensors, states, "torch")
        assert all(v is not None for v in got.values()), [k for k, v in got.items() if v is None]


def test_without_initial_state():
    m = _load("gated_deltaproduct")
    tensors, _ = random_call(m, T=29, H=2, seed=4, initial_state=False)
    _assert_close(compare(m, "torch", tensors, None, seed=4), "no initial state")


def test_strong_decays_stay_exact():
    """Per-token decays of e^-20 between writes: every exponent is a segment sum at ordered sub-tokens."""
    m = _load("rwkv7")
    tensors, states = random_call(m, T=40, H=2, seed=6)
    tensors["w"] = tensors["w"] * 0 - 20.0
    c = compare(m, "torch", tensors, states)
    assert c.worst < 1e-7, c.errors  # d(log decay) sums terms that cancel: as tests/test_torch_backend.py's extreme gates


# ---- the plan, the Triton backend, the layer ----
def test_the_plan_records_the_sub_steps():
    (group,) = lamixer.load("rwkv7").compiled.plan.groups
    assert [(s.decay, s.erase, s.value) for s in group.substeps] == [(True, "before decay", False), (False, None, True)]
    assert group.read_steps == (1,) and group.reads == ("after",) and (group.train.template, group.decode.template) == ("scan_delta", "recurrent")
    (group,) = _load("delta_product_3").compiled.plan.groups
    assert [s.erase for s in group.substeps] == ["decayed"] * 3 and group.read_steps == (0, 2)


@pytest.mark.parametrize("name", ["hgrn"])
def test_triton_refuses_and_auto_runs_torch(name):
    """A vector state read whole has no Triton template (several writes and RWKV-7's write run on the kernels)."""
    m = _load(name)
    tensors, states = random_call(m, T=20, H=2, seed=2, dtype=torch.float32)
    with pytest.raises(lamixer.LamixerError, match="no Triton template"):
        m(**tensors, initial_state=states[0], backend="triton")
    with torch.no_grad():
        auto = m(**tensors, initial_state=states[0], backend="auto")[0]
        torch_o = m(**tensors, initial_state=states[0], backend="torch")[0]
    assert torch.equal(auto, torch_o)


MATRIX_PARAM_LAYER = HEDGEHOG + """
layer
  size K = hidden / H, V = hidden / H, M = 4
  proj q, k, v
  param W[H, K, M] = normal(0, 0.5)
"""


def test_a_layer_initialises_a_matrix_param():
    layer = lamixer.Layer(lamixer.loads(MATRIX_PARAM_LAYER), 16, 2)
    assert layer.params["W"].shape == (2, 8, 4) and layer.params["W"].std() > 0.1
    layer(torch.randn(1, 5, 16)).sum().backward()
    assert layer.params["W"].grad.abs().sum() > 0


# ---- what stays outside the language: the forms, the nearest one, the line and a caret ----
BASE = """mixer outside
dims K, V
input q[K], k[K], v[V], u[V], g[] in (-inf, 0), beta[] in (0, 1)
state S[K, V], z[K]
{body}
z = z + k
out o = scale * q @ S + (q @ z) * (v + u) * (g + beta) + {extra}
"""


@pytest.mark.parametrize("body,extra,where,text", [
    # an erase reading the state before an earlier write of the same token
    ("S = exp(g) * S + outer(k, v) + outer(beta * k, u - k @ S)", "0", "5:52", "put this write first"),
    # a read between two decays of one token
    ("S = exp(g) * S\nlet x = q @ S\nS = exp(g) * S + outer(k, v)", "x", "6:9", "between two of its decays"),
    # a decay after the last write
    ("S = S + outer(k, v)\nS = exp(g) * S", "0", "6:5", "decayed after its last write"),
    # a write that is not linear in the state
    ("S = S + outer(k, exp(k @ S))", "0", "5:18", "a write's value is linear in one read of the state"),
    # a state read in a form the language lacks
    ("S = S + outer(k, v)\nlet n = sum(S)", "n", "6:9", "a state is read as `x @ S`"),
])  # fmt: skip
def test_outside_the_language_names_the_forms(body, extra, where, text):
    with pytest.raises(lamixer.SpecError) as info:
        lamixer.loads(BASE.format(body=body, extra=extra), "m.lam")
    message = str(info.value)
    first, _, caret = message.splitlines()
    assert first.startswith(f"m.lam:{where}: ") and text in first, message
    assert caret.strip() == "^"


def test_the_forms_are_listed_where_a_write_is_outside_the_language():
    with pytest.raises(lamixer.SpecError) as info:
        lamixer.loads(BASE.format(body="S = S + outer(k, exp(k @ S))", extra="0"))
    assert "then writes in order, each `S = S + outer(a, b)` or `S = S + outer(a, b + c @ S)`" in str(info.value)


def test_vector_read_both_ways_and_param_dims():
    both = "mixer m\ndims K\ninput k[K]\nstate z[K]\nz = z + k\nout o = z * (k @ z)"
    with pytest.raises(lamixer.SpecError, match="read it one way"):
        lamixer.loads(both)
    with pytest.raises(lamixer.SpecError, match="at most 2 dims"):
        lamixer.loads("mixer m\ndims K, V, M\ninput k[K], v[V]\nparam W[H, K, M, V]\nstate S[K, V]\nS = S + outer(k, v)\nout o = k @ S")
