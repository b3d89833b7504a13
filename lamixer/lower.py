"""AST -> IR: name resolution and shape (named-dim) inference, with located errors."""
from __future__ import annotations

import difflib

import networkx as nx

from . import ir
from . import syntax as S
from .errors import Loc, SpecError

RESERVED = {"h": "the head index", "scale": "the read-out scale", "H": "the number of heads"}
CALLS = set(ir.UNARY) | {"pow", "max", "min", "sum", "mean", "l2norm", "softmax", "dot", "outer", "block_attention"}


def _fmt(dims: tuple[str, ...]) -> str:
    return "[" + ", ".join(dims) + "]"


class _Lowerer:
    def __init__(self, spec: S.Spec):
        self.spec = spec
        self.graph = ir.Graph(spec.name, spec.title, source=spec.source, filename=spec.filename)
        self.env: dict[str, int] = {}  # value names -> node
        self.kinds: dict[str, tuple[str, Loc]] = {}  # every defined name -> (kind, where)
        self.dim_nodes: dict[str, int] = {}
        self.assigned: set[str] = set()
        self.out_seen: Loc | None = None
        self.scale_seen: Loc | None = None

    # ---- helpers ----
    def err(self, message: str, loc: Loc) -> SpecError:
        return SpecError(message, loc)

    def define(self, name: str, kind: str, loc: Loc) -> None:
        if name in RESERVED:
            raise self.err(f"'{name}' is reserved ({RESERVED[name]}) and cannot be redefined", loc)
        if name in CALLS or name in ir.STAT:
            raise self.err(f"'{name}' is a built-in function and cannot be used as a name", loc)
        if name in self.kinds:
            kind0, loc0 = self.kinds[name]
            raise self.err(f"'{name}' is already defined as {kind0} at line {loc0.line}", loc)
        self.kinds[name] = (kind, loc)

    def check_shape(self, shape: S.Shape, allow_head: bool, max_dims: int, what: str, loc: Loc) -> None:
        seen: set[str] = set()
        for i, (d, dloc) in enumerate(zip(shape.dims, shape.locs)):
            if d == ir.HEAD_DIM:
                if what.startswith("input"):
                    raise self.err("an input is per head already (laid out [B, T, H, ...]): drop H from its shape", dloc)
                if not (allow_head and i == 0):
                    raise self.err("the head dim H may only lead a param's shape", dloc)
            elif d not in self.graph.dims:
                hint = self._hint(d, self.graph.dims)
                raise self.err(f"unknown dim '{d}'; declare it with `dims {d}`{hint}", dloc)
            if d in seen:
                raise self.err(f"dim '{d}' appears twice in {_fmt(shape.dims)}", dloc)
            seen.add(d)
        if len(shape.dims) > max_dims + (1 if allow_head and shape.dims[:1] == (ir.HEAD_DIM,) else 0):
            raise self.err(f"{what} may have at most {max_dims} dim{'s' if max_dims != 1 else ''}, got {_fmt(shape.dims)}", loc)

    @staticmethod
    def _hint(name: str, candidates) -> str:
        close = difflib.get_close_matches(name, list(candidates), n=1)
        return f" (did you mean '{close[0]}'?)" if close else ""

    def add(self, op: str, args=(), dims=(), loc: Loc | None = None, **attrs) -> int:
        return self.graph.add(op, tuple(args), tuple(dims), loc, **attrs)

    # ---- shape rules ----
    def elementwise_dims(self, fn: str, a: int, b: int, loc: Loc) -> tuple[str, ...]:
        da, db = self.graph.dims_of(a), self.graph.dims_of(b)
        if set(da) <= set(db):
            return db
        if set(db) <= set(da):
            return da
        extra = " (use outer(a, b) for an outer product)" if fn == "mul" and len(da) == len(db) == 1 else ""
        raise self.err(f"cannot combine values of dims {_fmt(da)} and {_fmt(db)} with '{fn}'{extra}", loc)

    def matmul_dims(self, a: int, b: int, loc: Loc) -> tuple[str, ...]:
        da, db = self.graph.dims_of(a), self.graph.dims_of(b)
        if not da or not db:
            raise self.err(f"'@' needs two non-scalar operands, got {_fmt(da)} @ {_fmt(db)}", loc)
        if da[-1] != db[0]:
            raise self.err(f"'@' contracts the last dim of the left with the first of the right: {_fmt(da)} @ {_fmt(db)}", loc)
        out = da[:-1] + db[1:]
        if len(set(out)) != len(out):
            raise self.err(f"'@' of {_fmt(da)} and {_fmt(db)} repeats a dim", loc)
        return out

    # ---- expressions ----
    def expr(self, e: S.Expr) -> int:
        if isinstance(e, S.Num):
            return self.add("const", (), (), e.loc, value=e.value)
        if isinstance(e, S.Name):
            return self.name(e)
        if isinstance(e, S.Neg):
            x = self.expr(e.operand)
            zero = self.add("const", (), (), e.loc, value=0.0)
            return self.add("binary", (zero, x), self.graph.dims_of(x), e.loc, fn="sub")
        if isinstance(e, S.BinOp):
            a, b = self.expr(e.left), self.expr(e.right)
            if e.op == "matmul":
                return self.add("matmul", (a, b), self.matmul_dims(a, b, e.loc), e.loc)
            return self.add("binary", (a, b), self.elementwise_dims(e.op, a, b, e.loc), e.loc, fn=e.op)
        return self.call(e)

    def name(self, e: S.Name) -> int:
        if e.id == "h":
            return self.add("head", (), (), e.loc)
        if e.id == "scale":
            self.graph.uses_scale = True
            self.scale_seen = self.scale_seen or e.loc
            return self.add("scale", (), (), e.loc)
        if e.id == ir.HEAD_DIM or e.id in self.graph.dims:
            return self.add("dim", (), (), e.loc, name=e.id)
        if e.id in self.env:
            return self.env[e.id]
        if e.id in CALLS or e.id in ir.STAT:
            raise self.err(f"'{e.id}' is a function; call it as {e.id}(...)", e.loc)
        hint = self._hint(e.id, list(self.env) + list(self.graph.dims))
        later = next((st.loc for st in self.spec.statements if not isinstance(st, S.Assign) and getattr(st, "name", None) == e.id), None)
        if later is not None and e.id not in self.kinds:
            raise self.err(f"'{e.id}' is used before it is defined (at line {later.line})", e.loc)
        if e.id in self.kinds:
            raise self.err(f"'{e.id}' is used before it is defined{hint}", e.loc)
        raise self.err(f"unknown name '{e.id}'{hint}", e.loc)

    def call(self, e: S.Call) -> int:
        fn, nargs = e.fn, len(e.args)
        if fn not in CALLS:
            if fn in ir.STAT:
                raise self.err(f"{fn}() is a whole-input statistic: use it as `stat NAME = {fn}(...)`", e.loc)
            raise self.err(f"unknown function '{fn}'{self._hint(fn, CALLS)}", e.loc)
        if e.kwargs and fn != "block_attention":
            raise self.err(f"{fn}() takes no keyword arguments", e.kwargs[0][2])
        if fn == "block_attention":
            return self.block_attention(e)
        want = {"pow": (2,), "max": (1, 2), "min": (1, 2), "dot": (2,), "outer": (2,)}.get(fn, (1,))
        if nargs not in want:
            raise self.err(f"{fn}() takes {' or '.join(map(str, want))} argument{'s' if max(want) > 1 else ''}, got {nargs}", e.loc)
        args = [self.expr(a) for a in e.args]
        if fn in ir.UNARY:
            return self.add("unary", args, self.graph.dims_of(args[0]), e.loc, fn=fn)
        if nargs == 2 and fn in ("pow", "max", "min"):
            return self.add("binary", args, self.elementwise_dims(fn, *args, e.loc), e.loc, fn=fn)
        if fn in ir.REDUCE:
            return self.add("reduce", args, (), e.loc, fn=fn)
        if fn in ir.NORMALIZE:
            if len(self.graph.dims_of(args[0])) != 1:
                raise self.err(f"{fn}() normalizes a vector, got dims {_fmt(self.graph.dims_of(args[0]))}", e.loc)
            return self.add("normalize", args, self.graph.dims_of(args[0]), e.loc, fn=fn)
        da, db = (self.graph.dims_of(a) for a in args)
        if fn == "dot":
            if set(da) != set(db) or not da:
                raise self.err(f"dot() needs two values of the same dims, got {_fmt(da)} and {_fmt(db)}", e.loc)
            return self.add("dot", args, (), e.loc)
        if len(da) != 1 or len(db) != 1 or da == db:
            raise self.err(f"outer() needs two vectors of different dims, got {_fmt(da)} and {_fmt(db)}", e.loc)
        return self.add("outer", args, da + db, e.loc)

    def block_attention(self, e: S.Call) -> int:
        if len(e.args) != 3:
            raise self.err(f"block_attention(q, k, v, size=..., scale=...) takes 3 positional arguments, got {len(e.args)}", e.loc)
        q, k, v = (self.expr(a) for a in e.args)
        dq, dk, dv = (self.graph.dims_of(x) for x in (q, k, v))
        if len(dq) != 1 or dq != dk or len(dv) != 1:
            raise self.err(f"block_attention needs q, k of one same dim and a vector v, got {_fmt(dq)}, {_fmt(dk)}, {_fmt(dv)}", e.loc)
        kwargs = {}
        for key, value, loc in e.kwargs:
            if key not in ("size", "scale"):
                raise self.err(f"block_attention() has no argument '{key}' (it takes size= and scale=)", loc)
            if key in kwargs:
                raise self.err(f"argument '{key}' given twice", loc)
            kwargs[key] = (value, loc)
        if "size" not in kwargs:
            raise self.err("block_attention() needs size= (a dim or a whole number): the block length", e.loc)
        size_expr, size_loc = kwargs["size"]
        if isinstance(size_expr, S.Name) and size_expr.id in self.graph.dims:
            size: str | int = size_expr.id
        elif isinstance(size_expr, S.Num) and size_expr.value >= 1 and float(size_expr.value).is_integer():
            size = int(size_expr.value)
        else:
            raise self.err("size= must be a dim name or a whole number >= 1", size_loc)
        if "scale" in kwargs:
            scale = self.expr(kwargs["scale"][0])
            if self.graph.dims_of(scale):
                raise self.err("scale= must be a scalar", kwargs["scale"][1])
        else:
            d = self.add("dim", (), (), e.loc, name=dq[0])
            half = self.add("const", (), (), e.loc, value=-0.5)
            scale = self.add("binary", (d, half), (), e.loc, fn="pow")
        return self.add("block_attention", (q, k, v, scale), dv, e.loc, size=size)

    # ---- statements ----
    def run(self) -> ir.Graph:
        g = self.graph
        for st in self.spec.statements:
            self.statement(st)
        if g.output is None:
            raise self.err("the mixer has no output: add `out o = ...`", self.spec.loc)
        if not any(op.kind == "input" for op in g.operands):
            raise self.err("the mixer has no per-token input: declare one with `input x[K]`", self.spec.loc)
        if self.scale_seen is not None and g.scale_default is None and not g.states:
            raise self.err("`scale` has no default: it is K ** -0.5 for the first state's K, and there is no state; "
                           "add `default scale = ...`", self.scale_seen)  # fmt: skip
        for name, info in g.states.items():
            if name not in self.assigned:
                raise self.err(f"state '{name}' is never updated", info.loc)
            g.state_out[name] = self.add("state_out", (self.env[name],), info.dims, info.loc, name=name)
        for op in g.operands:
            if g.g.out_degree(self.env[op.name]) == 0:
                raise self.err(f"{op.kind} '{op.name}' is never used", op.loc)
        bound = {d for op in g.operands for d in op.dims}
        for name, (kind, loc) in self.kinds.items():
            if kind == "a dim" and name not in bound:
                raise self.err(f"dim '{name}' is not the size of any input or param, so its size is unknown", loc)
        return g

    def statement(self, st) -> None:
        g = self.graph
        if isinstance(st, S.DimDecl):
            if st.name == ir.HEAD_DIM:
                raise self.err("'H' (the number of heads) is implicit; do not declare it", st.loc)
            self.define(st.name, "a dim", st.loc)
            if st.default is not None and st.default < 1:
                raise self.err(f"dim '{st.name}' needs a size >= 1", st.loc)
            g.dims[st.name] = st.default
        elif isinstance(st, (S.InputDecl, S.ParamDecl)):
            is_input = isinstance(st, S.InputDecl)
            kind = "input" if is_input else "param"
            self.define(st.name, f"an {kind}" if is_input else "a param", st.loc)
            self.check_shape(st.shape, allow_head=not is_input, max_dims=1, what=f"{kind} '{st.name}'", loc=st.loc)
            per_head = bool(st.shape.dims) and st.shape.dims[0] == ir.HEAD_DIM
            dims = st.shape.dims[1:] if per_head else st.shape.dims
            domain = st.domain if is_input else (float("-inf"), float("inf"))
            g.operands.append(ir.Operand(st.name, kind, dims, per_head, domain, st.loc))
            self.env[st.name] = self.add(kind, (), dims, st.loc, name=st.name, per_head=per_head)
        elif isinstance(st, S.StateDecl):
            self.define(st.name, "a state", st.loc)
            self.check_shape(st.shape, allow_head=False, max_dims=2, what=f"state '{st.name}'", loc=st.loc)
            if not st.shape.dims:
                raise self.err(f"state '{st.name}' needs one or two dims, e.g. [K, V]", st.loc)
            g.states[st.name] = ir.StateInfo(st.name, st.shape.dims, st.loc, st.domain)
            self.env[st.name] = g.state_in[st.name] = self.add("state_in", (), st.shape.dims, st.loc, name=st.name)
        elif isinstance(st, S.Default):
            if st.name != "scale":
                raise self.err(f"only `default scale = ...` can be set, not '{st.name}'", st.loc)
            if g.scale_default is not None:
                raise self.err("the default scale is set twice", st.loc)
            node = self.expr(st.value)
            self.require_constant(node, "the default scale", st.loc)
            g.scale_default = node
        elif isinstance(st, S.Stat):
            self.stat(st)
        elif isinstance(st, S.Let):
            self.define(st.name, "a let", st.loc)
            self.env[st.name] = self.expr(st.value)
            g.node(self.env[st.name]).setdefault("let", st.name)
        elif isinstance(st, S.Out):
            if self.out_seen is not None:
                raise self.err(f"a mixer has one output; another was defined at line {self.out_seen.line}", st.loc)
            self.define(st.name, "the output", st.loc)
            value = self.expr(st.value)
            if len(g.dims_of(value)) != 1:
                raise self.err(f"the output must be a vector (one dim), got {_fmt(g.dims_of(value))}", st.loc)
            self.env[st.name] = value
            g.output = self.add("output", (value,), g.dims_of(value), st.loc)
            g.output_name = st.name
            self.out_seen = st.loc
        else:
            self.assign(st)

    def require_constant(self, node: int, what: str, loc: Loc) -> None:
        g = self.graph
        for n in {node} | nx.ancestors(g.g, node):
            if g.op(n) not in ("const", "dim", "unary", "binary"):
                raise self.err(f"{what} may use only numbers and dims", loc)

    def stat(self, st: S.Stat) -> None:
        g = self.graph
        self.define(st.name, "a stat", st.loc)
        v = st.value
        if not (isinstance(v, S.Call) and v.fn in ir.STAT and len(v.args) == 1 and not v.kwargs):
            raise self.err(f"a stat is one of {', '.join(f'{f}(x)' for f in ir.STAT)} over the whole input", st.loc)
        groups: list[str] = []
        for name, loc in st.groups:
            if name not in ir.STAT_GROUPS:
                raise self.err(f"a stat can be taken per {' or '.join(ir.STAT_GROUPS)}, not per '{name}'", loc)
            if name in groups:
                raise self.err(f"'{name}' given twice", loc)
            groups.append(name)
        arg = self.expr(v.args[0])
        if g.depends_on(arg, set(g.state_in.values())):
            raise self.err("a stat cannot depend on a state", v.loc)
        self.env[st.name] = self.add("stat", (arg,), (), v.loc, fn=v.fn, groups=tuple(g for g in ir.STAT_GROUPS if g in groups))

    def assign(self, st: S.Assign) -> None:
        g = self.graph
        if st.name not in g.states:
            if st.name in self.kinds:
                kind, _ = self.kinds[st.name]
                raise self.err(f"cannot assign to '{st.name}', which is {kind}; only states are updated", st.loc)
            raise self.err(f"'{st.name}' is not a state: declare it with `state {st.name}[...]` or define a value with `let {st.name} = ...`", st.loc)
        value = self.expr(st.value)
        want, got = g.states[st.name].dims, g.dims_of(value)
        if got != want:
            lacks = set(got) - set(want)
            why = f": the state has no dim {', '.join(sorted(lacks))}" if lacks else ""
            raise self.err(f"state '{st.name}' has dims {_fmt(want)} but is assigned a value of dims {_fmt(got)}{why}", st.value.loc if hasattr(st.value, "loc") else st.loc)
        g.node(value).setdefault("version_of", st.name)
        self.env[st.name] = value
        self.assigned.add(st.name)


def lower(spec: S.Spec) -> ir.Graph:
    """Build the IR of a parsed spec; mistakes raise located SpecErrors."""
    return _Lowerer(spec).run()
