"""The chunkwise torch backend against the interpreter: outputs, final states, every gradient, float64."""
import dataclasses
import os

import pytest
import torch

import lamixer
from lamixer.backends import evaluate as torch_backend
from lamixer.backends.binding import bind
from lamixer.tools.check import compare, random_call, rel_rms

TOL = 1e-7
SPECS = lamixer.shipped_specs()
EXAMPLES = sorted(os.path.join(os.path.dirname(__file__), "..", "examples", "specs", f)
                  for f in os.listdir(os.path.join(os.path.dirname(__file__), "..", "examples", "specs")))  # fmt: skip


def _assert_close(c, what):
    bad = {k: f"{v:.2e}" for k, v in c.errors.items() if not v < TOL}
    assert not bad, f"{what}: {bad}"


@pytest.mark.parametrize("name", SPECS)
@pytest.mark.parametrize("T,gate", [(1, "normal"), (37, "strong"), (130, "weak"), (200, "normal")])
def test_torch_matches_interpreter(name, T, gate):
    m = lamixer.load(name)
    tensors, states = random_call(m, B=2, T=T, H=2, gate=gate, seed=T)
    _assert_close(compare(m, "torch", tensors, states, seed=T), f"{name} T={T} {gate}")


@pytest.mark.parametrize("name", SPECS)
def test_torch_varlen_matches_interpreter(name):
    m = lamixer.load(name)
    cu = [0, 1, 18, 83, 100]
    tensors, states = random_call(m, H=2, cu_seqlens=cu, seed=3)
    _assert_close(compare(m, "torch", tensors, states, cu_seqlens=cu, seed=3), f"{name} varlen")


@pytest.mark.parametrize("name", [n for n in SPECS if not lamixer.load(n).compiled.classification.stats])
def test_varlen_equals_each_sequence_alone(name):
    """A packed batch gives what each sequence gives run on its own (specs without whole-input statistics)."""
    m = lamixer.load(name)
    cu = [0, 7, 40, 41, 90]
    tensors, states = random_call(m, H=2, cu_seqlens=cu, seed=5)
    o, finals = m(**tensors, initial_state=states if len(states) > 1 else states[0], output_final_state=True,
                  cu_seqlens=torch.tensor(cu), backend="torch")  # fmt: skip
    finals = finals if isinstance(finals, tuple) else (finals,)
    per_token = {op.name for op in m.compiled.graph.operands if op.kind == "input"}
    for i, (a, e) in enumerate(zip(cu[:-1], cu[1:])):
        one = {k: (v[:, a:e] if k in per_token else v) for k, v in tensors.items()}
        h0 = tuple(s[i : i + 1] for s in states)
        o1, f1 = m(**one, initial_state=h0 if len(h0) > 1 else h0[0], output_final_state=True, backend="torch")
        f1 = f1 if isinstance(f1, tuple) else (f1,)
        assert rel_rms(o[:, a:e], o1) < TOL
        for f, g in zip(finals, f1):
            assert rel_rms(f[i : i + 1], g) < TOL


@pytest.mark.parametrize("name", ["gla", "gated_deltanet", "gsa", "mamba2"])
def test_extreme_gates_stay_finite_and_exact(name):
    """Decays of e^-20 per token: every exponent is a difference at ordered positions, so nothing overflows."""
    m = lamixer.load(name)
    tensors, states = random_call(m, T=70, H=2, seed=1)
    for op in m.compiled.graph.operands:
        if op.domain == (float("-inf"), 0.0):
            tensors[op.name] = tensors[op.name] * 0 - 20.0
        if op.name == "dt":
            tensors[op.name] = tensors[op.name] * 0 + 30.0
    _assert_close(compare(m, "torch", tensors, states), f"{name} extreme gates")


def test_novel_specs_compile_and_match(example_specs):
    """Specs that combine the axes in ways no paper does compile without a Python change and match."""
    assert len(example_specs) >= 3
    rules = set()
    for path in example_specs:
        m = lamixer.load(path)
        rules.add((m.compiled.classification.update_rule, tuple(s.decay for s in m.compiled.classification.scans)))
        for T, gate in [(37, "strong"), (130, "weak")]:
            tensors, states = random_call(m, T=T, H=2, gate=gate, seed=T)
            _assert_close(compare(m, "torch", tensors, states, seed=T), f"{path} T={T}")
        cu = [0, 9, 50]
        tensors, states = random_call(m, H=2, cu_seqlens=cu, seed=2)
        _assert_close(compare(m, "torch", tensors, states, cu_seqlens=cu), f"{path} varlen")
    assert ("delta", ("key",)) in rules  # the delta rule under a vector decay


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_low_precision_inputs(dtype):
    """o comes back in the input dtype, states in float32, close to the float64 oracle."""
    m = lamixer.load("gla")
    tensors, states = random_call(m, T=50, H=2, seed=0, dtype=dtype)
    o, S = m(**tensors, initial_state=states[0].float(), output_final_state=True, backend="torch")
    assert o.dtype == dtype and S.dtype == torch.float32
    ref, S_ref = m(**tensors, initial_state=states[0].float(), output_final_state=True, backend="interpret")
    assert ref.dtype == dtype and S_ref.dtype == torch.float32
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert rel_rms(o, ref) < tol and rel_rms(S, S_ref) < tol


def test_no_final_state_unless_asked():
    m = lamixer.load("gsa")
    tensors, _ = random_call(m, T=5, seed=0)
    o, final = m(**tensors)
    assert final is None and o.shape == (2, 5, 2, 9)  # random_call sizes K, V, M = 8, 9, 10
    _, final = m(**tensors, output_final_state=True)
    assert isinstance(final, tuple) and [f.shape[-2:] for f in final] == [(8, 10), (10, 9)]


def test_positional_and_named_calls_agree():
    m = lamixer.load("rwkv6")
    tensors, _ = random_call(m, T=9, seed=0)
    o1, _ = m(*tensors.values())
    o2, _ = m(**dict(reversed(list(tensors.items()))))
    assert torch.equal(o1, o2)


def test_scale_default_and_override():
    m = lamixer.load("linear_attn")
    tensors, _ = random_call(m, T=9, seed=0)
    o_default, _ = m(**tensors)
    o_explicit, _ = m(**tensors, scale=tensors["q"].shape[-1] ** -0.5)
    o_half, _ = m(**tensors, scale=0.5 * tensors["q"].shape[-1] ** -0.5)
    assert torch.allclose(o_default, o_explicit) and torch.allclose(o_half, 0.5 * o_default)


@pytest.mark.parametrize("name", lamixer.shipped_specs())
def test_the_evaluation_traces_to_one_graph(name):
    """What runtime/fuse.py compiles on a GPU, the evaluation of the per-token work around the scans, traces to one
    graph: a graph break splits it into pieces compiled apart, each a kernel per op (a generator passed to math.prod
    in a statistic did that to lln: 2.1 -> 5.1 ms forward on the H200)."""
    m = lamixer.load(name)
    tensors, _ = random_call(m, B=2, T=70, H=2, size=16, dtype=torch.float32, initial_state=False, distinct=False)
    call = dataclasses.replace(bind(m.compiled, (), tensors, None, None, None), memo=None)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(lambda c: torch_backend.run(m.compiled, c))(call)
    assert explained.graph_count == 1, [str(b.reason)[:300] for b in explained.break_reasons]
