"""Several writes per token (DeltaProduct) and the generalized delta rule (RWKV-7) on the Triton kernels, under
TRITON_INTERPRET=1 (set in conftest), against the interpreter in float64.

A token of n writes runs as n sub-tokens of the delta rule's chunk kernels (lamixer.runtime.substeps), a write
whose erase reads the state before its decay on the same kernels rendered with erase_before; decoding runs them on
the recurrent kernel. Each case checks outputs, final states and every gradient (inputs, params, initial states):
odd lengths, strong and weak gates, packed sequences, no decay, a scalar and a per-key decay, reads before, between
and after the writes, n_h = 2 and 3. (tests/test_recurrent.py decodes the shipped specs' layers step by step.)
"""
import pytest
import torch

import lamixer
from lamixer.backends import triton as triton_backend
from lamixer.kernels import delta
from lamixer.tools.check import compare, compare_inference, random_call, rel_rms

TOL = 1e-10  # float64 all the way: measured below 1e-13 (d(log decay) under strong gates, the largest)

# the generalized delta rule under a scalar decay: S_t = (exp(w) I + b a^T) S_{t-1} + k v^T
GENERALIZED = """mixer generalized
dims K, V
input r[K], w[] in (-inf, 0), k[K], v[V], a[K], b[K]
state S[K, V]
S = exp(w) * S + outer(b, a @ S) + outer(k, v)
out o = scale * r @ S
"""
# the same without a decay: two writes, the first a read of the state alone (no value term)
UNDECAYED = """mixer undecayed
dims K, V
input r[K], k[K], v[V], a[K], b[K]
state S[K, V]
S = S + outer(b, a @ S) + outer(k, v)
out o = scale * r @ S
"""
# a read before the update: its query and the erase key both see the decay from the next token on
READ_BEFORE = """mixer read_before
dims K, V
input r[K], w[{dim}] in (-inf, 0), k[K], v[V], a[K], b[K]
state S[K, V]
let o0 = r @ S
S = exp(w) * S + outer(b, a @ S) + outer(k, v)
out o = scale * o0
"""
# n_h = 3 under a decay along the keys
PRODUCT_3 = """mixer product_3
dims K, V
input q[K], k1[K], v1[V], b1[] in (0, 1), k2[K], v2[V], b2[] in (0, 1), k3[K], v3[V], b3[] in (0, 1), g[K] in (-inf, 0)
state S[K, V]
let kn1 = l2norm(k1)
let kn2 = l2norm(k2)
let kn3 = l2norm(k3)
S = exp(g) * S
S = S + outer(b1 * kn1, v1 - kn1 @ S)
S = S + outer(b2 * kn2, v2 - kn2 @ S)
S = S + outer(b3 * kn3, v3 - kn3 @ S)
out o = scale * q @ S
"""
# a read after the decay, before the first write
READ_MID = """mixer read_mid
dims K, V
input q[K], k1[K], v1[V], b1[] in (0, 1), k2[K], v2[V], b2[] in (0, 1), g[] in (-inf, 0)
state S[K, V]
S = exp(g) * S
let m = q @ S
S = S + outer(b1 * k1, v1 - k1 @ S)
S = S + outer(b2 * k2, v2 - k2 @ S)
out o = scale * m
"""
# one write of a read of the decayed state alone: b = 0
READ_ALONE = """mixer read_alone
dims K, V
input r[K], w[] in (-inf, 0), a[K], b[K], v[V]
state S[K, V]
S = exp(w) * S
S = S + outer(b, a @ S)
out o = scale * r @ S + v
"""
# an additive write, then a decay and a delta write; a vector state written twice (the additive kernels)
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
# two reads of one state: the recurrent kernel decodes it, no chunk template trains it
TWO_READS = """mixer two_reads
dims K, V
input q[K], k1[K], v1[V], b1[] in (0, 1), k2[K], v2[V], b2[] in (0, 1), g[] in (-inf, 0)
state S[K, V]
S = exp(g) * S
S = S + outer(b1 * k1, v1 - k1 @ S)
let mid = q @ S
S = S + outer(b2 * k2, v2 - k2 @ S)
out o = scale * q @ S + mid
"""
SPECS = {"gated_deltaproduct": "gated_deltaproduct", "rwkv7": "rwkv7", "generalized": GENERALIZED, "undecayed": UNDECAYED,
         "read_before_scalar": READ_BEFORE.format(dim=""), "read_before_key": READ_BEFORE.format(dim="K"), "product_3": PRODUCT_3,
         "read_mid": READ_MID, "read_alone": READ_ALONE, "interleaved": INTERLEAVED, "two_reads": TWO_READS}  # fmt: skip


def _load(name: str) -> lamixer.Mixer:
    text = SPECS[name]
    return lamixer.load(text) if text in lamixer.shipped_specs() else lamixer.loads(text)


def _bounded(tensors: dict) -> dict:
    """A generalized transition's low-rank terms scaled so the transition has norm about 1 (as RWKV-7's has)."""
    return {k: v * 0.3 if k in ("a", "b") else v for k, v in tensors.items()}


def _check(name: str, T: int = 37, gate: str = "strong", cu=None, seed: int = 0, initial_state: bool = True) -> None:
    m = _load(name)
    tensors, states = random_call(m, B=2, T=T, H=2, size=16, gate=gate, seed=seed, cu_seqlens=cu, initial_state=initial_state)
    c = compare(m, "triton", _bounded(tensors), states, cu_seqlens=cu, seed=seed)
    bad = {k: f"{v:.1e}" for k, v in c.errors.items() if not v < TOL}
    assert not bad, f"{name} T={T} {gate} cu={cu}: {bad}"


def test_the_plan_runs_them_on_the_delta_kernels():
    plans = {name: _load(name).compiled.plan.groups[0] for name in SPECS}
    for name, group in plans.items():
        assert group.decode is not None, name
        if name != "two_reads":
            assert group.train is not None and not group.missing, name
    assert plans["two_reads"].train is None and "more than one read" in plans["two_reads"].missing[0]
    # the erase flag where a write reads the state before its decay, and a decay to read it before
    assert [name for name, g in plans.items() if g.train and ("erase_before", True) in g.train.args] == [
        "rwkv7", "generalized", "read_before_scalar", "read_before_key"]  # fmt: skip
    assert ("erase_before", True) in plans["rwkv7"].decode.args and plans["undecayed"].train.args == (("decay", "none"), ("read", "after"))
    assert [g.train.template for g in _load("interleaved").compiled.plan.groups] == ["scan_delta", "chunk_additive"]


def test_mixed_erase_positions_are_refused():
    """One write erasing before its decay and another after a decay of its own: the kernels' one flag cannot say it."""
    m = lamixer.loads("""mixer mixed
dims K, V
input r[K], w[] in (-inf, 0), u[] in (-inf, 0), k[K], v[V], a[K], b[K]
state S[K, V]
S = exp(w) * S + outer(b, a @ S)
S = exp(u) * S
S = S + outer(k, v - k @ S)
out o = r @ S
""")  # fmt: skip
    (group,) = m.compiled.plan.groups
    assert group.train is None and group.decode is None and "before their decays beside" in group.missing[0]
    tensors, states = random_call(m, T=5, H=2, seed=1, dtype=torch.float32)
    with pytest.raises(lamixer.LamixerError, match="before their decays beside"):
        m(**tensors, initial_state=states[0], backend="triton")


@pytest.mark.parametrize("name", ["gated_deltaproduct", "rwkv7"])
@pytest.mark.parametrize("T,gate", [(37, "strong"), (70, "weak")])
def test_shipped_specs_match_interpreter(name, T, gate):
    """A chunk's tail (74 sub-tokens), several chunks of sub-tokens; strong and weak gates (one token: below)."""
    _check(name, T, gate, seed=T)


@pytest.mark.parametrize("name", ["gated_deltaproduct", "rwkv7", "generalized"])
def test_packed_sequences(name):
    _check(name, cu=[0, 1, 18, 53], seed=3)


@pytest.mark.parametrize("name,rows,n", [("gated_deltaproduct", (2, 1), 2), ("rwkv7", (2, 1), 2), ("product_3", (1, 0), 3)])
def test_the_read_out_takes_the_read_rows_alone(name, rows, n, monkeypatch):
    """A read at one sub-step of n: the output kernel and the backward's A^T dO take that sub-step's BT / n rows alone
    where n leaves a power of two of at least 16 tokens a chunk (gated_deltaproduct's 64 sub-tokens, rwkv7's 32), else
    every row (n = 3); the kernels are given a query row per token, not per sub-token; the reads and every gradient
    stay exact."""
    chosen, per_query = [], []
    real, real_rows = delta.read_rows, delta.query_rows
    monkeypatch.setattr(delta, "read_rows", lambda *args: chosen.append(real(*args)) or chosen[-1])
    monkeypatch.setattr(delta, "query_rows", lambda *args: per_query.append(real_rows(*args)) or per_query[-1])
    _check(name, T=45, gate="normal", seed=5)
    assert set(chosen) == {rows} and set(per_query) == {n}


@pytest.mark.parametrize("cu", [None, [0, 1, 18, 53]])
def test_a_per_key_decay_at_one_sub_step_comes_a_row_per_token(cu, monkeypatch):
    """rwkv7's decay (per key, at the first of its two sub-steps): the chunk kernels are given its log decays a row per
    token (ScanOperands.decay_step), not the scan's two rows per token of which one is 0; reads, the final state and
    every gradient stay exact, packed sequences included."""
    seen = []
    real = delta.decay_rows
    monkeypatch.setattr(delta, "decay_rows", lambda *args: seen.append(real(*args)) or seen[-1])
    _check("rwkv7", cu=cu, seed=2)
    assert seen and all(rows == {"GN": 2, "GSTEP": 0} for rows in seen)


def test_without_an_initial_state():
    _check("gated_deltaproduct", T=29, initial_state=False, seed=4)


def test_one_token():
    _check("rwkv7", T=1, gate="normal", seed=1)


def test_context_parallel_two_ranks():
    """The sub-token scans composed across ranks (lamixer.parallel): rwkv7's chunk kernels, gradients included, and
    gated_deltaproduct's recurrent kernel (inference), against one process."""
    from test_context_parallel import _launch

    _launch(2, [("mixer", "rwkv7", "triton", None), ("inference", "gated_deltaproduct", "triton")])


@pytest.mark.parametrize("name", ["generalized", "undecayed", "read_before_scalar", "read_before_key", "product_3", "read_mid",
                                  "read_alone", "interleaved"])  # fmt: skip
def test_forms_match_interpreter(name):
    _check(name, seed=5)


@pytest.mark.parametrize("name,cu", [("gated_deltaproduct", None), ("rwkv7", [0, 5, 6, 30]), ("product_3", None),
                                     ("read_before_key", None), ("two_reads", [0, 5, 6, 30])])  # fmt: skip
def test_inference_runs_the_recurrent_kernel(name, cu, monkeypatch):
    from lamixer.kernels import recurrent

    m = _load(name)
    launches = []
    launch = recurrent.launch
    monkeypatch.setattr(recurrent, "launch", lambda *args, **flags: launches.append(flags.get("erase_before", False)) or launch(*args, **flags))
    tensors, states = random_call(m, B=2, T=21, H=2, size=16, gate="strong", seed=6, cu_seqlens=cu)
    c = compare_inference(m, "triton", _bounded(tensors), states, cu_seqlens=cu)
    assert c.worst < TOL, c.errors
    assert launches == [name in ("rwkv7", "read_before_key")]


def test_a_layer_trains_on_triton():
    """A layer's training step (params' gradients through the chunk kernels) equals the torch backend's."""
    torch.manual_seed(1)
    layer = lamixer.Layer("rwkv7", 16, 2, backend="triton", decay_rank=4, alpha_rank=4).double()
    x = torch.randn(2, 11, 16, dtype=torch.float64)
    grads = {}
    for backend in ("triton", "torch"):
        layer.zero_grad()
        layer.backend = backend
        layer(x).square().sum().backward()
        grads[backend] = {n: p.grad.clone() for n, p in layer.named_parameters()}
    assert not triton_backend.unsupported(layer.mixer.compiled)
    for n, g in grads["torch"].items():
        assert rel_rms(grads["triton"][n], g) < 1e-10, n
