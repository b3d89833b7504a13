"""The spec's abstract syntax: plain dataclasses, each carrying its source location."""
from __future__ import annotations

from dataclasses import dataclass, field

from .errors import Loc


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


@dataclass
class Spec:
    name: str
    title: str
    statements: list[Statement] = field(default_factory=list)
    source: str = ""
    filename: str = "<spec>"
    loc: Loc = Loc(1, 1)
