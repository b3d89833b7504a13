"""The IR: a networkx DiGraph of typed per-token, per-head operations.

Every node has an `op`, ordered operands `args` (mirrored by edges arg -> node, so graph
algorithms see the dataflow), named feature dims `dims` (batch, time and head are implicit) and
the source `loc` it came from. States are SSA: `state_in` is the state before the token, each
assignment makes a new version, `state_out` marks the version after the token.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx

from ..errors import Loc

# Elementwise functions of one argument (the meaning of each lives in lamixer/runtime/ops.py).
UNARY = ("exp", "log", "sigmoid", "logsigmoid", "softplus", "silu", "elu", "relu", "tanh", "sqrt", "abs")
# Elementwise functions of two arguments, broadcasting by dim name.
BINARY = ("add", "sub", "mul", "div", "pow", "max", "min")
# Reductions of a per-token value over all its feature dims to a scalar.
REDUCE = ("sum", "mean", "max", "min")
# Normalizers of a per-token vector over its one dim.
NORMALIZE = ("l2norm", "softmax")
# Whole-input statistics (stop-gradient), reduced over time, feature dims and the ungrouped of batch/head.
STAT = ("mean", "std", "var", "max", "min")
STAT_GROUPS = ("batch", "head")

LEAF_OPS = ("input", "param", "const", "dim", "head", "scale", "state_in")
VALUE_LEAVES = LEAF_OPS[:-1]  # the leaves a plan evaluates (a state's input is its scan's)
SPEC_CONSTANTS = ("const", "dim", "head")  # what a value fixed by the spec alone (for each head and dim size) is made of
CALL_CONSTANTS = SPEC_CONSTANTS + ("scale",)  # ... and by one call's sizes and scale
OPS = LEAF_OPS + (
    "unary", "binary", "reduce", "normalize", "dot", "outer", "matmul", "stat", "block_attention",
    "output", "state_out",
)  # fmt: skip
HEAD_DIM = "H"



def broadcast(a: tuple[str, ...], b: tuple[str, ...]) -> tuple[str, ...] | None:
    """The dims of an elementwise result of operands of dims a and b, matched by name: the wider one's, when the
    other's dims are all among them (b's when they are the same set); None when neither holds the other's."""
    if set(a) <= set(b):
        return b
    return a if set(b) <= set(a) else None

@dataclass(frozen=True)
class Operand:
    """A declared input or parameter of the mixer, in call order."""

    name: str
    kind: str  # "input" (per token) or "param" (per head when per_head)
    dims: tuple[str, ...]
    per_head: bool
    domain: tuple[float, float]
    loc: Loc


@dataclass(frozen=True)
class StateInfo:
    name: str
    dims: tuple[str, ...]
    loc: Loc
    domain: tuple[float, float] = (float("-inf"), float("inf"))


@dataclass
class Graph:
    """The mixer's IR: the dataflow graph plus its declarations."""

    name: str
    title: str
    g: nx.DiGraph = field(default_factory=nx.DiGraph)
    dims: dict[str, int | None] = field(default_factory=dict)  # declared dims -> default size
    operands: list[Operand] = field(default_factory=list)
    states: dict[str, StateInfo] = field(default_factory=dict)
    state_in: dict[str, int] = field(default_factory=dict)
    state_out: dict[str, int] = field(default_factory=dict)
    output: int | None = None
    output_name: str = "o"
    scale_default: int | None = None  # a node of constants and dims (lowering sets the language rule, K ** -0.5, when the spec gives none)
    uses_scale: bool = False
    source: str = ""
    filename: str = "<spec>"
    layer: LayerInfo | None = None  # the spec's layer section, if it has one
    _next: int = 0

    def add(self, op: str, args: tuple[int, ...] = (), dims: tuple[str, ...] = (), loc: Loc | None = None, **attrs) -> int:
        n = self._next
        self._next += 1
        self.g.add_node(n, op=op, args=tuple(args), dims=tuple(dims), loc=loc or Loc(1, 1), **attrs)
        for pos, a in enumerate(args):
            self.g.add_edge(a, n, pos=pos)
        return n

    def node(self, n: int) -> dict:
        return self.g.nodes[n]

    def op(self, n: int) -> str:
        return self.g.nodes[n]["op"]

    def args(self, n: int) -> tuple[int, ...]:
        return self.g.nodes[n]["args"]

    def dims_of(self, n: int) -> tuple[str, ...]:
        return self.g.nodes[n]["dims"]

    def is_fn(self, n: int, op: str, fn: str | None = None) -> bool:
        d = self.g.nodes[n]
        return d["op"] == op and (fn is None or d.get("fn") == fn)

    def replace_args(self, n: int, args: tuple[int, ...]) -> None:
        for a in set(self.args(n)):
            self.g.remove_edge(a, n)
        self.g.nodes[n]["args"] = tuple(args)
        for pos, a in enumerate(args):
            self.g.add_edge(a, n, pos=pos)

    def carries_state(self) -> bool:
        """Whether a sequence can be run in pieces with the state carried between them: not when a whole-input
        statistic or block attention sees the entire input."""
        return not any(d["op"] in ("stat", "block_attention") for _, d in self.g.nodes(data=True))

    def roots(self) -> list[int]:
        """The nodes every result hangs from: the output, each state's final version, the default scale."""
        extra = [self.scale_default] if self.scale_default is not None else []
        return [n for n in (self.output, *self.state_out.values(), *extra) if n is not None]

    def prune(self, extra_roots: tuple[int, ...] = ()) -> None:
        """Drop nodes nothing needed depends on (state_in nodes stay: they are the declarations)."""
        roots = set(self.roots()) | set(extra_roots)
        keep = roots | set(self.state_in.values())
        for r in roots:
            keep |= nx.ancestors(self.g, r)
        self.g.remove_nodes_from([n for n in list(self.g.nodes) if n not in keep])

    def order(self) -> list[int]:
        """A deterministic topological order."""
        return list(nx.lexicographical_topological_sort(self.g))

    def depends_on(self, n: int, sources: set[int]) -> bool:
        return n in sources or bool(nx.ancestors(self.g, n) & sources)

    def label(self, n: int) -> str:
        d = self.g.nodes[n]
        op = d["op"]
        if op in ("input", "param", "dim", "state_in", "state_out"):
            text = f"{op} {d['name']}"
        elif op == "const":
            text = f"{d['value']:g}"
        elif op in ("unary", "binary", "reduce", "normalize", "stat"):
            text = f"{op}.{d['fn']}" if op != "binary" else d["fn"]
        else:
            text = op
        return text + (f" [{', '.join(d['dims'])}]" if d["dims"] else "")


def stats(g: Graph) -> list[tuple[int, dict]]:
    """The stat nodes and their data, in node order (the order a call's statistics are reported in)."""
    return sorted((n, d) for n, d in g.g.nodes(data=True) if d["op"] == "stat")


def blocks(g: Graph) -> list[tuple[int, dict]]:
    """The block_attention nodes and their data, in node order (the order of a call's window)."""
    return sorted((n, d) for n, d in g.g.nodes(data=True) if d["op"] == "block_attention")


# ---- the layer section, lowered: a declarative plan that lamixer.layer builds modules from ----
# Expressions stay syntax trees (lamixer.syntax); lowering has checked every name and dim in them.
@dataclass(frozen=True)
class LayerParamInfo:
    name: str
    dims: tuple[str, ...]  # feature dims, without the leading H
    per_head: bool
    init: object  # syntax.Expr over numbers, options, dims and draws (uniform, log_uniform, normal)
    of_mixer: bool  # a param the mixer takes (else used only by the layer's maps)


@dataclass(frozen=True)
class ProjInfo:
    name: str
    dims: tuple[str, ...]
    rank: int | str | None  # low rank: a number or an option's name
    activation: str | None  # between the low-rank factors
    bias: bool
    shared: bool  # one projection for all heads


@dataclass(frozen=True)
class ConvInfo:
    name: str  # an input, or "hidden" for the hidden state before the projections
    kernel: int | str
    activation: str | None


@dataclass(frozen=True)
class MapInfo:
    name: str
    dims: tuple[str, ...]
    value: object  # syntax.Expr over layer values, layer params, options, dims


@dataclass(frozen=True)
class RotaryInfo:
    name: str  # a vector input, rotated by its token's position after the maps
    base: int | str  # the wavelength base (a number or an option's name)


@dataclass(frozen=True)
class ShiftInfo:
    name: str  # a projected input whose projection reads a lerp of x_t and x_{t-1}
    rank: int | str | None  # the data-dependent part's rank, or None for a learned constant mix


@dataclass(frozen=True)
class RunningInfo:
    stats: tuple[str, ...]  # the mixer's stats the layer keeps running estimates of
    momentum: float | str  # a number or an option's name
    switch: str | None  # an option: running estimates while it is nonzero, whole-input statistics when it is 0


@dataclass(frozen=True)
class PostInfo:
    kind: str  # "norm" or "gate"
    fn: str  # rmsnorm / layernorm, or the gate's activation
    per_head: bool = False


@dataclass
class LayerInfo:
    options: dict[str, float] = field(default_factory=dict)
    sizes: dict[str, object] = field(default_factory=dict)  # dim -> syntax.Expr over options, hidden, H
    params: dict[str, LayerParamInfo] = field(default_factory=dict)
    projs: list[ProjInfo] = field(default_factory=list)
    convs: list[ConvInfo] = field(default_factory=list)
    maps: list[MapInfo] = field(default_factory=list)
    rotary: list[RotaryInfo] = field(default_factory=list)
    shifts: list[ShiftInfo] = field(default_factory=list)
    post: list[PostInfo] = field(default_factory=list)
    running: RunningInfo | None = None
    loc: Loc = Loc(1, 1)
