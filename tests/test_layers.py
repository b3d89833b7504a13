"""lamixer.Layer: layers built from each shipped spec's `layer` section.

Decoding token by token equals running the whole sequence, packed sequences equal separate runs,
state dicts round-trip, bf16 autocast runs, bad arguments name themselves, gradients reach every
parameter, and mistakes in a layer section are located SpecErrors.
"""
import traceback
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import lamixer

HIDDEN, HEADS = 16, 2
# small sizes for the specs whose paper defaults are large (256-dim heads, 64 slots, 128 states)
SMALL = {"gated_deltanet": {"head_dim": 8}, "gsa": {"M": 4}, "mamba2": {"d_state": 4}, "gla": {"gate_rank": 4}, "rwkv6": {"decay_rank": 4, "mix_rank": 4},
         "gated_deltaproduct": {"head_dim": 8}, "rwkv7": {"decay_rank": 4, "alpha_rank": 4}, "kda": {"head_dim": 8, "gate_rank": 4}}
SPECS = lamixer.shipped_specs()


def make(name: str, dtype=torch.float64, seed: int = 0, **options) -> lamixer.Layer:
    """In eval mode: a layer with running statistics (lln) then uses its estimates, as decoding does."""
    torch.manual_seed(seed)
    return lamixer.Layer(name, HIDDEN, HEADS, **SMALL.get(name, {}), **options).to(dtype).eval()


def stateful(name: str) -> bool:
    return make(name).stateful


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("name", SPECS)
def test_every_shipped_spec_has_a_layer(name):
    layer = make(name, torch.float32)
    y = layer(torch.randn(2, 5, HIDDEN))
    assert y.shape == (2, 5, HIDDEN) and torch.isfinite(y).all()


@pytest.mark.parametrize("name", [s for s in SPECS if stateful(s)])
def test_prompt_then_step_equals_whole_sequence(name):
    layer = make(name)
    x = torch.randn(2, 11, HIDDEN, dtype=torch.float64)
    whole = layer(x)
    y, state = layer(x[:, :6], return_state=True)
    outs = [y]
    for t in range(6, 11):
        y_t, state = layer.step(x[:, t], state)
        outs.append(y_t[:, None])
    assert rel(torch.cat(outs, 1), whole) < 1e-6
    # and from nothing, every token by step
    state, outs = None, []
    for t in range(11):
        y_t, state = layer.step(x[:, t], state)
        outs.append(y_t[:, None])
    assert rel(torch.cat(outs, 1), whole) < 1e-6


# lln with whole-input statistics (running_stats=0), as every spec with a statistic the layer keeps no estimate of
@pytest.mark.parametrize("name", [s for s in SPECS if not stateful(s)] + ["lln"])
def test_whole_input_specs_refuse_state(name):
    layer = make(name, running_stats=0) if name == "lln" else make(name)
    x = torch.randn(1, 4, HIDDEN, dtype=torch.float64)
    with pytest.raises(lamixer.LamixerError, match="whole sequences"):
        layer.step(x[:, 0])
    with pytest.raises(lamixer.LamixerError, match="whole sequences"):
        layer(x, return_state=True)


@pytest.mark.parametrize("name", [s for s in SPECS if stateful(s)])
def test_packed_sequences_equal_separate_runs(name):
    layer = make(name)
    lengths = [5, 1, 7]
    xs = [torch.randn(1, n, HIDDEN, dtype=torch.float64) for n in lengths]
    cu = torch.tensor([0, 5, 6, 13])
    alone = [layer(x, return_state=True) for x in xs]  # (output, final state) of each sequence run by itself
    packed = layer(torch.cat(xs, 1), cu_seqlens=cu)
    assert rel(packed, torch.cat([y for y, _ in alone], 1)) < 1e-6
    # with the final states asked for, the same outputs; the packed final states are the separate ones, and continue
    # as they would
    packed_too, state = layer(torch.cat(xs, 1), cu_seqlens=cu, return_state=True)
    assert rel(packed_too, packed) < 1e-6
    nxt = torch.randn(3, HIDDEN, dtype=torch.float64)
    y_t, _ = layer.step(nxt, state)
    for n, (_, s) in enumerate(alone):
        assert rel(layer.step(nxt[n : n + 1], s)[0], y_t[n : n + 1]) < 1e-6


@pytest.mark.parametrize("name", SPECS)
def test_state_dict_round_trips(name):
    a, b = make(name, seed=0), make(name, seed=1)
    x = torch.randn(2, 4, HIDDEN, dtype=torch.float64)
    assert rel(a(x), b(x)) > 1e-3
    b.load_state_dict(a.state_dict())
    assert torch.equal(a(x), b(x))


@pytest.mark.parametrize("name", SPECS)
def test_runs_under_bf16_autocast(name):
    layer = make(name, torch.float32)
    x = torch.randn(2, 6, HIDDEN)
    ref = layer(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
    assert y.shape == ref.shape and torch.isfinite(y).all()
    assert rel(y.float(), ref) < 0.25  # bf16 keeps ~3 digits; a per-head norm of 8 values amplifies that


@pytest.mark.parametrize("name", SPECS)
def test_gradients_reach_every_parameter(name):
    layer = make(name)
    x = torch.randn(2, 6, HIDDEN, dtype=torch.float64, requires_grad=True)
    layer(x).pow(2).sum().backward()
    for pname, p in layer.named_parameters():
        assert p.grad is not None, pname
        assert torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, pname
    assert x.grad is not None and x.grad.abs().sum() > 0


def test_interpreter_backend_agrees():
    torch.manual_seed(0)
    a = lamixer.Layer("gla", HIDDEN, HEADS, **SMALL["gla"]).double()
    b = lamixer.Layer("gla", HIDDEN, HEADS, backend="interpret", **SMALL["gla"]).double()
    b.load_state_dict(a.state_dict())
    x = torch.randn(2, 9, HIDDEN, dtype=torch.float64)
    assert rel(a(x), b(x)) < 1e-9


def test_rotary_depends_on_relative_position_only():
    from lamixer.runtime.blocks import rotate as _rotate

    q, k = torch.randn(1, 1, 1, 8, dtype=torch.float64), torch.randn(1, 1, 1, 8, dtype=torch.float64)

    def score(m: int, n: int) -> float:
        return (_rotate(q, torch.tensor([[m]]), 10000.0) * _rotate(k, torch.tensor([[n]]), 10000.0)).sum().item()

    assert score(7, 3) == pytest.approx(score(4, 0), rel=1e-12) and score(7, 3) != pytest.approx(score(3, 7), rel=1e-6)
    assert _rotate(q, torch.tensor([[5]]), 10000.0).norm().item() == pytest.approx(q.norm().item(), rel=1e-12)


def test_paper_inits():
    mamba = lamixer.Layer("mamba2", 64, 4, d_state=8)
    A = mamba.params["A_log"].exp()
    dt = torch.nn.functional.softplus(mamba.params["dt_bias"])
    assert ((A >= 1) & (A <= 16)).all() and ((dt >= 1e-3 - 1e-9) & (dt <= 0.1 + 1e-9)).all()
    assert torch.equal(mamba.params["D"], torch.ones(4))
    assert mamba.sizes == {"N": 8, "P": 32}  # expand 2: P = 2 * 64 / 4
    gsa = lamixer.Layer("gsa", 64, 4)
    assert gsa.sizes["M"] == 64
    gla = lamixer.Layer("gla", 64, 4)
    assert gla.sizes == {"K": 8, "V": 16}  # expand_k 0.5, expand_v 1
    assert lamixer.Layer("gla", 64, 4, expand_k=1).sizes["K"] == 16


# ---- bad arguments name themselves ----
def test_bad_hidden_size():
    layer = make("gla")
    with pytest.raises(lamixer.ArgumentError, match="argument 'x'"):
        layer(torch.randn(2, 3, HIDDEN + 1, dtype=torch.float64))
    with pytest.raises(lamixer.ArgumentError, match="argument 'x_t'"):
        layer.step(torch.randn(2, 3, HIDDEN, dtype=torch.float64))


def test_state_from_another_spec_or_batch():
    gla, retnet = make("gla"), make("retnet")
    x = torch.randn(2, 3, HIDDEN, dtype=torch.float64)
    _, state = gla(x, return_state=True)
    with pytest.raises(lamixer.ArgumentError, match="argument 'state'.*another spec"):
        retnet.step(x[:, 0], state)
    with pytest.raises(lamixer.ArgumentError, match="argument 'state'.*2 sequences"):
        gla.step(x[:1, 0], state)
    with pytest.raises(lamixer.ArgumentError, match="argument 'state'"):
        gla.step(x[:, 0], (torch.zeros(1),))
    wider = lamixer.Layer("gla", HIDDEN, HEADS, expand_k=1, **SMALL["gla"]).double()
    with pytest.raises(lamixer.ArgumentError, match="argument 'state'.*other sizes"):
        wider.step(x[:, 0], state)


@pytest.mark.parametrize("cu, why", [([0, 3, 3, 6], "increasing"), ([0, 4, 3, 6], "increasing"), ([0, 3, 5], "cover"), ([1, 6], "cover")])
def test_bad_cu_seqlens(cu, why):
    layer = make("gla")
    with pytest.raises(lamixer.ArgumentError, match=f"argument 'cu_seqlens'.*{why}"):
        layer(torch.randn(1, 6, HIDDEN, dtype=torch.float64), cu_seqlens=torch.tensor(cu))


def test_bad_options():
    with pytest.raises(lamixer.ArgumentError, match="argument 'expand_q'"):
        lamixer.Layer("gla", 16, 2, expand_q=1)
    with pytest.raises(lamixer.ArgumentError, match="argument 'hidden_size'.*whole number"):
        lamixer.Layer("gla", 18, 4)
    with pytest.raises(lamixer.ArgumentError, match="argument 'num_heads'"):
        lamixer.Layer("gla", 16, 0)
    with pytest.raises(lamixer.ArgumentError, match="argument 'spec'.*no layer section"):
        lamixer.Layer(lamixer.loads(lamixer.api.shipped_source("gla").split("\nlayer")[0]), 16, 2)


# ---- the layer section's own errors are located ----
MIXER = """mixer t
dims K, V
input q[K], k[K], v[V], g[K] in (-inf, 0)
state S[K, V]
S = exp(g) * S + outer(k, v)
out o = scale * q @ S
layer
"""

BROKEN_LAYERS = [
    ("size K = hidden / H, V = hidden / H\nproj q, k, v, x", 9, 15, "not one"),
    ("size K = hidden / H, V = hidden / H\nproj q, k, v\nmap g = logsigmoid(f) / 16", 10, 20, "unknown name 'f'"),
    ("size K = hidden / H, V = hidden / H\nproj q, k, v, g\nconv q, k kernel", 10, 11, "option"),
    ("size K = hidden / H, V = hidden / H\nproj q, k, v, g\nnorm batchnorm", 10, 6, "unknown norm"),
    ("size K = hidden / H\nproj q, k, v, g", 7, 1, "does not size dim 'V'"),
    ("size K = hidden / H, V = hidden / H\nproj q, k, v", 7, 1, "never makes input 'g'"),
    ("size K = hidden / H, V = hidden / H\nproj q, k, v, g\nmap q, k gelu", 10, 10, "unknown activation"),
    ("size K = hidden / H, V = hidden / H\nproj q, k, v, g\nproj q", 10, 6, "projected twice"),
    ("size K = hidden / H, V = hidden / H\nproj q, k, v, g\nmap v = outer(q, v)", 10, 9, "unknown function"),
    ("size K = hidden / H, V = hidden / H\nproj q, k, v, g\nmap v = q", 10, 9, "dims [V] but the map gives [K]"),
    ("size K = hidden / H, V = hidden / H\nproj q, k, v, g lowrank", 9, 24, "unexpected"),
    ("option K = 2\nsize V = hidden / H", 8, 8, "would shadow a dim"),
    ("option backend = 2", 8, 8, "argument of lamixer.Layer"),
    ("size K = hidden / H, V = hidden / H\nproj q, k, v, g\nrotary q, g2", 10, 11, "not one"),
    ("size K = hidden / H, V = hidden / H\nshift q\nproj q, k, v, g", 9, 7, "not projected"),
    ("size K = hidden / H, V = hidden / H\nproj q, k, v, g\nparam A[H, Q] = 1", 10, 12, "unknown dim 'Q'"),
    ("size K = hidden / H, V = hidden / H\nproj q, k, v, g\nparam A[H] = uniform(0, g)", 10, 25, "unknown name 'g'"),
    ("size K = hidden / H, V = hidden / H\nproj q, k, v, g\nconv hidden 0", 10, 13, "at least 1"),
]


@pytest.mark.parametrize("body, line, col, what", BROKEN_LAYERS)
def test_layer_section_errors_are_located(body, line, col, what):
    with pytest.raises(lamixer.SpecError) as info:
        lamixer.loads(MIXER + body + "\n", "t.lam")
    text = str(info.value)
    assert text.startswith(f"t.lam:{line}:{col}: "), text
    assert what in text.splitlines()[0], text


def test_the_documented_example_builds():
    text = (Path(__file__).parent.parent / "docs" / "language.md").read_text()
    example = text.split("## The layer section")[1].split("```")[1]
    layer = lamixer.Layer(lamixer.loads(MIXER.replace("layer\n", "") + example), 32, 2)
    assert layer.sizes == {"K": 8, "V": 16} and layer(torch.randn(1, 3, 32)).shape == (1, 3, 32)


def test_layer_section_accepts_semicolons_and_runs():
    body = "size K = hidden / H, V = hidden / H; proj q, k, v, g; map g logsigmoid; norm rmsnorm per_head; out_gate swish\n"
    layer = lamixer.Layer(lamixer.loads(MIXER + body), 8, 2)
    assert layer(torch.randn(1, 3, 8)).shape == (1, 3, 8)


def test_torch_compile_fullgraph_over_a_model_of_layers():
    """A small model of lamixer layers traces whole (the Triton scans are custom ops, the plan plain data)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(lamixer.Layer("gla", hidden_size=32, num_heads=2, backend="triton", **SMALL["gla"]),
                                lamixer.Layer("gsa", hidden_size=32, num_heads=2, backend="triton", **SMALL["gsa"]))  # fmt: skip
    x = torch.randn(2, 12, 32, requires_grad=True)
    y = model(x)
    y.sum().backward()
    grad = x.grad.clone()
    x.grad = None
    y2 = torch.compile(model, fullgraph=True, backend="aot_eager")(x)
    y2.sum().backward()
    assert torch.equal(y, y2) and torch.equal(grad, x.grad)


def test_torch_compile_fullgraph_over_a_decode_step():
    """step() traces whole too, so a GPU can replay a decode step as one CUDA graph (mode="reduce-overhead")."""
    torch.manual_seed(0)
    layer = lamixer.Layer("gla", hidden_size=32, num_heads=2, backend="triton", **SMALL["gla"])
    _, state = layer(torch.randn(2, 9, 32), return_state=True)
    x_t = torch.randn(2, 32)
    y, new = layer.step(x_t, state)
    y2, new2 = torch.compile(layer.step, fullgraph=True, backend="aot_eager")(x_t, state)
    assert torch.equal(y, y2) and all(torch.equal(a, b) for a, b in zip(new.mixer, new2.mixer))



@pytest.mark.parametrize("name, backend", [("gla", "torch"), ("gated_deltanet", "triton"), ("gsa", "triton"), ("rwkv6", "torch")])
def test_a_decoder_steps_as_layer_step_does(name, backend):
    """Layer.decoder holds the state and updates it in place (the recurrent kernel writes it over the decoder's own:
    runtime.scan.STATES_IN_PLACE); off CUDA it steps eagerly. Its steps equal Layer.step's carrying the state, from
    a prompt's state and after a reset; bad arguments name themselves. (On a GPU, `lamixer bench` checks the
    captured graph's steps the same way.)"""
    torch.manual_seed(0)
    layer = lamixer.Layer(name, HIDDEN, HEADS, backend=backend, **SMALL.get(name, {}))
    with torch.no_grad():
        _, state = layer(torch.randn(2, 7, HIDDEN), return_state=True)
        dec = layer.decoder(2, state)
        xs = torch.randn(5, 2, HIDDEN)
        for x in xs:
            y, state = layer.step(x, state)
            assert rel(dec.step(x), y) < 1e-6
        assert all(rel(a, b) < 1e-6 for a, b in zip(dec.state.mixer, state.mixer)) and torch.equal(dec.state.position, state.position)
        dec.reset()
        y, _ = layer.step(xs[0])
        assert rel(dec.step(xs[0]), y) < 1e-6
    with pytest.raises(lamixer.ArgumentError, match="x_t"):
        dec.step(torch.randn(3, HIDDEN))
    with pytest.raises(lamixer.ArgumentError, match="batch"):
        layer.decoder(0)
    with pytest.raises(lamixer.LamixerError, match="whole sequences"):
        make("lln", torch.float32, running_stats=0).decoder(1)


class _HostData(TorchDispatchMode):
    """Records the ops that make a tensor from host data (torch.tensor(...)): on a GPU each is a host-to-device copy,
    which a CUDA graph's capture refuses."""

    def __init__(self):
        super().__init__()
        self.made = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten.lift_fresh.default, torch.ops.aten.lift_fresh_copy.default):
            ours = [f for f in traceback.extract_stack() if "/lamixer/" in f.filename]
            self.made.append(f"{ours[-1].filename}:{ours[-1].lineno}" if ours else "?")
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name", SPECS)
def test_a_decode_step_makes_no_tensor_from_host_data(name):
    """Layer.decoder captures Layer.step in a CUDA graph, so a step may not copy host data to the device (the
    generalized delta rule's sub-step marks did: rwkv7's and gated_deltaproduct's graphed decoders failed on the
    H200). Checked on the CPU by the ops that make such tensors, on a second step: the first binds the call's
    signature (its host-side checks and default scale), as a decoder's warm-up step does before the capture."""
    layer = make(name, torch.float32)
    with torch.no_grad():
        _, state = layer(torch.randn(1, 3, HIDDEN), return_state=True)
        _, state = layer.step(torch.randn(1, HIDDEN), state)
        with _HostData() as seen:
            layer.step(torch.randn(1, HIDDEN), state)
    assert not seen.made, seen.made
