"""The delta rule's generated Triton kernels under TRITON_INTERPRET=1 (set in conftest) against the interpreter in
float64: outputs, final states and every gradient (inputs and initial state), d(log decay) included."""
import os

import pytest
import torch
from conftest import EXAMPLE_SPECS as EXAMPLES

import lamixer
from lamixer.backends import triton as triton_backend
from lamixer.kernels import delta as triton_delta
from lamixer.kernels.config import Config
from lamixer.render import kernel_cache
from lamixer.tools.check import compare, random_call
from lamixer.tuning.search import configured

TOL = 1e-10  # measured: below 1e-13 on every case here
DELTA = ["deltanet", "gated_deltanet", os.path.join(EXAMPLES, "gated_delta_vector.lam")]  # no decay, scalar, per key
SIZE = 16  # head dims 16 and 17: masked key and value columns


def _assert_close(c, what, tol=TOL):
    bad = {k: f"{v:.2e}" for k, v in c.errors.items() if not v < tol}
    assert not bad, f"{what}: {bad}"


def _check(m, what, T=1, gate="normal", cu=None, seed=0, initial_state=True, B=2, size=SIZE, call=None):
    tensors, states = random_call(m, B=B, T=T, H=2, size=size, gate=gate, seed=seed, cu_seqlens=cu, initial_state=initial_state)
    _assert_close(compare(m, "triton", tensors, states, cu_seqlens=cu, seed=seed, call=call), what)


def _plan(scan_group) -> tuple[str, str]:
    """(decay, read) of the delta kernels the plan renders for a scan group."""
    assert scan_group.train.template == triton_delta.FAMILY
    return scan_group.decay.kind, scan_group.read


def test_the_delta_specs_run_on_the_delta_template():
    for name in DELTA:
        c = lamixer.load(name).compiled
        assert not triton_backend.unsupported(c) and c.classification.scans[0].rule == "delta", name
    assert [_plan(lamixer.load(n).compiled.plan.groups[0]) for n in DELTA] == [
        ("none", "after"), ("scalar", "after"), ("key", "after")]  # fmt: skip


@pytest.mark.parametrize("name", DELTA, ids=os.path.basename)
@pytest.mark.parametrize("T,gate", [(1, "normal"), (37, "strong"), (150, "weak")])
def test_delta_matches_interpreter(name, T, gate):
    """One token, a chunk's tail, several chunks with a tail; strong and weak gates; initial states."""
    _check(lamixer.load(name), f"{name} T={T} {gate}", T=T, gate=gate, seed=T)


@pytest.mark.parametrize("name", DELTA, ids=os.path.basename)
def test_delta_varlen(name):
    """Packed sequences, one longer than a chunk and than the 64-token segments of d(log decay)."""
    _check(lamixer.load(name), f"{name} varlen", cu=[0, 3, 90, 111], gate="strong", seed=4)


def test_delta_without_an_initial_state():
    _check(lamixer.load("gated_deltanet"), "no initial state", T=70, initial_state=False, seed=5)


GENERAL = "mixer {name}\ndims K, V\ninput q[K], k[K], e[K], v[V]{gate}, beta[] in (0, 1)\nstate S[K, V]\n"
READS = {  # a write key and an erase key that differ (a = beta k, c = -e; a = k, c = 0.5 e with the value scaled)
    "before": "out o = scale * q @ S\n{decay}S = S + outer(beta * k, v - e @ S)\n",
    "mid": "{decay}out o = scale * q @ S\nS = S + outer(beta * k, v - e @ S)\n",
    "after": "{decay}S = S + outer(k, beta * v + 0.5 * e @ S)\nout o = q @ S\n",
}


@pytest.mark.parametrize("read,decay", [("before", "key"), ("mid", "scalar"), ("after", "none"), ("before", "none")])
def test_any_read_position_and_distinct_write_and_erase_keys(read, decay):
    """Nothing is special-cased on DeltaNet: reads before the update or between decay and write, a != c."""
    gate = {"key": ", g[K] in (-inf, 0)", "scalar": ", g[] in (-inf, 0)", "none": ""}[decay]
    body = READS[read].format(decay="S = exp(g) * S\n" if gate else "")
    m = lamixer.loads(GENERAL.format(name=f"d_{read}_{decay}", gate=gate) + body)
    (s,) = m.compiled.classification.scans
    assert s.rule == "delta" and _plan(m.compiled.plan.groups[0]) == (decay, read if gate or read == "after" else "before")
    _check(m, f"read {read}, decay {decay}", T=40, gate="strong", seed=2)
    _check(m, f"read {read}, decay {decay}, varlen", cu=[0, 5, 75, 90], gate="strong", seed=3)


@pytest.mark.parametrize("BT,name", [(16, "gated_deltanet"), (32, "gated_deltanet"), (32, DELTA[2])], ids=["16-scalar", "32-scalar", "32-key"])
def test_chunk_lengths_and_key_and_value_blocks(BT, name, monkeypatch):
    """Chunks of one and two 16-token solve blocks (the defaults: 64 for a scalar decay, 16 per key); K = 20 and
    V = 21 in two blocks each (but the per-chunk kernels' value blocks, at least triton_delta.CHUNK_BLOCK wide)."""
    m = lamixer.load(name)
    _check(m, f"{name} BT={BT}", T=80, gate="strong", seed=BT, B=1, size=20, call=configured(m, {triton_delta.FAMILY: Config(BT, 16, 16, 4, 1, BW=16)}))


def test_half_inputs_keep_float32_states():
    """bf16 q, k, v, beta with a float32 gate (run in float32 under the interpreter, as the additive family is)."""
    m = lamixer.load("gated_deltanet")
    tensors, states = random_call(m, T=80, H=2, size=SIZE, seed=3, dtype=torch.float32)
    tensors = {k: v if k == "g" else v.to(torch.bfloat16) for k, v in tensors.items()}
    o, S = m(**tensors, initial_state=states[0], output_final_state=True, backend="triton")
    assert o.dtype == torch.bfloat16 and S.dtype == torch.float32
    c = compare(m, "triton", tensors, states, seed=3)
    _assert_close(c, "bf16 inputs", tol=2e-4)  # measured: 4e-5 (gradients rounded to bf16 on both sides)


def test_rendered_kernels_are_named_for_their_configuration():
    from lamixer.render.templates import render

    source = render("scan_delta", decay="key", read="before", acc="float32")
    assert "decay=key, read=before" in source
    for kernel in triton_delta.kernel_names("key"):
        assert f"def scan_delta_key_before_float32_{kernel}(" in source


def test_tuning_a_delta_spec_stores_under_its_kernel(tmp_path, monkeypatch):
    from lamixer.render.templates import source_hash
    from lamixer.tuning import choose, search
    from lamixer.tuning import config_cache as cache

    monkeypatch.setenv("LAMIXER_CACHE", str(tmp_path))
    cache._memo.clear()
    choose.forget()
    m = lamixer.load("gated_deltanet")
    trials, keys = search.tune(m, 1, 40, 2, 16, torch.float32, "cpu", limit=2)
    assert all(t.error < 1e-3 and t.ms > 0 for t in trials)
    assert len(keys) == 1 and source_hash("scan_delta", decay="scalar", read="after", acc="float32") in keys[0]
    best = min(trials, key=lambda t: t.ms).config
    assert choose.choose(m.compiled.plan.groups[0], torch.float32, 1, 40, 2, 16, 16, torch.device("cpu")) == best
    cache._memo.clear()
    choose.forget()


@pytest.mark.parametrize("name", ["gated_deltanet", "kda"])
def test_torch_compile_fullgraph_traces_the_delta_scan(name):
    """The scan and its backward are custom ops with fake implementations: a traced call equals the eager one (kda: the
    scan keeps the read's scores, an output more, for its backward)."""
    m = lamixer.load(name)
    tensors, _ = random_call(m, T=20, H=2, size=SIZE, dtype=torch.float32, initial_state=False, seed=3)
    eager = {k: v.clone().requires_grad_() for k, v in tensors.items()}
    o, _ = m(**eager, backend="triton")
    o.sum().backward()
    traced = torch.compile(lambda q, k, v, g, beta: m(q, k, v, g, beta, backend="triton")[0], fullgraph=True, backend="aot_eager")
    leaves = {k: v.clone().requires_grad_() for k, v in tensors.items()}
    o2 = traced(*leaves.values())  # with gradients: the chunk kernels, as the eager call
    o2.sum().backward()
    assert torch.equal(o, o2)
    for k in leaves:
        assert torch.equal(leaves[k].grad, eager[k].grad), k


@pytest.mark.parametrize("name", ["deltanet", "gated_deltanet"])
def test_half_precision_errors_stay_at_the_formats_level(name):
    """fp16 inputs (the interpreter runs no bf16 dot), strong gates: every output and gradient within 2e-3 of the
    float64 interpreter. Without a decay W, U and the states are kept in fp16 (6e-4 to 8e-4 here); with one they
    must stay float32: d(log decay) cancels, and fp16 intermediates took it to 7.5e-3."""
    m = lamixer.load(name)
    tensors, states = random_call(m, B=1, T=150, H=2, size=32, gate="strong", dtype=torch.float16, seed=5)
    c = compare(m, "triton", tensors, tuple(s.float() for s in states), seed=5)
    bad = {k: f"{v:.2e}" for k, v in c.errors.items() if not v < 2e-3}
    assert not bad, bad


@pytest.mark.parametrize("decay", ["scalar", "key"])
def test_the_forward_keeps_each_chunks_inverse_for_the_backward(decay):
    """delta_scan's third output is T = (I - M)^-1 per chunk (M_ij = c_i . a_j exp(B_i - B_j), i > j, within a chunk
    of 16, the last one short), its fourth, under a per-key decay, the read's scores A_ij = q_i . a_j exp(B_i - B_j),
    j <= i (empty for a scalar decay, whose kernels recompute them); the backward reads both instead of making them
    again: a wrong T or A changes its gradients."""
    torch.manual_seed(0)
    B, T, H, K, BT = 1, 40, 2, 8, 16
    q, a, b, c = (torch.randn(B, T, H, K, dtype=torch.float64) * 0.5 for _ in range(4))
    g = -torch.rand(B, T, H, *((K,) if decay == "key" else ()), dtype=torch.float64)
    h0 = torch.zeros(B, H, K, K, dtype=torch.float64)
    cfg = Config(BT, 16, 16, 4, 1).as_list()
    o, ht, tm, sc, rq, cn, rc = triton_delta.delta_scan(q, None, a, b, c, g, h0, None, decay, "after", cfg)
    assert sc.numel() == (tm.numel() if decay == "key" else 0)
    gk = (g[..., None] if decay == "scalar" else g).expand(B, T, H, K)
    for start in range(0, T, BT):
        rows = slice(start, min(start + BT, T))
        n = rows.stop - start
        Bc = gk[0, rows].cumsum(0)  # [n, H, K]
        # x_i . a_j exp(B_i - B_j) for every pair of the chunk's tokens, per head
        M, A = (torch.einsum("ihk,jhk->hij", x[0, rows] * Bc.exp(), a[0, rows] * (-Bc).exp()) for x in (c, q))
        for h in range(H):
            Tm = tm[0, rows, h, :n]
            assert torch.allclose(Tm @ (torch.eye(n, dtype=M.dtype) - M[h].tril(-1)), torch.eye(n, dtype=M.dtype), atol=1e-12)
            if decay == "key":
                assert torch.allclose(sc[0, rows, h, :n], A[h].tril(), atol=1e-12)
    do, dht = torch.randn_like(o), torch.randn_like(ht)
    grads = triton_delta.delta_scan_backward(q, None, a, b, c, g, h0, None, tm, sc, rq, cn, rc, do, dht, decay, "after", cfg)
    wrong = triton_delta.delta_scan_backward(q, None, a, b, c, g, h0, None, tm * 0.5, sc, rq, cn, rc, do, dht, decay, "after", cfg)
    assert all(torch.isfinite(x).all() for x in grads)
    assert not torch.allclose(grads[1], wrong[1])
    if decay == "key":
        wrong = triton_delta.delta_scan_backward(q, None, a, b, c, g, h0, None, tm, sc * 0.5, rq, cn, rc, do, dht, decay, "after", cfg)
        assert not torch.allclose(grads[2], wrong[2])  # db = T^T (A^T dO + ...)


@pytest.mark.parametrize("decay, read, erase_before", [("none", "after", False), ("scalar", "after", False), ("key", "after", False),
                                                       ("scalar", "before", False), ("key", "after", True)])  # fmt: skip
def test_strengths_stand_for_the_write_keys(decay, read, erase_before):
    """Given the writes' strengths s (strength=True), the kernels scale their products with the erase keys by -s: the
    same outputs and final state as the write keys -s c made first, to float64's rounding, packed sequences and a
    chunk's tail included; the gradients of s and c are those of the keys through -s c (a read or erase before the
    decay takes the pairs no decay weighs, the previous token's key among them)."""
    torch.manual_seed(1)
    B, T, H, K = 1, 45, 2, 8
    q, b, c = (torch.randn(B, T, H, K, dtype=torch.float64, requires_grad=True) for _ in range(3))
    s = torch.rand(B, T, H, dtype=torch.float64, requires_grad=True)
    g = None if decay == "none" else -torch.rand(B, T, H, *((K,) if decay == "key" else ()), dtype=torch.float64)
    h0 = torch.randn(2, H, K, K, dtype=torch.float64)
    cu = torch.tensor([0, 20, T])
    cfg = Config(16, 16, 16, 4, 1).as_list()
    made = triton_delta.delta_scan(q, None, -s[..., None] * c, b, c, g, h0, cu, decay, read, cfg, erase_before)
    taken = triton_delta.delta_scan(q, None, s, b, c, g, h0, cu, decay, read, cfg, erase_before, strength=True)
    for x, y in zip(made[:2], taken[:2]):
        assert (x - y).abs().max() < 1e-12 * x.abs().max()
    do = torch.randn_like(made[0])
    want = torch.autograd.grad((made[0] * do).sum(), (q, b, c, s))
    args = (q, None, s, b, c, g, h0, cu, decay, read, cfg, erase_before, 1, 0, 1, True, -1, False, False, None)
    o, _ = triton_delta._EagerDeltaScan.apply(*args)
    got = torch.autograd.grad((o * do).sum(), (q, b, c, s))
    for name, x, y in zip(("dq", "db", "dc", "ds"), want, got):
        assert (x - y).abs().max() < 1e-11 * x.abs().max(), name


def test_the_plan_takes_a_delta_rules_strengths():
    """A write key s * x beside the erase key -x (DeltaNet's beta k and -k) gives the scans s: its keys are never made
    on the torch side (the write key's node is not evaluated); RWKV-7's a vector times its erase key does not."""
    from lamixer.backends.evaluate import program

    for name, writes in (("deltanet", 1), ("gated_deltanet", 1), ("kda", 1), ("gated_deltaproduct", 2), ("rwkv7", 0)):
        c = lamixer.load(name).compiled
        (group,) = c.plan.groups
        assert len(group.strengths) == writes, name
        scan = c.classification.scan(group.states[0])
        evaluated = {n for n, _ in program(c).steps}
        for w, st in zip(scan.writes, group.strengths):
            assert c.plan.nodes[st]["op"] == "input" and w.key not in evaluated, name


def test_the_delta_chunk_kernels_normalise_the_query_and_the_erase_keys_themselves():
    """The plan gives the delta rule's chunk kernels a query l2norm(q) as q with its norm to finish (delta.QUERY_NORM),
    its per-head factor too, and an erase key -l2norm(k) as k with its norm and sign (delta.KEY_NORM), while their
    scans still take the strengths for the write keys; the additive rule's kernels take a normalised query made
    before them."""
    from lamixer.backends.evaluate import program

    additive = lamixer.loads("""mixer normalised_query_gla
dims K, V
input q[K], k[K], v[V], g[K] in (-inf, 0)
state S[K, V]
S = exp(g) * S + outer(k, v)
out o = scale * l2norm(q) @ S
""")
    for name, finished in (("gated_deltanet", True), ("deltanet", True), ("kda", True), (additive, False)):
        c = (lamixer.load(name) if isinstance(name, str) else name).compiled
        (group,) = c.plan.groups
        query = c.classification.scan(group.states[0]).reads[0].query
        forms = dict(group.finished_train)
        assert (query in forms and forms[query].norm and forms[query].factor is not None) == finished, name
        assert dict(group.finished_decode)[query].norm, name  # the recurrent kernel finishes it either way
        if finished:
            erase = c.classification.scan(group.states[0]).writes[0].erase
            assert forms[erase] == (forms[erase].input, None, True, True, None, ()), name
            assert program(c, forms).strengths == {group.states[0]: group.strengths}, name
            assert not program(c, dict(group.finished_decode), decoding=True).strengths, name  # it takes the write keys


def test_the_delta_chunk_kernels_take_only_the_norms_they_finish():
    """delta.scan reads a query's l2norm and an erase key's l2norm with its per-head factor off the operands' forms,
    and refuses any other form rather than leave it unapplied."""
    import types

    from lamixer.runtime.scan import KeyForm

    def norms(**forms):
        return triton_delta._norms(types.SimpleNamespace(forms=forms), torch.float32)

    sign = torch.tensor([-1.0, -1.0])
    assert norms() == (False, False, None)
    assert norms(q0=KeyForm(norm=True)) == (True, False, None)
    qnorm, knorm, factor = norms(q0=KeyForm(norm=True), c=KeyForm(norm=True, factor=sign))
    assert qnorm and knorm and torch.equal(factor, sign)
    for forms in (dict(a=KeyForm(norm=True)), dict(c=KeyForm(factor=sign)), dict(c=KeyForm(norm=True, token=sign)),
                  dict(q0=KeyForm(norm=True, factor=sign))):  # fmt: skip
        with pytest.raises(ValueError, match="finish a query's l2norm"):
            norms(**forms)


@pytest.mark.parametrize("rows", [{6: 1e-3, 40: 1e3, 41: 1e3}, {5: 0., 7: 1e-14}], ids=["scaled", "below the floor"])
@pytest.mark.parametrize("operand", ["q", "k"])
@pytest.mark.parametrize("name", ["gated_deltanet", os.path.join(EXAMPLES, "gated_delta_vector.lam")], ids=os.path.basename)
def test_the_kernels_norms_at_small_and_large_rows(name, operand, rows):
    """Query or key rows scaled far from the others' norms, a chunk's tail and packed sequences: outputs and every
    gradient as the interpreter's l2norm gives them, both where the norm's gradient projects dq or dk and where a norm
    below the floor of 1e-12 is clamped (no gradient through the norm; those rows' gradient, 1e12 times the others',
    then rules the error)."""
    m = lamixer.load(name)
    tensors, states = random_call(m, B=1, T=90, H=2, size=SIZE, seed=3, cu_seqlens=[0, 20, 90])
    for row, scale in rows.items():
        tensors[operand][:, row] *= scale
    _assert_close(compare(m, "triton", tensors, states, cu_seqlens=[0, 20, 90], seed=3), f"{name} {operand} rows {rows}")


@pytest.mark.parametrize("name", DELTA, ids=os.path.basename)
def test_wide_heads_take_several_state_blocks(name):
    """K = 130: the state pass holds three key blocks of 64 rows (the last one masked), every decay kind."""
    _check(lamixer.load(name), f"{name} K=130", T=70, gate="strong", seed=7, B=1, size=130)


@pytest.mark.parametrize("decay", ["scalar", "key"])
@pytest.mark.parametrize("BT", [16, 32, 64])
def test_the_solve_holds_float32_where_its_powers_cancel(decay, BT):
    """The chunk's (I - M)^-1 (diagonal blocks by doubling, (I + L)(I + L^2)(I + L^4)(I + L^8), one to four blocks a
    chunk) in float32 against float64, for the case that cancels most: 16-token blocks of one repeated unit key at
    beta 0.99, whose powers of L grow to C(15, 7) = 6435 while the inverse stays of order 1 (numpy float32: 1.2e-4 by
    doubling, 5e-8 by substitution), and random keys after them."""
    torch.manual_seed(0)
    B, T, H, K = 1, 64, 1, 16
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K), dim=-1)
    k[:, :32] = k[:, :1]  # the first two 16-token blocks: one key repeated
    beta = torch.full((B, T, H, 1), 0.99)
    a, c, b = beta * k, -k, torch.randn(B, T, H, K)
    g = torch.full((B, T, H) + ((K,) if decay == "key" else ()), -1e-3)
    mod = triton_delta._module(decay, "after", False, torch.float32)
    tm = triton_delta._forward(mod, a, None, a, b, c, g, torch.zeros(B, H, K, K), None, decay, Config(BT, 64, 16, 4, 1), False, "ieee")[0]
    gk = (g[..., None] if decay == "scalar" else g).double().expand(B, T, H, K).cumsum(1)
    worst = 0.0
    for s in range(0, T, BT):  # each chunk's own inverse, its decays from the chunk's start
        rows = slice(s, s + BT)
        cum = gk[:, rows] - (gk[:, s - 1 : s] if s else 0.0)
        M = torch.einsum("bihk,bjhk->bhij", c[:, rows].double() * cum.exp(), a[:, rows].double() * (-cum).exp()).tril(-1)
        want = torch.linalg.inv(torch.eye(BT, dtype=torch.float64) - M).permute(0, 2, 1, 3)
        worst = max(worst, ((tm[:, rows].double() - want).norm() / want.norm()).item())
    assert worst < 2e-4, worst  # measured 2.5e-5 to 9.5e-5


def test_the_state_passes_narrow_their_value_block_on_a_device_they_leave_idle(monkeypatch):
    """The sequential passes' value block halves while the halved grid still fits one wave of the device's
    multiprocessors (132 on an H200), down to 32: 32 walks of 128 values take 32-wide blocks, 64 walks keep the
    configuration's 64, one walk's 128 stops at 32; off a GPU the configuration's block stands, at most V's."""
    from lamixer.kernels import launch

    monkeypatch.setattr(launch, "_sm_count", lambda index: 132)
    gpu = torch.device("cuda", 0)
    assert launch.state_value_block(64, 128, 32, gpu) == 32
    assert launch.state_value_block(64, 128, 64, gpu) == 64
    assert launch.state_value_block(128, 128, 1, gpu) == 32
    assert launch.state_value_block(64, 40, 200, gpu) == 64
    assert launch.state_value_block(64, 128, 1, torch.device("cpu")) == 64
    assert launch.state_value_block(64, 20, 1, torch.device("cpu")) == 32


def test_a_chunks_tail_under_decays_past_the_floats_range():
    """A chunk's rows past the sequence's end under log decays whose sum over the chunk leaves float64's range: the
    gradient kernel reads the scalar decay's stored terms there as the chunk's sums give them (B_last, not 0), so that
    their pairs with the chunk's tokens stay finite (a zero gradient weighed by an overflowing exp is NaN)."""
    m = lamixer.load("gated_deltanet")
    tensors, states = random_call(m, B=1, T=37, H=2, size=SIZE, seed=7)
    tensors["g"] = torch.full_like(tensors["g"], -100.0)
    _assert_close(compare(m, "triton", tensors, states, seed=7), "log decays of -100")


def _outputs(m, tensors, states):
    leaves = {k: v.clone().requires_grad_() for k, v in tensors.items()}  # gradients wanted: the chunk kernels run
    o, _ = m(**leaves, initial_state=states[0], backend="triton")
    return o.detach()


@pytest.mark.parametrize("name", ["deltanet", "gated_deltanet"])
def test_only_chunks_with_non_finite_stores_run_the_prepare_kernel_again(name, monkeypatch):
    """The forward's prepare kernel checks what it stored and a second launch runs only the flagged chunks again
    (CHECK_STORES, RERUN). With that second run made to poison its chunk's first row, finite inputs keep their results
    (no chunk ran twice) and a NaN value at token 80 turns token 64's output NaN (its chunk ran twice)."""
    render = kernel_cache.render

    def poisoned(family, **config):
        source = render(family, **config)
        if family != triton_delta.FAMILY:
            return source
        start = source.index("_prepare_kernel(")
        end = source.index("@triton.jit", start)
        poison = '    if RERUN:\n        tl.store(w + (t * H + i_h) * K, float("nan"), mask=o_t == 0)\n\n\n'
        return source[:end].rstrip("\n") + "\n" + poison + source[end:]

    m = lamixer.load(name)
    tensors, states = random_call(m, B=1, T=100, H=1, size=SIZE, seed=4)
    clean = _outputs(m, tensors, states)
    monkeypatch.setattr(kernel_cache, "render", poisoned)
    kernel_cache.kernels.cache_clear()
    try:
        assert torch.equal(_outputs(m, tensors, states), clean)
        tensors["v"] = tensors["v"].clone()
        tensors["v"][0, 80, 0, 0] = float("nan")
        o = _outputs(m, tensors, states)
        assert o[0, 64].isnan().any() and not o[0, :64].isnan().any()
    finally:
        monkeypatch.undo()
        kernel_cache.kernels.cache_clear()
