"""A decay constant over each sequence (a per-head constant such as RetNet's, one made of params, one made of
statistics) runs on chunk_additive's "constant" kernels, which read one log decay per sequence and head: against the
interpreter in float64 under TRITON_INTERPRET=1, outputs, final states and every gradient, the param-made constant's
included."""
import pytest
import torch

import lamixer
from lamixer.kernels import additive
from lamixer.render.templates import render
from lamixer.tools.check import compare, random_call

TOL = 1e-7


def _assert_close(c, what):
    bad = {k: f"{v:.2e}" for k, v in c.errors.items() if not v < TOL}
    assert not bad, f"{what}: {bad}"


def _learned(read: str) -> str:
    """A retention whose per-head decay exp(-exp(w)) is learned, read after the write, between decay and write, or
    before the decay."""
    decay, write, out = "S = exp(-exp(w)) * S", "S = S + outer(k, v)", "out o = scale * q @ S"
    body = {"after": [decay, write, out], "mid": [decay, out, write], "before": [out, decay, write]}[read]
    return "\n".join([f"mixer learned_{read}", "dims K, V", "input q[K], k[K], v[V]", "param w[H]", "state S[K, V]", *body, ""])


NORMALISED = """mixer learned_normalised
dims K, V
input q[K], k[K], v[V]
param w[H]
state S[K, V], z[K]
let phi_k = elu(k) + 1
let gamma = exp(-exp(w))
S = gamma * S + outer(phi_k, v)
z = gamma * z + phi_k
out o = (q @ S) / (q @ z + 4)
"""

STATISTIC = """mixer stat_decay
dims K, V
input q[K], k[K], v[V]
state S[K, V]
stat m = mean(k * k) per batch, head
S = exp(-m) * S + outer(k, v)
out o = scale * q @ S
"""


@pytest.fixture
def launches(monkeypatch):
    """The decay kind and log decay shape of every chunk_additive launch."""
    seen = []
    real = additive.run_chunk_scan

    def spy(q, qs, a, b, g, h0, cu_seqlens, decay, *rest):
        seen.append((decay, None if g is None else tuple(g.shape)))
        return real(q, qs, a, b, g, h0, cu_seqlens, decay, *rest)

    monkeypatch.setattr(additive, "run_chunk_scan", spy)
    return seen


def test_the_plan_runs_a_constant_as_one():
    group = lamixer.load("retnet").compiled.plan.groups[0]
    assert group.decay.kind == "scalar" and group.decay.constant  # the recurrent kernel's kind
    assert dict(group.train.args)["decay"] == "constant" and group.train.module == "chunk_additive_constant_after"
    source = render("chunk_additive", decay="constant", read="after", acc="float32")
    # no per-token gate and no cumulative sum: one log decay per sequence and head
    assert "tl.cumsum" not in source and "tl.load(g + t" not in source and source.count("tl.load(g + i_n * H + i_h)") == 4


@pytest.mark.parametrize("T", [1, 37, 150])
def test_retnet_matches_interpreter(T, launches):
    m = lamixer.load("retnet")
    tensors, states = random_call(m, B=2, T=T, H=3, seed=T)
    _assert_close(compare(m, "triton", tensors, states, seed=T), f"retnet T={T}")
    assert launches and all(decay == "constant" and shape == (2, 3) for decay, shape in launches)


def test_retnet_packed_sequences(launches):
    m = lamixer.load("retnet")
    cu = [0, 3, 150, 171]
    tensors, states = random_call(m, H=2, cu_seqlens=cu, seed=4)
    _assert_close(compare(m, "triton", tensors, states, cu_seqlens=cu, seed=4), "retnet packed")
    assert launches and all(shape == (3, 2) for _, shape in launches)


@pytest.mark.parametrize("read", ["after", "mid", "before"])
@pytest.mark.parametrize("w", [(2.5, -2.0), (-4.0, 0.5)])  # log decays -12.2, -0.14 per token; -0.018, -1.6
def test_learned_constant_and_its_gradient(read, w, launches):
    """d(w) is the sum over every token of d(log decay): the gradient kernel's chunk sums, summed per sequence."""
    m = lamixer.loads(_learned(read))
    tensors, states = random_call(m, B=2, T=70, H=2, seed=7)
    tensors["w"] = torch.tensor(w, dtype=torch.float64)
    _assert_close(compare(m, "triton", tensors, states, seed=7), f"{read} {w}")
    assert launches[0] == ("constant", (2, 2))


def test_learned_constant_packed_without_initial_state():
    m = lamixer.loads(_learned("before"))
    cu = [0, 65, 70, 135]
    tensors, _ = random_call(m, H=2, cu_seqlens=cu, seed=5, initial_state=False)
    tensors["w"] = torch.tensor((1.0, -1.0), dtype=torch.float64)
    _assert_close(compare(m, "triton", tensors, None, cu_seqlens=cu, seed=5), "learned packed")


def test_a_constant_with_a_normaliser():
    m = lamixer.loads(NORMALISED)
    assert m.compiled.plan.groups[0].train.args == (("decay", "constant"), ("read", "after"), ("ones", True))
    tensors, states = random_call(m, B=2, T=70, H=2, seed=3)
    _assert_close(compare(m, "triton", tensors, states, seed=3), "normalised")


@pytest.mark.parametrize("cu", [None, [0, 3, 70, 135]])
def test_a_constant_made_of_statistics_per_sequence(cu, launches):
    """The statistic differs between batch rows, and between packed sequences: each sequence's own."""
    m = lamixer.loads(STATISTIC)
    tensors, states = random_call(m, B=2, T=70, H=2, seed=2, cu_seqlens=cu)
    _assert_close(compare(m, "triton", tensors, states, cu_seqlens=cu, seed=2), f"statistic {cu}")
    assert launches[0] == ("constant", (2 if cu is None else 3, 2))


def test_a_log_decay_without_a_gradient_is_left_out():
    """A scalar gate that needs no gradient: the gradient kernel skips d(log decay) (DECAY_GRAD), the others stay."""
    m = lamixer.load("simple_gla")
    tensors, states = random_call(m, B=2, T=70, H=2, seed=6)
    grads = {}
    for backend in ("interpret", "triton"):
        leaves = {k: v.clone().requires_grad_(k != "g") for k, v in tensors.items()}
        o, _ = m(**leaves, initial_state=states[0], output_final_state=True, backend=backend)
        o.square().sum().backward()
        assert leaves["g"].grad is None
        grads[backend] = {k: v.grad for k, v in leaves.items() if k != "g"}
    for k, ref in grads["interpret"].items():
        assert ((grads["triton"][k] - ref).norm() / ref.norm()).item() < TOL, k


def test_strong_constant_in_float32_on_a_partial_chunk():
    """Padded rows of a sequence's last chunk (6 tokens of 64) under a strong decay: their weights must not grow past the
    chunk's end, where float32 overflows and 0 * inf is NaN (float64 would not show it). d(w) too: summed as the
    scalar decay's suffix sums of q.dq - a.da, it is rounding noise under such a decay (4.5 relative)."""
    m = lamixer.loads(_learned("after"))
    tensors, states = random_call(m, B=1, T=70, H=2, seed=8, dtype=torch.float32)
    tensors["w"] = torch.tensor((2.5, 4.0), dtype=torch.float32)  # log decays -12.2 and -54.6 per token
    c = compare(m, "triton", tensors, states, seed=8)
    assert c.worst < 1e-4, c.errors


def test_a_compiled_package_runs_the_constant_kernels(tmp_path, monkeypatch):
    """`lamixer compile`: the package's scans.py tells the host code the decay its kernels were rendered for, and its
    training call runs the same kernels as lamixer's triton backend: the gradients bit for bit (d(w) included), o to
    float32's rounding."""
    import importlib
    import sys

    from lamixer.emit.write import write
    from lamixer.tools.check import forward_backward, rel_rms

    m = lamixer.loads(_learned("mid"))
    write([m.compiled], tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    package = importlib.import_module(m.compiled.name)
    assert 'functools.partial(additive.scan, decay="constant")' in (tmp_path / m.compiled.name / "scans.py").read_text()
    tensors, states = random_call(m, B=2, T=70, H=2, seed=9, dtype=torch.float32)
    tensors["w"] = torch.tensor((1.5, -1.0))
    got = forward_backward(m, tensors, states, "triton", call=getattr(package, m.compiled.name))
    want = forward_backward(m, tensors, states, "triton")
    assert f"{m.compiled.name}.kernels.chunk_additive_constant_mid" in sys.modules
    for k, ref in want.items():
        if k == "o":  # the package scales q in torch, the backend's output kernel weighs o's rows: float32's rounding apart
            assert rel_rms(got[k], ref) < 1e-6, k
        else:
            assert torch.equal(got[k], ref), k
