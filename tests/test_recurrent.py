"""The recurrent kernel (templates/recurrent.py.jinja) under TRITON_INTERPRET=1 (set in conftest).

Every shipped spec and example runs its scans token by token against the interpreter in float64:
outputs and final states, T = 1, 5 and 37, packed sequences, initial states, strong and weak gates;
several reads of one state; which calls it serves (inference up to 64 tokens) and which it leaves
to the chunk kernels; low precision; torch.compile; layers decoding on it.
"""
import ast
import os

import pytest
import torch
from conftest import EXAMPLE_SPECS as EXAMPLES
from test_layers import SMALL

import lamixer
from lamixer.backends import triton as triton_backend
from lamixer.kernels import additive as chunk_host
from lamixer.kernels import recurrent
from lamixer.tools.check import random_call, rel_rms

TOL = 1e-12  # float64 all the way: only summation order differs from the interpreter
SPECS = lamixer.shipped_specs() + sorted(os.path.join(EXAMPLES, f) for f in os.listdir(EXAMPLES) if f.endswith(".lam"))
# the specs whose every scan group has a recurrent kernel (the others run on the torch backend: tests/test_multi_write.py)
SPECS = [n for n in SPECS if all(g.decode is not None for g in lamixer.load(n).compiled.plan.groups)]


class Launches(list):
    finished: list


@pytest.fixture
def launches(monkeypatch):
    """The (rule, decay, reads) of every recurrent launch; a chunk kernel launch fails the test."""
    seen, finished = Launches(), []  # finished: per launch, the key-side operands' forms as launch takes them, a, c, q
    seen.finished = finished
    launch = recurrent.launch

    def spy(queries, qs, a, b, c, g, h0, cu, rule, decay, reads, out_dtype, *forms, **flags):
        seen.append((rule, decay, reads))
        finished.append((forms, a, c, queries))
        return launch(queries, qs, a, b, c, g, h0, cu, rule, decay, reads, out_dtype, *forms, **flags)

    def chunk(*args):
        raise AssertionError("a chunk kernel ran where the recurrent kernel should")

    monkeypatch.setattr(recurrent, "launch", spy)
    monkeypatch.setattr(chunk_host, "run_chunk_scan", chunk)
    return seen


def run(m, tensors, states, backend, cu=None, scale=None):
    h0 = None if states is None else (states[0] if len(states) == 1 else states)
    cu = None if cu is None else torch.tensor(cu)
    with torch.no_grad():
        o, finals = m(**tensors, initial_state=h0, output_final_state=True, cu_seqlens=cu, backend=backend, scale=scale)
    return o, finals if isinstance(finals, tuple) else (finals,)


def assert_matches(m, tensors, states, what, cu=None, scale=None, tol=TOL):
    got, ref = run(m, tensors, states, "triton", cu, scale), run(m, tensors, states, "interpret", cu, scale)
    errors = {"o": rel_rms(got[0], ref[0]), **{f"state {n}": rel_rms(a, b) for n, a, b in zip(m.states, got[1], ref[1])}}
    bad = {k: f"{v:.1e}" for k, v in errors.items() if not v < tol}
    assert not bad, f"{what}: {bad}"


@pytest.mark.parametrize("name", SPECS, ids=os.path.basename)
def test_matches_interpreter(name, launches):
    m = lamixer.load(name)
    for T, gate, cu in [(1, "normal", None), (5, "weak", None), (37, "strong", None), (None, "normal", [0, 3, 4, 20])]:
        tensors, states = random_call(m, T=T or 1, H=2, gate=gate, cu_seqlens=cu, seed=T or 9)
        assert_matches(m, tensors, states, f"{m.name} T={T} {gate} cu={cu}", cu)
    assert len(launches) == 4 * (len(m.compiled.classification.scans) - sum(len(f) - 1 for f in m.compiled.plan.fusable))


THREE_READS = """mixer three_reads
dims K, V
input q[K], p[K], k[K], v[V], g[K] in (-inf, 0), beta[] in (0, 1)
param w[H, K]
state S[K, V]
let before = scale * q @ S
S = exp(g) * S
let mid = (w * p) @ S
S = S + outer(beta * k, v - k @ S)
out o = before + mid + q @ S
"""


FINISHED_KEYS = """mixer finished_keys
dims K, V
input q[K], k[K], v[V], beta[] in (0, 1), g[] in (-inf, 0)
param w[H]
state S[K, V]
let kn = l2norm(k)
S = exp(g) * S
S = S + outer(0.5 * (beta * kn), v - kn @ S)
out o = (0 - w * l2norm(q)) @ S
"""


@pytest.mark.parametrize("name", ["gated_deltanet", "finished_keys"])
def test_the_kernel_finishes_key_side_operands(name, launches):
    """A decode step runs no torch op on q, k, beta: the kernel reads the caller's tensors and l2-normalises the
    query, write and erase keys itself, scales the write key by the token's beta (and a constant), negates the erase
    key, and multiplies the query by its per-head factor and sign (Gated DeltaNet's, and a spec made to use each)."""
    m = lamixer.load(name) if name in lamixer.shipped_specs() else lamixer.loads(FINISHED_KEYS)
    for T, cu in [(1, None), (9, None), (None, [0, 3, 4, 20])]:
        tensors, states = random_call(m, T=T or 1, H=2, cu_seqlens=cu, seed=4, gate="strong")
        assert_matches(m, tensors, states, f"{name} T={T} cu={cu}", cu)
        (norms, at, ct, af, cf), a, c, queries = launches.finished[-1]
        assert norms == [True, True, True] and at is tensors["beta"] and ct is None
        assert a is tensors["k"] and c is tensors["k"] and queries[0] is tensors["q"]
        assert torch.equal(cf, -torch.ones(2, dtype=cf.dtype)) and (af is None) == (name == "gated_deltanet")


def test_several_reads_of_one_state(launches):
    """Reads before the update, between decay and write and after it, of a delta-rule state: one kernel, three outputs."""
    m = lamixer.loads(THREE_READS)
    assert [(r.decayed, r.written) for r in m.compiled.classification.scans[0].reads] == [(False, False), (True, False), (True, True)]
    for T, cu in [(1, None), (37, None), (None, [0, 3, 4, 20])]:
        tensors, states = random_call(m, T=T or 1, H=3, cu_seqlens=cu, seed=5, gate="strong")
        assert_matches(m, tensors, states, f"T={T} cu={cu}", cu)
    tensors, _ = random_call(m, T=6, H=2, seed=1, initial_state=False)
    assert_matches(m, tensors, None, "no initial state, a scale", scale=0.3)
    assert set(launches) == {("delta", "key", "before_mid_after")}


def test_no_initial_state_and_scale(launches):
    m = lamixer.load("gla")
    tensors, _ = random_call(m, T=7, H=2, seed=1, initial_state=False)
    assert_matches(m, tensors, None, "gla without a state", scale=0.3)


def test_broadcast_operands_need_no_copy(launches, monkeypatch):
    """Operands go to the kernel in their strides: a per-head constant decay (RetNet) and inputs that are views."""
    m = lamixer.load("retnet")
    tensors, states = random_call(m, B=2, T=5, H=3, seed=2)
    tensors = {k: v.transpose(0, 1).contiguous().transpose(0, 1) for k, v in tensors.items()}  # [B, T] swapped in memory
    assert not tensors["q"].is_contiguous()
    strides = []
    launch = recurrent.launch

    def spy(queries, qs, a, b, c, g, *rest, **flags):
        strides.append((queries[0].stride(), a.stride(), g.stride()))
        return launch(queries, qs, a, b, c, g, *rest, **flags)

    monkeypatch.setattr(recurrent, "launch", spy)
    assert_matches(m, tensors, states, "retnet, strided inputs")
    (q, a, g), *_ = strides
    assert q == tensors["q"].stride() and a == tensors["k"].stride() and g[:2] == (0, 0)


def test_serves_inference_up_to_64_tokens_and_leaves_the_rest_to_the_chunk_kernels(monkeypatch):
    m = lamixer.load("simple_gla")
    used = []
    launch, chunk = recurrent.launch, chunk_host.run_chunk_scan
    monkeypatch.setattr(recurrent, "launch", lambda *args, **flags: used.append("recurrent") or launch(*args, **flags))
    monkeypatch.setattr(chunk_host, "run_chunk_scan", lambda *args: used.append("chunk") or chunk(*args))

    def kernel(T=None, grad=False, enabled=True, cu=None):
        used.clear()
        tensors, states = random_call(m, B=1, T=T or 1, H=1, size=4, seed=0, cu_seqlens=cu)
        tensors = {k: v.requires_grad_(grad) for k, v in tensors.items()}
        with torch.set_grad_enabled(enabled):
            m(**tensors, initial_state=states[0], cu_seqlens=None if cu is None else torch.tensor(cu), backend="triton")
        return used

    assert kernel(64) == ["recurrent"] and kernel(65) == ["chunk"]
    assert kernel(None, cu=[0, 60, 100, 164]) == ["recurrent"]  # the longest sequence decides, not the packed length
    assert kernel(None, cu=[0, 65, 70]) == ["chunk"]
    assert kernel(5, grad=True) == ["chunk"]  # autograd needs the chunk kernels' backward
    assert kernel(5, grad=True, enabled=False) == ["recurrent"]  # under no_grad, requires_grad does not matter
    assert kernel(5) == ["recurrent"]  # nor with grad enabled when nothing requires it


def test_the_delta_rule_runs_on_triton_kernels_for_inference(launches):
    m = lamixer.load("gated_deltanet")
    tensors, states = random_call(m, T=4, H=2, seed=0)
    assert_matches(m, tensors, states, "gated_deltanet")
    assert launches == [("delta", "scalar", "after")] * 1
    grads = {k: v.clone().requires_grad_() for k, v in tensors.items()}
    o, _ = m(**grads, backend="triton")  # training: the delta rule's chunk kernels, not this one
    assert o.requires_grad and len(launches) == 1


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_inputs_and_a_float32_gate(dtype, launches):
    """q, k, v in half precision with a float32 gate: o in the input dtype, states in float32, converted as the kernel loads."""
    m = lamixer.load("gla")
    tensors, states = random_call(m, T=9, H=2, seed=3, dtype=torch.float32)
    tensors = {k: v if k == "g" else v.to(dtype) for k, v in tensors.items()}
    with torch.no_grad():
        o, S = m(**tensors, initial_state=states[0], output_final_state=True, backend="triton")
        ref, S_ref = m(**tensors, initial_state=states[0], output_final_state=True, backend="interpret")
    assert o.dtype == dtype and S.dtype == torch.float32
    assert rel_rms(o, ref) < 1e-3 and rel_rms(S, S_ref) < 1e-6  # measured: 0 and 5e-8 (bf16 and fp16)


def test_head_dims_up_to_256(launches):
    m = lamixer.load("gated_deltanet")
    tensors, states = random_call(m, B=1, T=2, H=1, size=256, seed=0, distinct=False)
    tensors = {k: v[..., :20] if k == "v" else v for k, v in tensors.items()}
    assert_matches(m, tensors, (states[0][..., :20],), "K = 256")
    big, _ = random_call(m, B=1, T=2, H=1, size=257, seed=0, initial_state=False, distinct=False)
    with torch.no_grad(), pytest.raises(lamixer.ArgumentError, match="above the kernels' 256"):
        m(**big, backend="triton")


def test_torch_compile_fullgraph_traces_the_custom_op():
    m = lamixer.load("gated_deltanet")
    tensors, states = random_call(m, T=1, H=2, seed=3, dtype=torch.float32)
    ops = []

    def backend(gm, inputs):
        ops.extend(n.target for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    def step(q, k, v, g, beta, S):
        return m(q, k, v, g, beta, initial_state=S, output_final_state=True, backend="triton")

    with torch.no_grad():
        o, S = step(*tensors.values(), states[0])
        o2, S2 = torch.compile(step, fullgraph=True, backend=backend)(*tensors.values(), states[0])
    assert torch.ops.lamixer.recurrent_scan.default in ops
    assert torch.equal(o, o2) and torch.equal(S, S2)


HIDDEN, HEADS = 16, 2
STATEFUL = [n for n in lamixer.shipped_specs() if n in SPECS and lamixer.Layer(n, HIDDEN, HEADS, **SMALL.get(n, {})).stateful]


@pytest.mark.parametrize("name", STATEFUL)
def test_layer_prompt_then_steps_on_the_recurrent_kernel(name, launches):
    """Layer.step decodes on the recurrent kernel and equals running the whole sequence (torch backend)."""
    torch.manual_seed(0)
    layer = lamixer.Layer(name, HIDDEN, HEADS, backend="triton", **SMALL.get(name, {})).double().eval()  # lln: its running estimates
    x = torch.randn(2, 9, HIDDEN, dtype=torch.float64)
    with torch.no_grad():
        y, state = layer(x[:, :5], return_state=True)
        outs = [y]
        for t in range(5, 9):
            y_t, state = layer.step(x[:, t], state)
            outs.append(y_t[:, None])
        layer.backend = "torch"
        whole = layer(x)
    assert len(launches) == 5 * len(layer.mixer.compiled.plan.groups)  # one launch per scan group (lln's S and z share one)
    assert rel_rms(torch.cat(outs, 1), whole) < 1e-10


def test_compiles_for_the_gpu_without_spills():
    """The interpreter accepts more than the compiler: compile the heaviest variant (delta rule, per-key decay, three
    reads, packed sequences aside), its key-side operands plain and finished in the kernel (l2norms, a token's
    scalar, a head's factor), for sm_90 on this machine, in a process without TRITON_INTERPRET, and ask ptxas."""
    pytest.importorskip("triton.backends.nvidia")
    import subprocess
    import sys

    code = ("import sys; sys.path.insert(0, 'bench'); import recurrent_registers as r\n"
            "from lamixer.kernels.recurrent import WARPS\n"
            "for f in (False, True): print(r.registers(r.compile_kernel('delta', 'key', 'before_mid_after', 128, 32, WARPS[(128, 32)], finished=f)))")  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.join(os.path.dirname(__file__), "..")
    out = subprocess.run([sys.executable, "-c", code], cwd=root, env={**env, "PYTHONPATH": os.path.abspath(root)}, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    plain, finished = (ast.literal_eval(line) for line in out.stdout.strip().splitlines()[-2:])
    assert plain[1] == 0 and plain[0] <= 128, plain
    assert finished[1] == 0 and finished[0] <= 192, finished  # three rows normalised, each a reduction over the keys


def test_states_in_place_overwrite_the_initial_state(launches):
    """Under runtime.scan.STATES_IN_PLACE (Layer.decoder's capture) the kernel writes the final state over the caller's
    float32 initial state: the same tensor comes back, holding what a fresh one would."""
    from lamixer.runtime.scan import states_in_place

    m = lamixer.load("gated_deltanet")
    tensors, states = random_call(m, T=3, H=2, seed=6, dtype=torch.float32)
    ref = run(m, tensors, states, "interpret")
    h0 = states[0].clone()
    with states_in_place(), torch.no_grad():
        o, final = m(**tensors, initial_state=h0, output_final_state=True, backend="triton")
    assert final.data_ptr() == h0.data_ptr() and rel_rms(final, ref[1][0]) < 1e-6 and rel_rms(o, ref[0]) < 1e-6


def test_random_mixers_infer_as_the_interpreter_does(launches):
    """The fuzzer's dims-typed random mixers (tests/test_fuzz.py) that compile and run: the Triton backend's
    inference path (the recurrent kernel, its key-side operands finished in it where their form allows) against the
    interpreter in float64, packed or not; specs whose reference overflows are left out. Some calls must have given
    the kernel unfinished operands, or the test would not test the forms."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
    from test_fuzz import load_or_located_error, typed_spec

    ran = []

    @settings(max_examples=200, derandomize=True, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(typed_spec(), st.booleans())
    def check(text, packed):
        m = load_or_located_error(text)
        if m is None or not all(s.reads for s in m.compiled.classification.scans):  # (the kernels need a read)
            return
        if triton_backend.unsupported(m.compiled):  # forms with no Triton template yet (several writes per token)
            return
        cu = [0, 2, 6] if packed else None
        tensors, states = random_call(m, B=1, T=6, H=2, size=3, cu_seqlens=cu)
        ref = run(m, tensors, states, "interpret", cu)
        if not all(torch.isfinite(x).all() for x in (ref[0], *ref[1])):
            return
        got = run(m, tensors, states, "triton", cu)
        errors = [rel_rms(a, b) for a, b in zip((got[0], *got[1]), (ref[0], *ref[1]))]
        assert max(errors) < 1e-9, (errors, text)
        ran.append(text)

    check()
    finished = [forms for forms, *_ in launches.finished if forms and (any(forms[0]) or any(x is not None for x in forms[1:]))]
    assert len(ran) > 50 and len(finished) > 5, (len(ran), len(finished))


def test_the_value_block_narrows_until_the_programs_fill_two_waves(monkeypatch):
    """recurrent.blocks: the widest value block WIDEST allows, halved (down to 16) while the (value block, sequence x
    head) programs fill fewer than two waves of the device's multiprocessors (launch.multiprocessors: 132 on an
    H200, 1 off a GPU)."""
    from lamixer.kernels import launch

    monkeypatch.setattr(launch, "_sm_count", lambda index: 132)
    gpu = torch.device("cuda", 0)
    assert recurrent.blocks(128, 128, 4, gpu) == (128, 16, recurrent.WARPS[(128, 16)])  # 32 programs at 16 wide
    assert recurrent.blocks(128, 128, 66, gpu) == (128, 32, recurrent.WARPS[(128, 32)])  # 264 programs at 32 wide
    assert recurrent.blocks(64, 64, 40, gpu) == (64, 16, recurrent.WARPS[(64, 16)])  # 160 at 16 wide, still one wave
    assert recurrent.blocks(64, 64, 200, gpu) == (64, 32, recurrent.WARPS[(64, 32)])
    assert recurrent.blocks(128, 128, 1, torch.device("cpu")) == (128, 32, recurrent.WARPS[(128, 32)])  # 4 programs >= 2
