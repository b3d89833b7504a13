"""Spec text -> located AST, through the lark grammar in grammar/lamixer.lark."""
from __future__ import annotations

import functools
import math
import unicodedata
from importlib import resources

import lark
from lark import Token, Transformer, v_args

from ..errors import Loc, SpecError
from . import syntax as S

MAX_SOURCE_CHARS = 100_000
MAX_WHOLE_DIGITS = 18  # a whole number (a dim size, a kernel size, a rank) fits an int64; Python's int() refuses over 4300 digits


@functools.cache
def _parser() -> lark.Lark:
    grammar = resources.files("lamixer").joinpath("frontend/grammar/lamixer.lark").read_text()
    return lark.Lark(grammar, parser="lalr", propagate_positions=True, maybe_placeholders=True)


def _real(token: Token) -> float:
    """A number token as a float; past float64's range (1e400 reads as inf) a located error: a spec's constant never
    turns into an infinity it did not write (a bound writes inf for that)."""
    value = float(token)
    if not math.isfinite(value):
        raise SpecError(f"{token[:24]} is beyond the range of a number (about 1.8e308 at most)", _loc(token))
    return value


def _whole(token: Token, what: str) -> int:
    """A whole number token as an int; too many digits is a located error (int() of a huge one raises deep inside lark)."""
    if len(token.lstrip("0")) > MAX_WHOLE_DIGITS:
        raise SpecError(f"{what} {token[:12]}... has {len(token)} digits; at most {MAX_WHOLE_DIGITS} are allowed", _loc(token))
    return int(token)


def _check_title(token: Token) -> None:
    """A title reaches docstrings and READMEs of compiled packages: a control character (a NUL makes a Python file
    Python refuses to read) is an error at the character."""
    for i, ch in enumerate(str(token)):
        if unicodedata.category(ch) == "Cc":
            raise SpecError(f"control character U+{ord(ch):04X} in the title; a title is plain text on one line",
                            Loc(token.line or 1, (token.column or 1) + i))  # fmt: skip


def _loc(item) -> Loc:
    if isinstance(item, Token):
        return Loc(item.line or 1, item.column or 1)
    meta = getattr(item, "meta", None)
    if meta is not None and not meta.empty:
        return Loc(meta.line, meta.column)
    return Loc(1, 1)


@v_args(meta=True)
class _ToAst(Transformer):
    """Builds syntax dataclasses; every node keeps the line:column where it starts."""

    # -- expressions --
    def number(self, meta, c):
        return S.Num(_real(c[0]), _loc(c[0]))

    def name(self, meta, c):
        return S.Name(str(c[0]), _loc(c[0]))

    def _binary(self, op, meta, c):
        return S.BinOp(op, c[0], c[1], Loc(meta.line, meta.column))

    def add(self, meta, c):
        return self._binary("add", meta, c)

    def sub(self, meta, c):
        return self._binary("sub", meta, c)

    def mul(self, meta, c):
        return self._binary("mul", meta, c)

    def div(self, meta, c):
        return self._binary("div", meta, c)

    def matmul(self, meta, c):
        return self._binary("matmul", meta, c)

    def pow(self, meta, c):
        return self._binary("pow", meta, c)

    def neg(self, meta, c):
        return S.Neg(c[0], Loc(meta.line, meta.column))

    def kwarg(self, meta, c):
        return ("kw", str(c[0]), c[1], _loc(c[0]))

    def call(self, meta, c):
        args, kwargs = [], []
        for a in c[1:]:
            if a is None:
                continue
            if isinstance(a, tuple) and a and a[0] == "kw":
                kwargs.append(a[1:])
            else:
                if kwargs:
                    raise SpecError("positional argument after a keyword argument", a.loc)
                args.append(a)
        return S.Call(str(c[0]), tuple(args), tuple(kwargs), _loc(c[0]))

    # -- declarations --
    def shape(self, meta, c):
        names = [t for t in c if t is not None]
        return S.Shape(tuple(str(t) for t in names), tuple(_loc(t) for t in names))

    def dim_item(self, meta, c):
        return S.DimDecl(str(c[0]), _whole(c[1], "the size") if c[1] is not None else None, _loc(c[0]))

    def bound_number(self, meta, c):
        return _real(c[0])

    def bound_neg_inf(self, meta, c):
        return float("-inf")

    def bound_inf(self, meta, c):
        return float("inf")

    def domain(self, meta, c):
        lo, hi = c
        if not lo < hi:
            raise SpecError(f"empty domain ({lo}, {hi}): the lower bound must be below the upper", Loc(meta.line, meta.column))
        return (lo, hi)

    def input_item(self, meta, c):
        shape = c[1] if c[1] is not None else S.Shape((), ())
        domain = c[2] if c[2] is not None else (float("-inf"), float("inf"))
        return S.InputDecl(str(c[0]), shape, domain, _loc(c[0]))

    def param_item(self, meta, c):
        return S.ParamDecl(str(c[0]), c[1], _loc(c[0]))

    def state_item(self, meta, c):
        domain = c[2] if c[2] is not None else (float("-inf"), float("inf"))
        return S.StateDecl(str(c[0]), c[1], domain, _loc(c[0]))

    def _items(self, meta, c):
        return list(c)

    dims_decl = input_decl = param_decl = state_decl = _items

    def default_decl(self, meta, c):
        return S.Default(str(c[0]), c[1], _loc(c[0]))

    def stat_groups(self, meta, c):
        return tuple((str(t), _loc(t)) for t in c)

    def stat_def(self, meta, c):
        return S.Stat(str(c[0]), c[1], c[2] or (), _loc(c[0]))

    def let_def(self, meta, c):
        return S.Let(str(c[0]), c[1], _loc(c[0]))

    def out_def(self, meta, c):
        return S.Out(str(c[0]), c[1], _loc(c[0]))

    def assign(self, meta, c):
        return S.Assign(str(c[0]), c[1], _loc(c[0]))

    # -- the layer section --
    def name_list(self, meta, c):
        return tuple(S.Ident(str(t), _loc(t)) for t in c)

    def count(self, meta, c):
        t = c[0]
        return S.Count(_whole(t, "the count") if t.type == "INT" else str(t), _loc(t))

    def _ident(self, t) -> S.Ident | None:
        return None if t is None else S.Ident(str(t), _loc(t))

    def option_item(self, meta, c):
        return S.LayerOption(str(c[0]), c[1], _loc(c[0]))

    def size_item(self, meta, c):
        return S.LayerSize(str(c[0]), c[1], _loc(c[0]))

    option_decl = size_decl = _items

    def lparam_decl(self, meta, c):
        return S.LayerParam(str(c[0]), c[1], c[2], _loc(c[0]))

    def proj_lowrank(self, meta, c):
        return ("lowrank", c[0], self._ident(c[1]))

    def proj_bias(self, meta, c):
        return ("bias",)

    def proj_shared(self, meta, c):
        return ("shared",)

    def proj_decl(self, meta, c):
        names, flags = c[0], c[1:]
        lowrank = next((f for f in flags if f[0] == "lowrank"), None)
        if sum(f[0] == "lowrank" for f in flags) > 1:
            raise SpecError("`lowrank` given twice", names[0].loc)
        return S.Proj(names, lowrank[1] if lowrank else None, lowrank[2] if lowrank else None,
                      any(f[0] == "bias" for f in flags), any(f[0] == "shared" for f in flags), Loc(meta.line, meta.column))  # fmt: skip

    def conv_decl(self, meta, c):
        return S.Conv(c[0], c[1], self._ident(c[2]), Loc(meta.line, meta.column))

    def map_fn(self, meta, c):
        return S.Map(c[0], self._ident(c[1]), None, Loc(meta.line, meta.column))

    def map_expr(self, meta, c):
        return S.Map((S.Ident(str(c[0]), _loc(c[0])),), None, c[1], Loc(meta.line, meta.column))

    def rotary_decl(self, meta, c):
        return S.Rotary(c[0], c[1], Loc(meta.line, meta.column))

    def shift_decl(self, meta, c):
        return S.Shift(c[0], c[1], Loc(meta.line, meta.column))

    def norm_decl(self, meta, c):
        return S.Norm(self._ident(c[0]), self._ident(c[1]), Loc(meta.line, meta.column))

    def out_gate_decl(self, meta, c):
        return S.OutGate(self._ident(c[0]), Loc(meta.line, meta.column))

    def running_momentum(self, meta, c):
        t = c[0]
        return _real(t) if t.type == "NUMBER" else S.Ident(str(t), _loc(t))

    def running_decl(self, meta, c):
        return S.Running(c[0], c[1], self._ident(c[2]), Loc(meta.line, meta.column))

    def layer_section(self, meta, c):
        statements: list = []
        for item in c:
            statements.extend(item if isinstance(item, list) else [item])
        return S.LayerSection(tuple(statements), Loc(meta.line, meta.column))

    def header(self, meta, c):
        if c[1] is not None:
            _check_title(c[1])
        title = str(c[1])[1:-1] if c[1] is not None else ""
        return (str(c[0]), title, _loc(c[0]))

    def start(self, meta, c):
        (name, title, loc), *rest = c
        statements: list = []
        layer = None
        for item in rest:
            if isinstance(item, S.LayerSection):
                layer = item
            else:
                statements.extend(item if isinstance(item, list) else [item])
        return S.Spec(name, title, statements, loc=loc, layer=layer)


_TERMINAL_WORDS = {"NAME": "a name", "NUMBER": "a number", "SIGNED_NUMBER": "a number", "INT": "a whole number",
                   "STRING": "a quoted title", "_NL": "end of line", "$END": "end of input"}  # fmt: skip


def _describe_terminal(name: str) -> str:
    if name in _TERMINAL_WORDS:
        return _TERMINAL_WORDS[name]
    term = next((t for t in _parser().terminals if t.name == name), None)
    if term is not None and isinstance(term.pattern, lark.lexer.PatternStr):
        return repr(term.pattern.value)
    return name.lower()


def _describe_expected(expected: set[str]) -> str:
    shown = sorted({_describe_terminal(n) for n in expected}, key=lambda w: (w[0] != "'", w))
    return ", ".join(shown[:8]) + (", ..." if len(shown) > 8 else "")


def _deepest(tree) -> Loc:
    """Where the most deeply nested part of a parse tree starts (found without recursion)."""
    best, stack = (0, tree), [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > best[0]:
            best = (depth, node)
        if isinstance(node, lark.Tree):
            stack.extend((c, depth + 1) for c in node.children if isinstance(c, (lark.Tree, Token)))
    return _loc(best[1])


def parse(source: str, filename: str = "<spec>") -> S.Spec:
    """Parse spec text; any mistake raises a SpecError located in the text."""
    if not isinstance(source, str):
        raise SpecError(f"spec text must be a string, not {type(source).__name__}", None, "", filename)
    if len(source) > MAX_SOURCE_CHARS:  # located where the limit is passed
        line = source.count("\n", 0, MAX_SOURCE_CHARS) + 1
        col = MAX_SOURCE_CHARS - (source.rfind("\n", 0, MAX_SOURCE_CHARS) + 1) + 1
        raise SpecError(f"spec is longer than {MAX_SOURCE_CHARS} characters", Loc(line, col), source, filename)
    text = source if source.endswith("\n") else source + "\n"
    tree = None
    try:
        tree = _parser().parse(text)
        spec = _ToAst().transform(tree)
    except lark.exceptions.UnexpectedCharacters as e:
        raise SpecError(f"unexpected character {text[e.pos_in_stream]!r}", Loc(e.line, e.column), source, filename) from None
    except lark.exceptions.UnexpectedToken as e:
        tok = e.token
        what = "end of input" if tok.type == "$END" else ("end of line" if tok.type == "_NL" else repr(str(tok)))
        raise SpecError(
            f"unexpected {what}; expected {_describe_expected(e.expected)}", Loc(tok.line or 1, tok.column or 1), source, filename
        ) from None
    except lark.exceptions.UnexpectedEOF as e:
        raise SpecError(f"unexpected end of input; expected {_describe_expected(set(e.expected))}", None, source, filename) from None
    except lark.exceptions.VisitError as e:
        if isinstance(e.orig_exc, SpecError):
            raise e.orig_exc.located(source, filename) from None
        if isinstance(e.orig_exc, RecursionError):  # raised inside a callback, so lark wrapped it
            raise SpecError("expression nested too deeply", _deepest(tree), source, filename) from None
        raise
    except RecursionError:
        raise SpecError("expression nested too deeply", _deepest(tree), source, filename) from None
    spec.source, spec.filename = source, filename
    return spec
