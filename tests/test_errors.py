"""Every user mistake raises a located lamixer error.

* tests/broken/*.lam: a corpus of broken specs, each starting with
  ``# expect: LINE:COL substring``; loading one must raise a SpecError whose message
  names ``file:LINE:COL:``, contains the substring and shows the line with a caret.
* Bad call arguments on shipped mixers raise an ArgumentError naming the argument.
"""
import math
import os
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import lamixer

BROKEN = Path(__file__).parent / "broken"
BROKEN_FILES = sorted(BROKEN.glob("*.lam"))
EXPECT = re.compile(r"#\s*expect:\s*(\d+):(\d+)\s+(.+?)\s*$")


def _expectation(text: str) -> tuple[int, int, str]:
    m = EXPECT.match(text.splitlines()[0])
    assert m, "the first line must be `# expect: LINE:COL substring`"
    return int(m.group(1)), int(m.group(2)), m.group(3)


def _assert_located(err: lamixer.SpecError, filename: str, line: int, col: int, substring: str) -> None:
    text = str(err)
    assert text.startswith(f"{filename}:{line}:{col}: "), text
    assert substring in text.splitlines()[0], text
    rendered = text.splitlines()
    assert len(rendered) == 3, f"expected the message, the source line and a caret line:\n{text}"
    caret = rendered[2]
    assert caret.strip() == "^", text
    assert caret.index("^") - 4 == col - 1, f"the caret is not under column {col}:\n{text}"


def test_corpus_is_large_enough():
    assert len(BROKEN_FILES) >= 24


@pytest.mark.parametrize("path", BROKEN_FILES, ids=[p.stem for p in BROKEN_FILES])
def test_broken_spec(path):
    text = path.read_text()
    line, col, substring = _expectation(text)
    with pytest.raises(lamixer.SpecError) as info:
        lamixer.loads(text, path.name)
    assert isinstance(info.value, lamixer.LamixerError)
    _assert_located(info.value, path.name, line, col, substring)
    assert info.value.loc.line == line and info.value.loc.col == col


@pytest.mark.parametrize("path", BROKEN_FILES[:3], ids=[p.stem for p in BROKEN_FILES[:3]])
def test_broken_spec_through_load(path):
    """lamixer.load(path) names the file as given."""
    line, col, substring = _expectation(path.read_text())
    with pytest.raises(lamixer.SpecError) as info:
        lamixer.load(path)
    _assert_located(info.value, str(path), line, col, substring)


def test_shipped_specs_load():
    for name in lamixer.shipped_specs():
        lamixer.load(name)


@pytest.mark.parametrize("spec", ["/nonexistent/dir/mixer.lam", "glaa", "", os.path.dirname(__file__)])
def test_load_missing(spec):
    with pytest.raises(lamixer.LamixerError) as info:
        lamixer.load(spec)
    assert "argument 'spec':" in str(info.value)


def test_load_unknown_name_lists_shipped():
    with pytest.raises(lamixer.ArgumentError, match="neither a shipped spec") as info:
        lamixer.load("glaa")
    assert "gla" in str(info.value)


def test_load_not_a_path():
    with pytest.raises(lamixer.ArgumentError, match="argument 'spec':"):
        lamixer.load(42)


def test_load_undecodable_file(tmp_path):
    path = tmp_path / "binary.lam"
    path.write_bytes(b"mixer x\n\xff\xfe\x00")
    with pytest.raises(lamixer.LamixerError):
        lamixer.load(path)


def test_loads_non_string():
    with pytest.raises(lamixer.ArgumentError, match="argument 'source'.*must be a string"):
        lamixer.loads(b"mixer x\n", "bytes.lam")
    with pytest.raises(lamixer.ArgumentError, match="argument 'source'"):
        lamixer.loads(["mixer x"])


def test_loads_too_long():
    """Located where the limit is passed (found by fuzzing: the one spec error without a location)."""
    with pytest.raises(lamixer.SpecError, match="longer than") as info:
        lamixer.loads("mixer x\n" + "#" * 200_000, "long.lam")
    assert str(info.value).startswith("long.lam:2:99993: ")


SMALL_MISTAKES = [
    ("", "1:1", "unexpected end of input"),
    ("mixer", "1:6", "expected a name"),
    ("mixer m\ndims K = 0\n", "2:6", "needs a size >= 1"),
    ("mixer m\ndims H\n", "2:6", "'H' (the number of heads) is implicit"),
    ("mixer m\ndims K\ninput q[K]\nstate S[K, K]\n", "4:12", "dim 'K' appears twice"),
    ("mixer m\ndims K\ninput q[H, K]\n", "3:9", "an input is per head already"),
    ("mixer m\ndims K\ninput q[K]\nparam p[K, H]\n", "4:12", "the head dim H may only lead a param"),
    ("mixer m\ndims K, V\ninput q[K, V]\n", "3:7", "at most 1 dim"),
    ("mixer m\ndims K, V\nstate S[]\n", "3:7", "needs one or two dims"),
    ("mixer m\ndims K\ninput q[K]\nlet exp = q\n", "4:5", "built-in function"),
    ("mixer m\ndims K\ninput q[K]\nlet x = exp\n", "4:9", "is a function; call it as exp(...)"),
    ("mixer m\ndims K\ninput q[K]\nlet x = std(q)\n", "4:9", "use it as `stat NAME = std(...)`"),
    ("mixer m\ndims K\ninput q[K]\nlet x = y\nlet y = q\n", "4:9", "'y' is used before it is defined (at line 5)"),
    ("mixer m\ndims K\ninput q[K]\nlet x = exp(q, base = 2)\n", "4:16", "takes no keyword arguments"),
    ("mixer m\ndims K\ninput q[K]\nout o = sum(q)\n", "4:5", "the output must be a vector"),
]


@pytest.mark.parametrize("text, where, substring", SMALL_MISTAKES, ids=[row[2][:40] for row in SMALL_MISTAKES])
def test_small_spec_mistakes(text, where, substring):
    with pytest.raises(lamixer.SpecError) as info:
        lamixer.loads(text, "small.lam")
    assert str(info.value).startswith(f"small.lam:{where}: "), str(info.value)
    assert substring in info.value.message


def test_syntax_error_names_symbols_not_terminals():
    """Regression: the expected-token list said `lpar, rpar, at, circumflex` instead of '(' ')' '@' '^'."""
    with pytest.raises(lamixer.SpecError) as info:
        lamixer.loads("mixer m\nlet x = (\n", "p.lam")
    message = info.value.message
    assert "'('" in message and "a name" in message and "lpar" not in message


# ---------------------------------------------------------------- call arguments

B, T, H, K, V, M = 1, 6, 2, 4, 3, 5


def _gen():
    return torch.Generator().manual_seed(0)


def _rand(*shape, gen=None):
    return torch.randn(*shape, generator=gen or _gen())


@pytest.fixture(scope="module")
def gla():
    return lamixer.load("gla")


@pytest.fixture(scope="module")
def gla_args():
    g = _gen()
    q, k = _rand(B, T, H, K, gen=g), _rand(B, T, H, K, gen=g)
    v = _rand(B, T, H, V, gen=g)
    gate = F.logsigmoid(_rand(B, T, H, K, gen=g))
    return q, k, v, gate


def _raises_argument(name: str, fn):
    with pytest.raises(lamixer.ArgumentError) as info:
        fn()
    assert str(info.value).startswith(f"argument '{name}':"), str(info.value)
    assert info.value.argument == name
    return info.value


def test_gla_call_works(gla, gla_args):
    o, state = gla(*gla_args, output_final_state=True)
    assert o.shape == (B, T, H, V) and state.shape == (B, H, K, V)


def test_wrong_rank(gla, gla_args):
    q, k, v, g = gla_args
    err = _raises_argument("q", lambda: gla(q[0], k, v, g))
    assert "[B, T, H, K]" in str(err)


def test_mismatched_batch_time_heads(gla, gla_args):
    q, k, v, g = gla_args
    _raises_argument("k", lambda: gla(q, k[:, :3], v, g))
    _raises_argument("v", lambda: gla(q, k, v.expand(2, -1, -1, -1), g))
    _raises_argument("g", lambda: gla(q, k, v, g[:, :, :1]))


def test_mismatched_dim_between_q_and_k(gla, gla_args):
    q, k, v, g = gla_args
    err = _raises_argument("k", lambda: gla(q, _rand(B, T, H, K + 1), v, g))
    assert "'q' has K = 4" in str(err)


def test_integer_dtype(gla, gla_args):
    q, k, v, g = gla_args
    _raises_argument("k", lambda: gla(q, k.long(), v, g))
    _raises_argument("v", lambda: gla(q, k, v.bool(), g))


def test_not_a_tensor(gla, gla_args):
    q, k, v, g = gla_args
    err = _raises_argument("v", lambda: gla(q, k, v.tolist(), g))
    assert "list" in str(err)
    _raises_argument("g", lambda: gla(q, k, v, g=0.5))


def test_missing_input(gla, gla_args):
    q, k, v, _ = gla_args
    _raises_argument("g", lambda: gla(q, k, v))
    _raises_argument("q", lambda: gla(k=k, v=v))


def test_unknown_keyword(gla, gla_args):
    err = _raises_argument("gate", lambda: gla(*gla_args, gate=gla_args[3]))
    assert "q, k, v, g" in str(err)
    _raises_argument("initial_states", lambda: gla(*gla_args, initial_states=None))


def test_input_given_twice(gla, gla_args):
    _raises_argument("k", lambda: gla(*gla_args, k=gla_args[1]))


def test_too_many_positional(gla, gla_args):
    err = _raises_argument("#5", lambda: gla(*gla_args, gla_args[3]))
    assert "takes 4 tensors" in str(err)


@pytest.mark.parametrize("backend", ["cuda", "", None, "Torch", 1])
def test_bad_backend(gla, gla_args, backend):
    _raises_argument("backend", lambda: gla(*gla_args, backend=backend))


@pytest.mark.parametrize("value", [1, "yes", None])
def test_bad_output_final_state(gla, gla_args, value):
    _raises_argument("output_final_state", lambda: gla(*gla_args, output_final_state=value))


@pytest.mark.parametrize("scale", ["0.5", math.nan, math.inf, -math.inf, True, torch.tensor(0.5), [0.5], 10**400])
def test_bad_scale(gla, gla_args, scale):
    """10**400 is a regression: float() of it raised OverflowError."""
    _raises_argument("scale", lambda: gla(*gla_args, scale=scale))


def test_scale_given_to_a_spec_without_scale(gla_args):
    mixer = lamixer.loads(
        "mixer plain\ndims K, V\ninput q[K], k[K], v[V]\nstate S[K, V]\nS = S + outer(k, v)\nout o = q @ S\n", "plain.lam"
    )
    q, k, v, _ = gla_args
    mixer(q, k, v)
    err = _raises_argument("scale", lambda: mixer(q, k, v, scale=0.5))
    assert "does not use a scale" in str(err)


def test_initial_state_wrong_shape(gla, gla_args):
    err = _raises_argument("initial_state", lambda: gla(*gla_args, initial_state=_rand(B, H, K, K)))
    assert "[N, H, K, V]" in str(err)
    _raises_argument("initial_state", lambda: gla(*gla_args, initial_state=_rand(B + 1, H, K, V)))


def test_initial_state_not_a_tensor(gla, gla_args):
    _raises_argument("initial_state", lambda: gla(*gla_args, initial_state="zeros"))
    _raises_argument("initial_state", lambda: gla(*gla_args, initial_state=[[0.0]]))
    _raises_argument("initial_state", lambda: gla(*gla_args, initial_state=torch.zeros(B, H, K, V, dtype=torch.long)))


@pytest.fixture(scope="module")
def gsa_args():
    g = _gen()
    q, k, v = _rand(B, T, H, K, gen=g), _rand(B, T, H, K, gen=g), _rand(B, T, H, V, gen=g)
    s, gate = _rand(B, T, H, M, gen=g), F.logsigmoid(_rand(B, T, H, M, gen=g))
    return q, k, v, s, gate


def test_initial_state_two_states(gsa_args):
    gsa = lamixer.load("gsa")
    kt, vt = _rand(B, H, K, M), _rand(B, H, M, V)
    gsa(*gsa_args, initial_state=(kt, vt))
    err = _raises_argument("initial_state", lambda: gsa(*gsa_args, initial_state=kt))
    assert "pass a tuple" in str(err)
    _raises_argument("initial_state", lambda: gsa(*gsa_args, initial_state=(kt,)))
    _raises_argument("initial_state", lambda: gsa(*gsa_args, initial_state=(kt, vt, vt)))
    _raises_argument("initial_state[1] (Vt)", lambda: gsa(*gsa_args, initial_state=(kt, vt.transpose(-1, -2))))
    _raises_argument("initial_state[0] (Kt)", lambda: gsa(*gsa_args, initial_state=("zeros", vt)))


def test_params_of_shipped_mixer():
    mamba2 = lamixer.load("mamba2")
    g = _gen()
    x, b, c = _rand(B, T, H, V, gen=g), _rand(B, T, H, K, gen=g), _rand(B, T, H, K, gen=g)
    dt, p = _rand(B, T, H, gen=g), _rand(H, gen=g)
    mamba2(x, b, c, dt, p, p, p)
    _raises_argument("A_log", lambda: mamba2(x, b, c, dt, _rand(H + 1), p, p))
    _raises_argument("D", lambda: mamba2(x, b, c, dt, p, _rand(H, 1), p))
    _raises_argument("dt", lambda: mamba2(x, b, c, dt[..., None], p, p, p))
    _raises_argument("C", lambda: mamba2(x, b, c[..., :2], dt, p, p, p))


def test_empty_sequence(gla):
    _raises_argument("q", lambda: gla(*(_rand(B, 0, H, d) for d in (K, K, V, K))))


CU_OK = torch.tensor([0, 2, 6])


@pytest.mark.parametrize("cu, why", [
    (torch.tensor([0.0, 2.0, 6.0]), "float dtype"),
    (torch.tensor([1, 2, 6]), "does not start at 0"),
    (torch.tensor([0, 2, 5]), "does not end at T"),
    (torch.tensor([0, 4, 2, 6]), "not increasing"),
    (torch.tensor([0, 2, 2, 6]), "an empty sequence"),
    (torch.tensor([[0, 2, 6]]), "2-D"),
    (torch.tensor([0]), "too short"),
    ([0, 2, 6], "a list"),
], ids=["float", "start", "end", "decreasing", "empty-sequence", "2-D", "too-short", "list"])
def test_bad_cu_seqlens(gla, gla_args, cu, why):
    _raises_argument("cu_seqlens", lambda: gla(*gla_args, cu_seqlens=cu))


def test_cu_seqlens_needs_one_batch_row(gla, gla_args):
    gla(*gla_args, cu_seqlens=CU_OK)
    two_rows = [x.expand(2, *x.shape[1:]) for x in gla_args]
    err = _raises_argument("cu_seqlens", lambda: gla(*two_rows, cu_seqlens=CU_OK))
    assert "B = 2" in str(err)


def test_cu_seqlens_initial_state_count(gla, gla_args):
    _raises_argument("initial_state", lambda: gla(*gla_args, cu_seqlens=CU_OK, initial_state=_rand(1, H, K, V)))


# ---------------------------------------------------------------- regressions found by fuzzing

def test_stateless_spec_can_be_called(gla_args):
    """Regression: a spec without a state compiled, then every call raised StopIteration (default scale)."""
    mixer = lamixer.loads("mixer gate\ndims K\ninput q[K], g[K]\nout o = sigmoid(g) * q\n", "gate.lam")
    q, _, _, g = gla_args
    o, final = mixer(q, g)
    assert o.shape == q.shape


def test_transposed_write_is_rejected_not_crashing():
    """Regression: `S = outer(v, k) + S` compiled and then crashed in the torch backend."""
    with pytest.raises(lamixer.SpecError, match="transposed"):
        lamixer.loads(
            "mixer t\ndims K, V\ninput q[K], k[K], v[V]\nstate S[K, V]\nS = outer(v, k) + S\nout o = q @ S\n", "t.lam"
        )


def test_non_finite_default_scale(gla_args):
    """Regression: a default scale that evaluates to inf was silently used."""
    mixer = lamixer.loads(
        "mixer d\ndims K, V\ninput q[K], k[K], v[V]\ndefault scale = 1 / (K - 4)\nstate S[K, V]\n"
        "S = S + outer(k, v)\nout o = scale * q @ S\n", "d.lam"
    )  # fmt: skip
    q, k, v, _ = gla_args
    err = _raises_argument("scale", lambda: mixer(q, k, v))
    assert "K = 4" in str(err)
    mixer(q, k, v, scale=0.5)


def test_the_tensor_core_precision_override_is_checked(monkeypatch):
    """LAMIXER_ACC_PRECISION (how float32 intermediates enter the tensor cores on a GPU, for measuring) takes Triton's
    names only, and the CPU interpreter and float64 keep exact products whatever it says."""
    from lamixer.kernels import launch as tb

    monkeypatch.setenv("LAMIXER_ACC_PRECISION", "bf16x3")
    assert tb.acc_precision(torch.float32) == "ieee"  # the interpreter (conftest)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert tb.acc_precision(torch.float32) == "bf16x3" and tb.acc_precision(torch.float64) == "ieee"
    monkeypatch.setenv("LAMIXER_ACC_PRECISION", "fp8")
    with pytest.raises(ValueError, match="LAMIXER_ACC_PRECISION='fp8'"):
        tb.acc_precision(torch.float32)
    monkeypatch.delenv("LAMIXER_ACC_PRECISION")
    assert tb.acc_precision(torch.float32) == "tf32x3"


def test_triton_on_cpu_tensors_without_the_interpreter_is_refused_by_name(monkeypatch):
    """Asking for the Triton kernels with CPU tensors and no interpreter names the argument instead of failing
    inside Triton's driver lookup; "auto" runs them on torch."""
    import triton.language  # noqa: F401  imported under the interpreter (conftest): Triton's own jit functions take the mode then

    from lamixer.tools.check import random_call

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    m = lamixer.loads(lamixer.api.shipped_source("gla"), "gla")
    tensors, _ = random_call(m, dtype=torch.float32)
    with pytest.raises(lamixer.ArgumentError, match="argument 'backend'.*inputs are on cpu.*CUDA tensors.*TRITON_INTERPRET=1"):
        m(**tensors, backend="triton")
    assert m(**tensors)[0].shape == (2, 37, 2, 9)
