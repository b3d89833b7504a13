"""The range a node's values can take, from its form and the declared domains: interval arithmetic over the IR.

Sound but not tight: a range always holds every value the node can take (for any call: any dim size from 1, any
head index from 0, any value of an input in its declared domain, anything for a param, a state read or the scale),
but may hold more. Its use is the sign of a decay factor, whose log the scans take (lamixer.passes.classify).
Each bound says whether it is attained, so that exp(x) is known positive, not merely non-negative.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from . import graph as ir

INF = math.inf


@dataclass(frozen=True)
class Range:
    """The values lo .. hi; lo_open: lo itself is not taken (likewise hi_open)."""

    lo: float = -INF
    hi: float = INF
    lo_open: bool = True
    hi_open: bool = True

    @property
    def positive(self) -> bool:
        return self.lo > 0 or (self.lo == 0 and self.lo_open)

    @property
    def never_positive(self) -> bool:
        return self.hi <= 0

    def text(self) -> str:
        def bound(x: float) -> str:
            return "inf" if x == INF else "-inf" if x == -INF else f"{x:.6g}"

        return f"{'(' if self.lo_open else '['}{bound(self.lo)}, {bound(self.hi)}{')' if self.hi_open else ']'}"


ANY = Range()


def exact(x: float) -> Range:
    return Range(x, x, False, False)


def _pick(values: list[tuple[float, bool]], low: bool) -> tuple[float, bool]:
    """The smallest (low) or largest of candidate bounds; a bound some candidate attains is attained."""
    best = min(v for v, _ in values) if low else max(v for v, _ in values)
    return best, all(is_open for v, is_open in values if v == best)


def _from(candidates: list[tuple[float, bool]]) -> Range:
    (lo, lo_open), (hi, hi_open) = _pick(candidates, True), _pick(candidates, False)
    return Range(lo, hi, lo_open, hi_open)


def neg(a: Range) -> Range:
    return Range(-a.hi, -a.lo, a.hi_open, a.lo_open)


def add(a: Range, b: Range) -> Range:
    lo, hi = a.lo + b.lo, a.hi + b.hi
    return Range(-INF if math.isnan(lo) else lo, INF if math.isnan(hi) else hi, a.lo_open or b.lo_open, a.hi_open or b.hi_open)


def _times(x: float, x_open: bool, y: float, y_open: bool) -> tuple[float, bool]:
    """A corner of a product: 0 * inf counts as 0 (the product nears 0 there); an attained 0 makes an attained 0."""
    zero = (x == 0 and not x_open) or (y == 0 and not y_open)
    value = x * y
    return (0.0 if math.isnan(value) else value), (x_open or y_open) and not zero


def mul(a: Range, b: Range) -> Range:
    return _from([_times(x, xo, y, yo) for x, xo in ((a.lo, a.lo_open), (a.hi, a.hi_open)) for y, yo in ((b.lo, b.lo_open), (b.hi, b.hi_open))])


def reciprocal(a: Range) -> Range:
    """1 / a for an a of one sign; anything when a may be 0 or take both signs."""
    if a.positive:
        lo = 0.0 if a.hi == INF else 1 / a.hi
        hi = INF if a.lo == 0 else 1 / a.lo
        return Range(lo, hi, a.hi_open or a.hi == INF, a.lo_open or a.lo == 0)
    if a.hi < 0 or (a.hi == 0 and a.hi_open):
        return neg(reciprocal(neg(a)))
    return ANY


def monotone(fn, a: Range, lo_limit: float = -INF, hi_limit: float = INF) -> Range:
    """fn (increasing) of a; a bound equal to fn's own limit (lo_limit, hi_limit) is never attained."""
    lo, hi = fn(a.lo), fn(a.hi)
    return Range(lo, hi, a.lo_open or lo <= lo_limit, a.hi_open or hi >= hi_limit)


def _safe(fn):
    def wrapped(x: float) -> float:
        try:
            return fn(x)
        except OverflowError:
            return INF
    return wrapped


def _exp(x: float) -> float:
    return 0.0 if x == -INF else _safe(math.exp)(x)


def _log(x: float) -> float:
    return -INF if x <= 0 else math.log(x)


def _sigmoid(x: float) -> float:
    return 1 / (1 + _exp(-x))


def _softplus(x: float) -> float:
    return x if x > 30 else math.log1p(_exp(x))


UNARY = {
    "exp": lambda a: monotone(_exp, a, 0.0),
    "log": lambda a: monotone(_log, a) if a.lo >= 0 else ANY,
    "sigmoid": lambda a: monotone(_sigmoid, a, 0.0, 1.0),
    "logsigmoid": lambda a: monotone(lambda x: -_softplus(-x), a, -INF, 0.0),
    "softplus": lambda a: monotone(_softplus, a, 0.0),
    "tanh": lambda a: monotone(math.tanh, a, -1.0, 1.0),
    "elu": lambda a: monotone(lambda x: x if x > 0 else _exp(x) - 1, a, -1.0),
    "relu": lambda a: Range(max(a.lo, 0.0), max(a.hi, 0.0), a.lo_open and a.lo >= 0, a.hi_open and a.hi > 0),
    "sqrt": lambda a: monotone(math.sqrt, a) if a.lo >= 0 else ANY,
    "abs": lambda a: a if a.lo >= 0 else neg(a) if a.hi <= 0 else Range(0.0, max(-a.lo, a.hi), False, a.hi_open if a.hi >= -a.lo else a.lo_open),
    # silu(x) = x sigmoid(x) is increasing from its minimum, about -0.2785 at x = -1.2785
    "silu": lambda a: monotone(lambda x: x * _sigmoid(x) if math.isfinite(x) else max(x, 0.0), a) if a.lo >= 0 else Range(-0.2785, INF, False, True),
}


def _pow(a: Range, b: Range) -> Range:
    """a ^ b = exp(b log a) for a positive base; else anything (a negative base to a fractional power is NaN)."""
    if not a.positive:
        return ANY
    return UNARY["exp"](mul(b, UNARY["log"](a)))


def _extreme(a: Range, b: Range, low: bool) -> Range:
    """min(a, b) (low) or max(a, b): the picked side's bound is attained where either operand attains it; the other
    side's only where both do."""
    if low:
        lo, lo_open = _pick([(a.lo, a.lo_open), (b.lo, b.lo_open)], True)
        hi = min(a.hi, b.hi)
        return Range(lo, hi, lo_open, any(r.hi_open for r in (a, b) if r.hi == hi))
    hi, hi_open = _pick([(a.hi, a.hi_open), (b.hi, b.hi_open)], False)
    lo = max(a.lo, b.lo)
    return Range(lo, hi, any(r.lo_open for r in (a, b) if r.lo == lo), hi_open)


def _sum(a: Range) -> Range:
    """A sum over a dim of at least one element, each in a: of a's sign, unbounded away from 0."""
    if a.lo >= 0:
        return Range(a.lo, INF if a.hi > 0 else 0.0, a.lo_open, a.hi > 0 or a.hi_open)
    if a.hi <= 0:
        return Range(-INF if a.lo < 0 else 0.0, a.hi, a.lo < 0 or a.lo_open, a.hi_open)
    return ANY


BINARY = {"add": add, "sub": lambda a, b: add(a, neg(b)), "mul": mul, "div": lambda a, b: mul(a, reciprocal(b)), "pow": _pow,
          "max": lambda a, b: _extreme(a, b, False), "min": lambda a, b: _extreme(a, b, True)}  # fmt: skip


class Bounds:
    """Ranges of a graph's nodes, each worked out once."""

    def __init__(self, g: ir.Graph):
        self.g = g
        self.domains = {op.name: op.domain for op in g.operands if op.kind == "input"}
        self.known: dict[int, Range] = {}

    def __call__(self, n: int) -> Range:
        stack = [n]
        while stack:  # operands before the node, without recursion (expressions may nest deeply)
            m = stack[-1]
            todo = [a for a in self.g.args(m) if a not in self.known]
            if todo:
                stack.extend(todo)
                continue
            stack.pop()
            if m not in self.known:
                self.known[m] = self._node(m)
        return self.known[n]

    def _node(self, n: int) -> Range:
        d = self.g.node(n)
        op, args = d["op"], [self.known[a] for a in d["args"]]
        if op == "const":
            return exact(d["value"])
        if op == "dim":
            return Range(1.0, INF, False, True)
        if op == "head":
            return Range(0.0, INF, False, True)
        if op == "input":
            lo, hi = self.domains[d["name"]]
            return Range(lo, hi, True, True)
        if op == "unary":
            return UNARY.get(d["fn"], lambda a: ANY)(args[0])
        if op == "binary":
            return BINARY[d["fn"]](*args)
        if op == "reduce":
            return _sum(args[0]) if d["fn"] == "sum" else args[0]
        if op == "normalize":
            return Range(0.0, 1.0, True, False) if d["fn"] == "softmax" else Range(-1.0, 1.0, False, False)
        if op in ("dot", "outer"):
            product = mul(args[0], args[1])
            return _sum(product) if op == "dot" else product
        if op == "stat":
            return Range(0.0, INF, False, True) if d["fn"] in ("std", "var") else args[0]
        return ANY  # params, the scale, state versions and their reads, block attention
