"""The plan's normalised reads (passes/normalised.py): which divisions of a scan's read by its normaliser's fold into
the scan, and that every backend, folded, still computes what the interpreter does from the IR as written."""
import os

import pytest
import torch
from conftest import EXAMPLE_SPECS

import lamixer
from lamixer.kernels import additive
from lamixer.kernels.config import Config
from lamixer.tools.check import compare, random_call
from lamixer.tools.explain import plan_json

HEAD = """mixer m
dims K, V
input q[K], k[K], v[V], g[K] in (-inf, 0)
state S[K, V], z[K]
S = exp(g) * S + outer(k, v)
z = exp(g) * z + k
"""


def group(spec: str):
    (g,) = lamixer.loads(spec).compiled.plan.groups
    return g


@pytest.mark.parametrize("out, eps", [
    ("(q @ S) / (q @ z + 1)", 1.0),
    ("(q @ S) / (1e-5 + q @ z)", 1e-5),
    ("(q @ S) / (q @ z)", 0.0),
])  # fmt: skip
def test_a_read_over_the_normalisers_read_plus_a_number_folds(out, eps):
    spec = HEAD + f"out o = {out}\n"
    assert group(spec).divide == eps
    plan = lamixer.loads(spec).compiled.plan
    assert not [n for n in plan.order if plan.nodes[n]["op"] == "binary"]  # the division and the sum left the plan


@pytest.mark.parametrize("body", [
    "let n = q @ S\nout o = n / (q @ z + 1) + n",  # the read has another reader
    "let d = q @ z + 1\nout o = (q @ S) / d + d",  # so has the denominator
    "out o = (q @ S) / (q @ z + e)",  # an input, not a number
    "out o = (q @ S) / (2 * (q @ z))",
    "out o = (q @ z + 1) / (q @ S)",
])  # fmt: skip
def test_what_is_not_that_division_stays(body):
    head = HEAD.replace("in (-inf, 0)", "in (-inf, 0), e") if " e)" in body else HEAD
    assert group(head + body + "\n").divide is None


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("spec", ["lln", "gla_normalized", "linear"])
def test_backends_match_the_interpreter_on_the_graph_as_written(backend, spec, monkeypatch):
    if spec == "linear":  # no decay, no epsilon
        m = lamixer.loads(HEAD.replace("exp(g) * ", "").replace(", g[K] in (-inf, 0)", "") + "out o = (q @ S) / (q @ z)\n")
    else:
        m = lamixer.load(os.path.join(EXAMPLE_SPECS, "gla_normalized.lam") if spec == "gla_normalized" else spec)
    assert m.compiled.plan.groups[0].divide is not None
    divides = []
    kernels = additive.run_chunk_scan
    monkeypatch.setattr(additive, "run_chunk_scan", lambda *args: divides.append(args[-1]) or kernels(*args))
    for T, cu in ((70, None), (None, [0, 5, 71, 90])):
        tensors, states = random_call(m, T=T or 0, size=16, seed=3, cu_seqlens=cu, gate="strong" if cu else "normal")
        c = compare(m, backend, tensors, states, cu_seqlens=cu, seed=3)
        bad = {k: f"{v:.2e}" for k, v in c.errors.items() if not v < 1e-10}
        assert not bad, bad
    assert divides == ([m.compiled.plan.groups[0].divide] * 2 if backend == "triton" else [])  # the kernels divided


@pytest.mark.parametrize("decay", ["none", "scalar", "key"])
def test_the_kernels_quotient_and_its_gradients(decay):
    """The output kernel's o / (oz + eps), with the gradients of both its outputs, against the undivided kernels'
    outputs divided in torch (float64; a per-head query factor; two chunks of 64 and a part)."""
    gen = torch.Generator().manual_seed(0)
    B, T, H, K, V = 2, 150, 2, 16, 32

    def rand(*shape, scale=1.0):
        return (torch.rand(*shape, generator=gen, dtype=torch.float64) * scale).requires_grad_()

    q, a, b = rand(B, T, H, K), rand(B, T, H, K), torch.randn(B, T, H, V, generator=gen, dtype=torch.float64).requires_grad_()
    g = None if decay == "none" else -rand(B, T, H, *((K,) if decay == "key" else ()), scale=0.2)
    qs = torch.rand(H, generator=gen, dtype=torch.float64) + 0.5
    h0, z0 = rand(B, H, K, V), rand(B, H, K)
    cfg = Config(BT=64, BV=32, BK=64, num_warps=4, num_stages=1).as_list()
    eps = 0.3
    dy, doz = torch.randn(B, T, H, V, generator=gen, dtype=torch.float64), torch.randn(B, T, H, generator=gen, dtype=torch.float64)

    def run(divide):
        o, ht, oz, zt = additive.run_chunk_scan(q, qs, a, b, g, h0, None, decay, "after", cfg, z0, divide)
        y = o if divide is not None else o / (oz.unsqueeze(-1) + eps)
        leaves = [x for x in (q, a, b, g, h0, z0) if x is not None]
        return [y, ht, oz, zt, *torch.autograd.grad((y * dy).sum() + (oz * doz).sum() + ht.sum() + zt.sum(), leaves)]

    for got, want in zip(run(eps), run(None)):
        assert ((got - want).norm() / want.norm()).item() < 1e-12


def test_explain_shows_the_fold_by_the_spec_s_names():
    c = lamixer.load("lln").compiled
    plan = plan_json(c)
    assert plan["scans"][0]["divide"] == 1e-5
    assert plan["block_attention"] == [{"line": 22, "residual": "o_lln", "weight": 0.5}]  # the read took the division's name
    stages = "\n".join(c.plan.stages(c.graph, c.classification))
    assert "S's read divided by (z's read + 1e-05)" in stages and "plus o_lln, times 0.5" in stages


@pytest.mark.parametrize("spec", ["lln", "gla_normalized"])
def test_half_precision_inputs(spec):
    """float16 inputs (the interpreter runs no bf16 dot): the kernels divide by the normaliser's float32 read and the
    backward divides by the same float32 values, kept (measured 3e-4 to 1.6e-3, as the unfolded division gave)."""
    m = lamixer.load(os.path.join(EXAMPLE_SPECS, "gla_normalized.lam") if spec == "gla_normalized" else spec)
    tensors, states = random_call(m, B=1, T=150, H=2, size=32, dtype=torch.float16, seed=5)
    c = compare(m, "triton", tensors, tuple(s.float() for s in states), seed=5)
    bad = {k: f"{v:.2e}" for k, v in c.errors.items() if not v < 3e-3}
    assert not bad, bad


def test_the_read_takes_the_division_s_name_and_drops_its_own():
    """Folded, S's read holds the quotient: a name the spec gave the read alone names it no longer."""
    for body, name in (("let num = q @ S\nout o = num / (q @ z + 1)", None), ("let o_n = (q @ S) / (q @ z + 1)\nout o = o_n * 2", "o_n")):
        c = lamixer.loads(HEAD + body + "\n").compiled
        (read,) = c.classification.scan("S").reads
        assert c.plan.groups[0].divide == 1.0 and c.plan.nodes[read.node].get("let") == name
