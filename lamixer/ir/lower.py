"""AST -> IR: name resolution and shape (named-dim) inference, with located errors."""
from __future__ import annotations

import difflib

import networkx as nx

from ..errors import Loc, SpecError
from ..frontend import syntax as S
from . import graph as ir

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
        dims = ir.broadcast(da, db)
        if dims is not None:
            return dims
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
        if g.scale_default is None:  # the language's rule, as an expression like any spec's `default scale = ...`
            if g.states:
                first = next(iter(g.states.values()))
                d = self.add("dim", (), (), first.loc, name=first.dims[0])
                g.scale_default = self.add("binary", (d, self.add("const", (), (), first.loc, value=-0.5)), (), first.loc, fn="pow")
            else:  # then nothing reads scale
                g.scale_default = self.add("const", (), (), self.spec.loc, value=1.0)
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
            self.check_shape(st.shape, allow_head=not is_input, max_dims=1 if is_input else 2, what=f"{kind} '{st.name}'", loc=st.loc)
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
        self.env[st.name] = self.add("stat", (arg,), (), v.loc, name=st.name, fn=v.fn, groups=tuple(g for g in ir.STAT_GROUPS if g in groups))

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
    graph = _Lowerer(spec).run()
    if spec.layer is not None:
        graph.layer = lower_layer(spec.layer, graph)
    return graph


# ---- the layer section ----
# Names a layer expression may call: the mixer's elementwise functions and, in a param's init,
# random draws. `swish` is the papers' name for silu.
LAYER_UNARY = set(ir.UNARY) | {"swish"}
LAYER_BINARY = {"pow", "max", "min"}
INIT_DRAWS = {"uniform": "uniform(lo, hi)", "log_uniform": "log_uniform(lo, hi)", "normal": "normal(mean, std)"}
INIT_ONLY = {"inv_softplus"}  # log(exp(x) - 1): a bias whose softplus is x (Mamba-2's dt_bias)
NORMS = ("rmsnorm", "layernorm")
HIDDEN = "hidden"  # the layer's input, before projections
LAYER_ARGUMENTS = ("spec", "hidden_size", "num_heads", "backend")  # options are keyword arguments beside these
RUNNING_MOMENTUM = 0.1  # a running estimate's default momentum, as torch's normalisation layers have it


def canonical_fn(name: str) -> str:
    return "silu" if name == "swish" else name


class _LayerLowerer:
    """Checks a layer section against the lowered mixer and builds its LayerInfo."""

    def __init__(self, section: S.LayerSection, graph: ir.Graph):
        self.section = section
        self.graph = graph
        self.info = ir.LayerInfo(loc=section.loc)
        self.inputs = {op.name: op for op in graph.operands if op.kind == "input"}
        self.mixer_params = {op.name: op for op in graph.operands if op.kind == "param"}
        self.seen: dict[str, Loc] = {}  # options and layer params by name
        self.defined: dict[str, tuple[str, ...]] = {}  # layer values (projected or mapped) -> dims
        self.projected: set[str] = set()

    def err(self, message: str, loc: Loc) -> SpecError:
        return SpecError(message, loc)

    # -- expressions: dims of a per-token, per-head value; scalars have () --
    def expr_dims(self, e: S.Expr, names: dict[str, tuple[str, ...]], calls: set[str], what: str) -> tuple[str, ...]:
        if isinstance(e, S.Num):
            return ()
        if isinstance(e, S.Name):
            if e.id in names:
                return names[e.id]
            hint = _Lowerer._hint(e.id, names)
            raise self.err(f"unknown name '{e.id}' in {what}{hint} (it may use {', '.join(sorted(names)) or 'only numbers'})", e.loc)
        if isinstance(e, S.Neg):
            return self.expr_dims(e.operand, names, calls, what)
        if isinstance(e, S.BinOp):
            a, b = (self.expr_dims(x, names, calls, what) for x in (e.left, e.right))
            if e.op == "matmul":
                raise self.err(f"'@' is not allowed in {what}: layer expressions are elementwise", e.loc)
            return self.broadcast(a, b, e.op, e.loc)
        if e.kwargs:
            raise self.err(f"{e.fn}() takes no keyword arguments", e.kwargs[0][2])
        if e.fn not in calls:
            raise self.err(f"unknown function '{e.fn}' in {what}{_Lowerer._hint(e.fn, calls)}", e.loc)
        want = 2 if e.fn in LAYER_BINARY or e.fn in INIT_DRAWS else 1
        if len(e.args) != want:
            raise self.err(f"{e.fn}() takes {want} argument{'s' if want > 1 else ''}, got {len(e.args)}", e.loc)
        dims = [self.expr_dims(a, names, calls, what) for a in e.args]
        if e.fn in INIT_DRAWS:
            if any(dims) or not all(self.is_constant(a) for a in e.args):
                raise self.err(f"the bounds of {INIT_DRAWS[e.fn]} must be numbers", e.loc)
            return ()
        return self.broadcast(dims[0], dims[1], e.fn, e.loc) if want == 2 else dims[0]

    def broadcast(self, a: tuple[str, ...], b: tuple[str, ...], fn: str, loc: Loc) -> tuple[str, ...]:
        dims = ir.broadcast(a, b)
        if dims is None:
            raise self.err(f"cannot combine values of dims {_fmt(a)} and {_fmt(b)} with '{fn}'", loc)
        return dims

    def is_constant(self, e: S.Expr) -> bool:
        """Numbers, options and dims combined by arithmetic (no draws, no layer values)."""
        if isinstance(e, S.Num):
            return True
        if isinstance(e, S.Name):
            return e.id in self.info.options or e.id in self.graph.dims
        if isinstance(e, S.Neg):
            return self.is_constant(e.operand)
        if isinstance(e, S.BinOp):
            return self.is_constant(e.left) and self.is_constant(e.right)
        return e.fn not in INIT_DRAWS and all(self.is_constant(a) for a in e.args)

    def constants(self) -> dict[str, tuple[str, ...]]:
        return {**{o: () for o in self.info.options}, **{d: () for d in self.graph.dims}}

    # -- statements --
    def name_free(self, name: str, loc: Loc, what: str) -> None:
        taken = {HIDDEN: "the hidden state", "H": "the number of heads"}
        taken.update({d: "a dim" for d in self.graph.dims})
        taken.update({n: "an input" for n in self.inputs})
        if name in taken:
            raise self.err(f"{what} '{name}' would shadow {taken[name]}", loc)
        if name in self.seen:
            raise self.err(f"'{name}' is already defined in the layer section at line {self.seen[name].line}", loc)
        self.seen[name] = loc

    def count(self, c: S.Count, what: str) -> int | str:
        if isinstance(c.value, int):
            if c.value < 1:
                raise self.err(f"{what} must be at least 1", c.loc)
            return c.value
        if c.value not in self.info.options:
            raise self.err(f"{what} must be a whole number or an option, not '{c.value}'{_Lowerer._hint(c.value, self.info.options)}", c.loc)
        return c.value

    def activation(self, ident: S.Ident | None) -> str | None:
        if ident is None:
            return None
        if ident.id not in LAYER_UNARY:
            raise self.err(f"unknown activation '{ident.id}'{_Lowerer._hint(ident.id, LAYER_UNARY)}", ident.loc)
        return canonical_fn(ident.id)

    def option(self, st: S.LayerOption) -> None:
        if st.name in LAYER_ARGUMENTS:
            raise self.err(f"'{st.name}' is an argument of lamixer.Layer itself; name the option otherwise", st.loc)
        self.name_free(st.name, st.loc, "option")
        value = st.value
        sign = 1.0
        if isinstance(value, S.Neg):
            value, sign = value.operand, -1.0
        if not isinstance(value, S.Num):
            raise self.err(f"option '{st.name}' needs a number as its default", st.value.loc)
        self.info.options[st.name] = sign * value.value

    def size(self, st: S.LayerSize) -> None:
        if st.dim not in self.graph.dims:
            raise self.err(f"`size` sets a dim of the mixer; '{st.dim}' is not one{_Lowerer._hint(st.dim, self.graph.dims)}", st.loc)
        if st.dim in self.info.sizes:
            raise self.err(f"the size of '{st.dim}' is set twice", st.loc)
        names = {**{o: () for o in self.info.options}, HIDDEN: (), "H": ()}
        self.expr_dims(st.value, names, LAYER_UNARY | LAYER_BINARY, f"the size of '{st.dim}'")
        self.info.sizes[st.dim] = st.value

    def param(self, st: S.LayerParam) -> None:
        mixer = self.mixer_params.get(st.name)
        if mixer is None:
            self.name_free(st.name, st.loc, "param")
            if st.shape is None:
                raise self.err(f"layer param '{st.name}' needs a shape, e.g. `param {st.name}[H] = ...`", st.loc)
        elif st.name in self.info.params:
            raise self.err(f"param '{st.name}' is initialised twice", st.loc)
        shape = st.shape
        if shape is not None:
            for d, dloc in zip(shape.dims, shape.locs):
                if d != ir.HEAD_DIM and d not in self.graph.dims:
                    raise self.err(f"unknown dim '{d}'{_Lowerer._hint(d, self.graph.dims)}", dloc)
            if ir.HEAD_DIM in shape.dims[1:]:
                raise self.err("the head dim H may only lead a param's shape", shape.locs[shape.dims.index(ir.HEAD_DIM, 1)])
            if len(shape.dims) - (shape.dims[:1] == (ir.HEAD_DIM,)) > 2 or len(set(shape.dims)) != len(shape.dims):
                raise self.err(f"a layer param is [H], [H, D], [H, D, E] or the same without H, got {_fmt(shape.dims)}", st.loc)
            per_head = shape.dims[:1] == (ir.HEAD_DIM,)
            dims = shape.dims[1:] if per_head else shape.dims
            if mixer is not None and (per_head != mixer.per_head or dims != mixer.dims):
                want = _fmt(((ir.HEAD_DIM,) if mixer.per_head else ()) + mixer.dims)
                raise self.err(f"param '{st.name}' is declared {want} by the mixer, not {_fmt(shape.dims)}", st.loc)
        else:
            per_head, dims = mixer.per_head, mixer.dims
        init_dims = self.expr_dims(st.init, self.constants(), LAYER_UNARY | LAYER_BINARY | set(INIT_DRAWS) | INIT_ONLY,
                                   f"the init of '{st.name}'")  # fmt: skip
        assert init_dims == ()
        self.info.params[st.name] = ir.LayerParamInfo(st.name, dims, per_head, st.init, mixer is not None)

    def proj(self, st: S.Proj) -> None:
        rank = self.count(st.lowrank, "the rank") if st.lowrank is not None else None
        if st.activation is not None and rank is None:
            raise self.err("an activation goes between low-rank factors: `lowrank R fn`", st.activation.loc)
        act = self.activation(st.activation)
        for ident in st.names:
            if ident.id not in self.inputs:
                raise self.err(f"`proj` makes an input of the mixer; '{ident.id}' is not one{_Lowerer._hint(ident.id, self.inputs)}", ident.loc)
            if ident.id in self.projected:
                raise self.err(f"'{ident.id}' is projected twice", ident.loc)
            self.projected.add(ident.id)
            self.defined[ident.id] = self.inputs[ident.id].dims
            self.info.projs.append(ir.ProjInfo(ident.id, self.inputs[ident.id].dims, rank, act, st.bias, st.shared))

    def conv(self, st: S.Conv) -> None:
        kernel = self.count(st.kernel, "the kernel size")
        act = self.activation(st.activation)
        done = {c.name for c in self.info.convs}
        for ident in st.names:
            if ident.id != HIDDEN and ident.id not in self.projected:
                raise self.err(f"`conv` applies to `{HIDDEN}` or a projected input; '{ident.id}' is neither (project it first)", ident.loc)
            if ident.id in done:
                raise self.err(f"'{ident.id}' is convolved twice", ident.loc)
            done.add(ident.id)
            self.info.convs.append(ir.ConvInfo(ident.id, kernel, act))

    def map(self, st: S.Map) -> None:
        if st.fn is not None:
            fn = self.activation(st.fn)
            for ident in st.names:
                if ident.id not in self.defined:
                    raise self.err(f"'{ident.id}' is not defined yet: `proj` it or `map {ident.id} = ...` first", ident.loc)
                call = S.Call(fn, (S.Name(ident.id, ident.loc),), (), st.fn.loc)
                self.info.maps.append(ir.MapInfo(ident.id, self.defined[ident.id], call))
            return
        target = st.names[0]
        if target.id not in self.inputs:
            raise self.err(f"`map` defines an input of the mixer; '{target.id}' is not one{_Lowerer._hint(target.id, self.inputs)}", target.loc)
        names = {**self.constants(), **{p.name: p.dims for p in self.info.params.values() if not p.of_mixer}, **self.defined}
        got = self.expr_dims(st.value, names, LAYER_UNARY | LAYER_BINARY, f"the map of '{target.id}'")
        want = self.inputs[target.id].dims
        if not set(got) <= set(want):
            raise self.err(f"'{target.id}' has dims {_fmt(want)} but the map gives {_fmt(got)}", st.value.loc)
        self.defined[target.id] = want
        self.info.maps.append(ir.MapInfo(target.id, want, st.value))

    def rotary(self, st: S.Rotary) -> None:
        base = self.count(st.base, "the rotary base") if st.base is not None else 10000
        for ident in st.names:
            op = self.inputs.get(ident.id)
            if op is None or len(op.dims) != 1:
                raise self.err(f"`rotary` turns a vector input of the mixer; '{ident.id}' is not one", ident.loc)
            if any(r.name == ident.id for r in self.info.rotary):
                raise self.err(f"'{ident.id}' is rotated twice", ident.loc)
            self.info.rotary.append(ir.RotaryInfo(ident.id, base))

    def shift(self, st: S.Shift) -> None:
        rank = self.count(st.lowrank, "the rank") if st.lowrank is not None else None
        for ident in st.names:
            if ident.id not in self.projected:
                raise self.err(f"`shift` mixes the hidden state a projection reads; '{ident.id}' is not projected (project it first)", ident.loc)
            if any(s.name == ident.id for s in self.info.shifts):
                raise self.err(f"'{ident.id}' is shifted twice", ident.loc)
            self.info.shifts.append(ir.ShiftInfo(ident.id, rank))

    def norm(self, st: S.Norm) -> None:
        if st.kind.id not in NORMS:
            raise self.err(f"unknown norm '{st.kind.id}' (one of {', '.join(NORMS)})", st.kind.loc)
        if st.scope is not None and st.scope.id != "per_head":
            raise self.err(f"a norm is over all heads or `per_head`, not '{st.scope.id}'", st.scope.loc)
        self.info.post.append(ir.PostInfo("norm", st.kind.id, st.scope is not None))

    def out_gate(self, st: S.OutGate) -> None:
        self.info.post.append(ir.PostInfo("gate", self.activation(st.fn)))

    def running(self, st: S.Running) -> None:
        if self.info.running is not None:
            raise self.err("`running` is given twice: name every statistic in one statement", st.loc)
        stats = {d["name"]: n for n, d in self.graph.g.nodes(data=True) if d["op"] == "stat"}
        names: list[str] = []
        for ident in st.names:
            if ident.id not in stats:
                raise self.err(f"`running` keeps estimates of the mixer's stats; '{ident.id}' is not one{_Lowerer._hint(ident.id, stats)}", ident.loc)
            if ident.id in names:
                raise self.err(f"'{ident.id}' given twice", ident.loc)
            names.append(ident.id)
        momentum = RUNNING_MOMENTUM if st.momentum is None else st.momentum
        if isinstance(momentum, S.Ident):
            if momentum.id not in self.info.options:
                raise self.err(f"the momentum must be a number or an option, not '{momentum.id}'{_Lowerer._hint(momentum.id, self.info.options)}", momentum.loc)
            momentum = momentum.id
        elif not 0 < momentum <= 1:
            raise self.err(f"the momentum must lie in (0, 1], got {momentum:g}", st.loc)
        if st.switch is not None and st.switch.id not in self.info.options:
            raise self.err(f"`if` names an option that turns the running estimates on; '{st.switch.id}' is not one"
                           f"{_Lowerer._hint(st.switch.id, self.info.options)}", st.switch.loc)  # fmt: skip
        self.info.running = ir.RunningInfo(tuple(names), momentum, None if st.switch is None else st.switch.id)

    def run(self) -> ir.LayerInfo:
        handlers = {S.LayerOption: self.option, S.LayerSize: self.size, S.LayerParam: self.param, S.Proj: self.proj,
                    S.Conv: self.conv, S.Map: self.map, S.Rotary: self.rotary, S.Shift: self.shift, S.Norm: self.norm, S.OutGate: self.out_gate,
                    S.Running: self.running}  # fmt: skip
        for st in self.section.statements:
            handlers[type(st)](st)
        loc = self.section.loc
        for name in self.inputs:
            if name not in self.defined:
                raise self.err(f"the layer never makes input '{name}': add `proj {name}` or `map {name} = ...`", loc)
        for name in self.mixer_params:
            if name not in self.info.params:
                raise self.err(f"the layer does not initialise param '{name}': add `param {name} = ...` (e.g. 0)", loc)
        for dim, default in self.graph.dims.items():
            if default is None and dim not in self.info.sizes:
                raise self.err(f"the layer does not size dim '{dim}': add `size {dim} = ...` (e.g. hidden / H)", loc)
        return self.info


def lower_layer(section: S.LayerSection, graph: ir.Graph) -> ir.LayerInfo:
    """Check a spec's layer section against its lowered mixer; mistakes raise located SpecErrors."""
    return _LayerLowerer(section, graph).run()
