"""The plan's block attention epilogues (passes/epilogue.py): which sums and constant factors after a block attention
fold into it, and that every backend still computes what the interpreter does from the IR as written."""
import pytest

import lamixer
from lamixer.tools.check import compare, random_call

HEAD = "mixer m\ndims K, V\ninput q[K], k[K], v[V], x[V]\n"


def attention_node(spec: str) -> dict:
    plan = lamixer.loads(spec).compiled.plan
    (d,) = [plan.nodes[n] for n in plan.order if plan.nodes[n]["op"] == "block_attention"]
    return d


@pytest.mark.parametrize("out, weight", [
    ("(block_attention(q, k, v, size = 4) + x) / 2", 0.5),
    ("0.25 * (x + block_attention(q, k, v, size = 4))", 0.25),
    ("(block_attention(q, k, v, size = 4) + x) * 3", 3.0),
    ("block_attention(q, k, v, size = 4) + x", 1.0),
    ("x / (block_attention(q, k, v, size = 4) + x)", 1.0),  # the sum alone: the attention is the divisor
])  # fmt: skip
def test_a_sum_and_a_constant_factor_fold(out, weight):
    d = attention_node(HEAD + f"out o = {out}\n")
    assert len(d["args"]) == 5 and d["weight"] == weight


@pytest.mark.parametrize("out", [
    "block_attention(q, k, v, size = 4) / 2 + 0 * x",  # a factor alone: no sum to fold it into
    "block_attention(q, k, v, size = 4) - x",
    "(block_attention(q, k, v, size = 4) + sum(x)) / 2",  # a residual of other dims
])  # fmt: skip
def test_what_is_not_a_trailing_sum_stays(out):
    d = attention_node(HEAD + f"out o = {out}\n")
    assert len(d["args"]) == 4 and "weight" not in d


def test_a_sum_read_twice_keeps_its_node_and_the_factor_stays_apart():
    spec = HEAD + "let s = block_attention(q, k, v, size = 4) + x\nout o = s / 2 + s\n"
    d = attention_node(spec)
    assert len(d["args"]) == 5 and d["weight"] == 1.0


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("out", ["0.25 * (x + block_attention(q, k, v, size = 4))", "(block_attention(q, k, v, size = 4) + x) / 2 + x"])
def test_backends_match_the_interpreter_on_the_graph_as_written(backend, out):
    m = lamixer.loads(HEAD + f"out o = {out}\n")
    tensors, _ = random_call(m, B=2, T=13, H=2, size=16, seed=5)
    for cu in (None, [0, 5, 26]):
        c = compare(m, backend, tensors if cu is None else random_call(m, cu_seqlens=cu, H=2, size=16, seed=5)[0], None, cu_seqlens=cu, seed=5)
        bad = {k: f"{v:.2e}" for k, v in c.errors.items() if not v < 1e-12}
        assert not bad, bad
