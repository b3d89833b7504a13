"""The spec's abstract syntax: plain dataclasses, each carrying its source location."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import Loc


# ---- expressions ----
@dataclass(frozen=True)
class Num:
    value: float
    loc: Loc


@dataclass(frozen=True)
class Name:
    id: str
    loc: Loc


@dataclass(frozen=True)
class BinOp:
    op: str  # add sub mul div matmul pow
    left: Expr
    right: Expr
    loc: Loc


@dataclass(frozen=True)
class Neg:
    operand: Expr
    loc: Loc


@dataclass(frozen=True)
class Call:
    fn: str
    args: tuple[Expr, ...]
    kwargs: tuple[tuple[str, Expr, Loc], ...]
    loc: Loc


Expr = Num | Name | BinOp | Neg | Call


# ---- declarations and statements ----
@dataclass(frozen=True)
class Shape:
    dims: tuple[str, ...]
    locs: tuple[Loc, ...]


@dataclass(frozen=True)
class DimDecl:
    name: str
    default: int | None
    loc: Loc


@dataclass(frozen=True)
class InputDecl:
    name: str
    shape: Shape
    domain: tuple[float, float]
    loc: Loc


@dataclass(frozen=True)
class ParamDecl:
    name: str
    shape: Shape
    loc: Loc


@dataclass(frozen=True)
class StateDecl:
    name: str
    shape: Shape
    domain: tuple[float, float]
    loc: Loc


@dataclass(frozen=True)
class Default:
    name: str
    value: Expr
    loc: Loc


@dataclass(frozen=True)
class Stat:
    name: str
    value: Expr
    groups: tuple[tuple[str, Loc], ...]
    loc: Loc


@dataclass(frozen=True)
class Let:
    name: str
    value: Expr
    loc: Loc


@dataclass(frozen=True)
class Out:
    name: str
    value: Expr
    loc: Loc


@dataclass(frozen=True)
class Assign:
    name: str
    value: Expr
    loc: Loc


Statement = DimDecl | InputDecl | ParamDecl | StateDecl | Default | Stat | Let | Out | Assign


# ---- the layer section ----
@dataclass(frozen=True)
class Ident:
    """A name in a layer statement, with where it was written."""

    id: str
    loc: Loc


@dataclass(frozen=True)
class Count:
    """A whole number written literally, or the name of an option that gives it."""

    value: int | str
    loc: Loc


@dataclass(frozen=True)
class LayerOption:
    name: str
    value: Expr
    loc: Loc


@dataclass(frozen=True)
class LayerSize:
    dim: str
    value: Expr
    loc: Loc


@dataclass(frozen=True)
class LayerParam:
    name: str
    shape: Shape | None
    init: Expr
    loc: Loc


@dataclass(frozen=True)
class Proj:
    names: tuple[Ident, ...]
    lowrank: Count | None
    activation: Ident | None  # between the two low-rank factors
    bias: bool
    shared: bool  # one projection for all heads
    loc: Loc


@dataclass(frozen=True)
class Conv:
    names: tuple[Ident, ...]
    kernel: Count
    activation: Ident | None
    loc: Loc


@dataclass(frozen=True)
class Map:
    names: tuple[Ident, ...]
    fn: Ident | None  # `map q, k silu`
    value: Expr | None  # `map g = logsigmoid(g) / 16`
    loc: Loc


@dataclass(frozen=True)
class Rotary:
    names: tuple[Ident, ...]
    base: Count | None  # 10000 when not given
    loc: Loc


@dataclass(frozen=True)
class Shift:
    names: tuple[Ident, ...]
    lowrank: Count | None  # a data-dependent mix through this rank (RWKV-6's ddlerp)
    loc: Loc


@dataclass(frozen=True)
class Norm:
    kind: Ident
    scope: Ident | None
    loc: Loc


@dataclass(frozen=True)
class OutGate:
    fn: Ident
    loc: Loc


@dataclass(frozen=True)
class Running:
    """Statistics the layer keeps running estimates of, as normalisation layers do."""

    names: tuple[Ident, ...]
    momentum: float | Ident | None  # a number or an option; None: the default
    switch: Ident | None  # an option: running estimates while it is nonzero, whole-input statistics when 0
    loc: Loc


LayerStatement = LayerOption | LayerSize | LayerParam | Proj | Conv | Map | Rotary | Shift | Norm | OutGate | Running


@dataclass(frozen=True)
class LayerSection:
    statements: tuple[LayerStatement, ...]
    loc: Loc


@dataclass
class Spec:
    name: str
    title: str
    statements: list[Statement] = field(default_factory=list)
    source: str = ""
    filename: str = "<spec>"
    loc: Loc = Loc(1, 1)
    layer: LayerSection | None = None
