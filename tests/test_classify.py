"""Classification and plan of the shipped specs, and the IR's invariants."""
import pytest

import lamixer
from lamixer.passes.verify import IRError, verify

EXPECTED = {  # name: (update rule, composition, per-state (decay, reads))
    "linear_attn": ("additive", "single", [("none", ["after update"])]),
    "retnet": ("additive", "single", [("constant", ["after update"])]),
    "simple_gla": ("additive", "single", [("scalar", ["after update"])]),
    "gla": ("additive", "single", [("key", ["after update"])]),
    "hgrn2": ("additive", "single", [("key", ["after update"])]),
    "metala": ("additive", "single", [("key", ["after update"])]),
    "rwkv6": ("additive", "single", [("key", ["before update"])]),
    "deltanet": ("delta", "single", [("none", ["after update"])]),
    "gated_deltanet": ("delta", "single", [("scalar", ["after update"])]),
    "kda": ("delta", "single", [("key", ["after update"])]),
    "gsa": ("slot-softmax", "chained", [("value", ["after update"]), ("key", ["after update"])]),
    "lln": ("additive", "parallel", [("none", ["after update"]), ("none", ["after update"])]),
    "mamba2": ("additive", "single", [("scalar", ["after update"])]),
    "rwkv7": ("delta", "single", [("key", ["after write 2"])]),
    "gated_deltaproduct": ("delta", "single", [("scalar", ["after write 2"])]),
}


def test_every_shipped_spec_is_expected():
    assert sorted(EXPECTED) == lamixer.shipped_specs()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_classification(name):
    c = lamixer.load(name).compiled
    rule, composition, scans = EXPECTED[name]
    cls = c.classification
    assert (cls.update_rule, cls.composition) == (rule, composition)
    assert [(s.decay, [r.when for r in s.reads]) for s in cls.scans] == scans
    verify(c.graph)


def test_lln_extras():
    cls = lamixer.load("lln").compiled.classification
    assert cls.denominators == ["z"] and len(cls.stats) == 3 and len(cls.side_branches) == 1
    assert lamixer.load("lln").compiled.plan.fusable == [("S", "z")]


def test_rwkv_bonus_becomes_a_per_token_term():
    c = lamixer.load("rwkv6").compiled
    ops = {c.graph.op(n) for n in c.plan.order}
    assert "dot" in ops and "outer" not in ops  # r @ outer(u * k, v) -> dot(r, u * k) * v


def test_chained_scans_run_in_dependency_order():
    c = lamixer.load("gsa").compiled
    reads = [c.plan.read_scan[n] for n in c.plan.order if n in c.plan.read_scan]
    assert reads == ["Kt", "Vt"]


def test_verifier_catches_a_miswired_node():
    c = lamixer.loads(lamixer.api.shipped_source("gla")).compiled
    g = c.graph
    n = next(n for n in g.g.nodes if g.op(n) == "outer")
    g.g.nodes[n]["dims"] = ("V", "K", "M")
    with pytest.raises(IRError):
        verify(g)
    lamixer.api._compile_cached.cache_clear()


def test_decay_written_as_a_plain_factor_is_taken_in_log_space():
    m = lamixer.loads("mixer f\ndims K, V\ninput q[K], k[K], v[V], a[] in (0, 1)\nstate S[K, V]\nS = a * S + outer(k, v)\nout o = q @ S\n")
    s = m.compiled.classification.scans[0]
    assert s.decay == "scalar" and m.compiled.graph.is_fn(s.log_decay, "unary", "log")
