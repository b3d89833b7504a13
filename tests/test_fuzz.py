"""Fuzzing: random spec text raises nothing but a located lamixer error.

Generators: (a) token soup from the language's alphabet (and shuffled shipped statements),
(b) mutations of the shipped specs (delete, duplicate or swap lines; replace, insert or delete
a token), (c) dims-typed random mixers, which mostly compile; a spec that compiles must then
run on both backends. Derandomized so that CI is deterministic; set FUZZ_EXAMPLES (e.g.
FUZZ_EXAMPLES=50000; the call tests run a tenth of that) to search harder.
"""
import os
import re

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lamixer
from lamixer.api import shipped_source

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "0"))
FUZZ = settings(
    max_examples=EXAMPLES or 3000,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
CALLS = settings(FUZZ, max_examples=EXAMPLES // 10 or 400)

KEYWORDS = ["mixer", "dims", "input", "param", "state", "default", "stat", "let", "out", "in", "per", "inf",
            "batch", "head", "time"]  # fmt: skip
NAMES = ["q", "k", "v", "g", "w", "u", "s", "x", "S", "z", "Kt", "Vt", "o", "beta", "K", "V", "M", "N", "P",
         "H", "h", "scale", "size", "A_log", "D"]  # fmt: skip
FUNCTIONS = ["exp", "log", "sigmoid", "softplus", "relu", "sqrt", "abs", "sum", "mean", "max", "min", "std", "var",
             "l2norm", "softmax", "dot", "outer", "pow", "block_attention", "l2_norm", "foo"]  # fmt: skip
NUMBERS = ["0", "1", "2", "64", "0.5", "1e-5", ".5", "3.", "1e999", "007", "1e", "-1", "+2", "-inf"]
SYMBOLS = ["+", "-", "*", "/", "@", "^", "=", ",", "(", ")", "[", "]", "(", ")", "\n", "\n", "\n", "#", '"t"',
           "\\\n", "\t", "$", ";", "'", "é", "\x00", "\r\n"]  # fmt: skip
ALPHABET = KEYWORDS + NAMES + FUNCTIONS + NUMBERS + SYMBOLS

SHIPPED = {name: shipped_source(name) for name in lamixer.shipped_specs()}
TOKEN = re.compile(r"\n|[A-Za-z_][A-Za-z0-9_]*|[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?|\S")
FILENAME = "fuzz.lam"


def load_or_located_error(text: str):
    """lamixer.loads(text); on a mistake, check the error is a located SpecError. Anything else fails the test."""
    try:
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

@st.composite
def mutated_spec(draw):
    name = draw(st.sampled_from(sorted(SHIPPED)))
    source = SHIPPED[name]
    lines = source.split("\n")
    pool = ALPHABET + TOKEN.findall(source) * 2
    for _ in range(draw(st.integers(1, 3))):
        if not lines:
            break
        op = draw(st.sampled_from(["delete", "duplicate", "swap", "replace", "replace", "insert", "insert", "drop"]))
        i = draw(st.integers(0, len(lines) - 1))
        if op == "delete":
            del lines[i]
        elif op == "duplicate":
            lines.insert(draw(st.integers(0, len(lines))), lines[i])
        elif op == "swap":
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        else:
            tokens = TOKEN.findall(lines[i])
            at = draw(st.integers(0, len(tokens)))
            if op == "insert" or at == len(tokens):
                tokens.insert(at, draw(st.sampled_from(pool)))
            elif op == "replace":
                tokens[at] = draw(st.sampled_from(pool))
            else:
                del tokens[at]
            lines[i] = " ".join(tokens)
    return "\n".join(lines)


@FUZZ
@given(mutated_spec())
def test_mutated_shipped_specs_raise_only_lamixer_errors(text):
    load_or_located_error(text)


@CALLS
@given(mutated_spec())
def test_mutated_specs_that_compile_can_be_called(text):
    """A spec the compiler accepts must not crash the backends (a crash means a check is missing)."""
    from lamixer.tools.check import random_call

    mixer = load_or_located_error(text)
    if mixer is None:
        return
    tensors, states = random_call(mixer, B=1, T=5, H=2, size=3, initial_state=True)
    initial = states[0] if len(states) == 1 else states
    for backend in ("torch", "interpret"):
        try:
            mixer(**tensors, initial_state=initial, output_final_state=True, backend=backend)
        except lamixer.ArgumentError as e:  # only the default scale may be refused (inf/nan for these sizes)
            assert e.argument == "scale", str(e)


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


class _Typed:
    """Expressions of given dims over the declared inputs and the reads made so far."""

    def __init__(self, rnd, reads):
        self.rnd, self.reads = rnd, reads

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
        return self.rnd.choice(options)


@st.composite
def typed_spec(draw):
    """A random mixer built to type-check: one or two states, decays, additive or delta writes, reads, an output."""
    rnd = draw(st.randoms(use_true_random=False))
    names = rnd.sample(sorted(TYPED_STATES), rnd.randint(1, 2))
    reads: dict[str, list[str]] = {}
    lines = [TYPED_HEADER.rstrip("\n"), "state " + ", ".join(f"{n}[{', '.join(TYPED_STATES[n])}]" for n in names)]

    def read(n, dims, query, of=None):
        lines.append(f"let r{len(lines)} = {query} @ {of or n}")
        reads.setdefault(dims[1] if len(dims) == 2 else "", []).append(f"r{len(lines) - 1}")

    for n in names:
        dims, t = TYPED_STATES[n], _Typed(rnd, reads)
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
    lines.append(f"out o = {expr}{USE_ALL}")
    return "\n".join(lines) + "\n"


@CALLS
@given(typed_spec(), st.booleans())
def test_typed_random_mixers_compile_or_fail_located_and_run(text, packed):
    """Found: a delta rule's erase read also used by the output compiled, then crashed the torch backend."""
    from lamixer.tools.check import random_call

    mixer = load_or_located_error(text)
    if mixer is None:
        return
    cu = [0, 2, 6] if packed else None
    tensors, states = random_call(mixer, B=1, T=6, H=2, size=3, cu_seqlens=cu)
    initial = states[0] if len(states) == 1 else states
    for backend in ("torch", "interpret"):
        mixer(**tensors, initial_state=initial, output_final_state=True, backend=backend,
              cu_seqlens=None if cu is None else torch.tensor(cu))  # fmt: skip


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
