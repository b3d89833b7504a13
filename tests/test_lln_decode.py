"""Running statistics and block attention that continues (lamixer/runtime/carry.py, runtime/running.py): LLN decodes.

A call's given statistics and Window on the interpreter, the torch and the interpreted triton backends agree (outputs,
final states, windows, every gradient, packed sequences); the lln layer's running estimates move in training and
stay in eval, where a prompt followed by steps equals the whole sequence across block boundaries; bad arguments and
bad `running` statements name themselves.
"""
import pytest
import torch

import lamixer

HIDDEN, HEADS = 16, 2  # K = V = 8: blocks of 8 tokens
DT = torch.float64


def rel(a, b) -> float:
    a, b = a.detach().to(DT), b.detach().to(DT)
    assert a.shape == b.shape, (a.shape, b.shape)
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def trained_layer(seed: int = 0, **options) -> lamixer.Layer:
    """An lln layer whose running estimates have moved off their starting values (a few training-mode calls), in eval."""
    torch.manual_seed(seed)
    layer = lamixer.Layer("lln", HIDDEN, HEADS, **options).to(DT)
    with torch.no_grad():
        for _ in range(3):
            layer(torch.randn(2, 13, HIDDEN, dtype=DT))
    return layer.eval()


def stepped(layer, x, prompt: int, cu=None):
    """The prompt x[:, :prompt] in one call, then each later token by step."""
    y, state = layer(x[:, :prompt], return_state=True)
    outs = [y]
    for t in range(prompt, x.shape[1]):
        y_t, state = layer.step(x[:, t], state)
        outs.append(y_t[:, None])
    return torch.cat(outs, 1), state


@pytest.mark.parametrize("prompt", [1, 5, 8, 11])  # inside the first block, at its end, inside the second
def test_prompt_then_steps_equal_the_whole_sequence(prompt):
    layer = trained_layer()
    x = torch.randn(2, 21, HIDDEN, dtype=DT)  # steps across two block boundaries (tokens 8 and 16)
    got, state = stepped(layer, x, prompt)
    assert rel(got, layer(x)) < 1e-12
    _, whole = layer(x, return_state=True)
    for a, b in zip(state.mixer, whole.mixer):
        assert rel(a, b) < 1e-12
    assert all(torch.equal(state.conv[k], whole.conv[k]) or rel(state.conv[k], whole.conv[k]) < 1e-12 for k in whole.conv)
    dec = layer.decoder(2)
    assert rel(torch.stack([dec.step(x[:, t]).clone() for t in range(21)], 1), layer(x)) < 1e-12


def test_packed_prompts_then_steps_equal_each_sequence_alone():
    layer = trained_layer(1)
    lengths, steps = [3, 9, 8], 6  # the sequences stand at different places in their blocks
    xs = [torch.randn(1, n + steps, HIDDEN, dtype=DT) for n in lengths]
    cu = torch.tensor([0, 3, 12, 20])
    y, state = layer(torch.cat([x[:, :n] for x, n in zip(xs, lengths)], 1), cu_seqlens=cu, return_state=True)
    outs = []
    for t in range(steps):
        y_t, state = layer.step(torch.cat([x[:, n + t] for x, n in zip(xs, lengths)]), state)
        outs.append(y_t)
    for i, x in enumerate(xs):
        got = torch.cat([y[:, cu[i] : cu[i + 1]], torch.stack([o[i] for o in outs])[None]], 1)
        assert rel(got, layer(x)) < 1e-12, i
    # a packed continuation of the same states
    more = [torch.randn(1, m, HIDDEN, dtype=DT) for m in (2, 10, 1)]
    y2, _ = layer(torch.cat(more, 1), state, cu_seqlens=torch.tensor([0, 2, 12, 13]), return_state=True)
    offsets = [0, 2, 12]
    for i, (x, n) in enumerate(zip(xs, lengths)):
        whole = layer(torch.cat([x, more[i]], 1))
        assert rel(y2[:, offsets[i] : offsets[i] + more[i].shape[1]], whole[:, n + steps :]) < 1e-12, i


def test_training_moves_the_estimates_and_eval_keeps_them():
    torch.manual_seed(2)
    layer = lamixer.Layer("lln", HIDDEN, HEADS).to(DT)
    assert set(layer.state_dict()) >= {"stats.running_sigma_q", "stats.running_sigma_k", "stats.running_shift_k", "stats.num_batches_tracked"}
    x = torch.randn(2, 10, HIDDEN, dtype=DT)
    q, k, v = (layer.proj[n](x).reshape(2, 10, HEADS, 8) for n in "qkv")
    _, _, used = layer.mixer(q, k, v, output_stats=True, backend="interpret")
    layer(x)  # the first update replaces the starting values
    got = layer.stats.estimates()
    assert rel(got["sigma_q"], used["sigma_q"]) < 1e-12 and rel(got["shift_k"], used["shift_k"].mean(0)) < 1e-12
    before = {k: v.clone() for k, v in got.items()}
    layer(torch.randn(2, 10, HIDDEN, dtype=DT))  # the second averages (weight 1/2 over the momentum's 0.1)
    assert all(rel(got[k], before[k]) > 1e-6 for k in got) and int(layer.stats.num_batches_tracked) == 2
    layer.eval()
    frozen = {k: v.clone() for k, v in got.items()}
    y = layer(torch.randn(2, 10, HIDDEN, dtype=DT))
    assert all(torch.equal(got[k], frozen[k]) for k in got) and int(layer.stats.num_batches_tracked) == 2
    # eval gives the estimates: the mixer's output with those statistics given
    q, k, v = (layer.proj[n](x).reshape(2, 10, HEADS, 8) for n in "qkv")
    o = layer.mixer(q, k, v, stats=frozen, backend="torch")[0]
    assert rel(layer(x), layer.o_proj(o.reshape(2, 10, -1))) < 1e-12 and torch.isfinite(y).all()
    # state_dict carries them
    other = lamixer.Layer("lln", HIDDEN, HEADS).to(DT).eval()
    other.load_state_dict(layer.state_dict())
    assert torch.equal(other(x), layer(x))


def test_whole_input_form_is_an_option():
    torch.manual_seed(3)
    layer = lamixer.Layer("lln", HIDDEN, HEADS, running_stats=0).to(DT).eval()
    assert not layer.stateful and not list(layer.buffers())
    x = torch.randn(2, 9, HIDDEN, dtype=DT)
    q, k, v = (layer.proj[n](x).reshape(2, 9, HEADS, 8) for n in "qkv")
    assert rel(layer(x), layer.o_proj(layer.mixer(q, k, v, backend="torch")[0].reshape(2, 9, -1))) < 1e-12
    with pytest.raises(lamixer.LamixerError, match="whole sequences"):
        layer.step(x[:, 0])
    with pytest.raises(lamixer.ArgumentError, match="stat_momentum"):
        lamixer.Layer("lln", HIDDEN, HEADS, stat_momentum=1.5)


# ---- the mixer: given statistics and windows agree across backends ----
def _call(seed, B=2, T=11, H=2, K=4):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, T, H, K, dtype=DT, generator=g).requires_grad_() for _ in range(3)]


def _given(seed, N, H=2, K=4, size=4):
    """Statistics (one shared, one per sequence) and a window whose sequences stand at different places in their blocks."""
    g = torch.Generator().manual_seed(seed)
    stats = {"sigma_q": torch.tensor(0.8, dtype=DT), "sigma_k": torch.tensor(1.3, dtype=DT), "shift_k": torch.rand(N, H, dtype=DT, generator=g) + 1}
    position = torch.tensor([5, 12, 7, 2][:N])
    held = (torch.arange(size)[None, :] < (position % size)[:, None])[:, None, :, None]  # rows past the block are zeros
    keys, values = (torch.randn(N, H, size, K, dtype=DT, generator=g) * held for _ in range(2))
    states = (torch.randn(N, H, K, K, dtype=DT, generator=g), torch.rand(N, H, K, dtype=DT, generator=g))
    return stats, lamixer.Window(position, (keys,), (values,)), states


def _run(m, backend, leaves, stats, window, states, cu=None):
    o, finals, win, used = m(*leaves, stats=stats, window=window, initial_state=states, cu_seqlens=cu, output_final_state=True,
                             output_window=True, output_stats=True, backend=backend)  # fmt: skip
    outs = [o, *finals, *win.keys, *win.values]
    g = torch.Generator().manual_seed(7)
    loss = sum((t * torch.randn(t.shape, dtype=DT, generator=g)).sum() for t in outs)
    grads = torch.autograd.grad(loss, leaves)
    return [t.detach() for t in outs], grads, win.position, used


@pytest.mark.parametrize("packed", [False, True])
def test_interpreter_and_torch_agree_with_given_statistics_and_a_window(packed):
    m = lamixer.load("lln")
    cu = torch.tensor([0, 3, 9, 11, 14]) if packed else None
    leaves = _call(4, B=1 if packed else 2, T=14 if packed else 11)
    N = 4 if packed else 2
    stats, window, states = _given(5, N)
    ref = _run(m, "interpret", leaves, stats, window, states, cu)
    got = _run(m, "torch", leaves, stats, window, states, cu)
    for a, b in zip(got[0] + list(got[1]), ref[0] + list(ref[1])):
        assert rel(a, b) < 1e-10
    assert torch.equal(got[2], ref[2]) and torch.equal(ref[2], window.position + (cu[1:] - cu[:-1] if packed else 11))
    assert all(rel(got[3][k], ref[3][k]) < 1e-12 and torch.equal(ref[3][k], stats[k].expand_as(ref[3][k])) for k in stats)
    # a given statistic is used: another value changes the output
    other = dict(stats, sigma_q=torch.tensor(2.0, dtype=DT))
    assert rel(m(*leaves, stats=other, window=window, initial_state=states, cu_seqlens=cu, backend="torch")[0], ref[0][0]) > 1e-3


def test_interpreted_triton_agrees_with_given_statistics_and_a_window():
    m = lamixer.load("lln")
    leaves = _call(6, T=7)
    stats, window, states = _given(8, 2)
    ref = _run(m, "interpret", leaves, stats, window, states)
    got = _run(m, "triton", leaves, stats, window, states)
    for a, b in zip(got[0] + list(got[1]), ref[0] + list(ref[1])):
        assert rel(a, b) < 1e-10
    with torch.no_grad():  # inference on a short sequence: the recurrent kernel
        o = m(*leaves, stats=stats, window=window, initial_state=states, backend="triton")[0]
    assert rel(o, ref[0][0]) < 1e-10


def test_reported_statistics_are_the_whole_inputs():
    m = lamixer.load("lln")
    q, k, v = _call(9)
    for backend in ("interpret", "torch"):
        o, _, used = m(q, k, v, output_stats=True, backend=backend)
        assert torch.equal(m(q, k, v, stats=used, backend=backend)[0], o) or rel(m(q, k, v, stats=used, backend=backend)[0], o) < 1e-12
        assert used["sigma_q"].shape == () and used["shift_k"].shape == (2, 2) and rel(used["sigma_q"], q.detach().std()) < 1e-12


def test_bad_statistics_and_windows_name_themselves():
    m = lamixer.load("lln")
    q, k, v = (x.detach() for x in _call(10))
    stats, window, _ = _given(11, 2)
    bad = [
        (dict(stats=[1.0]), "stats"),
        (dict(stats={"sigma": torch.tensor(1.0, dtype=DT)}), "stats"),
        (dict(stats={"sigma_q": torch.ones(2, dtype=DT)}), r"stats\['sigma_q'\]"),
        (dict(stats={"shift_k": torch.ones(3, 2, dtype=DT)}), r"stats\['shift_k'\]"),
        (dict(stats={"sigma_q": 1.0}), r"stats\['sigma_q'\]"),
        (dict(stats={"sigma_q": torch.tensor(float("nan"), dtype=DT)}), r"stats\['sigma_q'\]"),
        (dict(window=(1, 2)), "window"),
        (dict(window=lamixer.Window(torch.zeros(3, dtype=torch.int64), window.keys, window.values)), "window"),
        (dict(window=lamixer.Window(window.position, window.keys[0][:, :, :2], window.values)), "window"),
        (dict(window=lamixer.Window(-window.position, window.keys, window.values)), "window"),
        (dict(output_stats=1), "output_stats"),
        (dict(output_window="yes"), "output_window"),
    ]
    for kwargs, name in bad:
        with pytest.raises(lamixer.ArgumentError, match=f"argument '{name}"):
            m(q, k, v, backend="torch", **kwargs)
    gla = lamixer.load("gla")
    with pytest.raises(lamixer.ArgumentError, match="output_stats"):
        gla(q, k, v, torch.full_like(q, -0.1), output_stats=True)
    with pytest.raises(lamixer.ArgumentError, match="stats"):
        gla(q, k, v, torch.full_like(q, -0.1), stats={"a": torch.tensor(1.0)})


@pytest.mark.parametrize("line, message", [
    ("running sigma_x", "not one"),
    ("running sigma_q momentum 0", r"\(0, 1\]"),
    ("running sigma_q momentum nope", "number or an option"),
    ("running sigma_q if nope", "turns the running"),
    ("running sigma_q, sigma_q", "given twice"),
])  # fmt: skip
def test_running_statement_mistakes_are_located(line, message):
    text = lamixer.api.shipped_source("lln").replace("  running sigma_q, sigma_k, shift_k momentum stat_momentum if running_stats", "  " + line)
    with pytest.raises(lamixer.SpecError, match=message) as e:
        lamixer.loads(text, "bad.lam")
    assert "bad.lam:" in str(e.value)


def test_running_is_a_keyword_only_where_a_layer_statement_starts():
    text = lamixer.api.shipped_source("lln").replace("let a = ", "let running = 0.14855178144710912\nlet a = running * 1 + 0 * ")
    assert lamixer.loads(text).name == "lln"
