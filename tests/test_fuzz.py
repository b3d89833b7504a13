"""Fuzzing: random spec text raises nothing but a located lamixer error, and random calls nothing but lamixer errors.

Spec generators: (a) token soup from the language's alphabet (and shuffled shipped statements),
(b) mutations of the shipped specs (delete, duplicate or swap lines; replace, insert or delete a
token; a huge whole number, a control character, a negated term, a line's expression repeated),
(c) dims-typed random mixers, which mostly compile, some with decay factors that are not positive.
A spec that compiles must then run on both backends and agree, or refuse the call with an
ArgumentError, keep earlier outputs when a later token is NaN, and compile into a package Python
reads. Calls: (d) valid calls of the shipped mixers and layers with one or two arguments spoilt.
Every example runs under a time limit (FUZZ_TIMEOUT seconds), so a hang or a superlinear pass
fails. Derandomized so that CI is deterministic, and small enough for it (about 15 s); set
FUZZ_EXAMPLES (e.g. FUZZ_EXAMPLES=50000; the call tests run a tenth of that) to search harder.
"""
import ast
import contextlib
import os
import re
import signal

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lamixer
from lamixer.api import shipped_source

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "0"))
FUZZ = settings(
    max_examples=EXAMPLES or 300,
    derandomize=True,
    deadline=None,  # the time limit below interrupts a slow example instead of timing it afterwards
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
CALLS = settings(FUZZ, max_examples=EXAMPLES // 10 or 50)
TIMEOUT = float(os.environ.get("FUZZ_TIMEOUT", "30"))

HUGE = "9" * 4400  # past Python's limit on int() of a digit string (4300)
CONTROL = ["\x00", "\x01", "\x1b", "\x7f", "\x85", "\x0b", "\x0c", "\r", "\u2028", "\ufeff"]
KEYWORDS = ["mixer", "dims", "input", "param", "state", "default", "stat", "let", "out", "in", "per", "inf",
            "batch", "head", "time", "layer", "proj", "conv", "lowrank", "rotary", "option", "size", "map"]  # fmt: skip
NAMES = ["q", "k", "v", "g", "w", "u", "s", "x", "S", "z", "Kt", "Vt", "o", "beta", "K", "V", "M", "N", "P",
         "H", "h", "scale", "size", "A_log", "D"]  # fmt: skip
FUNCTIONS = ["exp", "log", "sigmoid", "softplus", "relu", "sqrt", "abs", "sum", "mean", "max", "min", "std", "var",
             "l2norm", "softmax", "dot", "outer", "pow", "block_attention", "l2_norm", "foo"]  # fmt: skip
NUMBERS = ["0", "1", "2", "64", "0.5", "1e-5", ".5", "3.", "1e999", "007", "1e", "-1", "+2", "-inf", HUGE]
SYMBOLS = ["+", "-", "*", "/", "@", "^", "=", ",", "(", ")", "[", "]", "(", ")", "\n", "\n", "\n", "#", '"t"',
           "\\\n", "\t", "$", ";", "'", "é", "\r\n", *CONTROL]  # fmt: skip
ALPHABET = KEYWORDS + NAMES + FUNCTIONS + NUMBERS + SYMBOLS

SHIPPED = {name: shipped_source(name) for name in lamixer.shipped_specs()}
TOKEN = re.compile(r"\n|[A-Za-z_][A-Za-z0-9_]*|[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?|\S")
FILENAME = "fuzz.lam"


class TimeLimit(Exception):
    """An example ran past FUZZ_TIMEOUT seconds."""


@contextlib.contextmanager
def time_limit(seconds: float = TIMEOUT):
    """Interrupt the example after `seconds` (SIGALRM: the main thread, where pytest runs tests)."""
    def expire(signum, frame):
        raise TimeLimit(f"one example took over {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def load_or_located_error(text: str):
    """lamixer.loads(text); on a mistake, check the error is a located SpecError. Anything else fails the test."""
    try:
        with time_limit():
            return lamixer.loads(text, FILENAME)
    except lamixer.SpecError as e:
        rendered = str(e)
        assert e.loc is not None, f"an error without a location: {rendered}"
        assert rendered.startswith(f"{FILENAME}:{e.loc.line}:{e.loc.col}: "), rendered
        lines = text.splitlines()
        assert 1 <= e.loc.line <= max(len(lines), 1) + 1, rendered
        if e.loc.line <= len(lines):
            assert rendered.splitlines()[-1].strip() == "^", rendered
        return None


def refused_by_data(e: lamixer.ArgumentError) -> bool:
    """The refusals a valid spec's random call may meet: a default scale that is not finite for these sizes, or a
    decay factor that the data makes <= 0 (the scans take its log)."""
    return e.argument == "scale" or "decay factor" in str(e)


def run_and_compare(mixer, tensors, initial, cu_seqlens=None):
    """Run a mixer on the torch backend and the interpreter: both refuse alike or neither does, and where the
    interpreter's output is finite (and not huge) the torch backend's is finite and close. Found: a decay factor
    the data made negative gave NaN on torch, numbers on the interpreter."""
    outs = {}
    for backend in ("torch", "interpret"):
        try:
            with time_limit():
                outs[backend], _ = mixer(**tensors, initial_state=initial, output_final_state=True, backend=backend, cu_seqlens=cu_seqlens)
        except lamixer.ArgumentError as e:
            assert refused_by_data(e), str(e)
            outs[backend] = e
    if any(isinstance(o, Exception) for o in outs.values()):
        assert all(isinstance(o, Exception) for o in outs.values()), outs
        return
    o, ref = outs["torch"].double(), outs["interpret"].double()
    sane = torch.isfinite(ref) & (ref.abs() < 1e6)
    assert torch.isfinite(o[sane]).all(), "the torch backend gives NaN or inf where the interpreter gives numbers"
    torch.testing.assert_close(o[sane], ref[sane], rtol=1e-4, atol=1e-4 * (1 + ref[sane].abs().max().item() if sane.any() else 1))


def causal_for_non_finite(mixer, tensors, initial) -> None:
    """A NaN at the last token of an input leaves every earlier output of the torch backend as it was (specs with
    whole-input statistics see every token by definition). Found: the chunked scan's masked products (0 * NaN)."""
    if mixer.compiled.classification.stats:
        return
    try:
        with time_limit():
            clean, _ = mixer(**tensors, initial_state=initial, backend="torch")
    except lamixer.ArgumentError as e:
        assert refused_by_data(e), str(e)
        return
    for op in mixer.compiled.graph.operands:
        if op.kind == "input":
            poisoned = dict(tensors)
            poisoned[op.name] = tensors[op.name].clone()
            poisoned[op.name][:, -1] = float("nan")
            with time_limit():
                o, _ = mixer(**poisoned, initial_state=initial, backend="torch")
            assert torch.equal(o[:, :-1], clean[:, :-1]), f"a NaN in {op.name} at the last token changed earlier outputs"


def emits_python(mixer) -> None:
    """The package `lamixer compile` writes for the mixer is Python that Python reads. Found: a NUL in a title."""
    from lamixer.emit.package import files

    for rel, text in files([mixer.compiled], shared=False).items():
        if rel.endswith(".py") and not {"runtime", "kernels"} & set(rel.split("/")):  # those are copied or rendered, not written from the spec
            ast.parse(text, rel)


# ---------------------------------------------------------------- (a) token soup

@st.composite
def token_soup(draw):
    tokens = draw(st.lists(st.sampled_from(ALPHABET), max_size=60))
    sep = draw(st.sampled_from([" ", "", "  "]))
    body = sep.join(tokens)
    header = draw(st.sampled_from(["", "mixer m\n", 'mixer m "title"\n', "mixer m\ndims K, V\n"]))
    return header + body


@FUZZ
@given(token_soup())
def test_token_soup_raises_only_lamixer_errors(text):
    load_or_located_error(text)


@st.composite
def statement_soup(draw):
    """Well-formed-looking statements in random order: reaches the lowering and the passes more often."""
    pool = [line for src in SHIPPED.values() for line in src.splitlines()[1:] if line and not line.startswith("#")]
    lines = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=12))
    return "mixer m\n" + "\n".join(lines)


@FUZZ
@given(statement_soup())
def test_statement_soup_raises_only_lamixer_errors(text):
    load_or_located_error(text)


# ---------------------------------------------------------------- (b) mutations of the shipped specs

MUTATIONS = ["delete", "duplicate", "swap", "replace", "replace", "insert", "insert", "drop", "huge", "control", "negate", "grow"]


def _mutate_line(draw, line: str, op: str, pool: list[str]) -> str:
    """One token-level mutation of a line."""
    if op == "control":  # anywhere, a title included
        at = draw(st.integers(0, len(line)))
        return line[:at] + draw(st.sampled_from(CONTROL)) + line[at:]
    tokens = TOKEN.findall(line)
    if op == "huge":
        numbers = [i for i, t in enumerate(tokens) if t[:1].isdigit()]
        if numbers:
            tokens[draw(st.sampled_from(numbers))] = HUGE
        else:
            tokens.insert(draw(st.integers(0, len(tokens))), HUGE)
        return " ".join(tokens)
    if op == "grow" and "=" in line:  # the right side repeated: many reads of a state (found: quadratic read rewriting)
        lhs, _, rhs = line.partition("=")
        return f"{lhs}= {rhs}" + f" + ({rhs.strip()})" * draw(st.integers(1, 150))
    at = draw(st.integers(0, len(tokens)))
    if op == "negate":  # found: a decay factor -exp(g) or -0.5
        tokens.insert(at, "-")
    elif op in ("insert", "grow") or at == len(tokens):
        tokens.insert(at, draw(st.sampled_from(pool)))
    elif op == "replace":
        tokens[at] = draw(st.sampled_from(pool))
    else:
        del tokens[at]
    return " ".join(tokens)


@st.composite
def mutated_spec(draw):
    name = draw(st.sampled_from(sorted(SHIPPED)))
    source = SHIPPED[name]
    lines = source.split("\n")
    pool = ALPHABET + TOKEN.findall(source) * 2
    for _ in range(draw(st.integers(1, 3))):
        if not lines:
            break
        op = draw(st.sampled_from(MUTATIONS))
        i = draw(st.integers(0, len(lines) - 1))
        if op == "delete":
            del lines[i]
        elif op == "duplicate":
            lines.insert(draw(st.integers(0, len(lines))), lines[i])
        elif op == "swap":
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        else:
            lines[i] = _mutate_line(draw, lines[i], op, pool)
    return "\n".join(lines)


@FUZZ
@given(mutated_spec())
def test_mutated_shipped_specs_raise_only_lamixer_errors(text):
    load_or_located_error(text)


@CALLS
@given(mutated_spec())
def test_mutated_specs_that_compile_run_agree_and_emit(text):
    """A spec the compiler accepts must not crash the backends (a crash means a check is missing), must give what the
    interpreter gives, and must compile into a package Python reads."""
    from lamixer.tools.check import random_call

    mixer = load_or_located_error(text)
    if mixer is None:
        return
    tensors, states = random_call(mixer, B=1, T=5, H=2, size=3, initial_state=True)
    initial = states[0] if len(states) == 1 else states
    run_and_compare(mixer, tensors, initial)
    causal_for_non_finite(mixer, tensors, initial)
    with time_limit():
        emits_python(mixer)


TITLE_CHARS = st.characters(codec="utf-8", exclude_characters='"\n')


@CALLS
@given(st.text(TITLE_CHARS, max_size=30))
def test_any_title_is_refused_located_or_emitted_as_python(title):
    """Found: a NUL in a title compiled into a package Python cannot parse."""
    mixer = load_or_located_error(f'mixer titled "{title}"\ndims K, V\ninput q[K], k[K], v[V]\nstate S[K, V]\nS = S + outer(k, v)\nout o = q @ S\n')
    if mixer is not None:
        with time_limit():
            emits_python(mixer)


# ---------------------------------------------------------------- (c) dims-typed random mixers

TYPED_HEADER = (
    "mixer typed\ndims K, V, M\n"
    "input q[K], k[K], g[K] in (-inf, 0), v[V], w[V] in (-inf, 0), s[M], m[M] in (-inf, 0), a[] in (-inf, 0), "
    "beta[] in (0, 1)\nparam p[H, K], c[H]\n"
)
TYPED_VECTORS = {"K": ["q", "k", "g", "p"], "V": ["v", "w"], "M": ["s", "m"]}
TYPED_STATES = {"S": ("K", "V"), "T": ("V", "K"), "z": ("K",), "Y": ("M", "V"), "X": ("K", "M")}
UNARY = ["exp", "sigmoid", "softplus", "tanh", "relu", "abs", "silu", "logsigmoid"]
USE_ALL = " + 0 * (sum(q) + sum(k) + sum(g) + sum(v) + sum(w) + sum(s) + sum(m) + a + beta + sum(p) + c)"
# with unsigned decays (typed_spec(unsigned=True)): an input in (-1, 0), decay factors the spec alone shows are not
# positive (a located error) or that the data decides (checked per call), and general factors shown positive
UNSIGNED_INPUT, UNSIGNED_USE = ", n[] in (-1, 0)", " + 0 * n"
UNSIGNED_DECAYS = ["-0.5", "(1 - 2 * h)", "n", "-exp(a)", "0", "(1 - 1 / K)", "(1 - beta * sum(k * k))", "(1 + n * c)", "c"]
POSITIVE_DECAYS = ["(1 - 2 ^ (-5 - h))", "(1 - beta * (1 - beta))", "(0.5 + 0.5 * beta)"]


class _Typed:
    """Expressions of given dims over the declared inputs and the reads made so far."""

    def __init__(self, rnd, reads, unsigned: bool = False):
        self.rnd, self.reads, self.unsigned = rnd, reads, unsigned

    def scalar(self, depth=0):
        r, c = self.rnd, self.rnd.random()
        if depth > 2 or c < 0.35:
            return r.choice(["a", "beta", "0.5", "2", "h", "K", "c"])
        if c < 0.5:
            return f"sum({self.vec(r.choice('KVM'), depth + 1)})"
        if c < 0.6:
            d = r.choice("KVM")
            return f"dot({self.vec(d, depth + 1)}, {self.vec(d, depth + 1)})"
        if c < 0.75:
            return f"{r.choice(UNARY)}({self.scalar(depth + 1)})"
        return f"({self.scalar(depth + 1)} {r.choice('+-*/')} {self.scalar(depth + 1)})"

    def vec(self, d, depth=0):
        r, c = self.rnd, self.rnd.random()
        if depth > 2 or c < 0.3:
            return r.choice(TYPED_VECTORS[d] + self.reads.get(d, []))
        if c < 0.45:
            return f"{r.choice(UNARY + ['l2norm', 'softmax'])}({self.vec(d, depth + 1)})"
        if c < 0.6:
            return f"({self.vec(d, depth + 1)} {r.choice('+-*')} {self.scalar(depth + 1)})"
        if c < 0.8:
            return f"({self.vec(d, depth + 1)} {r.choice('+-*/')} {self.vec(d, depth + 1)})"
        return f"max({self.vec(d, depth + 1)}, {self.scalar(depth + 1)})"

    def decay(self, dims):
        options = [f"exp(-softplus({self.scalar(1)}))", f"exp(-softplus({self.vec(dims[0], 1)}))", "0.9",
                   f"sigmoid({self.scalar(1)})", "exp(a)"]  # fmt: skip
        if len(dims) == 2:
            options.append(f"exp(-softplus({self.vec(dims[1], 1)}))")
        if self.unsigned:  # (only then: tests/test_triton_backend.py draws the same mixers as before these)
            if self.rnd.random() > 0.85:  # (hypothesis's randoms lean to 0: a test of < 0.15 held for most mixers)
                return self.rnd.choice(UNSIGNED_DECAYS)
            options.append(self.rnd.choice(POSITIVE_DECAYS))
        return self.rnd.choice(options)


@st.composite
def typed_spec(draw, unsigned: bool = False):
    """A random mixer built to type-check: one or two states, decays, additive or delta writes, reads, an output;
    unsigned: some decay factors not shown positive (UNSIGNED_DECAYS)."""
    rnd = draw(st.randoms(use_true_random=False))
    names = rnd.sample(sorted(TYPED_STATES), rnd.randint(1, 2))
    reads: dict[str, list[str]] = {}
    header = TYPED_HEADER.rstrip("\n").replace("\nparam", UNSIGNED_INPUT + "\nparam") if unsigned else TYPED_HEADER.rstrip("\n")
    lines = [header, "state " + ", ".join(f"{n}[{', '.join(TYPED_STATES[n])}]" for n in names)]

    def read(n, dims, query, of=None):
        lines.append(f"let r{len(lines)} = {query} @ {of or n}")
        reads.setdefault(dims[1] if len(dims) == 2 else "", []).append(f"r{len(lines) - 1}")

    for n in names:
        dims, t = TYPED_STATES[n], _Typed(rnd, reads, unsigned)
        if rnd.random() < 0.3 and len(dims) == 2:
            read(n, dims, t.vec(dims[0], 1))
        decay = t.decay(dims) + " * " if rnd.random() < 0.7 else ""
        shape = rnd.random()
        if len(dims) == 1:
            lines.append(f"{n} = {decay}{n} + {t.vec(dims[0])}")
        elif shape < 0.15:
            lines.append(f"{n} = {decay}{n}")
            read(n, dims, t.vec(dims[0], 1))
            lines.append(f"{n} = {n} + outer({t.vec(dims[0])}, {t.vec(dims[1])})")
        elif shape < 0.25:
            read(n, dims, t.vec(dims[0], 1), of=f"({n} + outer({t.vec(dims[0], 2)}, {t.vec(dims[1], 2)}))")
            lines.append(f"{n} = {decay}{n} + outer({t.vec(dims[0])}, {t.vec(dims[1])}) * {t.scalar(2)}")
        elif shape < 0.6:
            if decay:
                lines.append(f"{n} = {decay}{n}")
            lines.append(f"{n} = {n} + outer({t.vec(dims[0])}, {t.vec(dims[1])} - {t.vec(dims[0], 2)} @ {n})")
        else:
            lines.append(f"{n} = {decay}{n} + outer({t.vec(dims[0])}, {t.vec(dims[1])})")
        read(n, dims, t.vec(dims[0], 1))
    t = _Typed(rnd, reads)
    dim = rnd.choice([d for d in "KVM" if reads.get(d)] or ["V"])
    expr = f"{rnd.choice(reads[dim])} + {t.vec(dim)}" if reads.get(dim) else t.vec(dim)
    if reads.get(""):
        expr = f"({expr}) / (1 + abs({reads[''][0]}))"
    if rnd.random() < 0.2:
        expr += f" + block_attention({t.vec('K', 2)}, {t.vec('K', 2)}, {t.vec(dim, 2)}, size = {rnd.choice(['2', 'K'])})"
    if rnd.random() < 0.2:
        lines.append(f"stat st = {rnd.choice(['mean', 'std', 'max'])}({t.vec(rnd.choice('KVM'), 2)})"
                     f"{rnd.choice(['', ' per head', ' per batch, head'])}")  # fmt: skip
        expr = f"({expr}) * st"
    lines.append(f"out o = {expr}{USE_ALL}{UNSIGNED_USE if unsigned else ''}")
    return "\n".join(lines) + "\n"


@CALLS
@given(typed_spec(unsigned=True), st.booleans())
def test_typed_random_mixers_compile_or_fail_located_and_run(text, packed):
    """Found: a delta rule's erase read also used by the output compiled, then crashed the torch backend; a decay
    factor that is not positive gave NaN on the torch backend, numbers on the interpreter."""
    from lamixer.tools.check import random_call

    mixer = load_or_located_error(text)
    if mixer is None:
        return
    cu = [0, 2, 6] if packed else None
    tensors, states = random_call(mixer, B=1, T=6, H=2, size=3, cu_seqlens=cu)
    initial = states[0] if len(states) == 1 else states
    run_and_compare(mixer, tensors, initial, None if cu is None else torch.tensor(cu))
    if cu is None:
        causal_for_non_finite(mixer, tensors, initial)


# ---------------------------------------------------------------- (d) spoilt calls of the shipped mixers and layers

SPOIL_VALUES = [None, 1.0, "q", [1.0], True, torch.tensor(2.0), torch.zeros(0), float("nan")]


def _spoil_tensor(draw, x: torch.Tensor):
    """A tensor argument made wrong: its dtype, its shape, its values, or not a tensor at all."""
    if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.numel() == 0 or not x.is_floating_point():  # spoilt already
        return x
    how = draw(st.sampled_from(["dtype", "shape", "values", "values", "object", "transpose", "empty"]))
    if how == "dtype":
        return x.to(draw(st.sampled_from([torch.bfloat16, torch.float16, torch.int64, torch.bool, torch.complex64])))
    if how == "shape":
        return draw(st.sampled_from([x.unsqueeze(0), x[..., :1], x.reshape(-1), x[..., None], torch.cat([x, x], -1)]))
    if how == "values":
        value = draw(st.sampled_from([float("nan"), float("inf"), float("-inf"), 1e30, -1e30, 2.0, -2.0]))
        x = x.clone()
        x.reshape(-1)[draw(st.integers(0, x.numel() - 1))] = value
        return x
    if how == "transpose":
        return x.transpose(1, 2) if x.dim() >= 3 else x.t() if x.dim() == 2 else x
    if how == "empty":
        return x[:, :0] if x.dim() >= 2 else x[:0]
    return draw(st.sampled_from(SPOIL_VALUES))


@st.composite
def spoilt_call(draw):
    """A shipped mixer, a valid call of it, and one or two of its arguments spoilt."""
    from lamixer.tools.check import random_call

    name = draw(st.sampled_from(sorted(SHIPPED)))
    mixer = lamixer.load(name)
    tensors, states = random_call(mixer, B=2, T=5, H=2, size=3, seed=draw(st.integers(0, 3)))
    kwargs = {"initial_state": states[0] if len(states) == 1 else states, "backend": "torch"}
    for _ in range(draw(st.integers(1, 2))):
        what = draw(st.sampled_from(["tensor", "tensor", "tensor", "drop", "extra", "scale", "state", "cu", "flag", "backend"]))
        key = draw(st.sampled_from(sorted(tensors)))
        if what == "tensor":
            tensors[key] = _spoil_tensor(draw, tensors[key])
        elif what == "drop":
            del tensors[key]
        elif what == "extra":
            tensors[draw(st.sampled_from(["bogus", "scale_", key + "2"]))] = tensors.get(key, torch.zeros(1))
        elif what == "scale":
            kwargs["scale"] = draw(st.sampled_from([0.5, -1.0, 0.0, float("nan"), float("inf"), "0.5", True, 10**400, torch.tensor(2.0)]))
        elif what == "state":
            h0 = kwargs["initial_state"]
            h0 = h0 if isinstance(h0, torch.Tensor) else torch.zeros(2, 2, 3, 4)
            kwargs["initial_state"] = draw(st.sampled_from([None, [], (h0,), (h0, h0, h0), torch.zeros(1), "state", h0.double()[:1], h0.int()]))
        elif what == "cu":
            kwargs["cu_seqlens"] = draw(st.sampled_from([torch.tensor([0, 5]), torch.tensor([0, 2, 5]), torch.tensor([0, 3, 2, 5]),
                                                         torch.tensor([0.0, 5.0]), [0, 5], torch.tensor([1, 5])]))  # fmt: skip
        elif what == "flag":
            kwargs["output_final_state"] = draw(st.sampled_from([True, 1, "yes", None]))
        else:
            kwargs["backend"] = draw(st.sampled_from(["interpret", "auto", "cuda", None, "Torch"]))
    return mixer, tensors, kwargs


@CALLS
@given(spoilt_call())
def test_spoilt_calls_raise_only_lamixer_errors(case):
    mixer, tensors, kwargs = case
    try:
        with time_limit():
            mixer(**tensors, **kwargs)
    except lamixer.LamixerError:
        pass


@st.composite
def spoilt_layer_call(draw):
    """A small layer of a shipped spec and a call of it (forward or step) with one argument spoilt."""
    name = draw(st.sampled_from(["gla", "deltanet", "retnet", "rwkv6", "mamba2"]))
    small = {"gla": {"gate_rank": 4}, "rwkv6": {"decay_rank": 4, "mix_rank": 4}, "mamba2": {"d_state": 4}}
    torch.manual_seed(0)
    layer = lamixer.Layer(name, 16, 2, **small.get(name, {}))
    x = torch.randn(2, 5, 16)
    args, kwargs = [x], {}
    what = draw(st.sampled_from(["x", "x", "keyword", "positional", "state", "cu", "flag", "step"]))
    if what == "x":
        args[0] = _spoil_tensor(draw, x)
    elif what == "keyword":
        kwargs[draw(st.sampled_from(["mask", "attention_mask", "states", "cache"]))] = None
    elif what == "positional":
        args += [None, None, False, draw(st.sampled_from([None, 1, x]))]
    elif what == "state":
        kwargs["state"] = draw(st.sampled_from([torch.zeros(1), "s", layer.initial_state(3), lamixer.Layer("linear_attn", 16, 2).initial_state(2)]))
    elif what == "cu":
        kwargs["cu_seqlens"] = draw(st.sampled_from([torch.tensor([0, 5]), torch.tensor([0, 2, 5]), torch.tensor([0, 6])]))
    elif what == "flag":
        kwargs["return_state"] = draw(st.sampled_from([1, "yes", None]))
    else:
        return layer.step, [_spoil_tensor(draw, x[:, 0])], {}
    return layer, args, kwargs


@CALLS
@given(spoilt_layer_call())
def test_spoilt_layer_calls_raise_only_lamixer_errors(case):
    """Found: a layer's forward given an unknown keyword raised Python's TypeError."""
    fn, args, kwargs = case
    try:
        with time_limit():
            fn(*args, **kwargs)
    except lamixer.LamixerError:
        pass


# ---------------------------------------------------------------- regressions found by fuzzing

@pytest.mark.parametrize("text", [
    "mixer m\nlet x = 1" + " ^ 1" * 3000 + "\nout o = x\n",  # a RecursionError inside a lark callback escaped
    "mixer m\nlet x = " + "-" * 5000 + "1\nout o = x\n",
    "mixer m\nlet x = " + "(" * 3000 + "1" + ")" * 3000 + "\nout o = x\n",
    "mixer m\nlet x = " + "exp(" * 2000 + "1" + ")" * 2000 + "\nout o = x\n",
    "mixer m\ndims K, V\ninput q[K], k[K], v[V]\nstate S[K, V]\nS = S" + " * 2" * 3000 + " + outer(k, v)\nout o = q @ S\n",
])
def test_deep_nesting_is_a_located_error(text):
    with pytest.raises(lamixer.SpecError) as info:
        lamixer.loads(text, FILENAME)
    assert info.value.loc is not None
    assert str(info.value).startswith(f"{FILENAME}:{info.value.loc.line}:")


def test_moderate_nesting_still_compiles():
    mixer = lamixer.loads(
        "mixer m\ndims K, V\ninput q[K], k[K], v[V]\nstate S[K, V]\n"
        "S = S + outer(k, v" + " * 1" * 150 + ")\nout o = q @ S\n", FILENAME
    )  # fmt: skip
    q = torch.randn(1, 3, 1, 2)
    mixer(q, q, q)


def test_spec_text_is_never_executed(tmp_path):
    marker = tmp_path / "pwned"
    payloads = [
        f"mixer m\nlet x = __import__('os').system('touch {marker}')\n",
        f'mixer m "{{__import__("os").system("touch {marker}")}}"\ndims K\ninput q[K]\nout o = q\n',
        f"mixer m\ndims K\ninput q[K]\nout o = eval(\"open('{marker}', 'w')\")\n",
        "mixer m\ndims K\ninput q[K]\nout o = exec(q)\n",
    ]
    for text in payloads:
        try:
            lamixer.loads(text, FILENAME)
        except lamixer.LamixerError:
            pass
    assert not marker.exists()


HUGE = "9" * 4400  # past Python's limit on int() of a digit string (4300)


@pytest.mark.parametrize("text, line", [
    (f"mixer m\ndims K = {HUGE}, V\ninput q[K], k[K], v[V]\nstate S[K, V]\nS = S + outer(k, v)\nout o = q @ S\n", 2),
    (shipped_source("deltanet").replace("conv q, k, v conv_size silu", f"conv q, k, v {HUGE} silu"), 16),
    (shipped_source("gla").replace("proj g lowrank gate_rank bias", f"proj g lowrank {HUGE} bias"), 14),
    (shipped_source("retnet").replace("rotary q, k", f"rotary q, k {HUGE}"), 15),
])
def test_huge_whole_numbers_are_located_errors(text, line):
    """Found: lark's VisitError (int() of over 4300 digits) escaped from a dim size and a conv, lowrank or rotary count."""
    with pytest.raises(lamixer.SpecError, match="digits") as info:
        lamixer.loads(text, FILENAME)
    assert info.value.loc.line == line


@pytest.mark.parametrize("text, where", [
    ('mixer m\ndims K, V\ninput q[K], k[K], v[V]\nstate S[K, V]\nS = 1e400 * S + outer(k, v)\nout o = q @ S\n', (5, 5)),
    ('mixer m\ndims K, V\ninput q[K], k[K], v[V] in (0, 2e308)\nstate S[K, V]\nS = S + outer(k, v)\nout o = q @ S\n', (3, 31)),
])
def test_numbers_past_float64s_range_are_located_errors(text, where):
    """Found: 1e400 read as an infinity: a decay of inf compiled, and every output was NaN."""
    with pytest.raises(lamixer.SpecError, match="beyond the range of a number") as info:
        lamixer.loads(text, FILENAME)
    assert (info.value.loc.line, info.value.loc.col) == where


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_a_constant_past_float32s_range_rounds_to_infinity(backend):
    """Found: a spec's 1e300 in a float32 call raised RuntimeError from torch.full on the torch backend. Every float32
    evaluator now fills it as a cast rounds it, to inf (the interpreter, float64, keeps 1e300)."""
    m = lamixer.loads('mixer m\ndims K, V\ninput q[K], k[K], v[V]\nstate S[K, V]\nS = S + outer(k, v)\nout o = q @ S * 1e300\n', FILENAME)
    q, k, v = (torch.randn(1, 5, 1, 4) for _ in range(3))
    assert not torch.isfinite(m(q, k, v, backend=backend)[0]).any()
    assert torch.isfinite(m(q.double(), k.double(), v.double(), backend=backend)[0]).all()


@pytest.mark.parametrize("char", ["\x00", "\x1b", "\x7f", "\x85", "\t", "\x0b"])
def test_control_characters_in_a_title_are_located_errors(char):
    """Found: a NUL in a title compiled into a package Python cannot parse."""
    text = f'mixer m "ab{char}c"\ndims K\ninput q[K]\nout o = q\n'
    with pytest.raises(lamixer.SpecError, match=f"U\\+{ord(char):04X}") as info:
        lamixer.loads(text, FILENAME)
    assert (info.value.loc.line, info.value.loc.col) == (1, 12)
    assert char not in str(info.value)  # the rendered line shows it as a visible symbol, under the caret


def test_odd_titles_compile_into_packages_python_reads(tmp_path):
    import ast

    from lamixer.emit.write import write

    title = "a \\ b \\x00 \\N{BULLET} ''' c \u2028 d \u200b é"
    mixer = lamixer.loads(f'mixer odd "{title}"\ndims K, V\ninput q[K], k[K], v[V]\nstate S[K, V]\nS = S + outer(k, v)\nout o = q @ S\n')
    for path in write([mixer.compiled], tmp_path / "out"):
        if path.suffix == ".py":
            ast.parse(path.read_text(), str(path))


def test_docstring_text_escapes_what_python_or_a_terminal_would_not_take_as_text():
    import ast

    from lamixer.emit.source import doc

    for s in ["a\x00b", "\x1b[31mred", 'x"""y', "back\\slash", "line\u2028sep", "tab\there"]:
        text = doc(s)
        assert text.isprintable() and "\n" not in text, repr(text)
        ast.parse(f'"""{text}"""\n')


def test_many_reads_of_state_expressions_compile_in_seconds():
    """Found: 800 reads of an expression of a state (x @ (S + outer(a, b)), 35 KB) took 43 s to load: the read
    rewriting sorted the whole graph again after each rewrite."""
    import time

    lines = ["mixer many", "dims K, V", "input q[K], k[K], v[V], u[K]", "state S[K, V]", "S = S + outer(k, v)", "let r0 = 0 * v"]
    lines += [f"let r{i} = r{i - 1} + (q * {i}) @ (S + outer(u * k, v))" for i in range(1, 801)]
    text = "\n".join(lines + ["out o = r800"]) + "\n"
    start = time.perf_counter()
    mixer = lamixer.loads(text, FILENAME)
    assert time.perf_counter() - start < 20
    assert len(mixer.compiled.classification.scan("S").reads) == 800
