"""Generated Triton kernels under TRITON_INTERPRET=1 (set in conftest): the additive family against the
interpreter in float64, outputs, final states and every gradient, including d(log decay)."""
import os

import pytest
import torch
from conftest import EXAMPLE_SPECS as EXAMPLES

import lamixer
from lamixer.backends import evaluate
from lamixer.backends import triton as triton_backend
from lamixer.runtime import fuse
from lamixer.tools.check import compare, forward_backward, random_call, rel_rms

TOL = 1e-7
ADDITIVE = [n for n in lamixer.shipped_specs()
            if not triton_backend.unsupported(lamixer.load(n).compiled) and lamixer.load(n).compiled.classification.update_rule != "delta"]  # fmt: skip


def _assert_close(c, what):
    bad = {k: f"{v:.2e}" for k, v in c.errors.items() if not v < TOL}
    assert not bad, f"{what}: {bad}"


def test_the_additive_family_is_covered():
    assert set(ADDITIVE) == {"linear_attn", "retnet", "simple_gla", "gla", "hgrn2", "metala", "rwkv6", "mamba2", "lln", "gsa"}


# specs whose training kernels render as another's (the same template and arguments: hgrn2 and metala as gla's,
# mamba2 as simple_gla's) run one case of the three: their own work around the kernels; the kernels at every length
# and gate strength are the other spec's cases
SAME_KERNELS = {"hgrn2": "gla", "metala": "gla", "mamba2": "simple_gla"}
CASES = [(1, "normal"), (37, "strong"), (150, "weak")]


def test_specs_run_one_case_only_where_another_renders_their_kernels():
    for name, twin in SAME_KERNELS.items():
        assert lamixer.load(name).compiled.plan.groups[0].train == lamixer.load(twin).compiled.plan.groups[0].train, name


@pytest.mark.parametrize("name,T,gate", [(n, T, gate) for n in ADDITIVE for T, gate in CASES if n not in SAME_KERNELS or T == 37])
def test_triton_matches_interpreter(name, T, gate):
    m = lamixer.load(name)
    tensors, states = random_call(m, B=1 if T > 64 else 2, T=T, H=2, gate=gate, seed=T)  # batch rows: the one-chunk cases
    _assert_close(compare(m, "triton", tensors, states, seed=T), f"{name} T={T} {gate}")


@pytest.mark.parametrize("name", ["gla", "rwkv6", "simple_gla", "linear_attn", "gsa"])
def test_triton_varlen(name):
    """Packed sequences, one longer than the 64-token segments d(log decay) is summed over."""
    m = lamixer.load(name)
    cu = [0, 3, 150, 171]
    tensors, states = random_call(m, H=2, cu_seqlens=cu, seed=4)
    _assert_close(compare(m, "triton", tensors, states, cu_seqlens=cu, seed=4), f"{name} varlen")


@pytest.mark.parametrize("spec", ["gla_normalized.lam", "simple_gla_bonus.lam", "value_gated.lam"])
def test_triton_novel_specs(spec):
    """New specs of the family (a normalizer under a per-dim decay; a read between decay and write) need no Python."""
    m = lamixer.load(os.path.join(EXAMPLES, spec))
    tensors, states = random_call(m, T=70, H=2, gate="strong", seed=2)
    _assert_close(compare(m, "triton", tensors, states, seed=2), spec)


def test_no_initial_state_and_scale():
    m = lamixer.load("gla")
    tensors, _ = random_call(m, T=20, H=2, seed=1, initial_state=False)
    _assert_close(compare(m, "triton", tensors, None, scale=0.3), "gla without a state")


def test_specs_outside_the_templates_say_why():
    m = lamixer.loads("mixer two_reads\ndims K, V\ninput q[K], k[K], v[V]\nstate S[K, V]\nS = S + outer(k, v)\nout o = q @ S + k @ S\n")
    tensors, _ = random_call(m, T=4, seed=0)
    tensors = {k: v.requires_grad_() for k, v in tensors.items()}  # training: inference runs on the recurrent kernel
    with pytest.raises(lamixer.ArgumentError, match="more than one read"):
        m(**tensors, backend="triton")
    o, _ = m(**tensors)  # auto falls back to the torch backend
    assert o.shape[:3] == (2, 4, 2)


def test_rendered_source_is_cached_by_content(tmp_path, monkeypatch):
    monkeypatch.setenv("LAMIXER_CACHE", str(tmp_path))
    from lamixer.render import kernel_cache as cache
    from lamixer.render import templates

    source = templates.render("chunk_additive", decay="key", read="before", acc="float32")
    assert "def chunk_additive_key_before_float32_state_fwd(" in source
    assert "decay=key, read=before" in source
    cache.kernels.cache_clear()
    mod = cache.kernels("chunk_additive", decay="key", read="before", acc="float32")
    files = list((tmp_path / "kernels").glob("chunk_additive_*.py"))
    assert len(files) == 1 and files[0].read_text() == source and hasattr(mod, "chunk_additive_key_before_float32_strips_bwd")
    cache.kernels.cache_clear()


def test_low_precision_inputs_keep_float32_states():
    m = lamixer.load("simple_gla")
    tensors, states = random_call(m, T=40, H=2, seed=0, dtype=torch.float32)
    o, S = m(**tensors, initial_state=states[0], output_final_state=True, backend="triton")
    ref, S_ref = m(**tensors, initial_state=states[0], output_final_state=True, backend="interpret")
    assert o.dtype == torch.float32 and S.dtype == torch.float32
    assert (o - ref).norm() / ref.norm() < 1e-5 and (S - S_ref).norm() / S_ref.norm() < 1e-5


@pytest.mark.parametrize("name", ["gla", "gsa", "deltanet"])
def test_torch_compile_fullgraph_does_not_break_on_a_mixer(name, monkeypatch):
    """The scans are torch.library custom ops with fake implementations (gsa: a value-dim scan, a softmax, a key-dim
    scan), and the plan runs on plain data. Traced before any eager call (no configuration chosen yet, nothing
    cached with the spec), with named arguments."""
    from lamixer.tuning import choose

    monkeypatch.setattr(choose, "_chosen", {})
    monkeypatch.setattr(choose, "_traced", {})
    m = lamixer.loads(lamixer.api.shipped_source(name) + "\n", name)  # a spec compiled afresh
    tensors, _ = random_call(m, T=20, H=2, dtype=torch.float32, initial_state=False, seed=3)
    compiled_fn = torch.compile(lambda **xs: m(**xs, backend="triton")[0], fullgraph=True, backend="aot_eager")
    leaves = {k: v.clone().requires_grad_() for k, v in tensors.items()}
    o2 = compiled_fn(**leaves)
    o2.sum().backward()
    eager = {k: v.clone().requires_grad_() for k, v in tensors.items()}
    o, _ = m(**eager, backend="triton")
    o.sum().backward()
    assert torch.equal(o, o2)
    for k in leaves:
        assert torch.equal(leaves[k].grad, eager[k].grad), k


@pytest.mark.parametrize("name", ["gla", "simple_gla", "linear_attn"])
def test_walks_split_over_key_rows_match_interpreter(name, monkeypatch):
    """chunk_additive's state walks with the key dim split over programs (Config.BK below K; K = 40: three programs of
    16 key rows, the last partial), one sequence and packed ones."""
    from dataclasses import replace

    from lamixer.kernels.config import default_config
    from lamixer.tuning.search import configured

    m = lamixer.load(name)
    call = configured(m, {"chunk_additive": replace(default_config("key", 40, 40), BK=16)})
    for T, cu in [(70, None), (1, [0, 5, 70, 91])]:
        tensors, states = random_call(m, T=T, H=2, size=40, gate="strong", cu_seqlens=cu, seed=8)
        _assert_close(compare(m, "triton", tensors, states, cu_seqlens=cu, seed=8, call=call), f"{name} key rows split, cu_seqlens {cu}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_inputs_and_a_float32_gate(dtype):
    """q, k, v in half precision with a float32 gate, as FLA's users call it: o in the input dtype, float32 state."""
    m = lamixer.load("gla")
    tensors, states = random_call(m, T=40, H=2, seed=3, dtype=torch.float32)
    tensors = {k: v if k == "g" else v.to(dtype) for k, v in tensors.items()}
    o, S = m(**tensors, initial_state=states[0], output_final_state=True, backend="triton")
    ref, S_ref = m(**tensors, initial_state=states[0], output_final_state=True, backend="interpret")
    assert o.dtype == dtype and S.dtype == torch.float32
    assert rel_rms(o, ref) < 1e-2 and rel_rms(S, S_ref) < 1e-3


@pytest.mark.parametrize("name", ["linear_attn", "simple_gla", "gla"])
def test_head_dims_above_128(name):
    """Wide heads take their own default configuration (32-token chunks, one stage: the 64-token one needs more shared
    memory than an H200 block has, tests/test_gpu_compile.py) and four key blocks in the walks (K = 200: the last
    one partial)."""
    m = lamixer.load(name)
    for T, cu in [(70, None), (1, [0, 5, 45])]:  # one sequence, and two packed ones (the second over two chunks)
        tensors, states = random_call(m, B=1, T=T, H=1, size=200, gate="strong", seed=5, cu_seqlens=cu)
        _assert_close(compare(m, "triton", tensors, states, cu_seqlens=cu, seed=5), f"{name} K = 200, cu_seqlens {cu}")


def test_head_dims_above_the_kernels_limit_are_refused_or_fall_back():
    m = lamixer.load("simple_gla")
    tensors, _ = random_call(m, T=3, H=1, size=300, seed=0, initial_state=False)
    with pytest.raises(lamixer.ArgumentError, match="above the kernels' 256"):
        m(**tensors, backend="triton")
    o, _ = m(**tensors)  # auto: the torch backend
    assert o.shape[-1] == 301


VALUE_DECAY_READS = {
    "before": "out o = scale * q @ (S + outer(u * k, v))\nS = S * exp(gv) + outer(k, v)\n",
    "mid": "S = S * exp(gv)\nout o = scale * q @ (S + outer(u * k, v))\nS = S + outer(k, v)\n",
}


@pytest.mark.parametrize("read", sorted(VALUE_DECAY_READS))
def test_value_dim_decay_with_early_reads(read):
    """A decay along the value dim read before the update, or between decay and write: exact, varlen included."""
    m = lamixer.loads(f"mixer vd_{read}\ndims K, V\ninput q[K], k[K], v[V], gv[V] in (-inf, 0)\nparam u[H, K]\nstate S[K, V]\n"
                      + VALUE_DECAY_READS[read])  # fmt: skip
    assert m.compiled.classification.scans[0].decay == "value"
    for T, cu in [(70, None), (None, [0, 5, 70, 91])]:  # two 64-token chunks and segments of d(log decay), odd ends
        tensors, states = random_call(m, T=T or 1, H=2, cu_seqlens=cu, seed=2, gate="strong")
        _assert_close(compare(m, "triton", tensors, states, cu_seqlens=cu, seed=2), f"value decay, read {read}")


SCALAR_DECAY_READS = {
    "before": "out o = q @ S\nS = exp(g) * S + outer(k, v)\n",
    "mid": "S = exp(g) * S\nout o = q @ S\nS = S + outer(k, v)\n",
    "after": "S = exp(g) * S + outer(k, v)\nout o = q @ S\n",
}


@pytest.mark.parametrize("read", sorted(SCALAR_DECAY_READS))
def test_scalar_decay_at_every_read_position(read):
    """A scalar decay's walks weigh each token by its reach: the forward walk to the chunk's end, the reverse walk
    from the chunk's start, which for a read before the decay stops a row short. Exact at each read position, strong
    gates, odd ends and packed sequences included."""
    m = lamixer.loads(f"mixer sd_{read}\ndims K, V\ninput q[K], k[K], v[V], g[] in (-inf, 0)\nstate S[K, V]\n" + SCALAR_DECAY_READS[read])
    scan = m.compiled.classification.scans[0]
    assert scan.decay == "scalar" and (scan.reads[0].decayed, scan.reads[0].written) == {"before": (False, False), "mid": (True, False), "after": (True, True)}[read]
    for T, cu, gate in [(70, None, "strong"), (None, [0, 5, 70, 133], "weak"), (37, None, "normal")]:
        tensors, states = random_call(m, T=T or 1, H=2, cu_seqlens=cu, seed=3, gate=gate)
        _assert_close(compare(m, "triton", tensors, states, cu_seqlens=cu, seed=3), f"scalar decay, read {read}, {gate}")


@pytest.mark.parametrize("name", ["gla", "rwkv6", "simple_gla"])
def test_float32_strong_gates_stay_finite(name):
    """In float32 exp overflows past 88: every exponent in the kernels must be <= 0 or masked before exp,
    padded rows of a chunk included (float64 hides a violation up to 709)."""
    m = lamixer.load(name)
    tensors, states = random_call(m, B=1, T=63, H=2, gate="strong", dtype=torch.float32, seed=5)
    c = compare(m, "triton", tensors, states, seed=5)
    bad = {k: f"{v:.2e}" for k, v in c.errors.items() if not v < 1e-4}
    assert not bad, bad


def test_half_precision_diagonal_dots():
    """Weak decays along the key dim take the scores' diagonal blocks as one dot of operands up to e^4 from the
    inputs in float16 (backends/triton.py diagonal_span): as precise as the per-column path (5.3e-4 measured)."""
    m = lamixer.load("gla")
    tensors, states = random_call(m, B=1, T=150, H=2, size=32, gate="weak", dtype=torch.float16, seed=63)
    c = compare(m, "triton", tensors, tuple(s.float() for s in states), seed=63)
    bad = {k: f"{v:.2e}" for k, v in c.errors.items() if not v < 8e-4}
    assert not bad, bad


@pytest.mark.parametrize("T", [63, 150])  # within one 64-token segment of d(log decay), and across three
@pytest.mark.parametrize("spec", ["gsa", "gla", os.path.join(EXAMPLES, "value_gated.lam")], ids=os.path.basename)
def test_half_precision_decay_gradients(spec, T):
    """d(log decay) is a suffix sum of terms that cancel (o * do - b * db along the value dim, q * dq - k * dk along
    the key dim): in float16 (the interpreter runs no bf16 dot) it must stay near the format's precision. It did
    not while the value-dim scan rounded o and db to the inputs' dtype (gsa 1.7e-2) or its state update's decayed
    values (value_gated 1.1e-3). Measured now: 3.5e-4 to 5e-4."""
    m = lamixer.load(spec)
    tensors, states = random_call(m, B=1, T=T, H=2, size=32, gate="strong", dtype=torch.float16, seed=63)
    c = compare(m, "triton", tensors, tuple(s.float() for s in states), seed=63)
    bad = {k: f"{v:.2e}" for k, v in c.errors.items() if not v < 8e-4}
    assert not bad, bad


@pytest.mark.parametrize("T", [4, 70])
def test_a_state_nothing_reads_is_refused_by_name(T):
    """A state only handed back at the end (never read) has no kernel configuration: asking for Triton names it,
    on the recurrent path (short, no gradient) as on the chunk path, and auto falls back to torch."""
    m = lamixer.loads("mixer unread\ndims K, V\ninput q[K], k[K], v[V]\nstate S[K, V], R[K, V]\n"
                      "S = S + outer(k, v)\nR = R + outer(q, v)\nout o = q @ S\n")  # fmt: skip
    tensors, _ = random_call(m, T=T, H=2, seed=1, initial_state=False)
    with torch.no_grad(), pytest.raises(lamixer.ArgumentError, match="state R: a scan without reads"):
        m(**tensors, backend="triton")
    o, _ = m(**tensors)
    assert o.shape[1] == T


def _memos(m) -> list[dict]:
    """The per-signature memos of a mixer's call bindings."""
    return [v.memo for v in m.compiled.cache.values() if getattr(v, "memo", None) is not None]


def test_per_token_work_fused_by_torch_compile(monkeypatch):
    """On a fusing device the plan around the chunked scans runs under torch.compile, one compiled function per call
    signature: the same outputs and gradients as unfused, bit for bit, at a new length (a second graph) and for a second spec. Here the
    CPU stands in for the GPU, with torch.compile's aot_eager backend (the same operations, no code generation)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    monkeypatch.setattr(fuse, "DEVICES", ("cpu",))
    monkeypatch.setattr(fuse, "BACKEND", "aot_eager")
    # a DeltaNet whose strengths are made per token, around its kernels' finished norms; rwkv7: sub-steps, an erase
    # before the decay
    mixer = lamixer.api.shipped_source("deltanet").split("\nlayer")[0]
    made_beta = mixer.replace("beta[] in (0, 1)", "b[]").replace("beta * kn", "sigmoid(b) * kn")
    for name, T in [("deltanet", 40), ("deltanet", 50), ("lln", 40), ("rwkv7", 40)]:
        source = made_beta if name == "deltanet" else lamixer.api.shipped_source(name)
        m = lamixer.loads(source + "\n# fused\n", name)  # compiled afresh: no fused function yet
        tensors, states = random_call(m, T=T, H=2, dtype=torch.float32, seed=T)
        outs = {}
        for fused in (True, False):
            monkeypatch.setattr(fuse, "ENABLED", fused)
            for _ in range(2 if fused else 1):  # a signature's first call runs unfused (it chooses the kernel configurations)
                leaves = {k: v.clone().requires_grad_() for k, v in tensors.items()}
                o, S = m(**leaves, initial_state=states, output_final_state=True, backend="triton")
                (o.square().sum() + S[0].sum()).backward()
            outs[fused] = (o, S[0], {k: v.grad for k, v in leaves.items()})
        assert name not in fuse._failed and any(k[0] == "fused" for memo in _memos(m) for k in memo if isinstance(k, tuple)), name
        o, S, grads = outs[True]
        assert torch.equal(o, outs[False][0]) and torch.equal(S, outs[False][1])
        for k, g in grads.items():
            assert torch.equal(g, outs[False][2][k]), (name, k)
    assert counters["stats"]["unique_graphs"] >= 4  # deltanet, deltanet at a new length, lln, rwkv7


@pytest.mark.parametrize("name", ["rwkv6", "gsa", "mamba2"])
def test_the_fused_graph_takes_the_call_constants_as_inputs(name, monkeypatch):
    """A signature's call constants (here a read-out scale, the query's per-head factor) are made once, outside the
    compiled graph, which takes them as inputs: made inside it, each was a small kernel every call
    (bench/fused_sm90.py counts them)."""
    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    monkeypatch.setattr(fuse, "DEVICES", ("cpu",))
    monkeypatch.setattr(fuse, "BACKEND", keep)
    m = lamixer.loads(lamixer.api.shipped_source(name) + "\n# constants\n", name)  # compiled afresh: no fused function yet
    tensors, states = random_call(m, T=80, H=2, dtype=torch.float32, seed=1)  # past the recurrent kernel's lengths
    for _ in range(2):  # a signature's first call runs unfused
        m(**tensors, initial_state=states, backend="triton")
    assert graphs, f"{name}: no fused call"
    made = [n.target for g in graphs for n in g.graph.nodes if n.op == "call_function" and n.target in (torch.full, torch.ones, torch.arange)]
    assert not made, made


@pytest.mark.parametrize("name", ["rwkv7", "gated_deltaproduct", "hgrn2"])
def test_decoding_step_fused_by_torch_compile(name, monkeypatch):
    """A one-token step on the recurrent kernel with per-token work around it (sub-steps' operands, feature maps, a
    bonus) runs under torch.compile on a fusing device: the same output and final state as unfused, bit for bit, and
    under STATES_IN_PLACE (a graphed decoder's) the state is written over the initial one, through the custom op that
    says so (CPU standing in for the GPU, aot_eager)."""
    from lamixer.runtime.scan import states_in_place

    monkeypatch.setattr(fuse, "DEVICES", ("cpu",))
    monkeypatch.setattr(fuse, "BACKEND", "aot_eager")
    m = lamixer.loads(lamixer.api.shipped_source(name) + "\n# fused decoding\n", name)
    tensors, states = random_call(m, B=3, T=1, H=2, dtype=torch.float32, seed=5)
    states = [s.float() for s in states]
    results = {}
    for fused in (True, False):
        monkeypatch.setattr(fuse, "ENABLED", fused)
        for in_place in (False, True):
            for _ in range(2 if fused else 1):  # a signature's first call runs unfused
                h0 = [s.clone() for s in states]
                with states_in_place(in_place), torch.no_grad():
                    o, finals = m(**tensors, initial_state=h0, output_final_state=True, backend="triton")
            assert [f.data_ptr() == h.data_ptr() for f, h in zip(finals, h0)] == [in_place] * len(h0), (fused, in_place)
            results[fused, in_place] = (o, finals)
    keys = [k for memo in _memos(m) for k in memo if isinstance(k, tuple) and k[0] == "fused"]
    assert len(keys) == 2 and name not in fuse._failed  # one compiled copy per in-place mode
    o, finals = results[False, False]
    for got, got_finals in results.values():
        assert torch.equal(got, o) and all(torch.equal(a, b) for a, b in zip(got_finals, finals))


def test_tracing_reads_the_configuration_an_eager_call_chose_for_its_shape(monkeypatch):
    """Under torch.compile no cache file is read: a traced call takes the configuration an eager call of its shape
    bucket chose (runtime/fuse.py runs each signature's first call eagerly), not the last one chosen for its head dims."""
    from lamixer.kernels.config import Config, default_config
    from lamixer.tuning import choose as chooser

    tuned = Config(32, 32, 64, 4, 1)
    monkeypatch.setattr(chooser, "_chosen", {})
    monkeypatch.setattr(chooser, "_traced", {})
    monkeypatch.setattr(chooser, "lookup", lambda key: tuned if "T8192" in key else None)
    group = lamixer.load("simple_gla").compiled.plan.groups[0]

    def choose(T):
        return chooser.choose(group, torch.float32, 4, T, 16, 128, 128, torch.device("cpu"))

    assert choose(8192) == tuned and choose(256) == default_config("scalar", 128, 128) != tuned  # eager, in this order
    traced = torch.compile(lambda x, T: x * choose(T).BT, backend="eager", fullgraph=True)
    x = torch.ones(2)
    assert traced(x, 8192).tolist() == [32.0, 32.0]
    assert traced(x, 256).tolist() == [64.0, 64.0]
    assert traced(x, 2 * 8192).tolist() == [64.0, 64.0]  # no eager call of that bucket: the last choice for these dims


@pytest.mark.parametrize("spec", ["gated_deltanet"])
def test_decay_gradient_assembly_fused(spec, monkeypatch):
    """The backward ops assemble a scalar decay's d(log decay) from the kernels' outputs with torch operations (a per-key
    decay's is finished in its gradient kernel), which run under torch.compile on a fusing device (runtime/fuse.py:
    function): the same gradients as unfused, bit for bit (the CPU standing in, aot_eager; only that assembly fused here,
    the plan around the scans left unfused)."""
    from torch._dynamo.utils import counters

    m = lamixer.load(spec)
    tensors, states = random_call(m, T=150, H=2, dtype=torch.float32, seed=5)
    monkeypatch.setattr(fuse, "BACKEND", "aot_eager")
    monkeypatch.setattr(fuse, "_functions", {})
    monkeypatch.setattr(fuse, "run", lambda fn, name, call, *args, when=True, version=None: fn(call, *args))  # the plan unfused
    grads = {}
    for devices in (("cpu",), ()):
        monkeypatch.setattr(fuse, "DEVICES", devices)
        counters.clear()
        leaves = {k: v.clone().requires_grad_() for k, v in tensors.items()}
        o, _ = m(**leaves, initial_state=states, backend="triton")
        o.square().sum().backward()
        grads[devices] = {k: v.grad for k, v in leaves.items()}
        if devices:
            assert fuse._functions and counters["stats"]["unique_graphs"] >= 1
    for k, g in grads[("cpu",)].items():
        assert torch.equal(g, grads[()][k]), k


@pytest.mark.parametrize("name,fusable", [("linear_attn", False), ("gla", False), ("deltanet", False), ("hgrn2", True)])
def test_only_per_token_work_is_fused(name, fusable, monkeypatch):
    """Specs whose scans read the inputs directly and whose output is a scan's read leave torch.compile nothing to
    fuse: they run unfused (its dispatch would only add host time), deltanet among them, whose kernels finish its
    normalisations; hgrn2's per-token work (its input gate 1 - f) is fused."""
    torch._dynamo.reset()
    monkeypatch.setattr(fuse, "DEVICES", ("cpu",))
    monkeypatch.setattr(fuse, "BACKEND", "aot_eager")
    m = lamixer.loads(lamixer.api.shipped_source(name) + "\n# fusable?\n", name)
    tensors, _ = random_call(m, T=70, H=2, dtype=torch.float32, seed=1, initial_state=False)
    for _ in range(2):
        m(**tensors, backend="triton")
    fused = any(k[0] == "fused" for memo in _memos(m) for k in memo if isinstance(k, tuple))
    assert fused == fusable


def test_a_failing_compilation_warns_and_runs_unfused(monkeypatch):
    """Should torch.compile fail (its backend here raises), fuse warns once and runs the work unfused from then on."""

    def failing_backend(gm, example_inputs):
        raise RuntimeError("no code generation here")

    def work(x, scale):
        return x.square() * scale

    monkeypatch.setattr(fuse, "DEVICES", ("cpu",))
    monkeypatch.setattr(fuse, "BACKEND", failing_backend)
    monkeypatch.setattr(fuse, "_functions", {})
    monkeypatch.setattr(fuse, "_failed", set())
    x = torch.arange(4.0)
    with pytest.warns(UserWarning, match="could not fuse work"):
        assert torch.equal(fuse.function(work, x.device, x, 2.0), x.square() * 2.0)
    assert "work" in fuse._failed
    assert torch.equal(fuse.function(work, x.device, x, 3.0), x.square() * 3.0)  # unfused now, no second attempt
    assert len(fuse._functions) == 1


def test_random_mixers_train_as_the_interpreter_does():
    """The fuzzer's dims-typed random mixers (tests/test_fuzz.py) that the chunk kernels take: one forward and
    backward on the Triton backend against the interpreter in float64 (outputs, final states, every gradient), at
    T = 6 and 70 (two chunks), packed or not; specs whose reference overflows are left out. Within 1e-8, or, for a
    gradient that is analytically zero and numerically rounding noise, within ten times the torch backend's own
    distance from the interpreter ((p * x) / p cancels d/dp with terms of order 1/p^2) or within rounding of it in
    absolute terms (k / k; a key the same for every token cancels its softmax gradients). 2500 examples locally:
    1270 ran, three with such a gradient, no other error. (The examples follow from this test's source: an edit
    draws others.)"""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
    from test_fuzz import load_or_located_error, typed_spec

    ran = []

    @settings(max_examples=90, derandomize=True, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(typed_spec(), st.booleans(), st.sampled_from([6, 70]))
    def check(text, packed, T):
        m = load_or_located_error(text)
        if m is None or triton_backend.unsupported(m.compiled):
            return
        cu = None if not packed else torch.tensor([0, 2, T])
        tensors, states = random_call(m, B=1, T=T, H=2, size=3, cu_seqlens=None if cu is None else cu.tolist(), dtype=torch.float64)
        ref = forward_backward(m, tensors, states, "interpret", cu_seqlens=cu)
        if not all(torch.isfinite(x).all() for x in ref.values() if x is not None):
            return
        got = forward_backward(m, tensors, states, "triton", cu_seqlens=cu)
        gauge = forward_backward(m, tensors, states, "torch", cu_seqlens=cu)
        for key, want in ref.items():
            assert (got[key] is None) == (want is None) == (gauge[key] is None), (key, text)
            if want is not None:
                bound = max(1e-8, 10 * rel_rms(gauge[key], want))
                noise = (got[key] - want).norm() < 1e-10 * want.numel() ** 0.5  # zero up to rounding, as the reference is
                assert rel_rms(got[key], want) < bound or noise, (key, rel_rms(got[key], want), bound, text)
        ran.append(text)

    check()
    assert len(ran) > 30, len(ran)


def test_a_constant_decay_of_zero_stays_finite():
    """A per-head constant decay that is exactly 0 at one head (exp(-softplus(K / h)) at h = 0: log decay -inf) runs as
    the smallest normal number's log: the kernels' differences of cumulative log decays gave NaN (found by fuzzing)."""
    m = lamixer.loads("mixer zero\ndims K, V\ninput q[K], k[K], v[V]\nstate S[K, V]\nS = exp(-softplus(K / h)) * S + outer(k, v)\nout o = q @ S\n")
    tensors, states = random_call(m, B=1, T=70, H=2, size=4, dtype=torch.float64, seed=2)
    ref = forward_backward(m, tensors, states, "interpret")
    got = forward_backward(m, tensors, states, "triton")
    errors = {k: rel_rms(got[k], ref[k]) for k in ref if ref[k] is not None}
    assert max(errors.values()) < 1e-10, errors


def test_a_sigmoid_gate_that_underflows_stays_finite():
    """A decay written sigmoid(x) lowers to the log decay logsigmoid(x), not log(sigmoid(x)): where sigmoid underflows
    to 0 (x = -300 in float32) the log is -inf, which the chunked forms of both backends turned into NaN (the
    token-by-token interpreter does not)."""
    m = lamixer.loads("mixer sig\ndims K, V\ninput q[K], k[K], v[V], x[]\nstate S[K, V]\nS = sigmoid(x) * S + outer(k, v)\nout o = q @ S\n")
    tensors, states = random_call(m, B=1, T=70, H=2, size=4, dtype=torch.float32, seed=1)
    tensors["x"][0, 10, 0] = -300.0
    ref = forward_backward(m, {k: v.double() for k, v in tensors.items()}, tuple(s.double() for s in states), "interpret")
    for backend in ("torch", "triton"):
        got = forward_backward(m, tensors, states, backend)
        errors = {k: rel_rms(got[k], ref[k]) for k in ref if ref[k] is not None}
        assert max(errors.values()) < 1e-4, (backend, errors)


@pytest.mark.parametrize("spec", ["gla", "simple_gla", "gsa", "gated_deltanet"])
def test_a_decay_of_zero_at_some_tokens_resets_the_state(spec):
    """A per-token log decay of exactly -inf (a gate that reaches 0: the state forgets everything there) mid-chunk, at
    a chunk's start and end and twice in a row, along the key dim, the value dim, per head, and under the delta rule:
    the kernels floor it at the accumulator's smallest normal number's log where they load it (their differences of
    cumulative log decays made -inf - -inf NaN), and match the interpreter in float64."""
    m = lamixer.load(spec)
    tensors, states = random_call(m, B=1, T=70, H=2, size=8, dtype=torch.float64, seed=5)
    g = tensors["g"].clone()
    g[:, [0, 5, 40, 41, 63, 64]] = float("-inf")
    tensors["g"] = g
    cmp = compare(m, "triton", tensors, states)
    assert cmp.worst < 1e-10, cmp.errors


NORMALISED = """mixer normalised
dims K, V
input q[K], k[K], v[V]{gate}
state z[K], S[K, V]
let qp = exp(q)
let kp = exp(k)
z = {decay}z + kp
S = {decay}S + outer(kp, v)
out o = (qp @ S) / (qp @ z)
"""


@pytest.mark.parametrize("decay", ["none", "scalar", "key"])
@pytest.mark.parametrize("packed", [False, True])
def test_a_normaliser_fused_with_its_state_sums_the_scores(decay, packed):
    """A vector state written with the same keys, decay and queries as a matrix state runs side by side with it as a
    last column of ones, which the output kernel sums (the rows of the chunk's scores) instead of giving a value block
    of its own; declared first, it still goes last. Against the interpreter in float64, packed sequences too."""
    gate = {"none": "", "scalar": ", g[] in (-inf, 0)", "key": ", g[K] in (-inf, 0)"}[decay]
    m = lamixer.loads(NORMALISED.format(gate=gate, decay="" if decay == "none" else "exp(g) * "))
    assert m.compiled.plan.fusable == [("z", "S")]
    cu = [0, 5, 70, 133] if packed else None
    tensors, states = random_call(m, B=1 if packed else 2, T=133, H=2, size=8, dtype=torch.float64, seed=7, cu_seqlens=cu)
    tensors = {n: x * 0.3 if n in ("q", "k") else x for n, x in tensors.items()}  # feature maps of order 1
    cmp = compare(m, "triton", tensors, states, cu_seqlens=cu)
    assert cmp.worst < 1e-10, cmp.errors


@pytest.mark.parametrize("name", [n for n in lamixer.shipped_specs() if not triton_backend.unsupported(lamixer.load(n).compiled)])
def test_what_fuse_compiles_traces_to_one_graph(name):
    """runtime/fuse.py compiles the evaluation around the kernels' custom ops (training: the chunk kernels, lln's
    normaliser included) as one graph: a break would compile its pieces apart."""
    import dataclasses

    from lamixer.backends.binding import bind

    m = lamixer.load(name)
    tensors, _ = random_call(m, B=1, T=70, H=2, size=16, dtype=torch.float32, initial_state=False, distinct=False)  # two chunks
    call = bind(m.compiled, (), {k: v.requires_grad_() for k, v in tensors.items()}, None, None, None)
    choices = triton_backend._choices(m.compiled, call, True, None)[:3]
    constants = evaluate.call_constants(m.compiled, call, choices[2])
    torch._dynamo.reset()
    explained = torch._dynamo.explain(lambda c: triton_backend._evaluate(c, m.compiled, *choices, constants))(dataclasses.replace(call, memo=None))
    assert explained.graph_count == 1, [str(b.reason)[:300] for b in explained.break_reasons]


def test_the_walks_narrow_their_value_block_when_their_grid_leaves_the_device_idle(monkeypatch):
    """chunk_additive's walks take launch.state_value_block's value block, their programs counted per key block: 32
    sequences x heads of 128 values narrow 64 to 32 (128 programs fit an H200's 132 multiprocessors), 64 keep 64, and
    the same 32 split over four key blocks keep 64; off a GPU the configuration's block stands."""
    from lamixer.kernels import additive, launch
    from lamixer.kernels.config import Config

    monkeypatch.setattr(launch, "_sm_count", lambda index: 132)
    gpu = torch.device("cuda", 0)
    whole, split = Config(64, 128, 128, 4, 2, 64), Config(64, 128, 32, 4, 2, 64)
    assert additive.walk_blocks(whole, 128, 128, 32, gpu) == (32, 64, 128)
    assert additive.walk_blocks(whole, 128, 128, 64, gpu) == (64, 64, 128)
    assert additive.walk_blocks(split, 128, 128, 32, gpu) == (64, 32, 32)
    assert additive.walk_blocks(whole, 128, 128, 32, torch.device("cpu")) == (64, 64, 128)


def test_a_walk_that_loads_no_per_token_decay_pipelines_one_stage_more():
    """The sequential passes' stages: three for 2-byte tiles, four where the pass loads no per-token decay, two for
    float32 tiles whatever the decay, one fewer above K = 128."""
    from lamixer.kernels.launch import state_stages

    assert [state_stages(torch.bfloat16, 128, token_decay=d) for d in (True, False)] == [3, 4]
    assert [state_stages(torch.float32, 128, token_decay=d) for d in (True, False)] == [2, 2]
    assert [state_stages(torch.float16, 256, token_decay=d) for d in (True, False)] == [2, 3]
    # the walks of no decay and of a per-head constant load their key and value tiles alone
    from lamixer.kernels import additive
    from lamixer.kernels.loader import kernels

    loads = {d: kernels(additive.FAMILY, **additive.template_args(d, "after", "float32")).WALK_TOKEN_DECAY
             for d in ("none", "constant", "scalar", "key", "value")}  # fmt: skip
    assert loads == {"none": False, "constant": False, "scalar": True, "key": True, "value": True}
