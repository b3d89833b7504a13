"""Classification: find, for each state, the recurrence the chunkwise scans implement.

Every state follows, per token, an ordered list of sub-steps (lamixer.passes.forms says it for people):
decays  S <- S * exp(log_decay)  (scalar or along one of its dims), then writes in order, each
S <- S + outer(a, b + c @ V)  (b or c may be absent, all free of S), where V is the version the write
finds or the one before the decays just above it (RWKV-7's a @ S_{t-1}). One write reading the version
it finds is the additive or the delta rule the kernels run; several are sub-steps of one token. A
vector state z[K] takes z <- z + a. Reads are `x @ S` (or a vector state whole) of any version. Anything
else is a located error that names the forms the language has.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx

from ..errors import SpecError
from ..ir import graph as ir
from ..ir.bounds import Bounds
from . import forms


@dataclass(frozen=True)
class Read:
    """A read x @ S of one state version (query None: a vector state read whole): at sub-step `step` of the token's
    update, decayed/written say which part of that sub-step it sees."""

    node: int
    query: int | None
    decayed: bool
    written: bool
    step: int = 0

    @property
    def position(self) -> str:
        """Where the read sits in its sub-step, as kernels and scans name it: "before", "mid" or "after"."""
        return "after" if self.written else ("mid" if self.decayed else "before")

    @property
    def when(self) -> str:
        if self.written:
            return "after update" if self.step == 0 else f"after write {self.step + 1}"
        if self.step:
            return f"after decay, before write {self.step + 1}" if self.decayed else f"before write {self.step + 1}"
        return "after decay, before write" if self.decayed else "before update"


@dataclass(frozen=True)
class Write:
    """One sub-step of a token's update: the decays since the previous write, then S <- S + a (b + V^T c)^T, V the
    version the write finds, or the one before those decays (erase_before_decay)."""

    log_decay: int | None  # the sum of the logs of the decays just above the write (None: none)
    key: int | None  # a; None: a unit key (a vector state read whole is a [1, D] matrix written with a = 1)
    value: int | None  # b; None: no value term (a write of c @ V alone)
    erase: int | None  # c; None: no read of the state
    erase_before_decay: bool = False

    def inputs(self) -> list[int]:
        return [n for n in (self.log_decay, self.key, self.value, self.erase) if n is not None]


@dataclass
class Scan:
    """One state's recurrence: per token, the sub-steps `writes` (one for the additive and the delta rule,
    S_t = D_t S_{t-1} + a_t (b_t + S'^T c_t)^T), read by queries."""

    state: str
    key_dim: str | None  # None: a vector state read whole, a [1, value_dim] matrix
    value_dim: str | None  # None: a vector state read as x @ z, written with b = 1
    rule: str  # "additive" | "delta" (some write reads the state)
    decay: str  # "none" | "constant" | "scalar" | "key" | "value" (over all sub-steps)
    writes: tuple[Write, ...]
    reads: list[Read] = field(default_factory=list)

    def inputs(self) -> list[int]:
        return [n for w in self.writes for n in w.inputs()] + [r.query for r in self.reads if r.query is not None]

    @property
    def plain(self) -> bool:
        """One write with a key, whose state read (if any) sees the decayed state and has a value term beside it: the
        additive or the delta rule as the kernels run it (write_key ... log_decay are its operands). Read while
        torch.compile traces a call: no starred unpacking, whose rest torch 2.11's dynamo makes a tuple it cannot
        negate, failing the whole trace."""
        w = self.writes[0]
        return len(self.writes) == 1 and w.key is not None and not w.erase_before_decay and (w.erase is None or w.value is not None)

    # the operands of a plain scan's one write
    @property
    def write_key(self) -> int | None:
        return self.writes[0].key

    @property
    def write_value(self) -> int | None:
        return self.writes[0].value

    @property
    def erase_key(self) -> int | None:
        return self.writes[0].erase

    @property
    def log_decay(self) -> int | None:
        return self.writes[0].log_decay

    @property
    def kernel_decay(self) -> str:
        """The decay kind the kernels run: a constant decay is a per-token scalar one whose value never changes."""
        return "scalar" if self.decay == "constant" else self.decay

    def describe(self) -> str:
        decay = {"none": "no decay", "constant": "constant decay", "scalar": "scalar decay",
                 "key": f"decay along {self.key_dim}", "value": f"decay along {self.value_dim}"}[self.decay]  # fmt: skip
        if len(self.writes) > 1:
            return f"{len(self.writes)} writes per token ({self.rule}), {decay}"
        if self.writes[0].erase_before_decay:
            return f"generalized delta write (reads the state before its decay), {decay}"
        return f"{self.rule} write, {decay}"


@dataclass
class Classification:
    scans: list[Scan]  # in an order where every scan comes after those it depends on
    update_rule: str  # "additive" | "delta" | "slot-softmax"
    composition: str  # "single" | "parallel" | "chained"
    stats: list[int]
    side_branches: list[int]
    denominators: list[str]

    def scan(self, state: str) -> Scan:
        return next(s for s in self.scans if s.state == state)




class _StateAnalysis:
    def __init__(self, g: ir.Graph, name: str, bounds: Bounds | None = None):
        self.g, self.name = g, name
        self.bounds = bounds or Bounds(g)
        self.s_in = g.state_in[name]
        self.dims = g.states[name].dims
        self.consumed: set[int] = set()
        self.versions: set[int] = set()  # the state's versions in this token: state_in and every step of its update
        self.read_version: int | None = None  # the version the write being analysed reads

    def err(self, msg: str, n: int) -> SpecError:
        return SpecError(msg, self.g.node(n)["loc"])

    def depends(self, n: int) -> bool:
        return self.g.depends_on(n, {self.s_in})

    def chain(self, n: int) -> list[tuple[str, int, int, int]] | None:
        """Steps (kind, node, operand, base) from state_in to n, or None when n is not a version of the state."""
        g = self.g
        if n == self.s_in:
            return []
        if g.dims_of(n) != self.dims or g.op(n) != "binary":
            return None
        fn, (a, b) = g.node(n)["fn"], g.args(n)
        if fn == "mul":
            for base, f in ((a, b), (b, a)):
                steps = self.chain(base)
                if steps is not None and not self.depends(f):
                    return steps + [("decay", n, f, base)]
                if steps is not None:
                    raise self.err(f"the decay of '{self.name}' depends on '{self.name}' itself; a decay must be free of the state", n)
            return None
        if fn in ("add", "sub"):
            left, right = self.chain(a), self.chain(b) if fn == "add" else None
            if left is not None and right is not None:
                raise self.err(f"the update of '{self.name}' adds two versions of the state", n)
            if left is not None:
                return left + [("write" if fn == "add" else "write-", n, b, a)]
            if right is not None:
                return right + [("write", n, a, b)]
        return None

    def as_outer(self, w: int) -> tuple[int, int]:
        """(a, b) with w == outer(a, b), pushing scalar and per-dim factors onto the vectors."""
        g, loc = self.g, self.g.node(w)["loc"]
        if len(self.dims) == 2 and g.dims_of(w) == self.dims[::-1]:
            raise self.err(f"the write to '{self.name}' has dims [{', '.join(g.dims_of(w))}], transposed from the "
                           f"state's [{', '.join(self.dims)}]: swap the arguments of outer()", w)  # fmt: skip
        if g.is_fn(w, "binary", "sub") and g.is_fn(g.args(w)[0], "const") and g.node(g.args(w)[0])["value"] == 0:
            raise self.err(f"the write to '{self.name}' is a negated outer product; add outer(-a, b) instead", w)
        if g.op(w) == "outer":
            a, b = g.args(w)
            return a, b
        if g.is_fn(w, "binary", "mul") or g.is_fn(w, "binary", "div"):
            x, y = g.args(w)
            mat, f = (x, y) if g.dims_of(x) == self.dims else (y, x)
            if g.dims_of(mat) == self.dims and (g.node(w)["fn"] == "mul" or mat == x):
                a, b = self.as_outer(mat)
                fn, df = g.node(w)["fn"], g.dims_of(f)
                if df in ((), self.dims[:1]):
                    return g.add("binary", (a, f), g.dims_of(a), loc, fn=fn), b
                if df == self.dims[1:]:
                    return a, g.add("binary", (b, f), g.dims_of(b), loc, fn=fn)
        raise self.err(f"the write to '{self.name}' must be an outer product outer(a, b) (times scalars): "
                       f"{forms.update(self.name)}", w)  # fmt: skip

    def affine(self, n: int, allowed: dict[int, bool]) -> tuple[int | None, int | None]:
        """(b0, c) with n == b0 + c @ V, b0 and c free of the state (either may be None for zero), V one of the versions
        `allowed` (each -> whether it is the one before the write's decays); self.read_version records V."""
        g = self.g
        if not self.depends(n):
            return n, None
        loc, op = g.node(n)["loc"], g.op(n)
        if op == "matmul" and not self.depends(g.args(n)[0]) and g.args(n)[1] in self.versions:
            v = g.args(n)[1]
            if v not in allowed:
                raise self.err(f"this write reads '{self.name}' as it was before an earlier write of this token, a form the "
                               f"language lacks ({forms.update(self.name)}); nearest: put this write first (writes that do "
                               "not read the state commute), or read the state as this write finds it", n)  # fmt: skip
            if self.read_version not in (None, v):
                raise self.err(f"this write reads two versions of '{self.name}' (before and after its decay); a write reads "
                               f"one: `{self.name} = {self.name} + outer(a, b + c @ {self.name})`", n)  # fmt: skip
            self.read_version = v
            self.consumed.add(n)
            return None, g.args(n)[0]
        if op == "binary" and g.node(n)["fn"] in ("add", "sub", "mul", "div"):
            fn, (x, y) = g.node(n)["fn"], g.args(n)
            if fn in ("add", "sub"):
                (bx, cx), (by, cy) = self.affine(x, allowed), self.affine(y, allowed)
                return self._combine(fn, bx, by, loc), self._combine(fn, cx, cy, loc)
            scalar, other = (x, y) if not g.dims_of(x) and not self.depends(x) else (y, x)
            if not g.dims_of(scalar) and not self.depends(scalar) and (fn == "mul" or other == x):
                b0, c = self.affine(other, allowed)
                def scaled(t):
                    return None if t is None else g.add("binary", (t, scalar), g.dims_of(t), loc, fn=fn)
                return scaled(b0), scaled(c)
        raise self.err(
            f"the write to '{self.name}' depends on the state in a form the language lacks: a write's value is linear in "
            f"one read of the state, b + c @ {self.name} with c a vector ({forms.update(self.name)})", n)  # fmt: skip

    def _combine(self, fn: str, x: int | None, y: int | None, loc) -> int | None:
        g = self.g
        if y is None:
            return x
        if x is None:
            if fn == "add":
                return y
            zero = g.add("const", (), (), loc, value=0.0)
            return g.add("binary", (zero, y), g.dims_of(y), loc, fn="sub")
        dims = ir.broadcast(g.dims_of(x), g.dims_of(y))
        return g.add("binary", (x, y), dims, loc, fn=fn)

    def log_decay(self, decays: list[tuple[str, int, int, int]]) -> int | None:
        """The sum of the logs of the decay steps' factors (None without a decay)."""
        g, logs = self.g, []
        factors = [f for _, _, f, _ in decays]
        for _, step, f, _ in decays:
            loc = g.node(f)["loc"]
            if g.is_fn(f, "unary", "exp"):
                logs.append(g.args(f)[0])
            elif g.is_fn(f, "unary", "sigmoid"):  # log(sigmoid(x)) is -inf where sigmoid underflows (x < -104 in
                # float32), which the chunked forms turn into NaN; logsigmoid(x) stays finite
                logs.append(g.add("unary", g.args(f), g.dims_of(f), loc, fn="logsigmoid"))
            else:  # log(f) is NaN for f < 0 and -inf for 0, where the interpreter, multiplying, gives numbers
                self.check_factor(f, step)
                logs.append(g.add("unary", (f,), g.dims_of(f), loc, fn="log", decay_of=self.decay_note(f, step)))
        total = None
        for f, lg in zip(factors, logs, strict=True):  # errors point at the decay factor as written, not at what it is made of
            if len(g.dims_of(lg)) == 2:
                raise self.err(f"'{self.name}' decays along both of its dims; the IR lowers a decay along one dim only", f)
            if total is None:
                total = lg
            else:
                if set(g.dims_of(total)) != set(g.dims_of(lg)) and g.dims_of(total) and g.dims_of(lg):
                    raise self.err(f"'{self.name}' decays along two different dims in one token", f)
                dims = g.dims_of(total) if len(g.dims_of(total)) >= len(g.dims_of(lg)) else g.dims_of(lg)
                total = g.add("binary", (total, lg), dims, g.node(lg)["loc"], fn="add")
        return total

    def factor_loc(self, f: int, step: int) -> int:
        """The node to point at for a decay factor: the factor as written, or the decay step for a declared name (whose
        node sits at its declaration)."""
        return step if self.g.op(f) in ("input", "param") else f

    def check_factor(self, f: int, step: int) -> None:
        """A factor whose log the scans take must be positive: an error when the spec alone shows it is not, that is
        when its range (from its form and the declared domains) holds no positive value, or when it is a constant of
        the spec (numbers, dim sizes, the head index) whose range cannot be shown positive. Anything else the data
        decides, and the backends check (lamixer.runtime.ops.check_decay)."""
        r = self.bounds(f)
        if r.positive:
            return
        if r.never_positive:
            raise self.err(f"the decay factor of '{self.name}' is never positive (its values lie in {r.text()}); the scans take "
                           "its log, so a decay must lie in (0, 1], e.g. exp(-softplus(x)), sigmoid(x) or exp(g) for g <= 0",
                           self.factor_loc(f, step))  # fmt: skip
        leaves = {self.g.op(n) for n in nx.ancestors(self.g.g, f) | {f} if not self.g.args(n)}
        if leaves <= set(ir.SPEC_CONSTANTS):
            sign = "negative" if r.lo < 0 else "zero"
            raise self.err(f"the decay factor of '{self.name}' is a constant that can be {sign} (its values lie in {r.text()} "
                           "over head indices h >= 0 and dim sizes >= 1); the scans take its log, so it must be positive for "
                           "every head", self.factor_loc(f, step))  # fmt: skip

    def decay_note(self, f: int, step: int) -> tuple[str, str, tuple[str, ...]]:
        """What a backend's check of the factor's values names: the state, where the decay is written, and the call's
        arguments it is made of."""
        g = self.g
        loc = g.node(self.factor_loc(f, step))["loc"]
        lines = g.source.split("\n")
        text = lines[loc.line - 1].strip() if 1 <= loc.line <= len(lines) else ""
        where = f"{g.filename}:{loc.line}:{loc.col}" + (f": `{text}`" if text else "")
        nodes = nx.ancestors(g.g, f) | {f}
        used = {g.node(n)["name"] for n in nodes if g.op(n) in ("input", "param")}
        names = [op.name for op in g.operands if op.name in used] + (["scale"] if any(g.op(n) == "scale" for n in nodes) else [])
        return self.name, where, tuple(names)

    def decay_kind(self, log: int | None, whole: bool = False) -> str:
        """The kind of one sub-step's decay (whole: a vector state read whole, whose dim is its value dim)."""
        g = self.g
        if log is None:
            return "none"
        d = g.dims_of(log)
        if len(d) == 2:
            raise self.err(f"'{self.name}' decays along both of its dims; the IR lowers a decay along one dim only", log)
        if d:
            return "key" if d == self.dims[:1] and not whole else "value"
        seen, stack = set(), [log]
        while stack:  # time-varying iff an input reaches it other than through a (time-constant) stat
            n = stack.pop()
            if n in seen:
                continue
            seen.add(n)
            if g.op(n) == "input":
                return "scalar"
            if g.op(n) != "stat":
                stack.extend(g.args(n))
        return "constant"

    def combined_kind(self, logs: list[int], whole: bool) -> str:
        """The decay kind over all of a token's sub-steps: along one dim, else the widest of scalar and constant."""
        kinds = [self.decay_kind(lg, whole) for lg in logs]
        along = [(k, lg) for k, lg in zip(kinds, logs) if k in ("key", "value")]
        if len({k for k, _ in along}) > 1:
            raise self.err(f"'{self.name}' decays along two different dims in one token", along[-1][1])
        return next((k for k in ("key", "value", "scalar", "constant") if k in kinds), "none")

    def read_whole(self) -> bool:
        """Whether a vector state is used whole somewhere (HGRN's `out o = hs`) rather than read as x @ z."""
        g = self.g
        out = g.state_out[self.name]
        return len(self.dims) == 1 and any(
            succ not in self.versions and succ != out and not (g.op(succ) == "matmul" and g.args(succ)[1] == v)
            for v in self.versions for succ in g.g.successors(v)
        )  # fmt: skip

    def write(self, step: tuple[str, int, int, int], pending: list, start: int, whole: bool) -> Write:
        """One sub-step: the decays `pending` (taken from version `start`), then the write `step`."""
        g = self.g
        kind, wnode, w, base = step
        if kind == "write-":
            zero = g.add("const", (), (), g.node(w)["loc"], value=0.0)
            w = g.add("binary", (zero, w), g.dims_of(w), g.node(w)["loc"], fn="sub")
        log = self.log_decay(pending)
        if len(self.dims) == 1:
            if self.depends(w):
                raise self.err(f"the write to the vector state '{self.name}' cannot depend on the state; a vector state is "
                               f"written `{self.name} = f * {self.name} + a`", w)  # fmt: skip
            return Write(log, None, w, None) if whole else Write(log, w, None, None)
        a, b = self.as_outer(w)
        if self.depends(a):
            raise self.err(f"the key written into '{self.name}' cannot depend on the state ({forms.update(self.name)})", a)
        self.read_version = None
        b0, c = self.affine(b, {base: False, start: bool(pending)})
        return Write(log, a, b0, c, c is not None and self.read_version == start and bool(pending))

    def run(self) -> Scan:
        g = self.g
        final = g.args(g.state_out[self.name])[0]
        steps = self.chain(final)
        if steps is None:
            raise self.err(f"cannot lower the update of '{self.name}': {forms.update(self.name)}", final)
        written = [i for i, s in enumerate(steps) if s[0].startswith("write")]
        if not written:
            raise self.err(f"state '{self.name}' is {'decayed but ' if steps else ''}never written", final)
        for s in steps[written[-1] + 1:]:
            raise self.err(f"'{self.name}' is decayed after its last write; a decay applies to the writes below it, so move "
                           f"`{self.name} = f * {self.name}` above the write (the next token's update starts with it)", s[1])  # fmt: skip
        self.versions = {self.s_in} | {node for _, node, _, _ in steps}
        whole = self.read_whole()
        # each version's place in the sub-steps: (step, decayed, written); None between two decays of one step
        where: dict[int, tuple[int, bool, bool] | None] = {self.s_in: (0, False, False)}
        writes: list[Write] = []
        pending, start = [], self.s_in
        for step in steps:
            if step[0] == "decay":
                if pending:
                    where[pending[-1][1]] = None
                pending.append(step)
                where[step[1]] = (len(writes), True, False)
                continue
            writes.append(self.write(step, pending, start, whole))
            where[step[1]] = (len(writes) - 1, True, True)
            pending, start = [], step[1]
        decay = self.combined_kind([w.log_decay for w in writes if w.log_decay is not None], whole)
        erasing = [w for w in writes if w.erase is not None]
        if erasing and decay == "value":
            raise self.err(f"the delta rule with a decay along '{self.dims[1]}' cannot be lowered: a write that reads "
                           f"'{self.name}' needs a scalar decay or one along '{self.dims[0]}'", steps[written[0]][1])  # fmt: skip
        dims = (None, self.dims[0]) if whole else (self.dims[0], self.dims[1] if len(self.dims) == 2 else None)
        scan = Scan(self.name, *dims, "delta" if erasing else "additive", decay, tuple(writes))
        scan.reads = self.reads(where, whole)
        return scan

    def reads(self, where: dict[int, tuple[int, bool, bool] | None], whole: bool) -> list[Read]:
        """Every use of a version that is not the update itself: x @ version (or the version, read whole)."""
        g, out, found = self.g, self.g.state_out[self.name], []
        for v, place in where.items():
            for succ in g.g.successors(v):
                if succ in where or succ in self.consumed or succ == out:
                    continue
                if place is None:
                    raise self.err(f"this reads '{self.name}' between two of its decays; a read sees the state before its "
                                   f"update, after all of a write's decays or after a write: join the decays into one, "
                                   f"`{self.name} = f1 * f2 * {self.name}`", succ)  # fmt: skip
                if g.op(succ) == "matmul" and g.args(succ)[1] == v:
                    if whole:
                        raise self.err(f"the vector state '{self.name}' is read whole elsewhere; read it one way, whole "
                                       f"or as x @ {self.name} (as dot(x, {self.name}) of the whole)", succ)  # fmt: skip
                    q = g.args(succ)[0]
                    if self.depends(q):
                        raise self.err(f"the query of this read depends on '{self.name}' itself", succ)
                    if len(g.dims_of(q)) != 1:
                        raise self.err(f"a read x @ {self.name} needs a vector x, got dims {list(g.dims_of(q))}", succ)
                    found.append(Read(succ, q, place[1], place[2], place[0]))
                elif whole:
                    if not any(r.node == v for r in found):
                        found.append(Read(v, None, place[1], place[2], place[0]))
                else:
                    raise self.err(self.read_error(v, succ), succ)
        return sorted(found, key=lambda r: r.node)

    def read_error(self, v: int, succ: int) -> str:
        """What the language lacks in this use of a state version, and the nearest read it has."""
        g, name = self.g, self.name
        if g.op(succ) == "matmul" and g.args(succ)[0] == v:
            near = (f"x @ {name} contracts the state's first dim ({self.dims[0]}); to contract {self.dims[-1]}, declare the "
                    f"state [{', '.join(reversed(self.dims))}] and write it transposed")  # fmt: skip
        elif len(self.dims) == 2:
            near = f"a matrix state is read through a vector over its first dim, x @ {name} with x[{self.dims[0]}]"
        else:
            near = f"read it as x @ {name}"
        return f"'{name}' is used here in a form the language lacks ({forms.read(name)}); nearest: {near}"


def classify(g: ir.Graph) -> Classification:
    bounds = Bounds(g)
    analyses = {name: _StateAnalysis(g, name, bounds) for name in g.states}
    scans = {name: a.run() for name, a in analyses.items()}
    read_of = {r.node: s.state for s in scans.values() for r in s.reads}
    # a read folded into a delta-rule write (c @ S) is not computed on its own, so nothing else may use it:
    # walk what the kernels evaluate (the output and the scans' inputs, stopping at reads, which scans compute)
    erase_read = {n: name for name, a in analyses.items() for n in a.consumed}
    stack, seen = [g.output, *(n for s in scans.values() for n in s.inputs())], set()
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n in erase_read:
            raise SpecError(f"this read of '{erase_read[n]}' is the erase term of its delta-rule write and cannot also "
                            f"be used elsewhere; read the state again (x @ {erase_read[n]}) for the other use",
                            g.node(n)["loc"])  # fmt: skip
        if n not in read_of:
            stack.extend(g.args(n))
    # scan-level dependencies: a scan depends on the scans whose reads reach its inputs
    deps = nx.DiGraph()
    deps.add_nodes_from(scans)
    for s in scans.values():
        for n in s.inputs():
            for anc in nx.ancestors(g.g, n) | {n}:
                if anc in read_of:
                    if read_of[anc] == s.state:
                        raise SpecError(f"the recurrence of '{s.state}' depends on its own read", g.node(anc)["loc"])
                    deps.add_edge(read_of[anc], s.state)
    if not nx.is_directed_acyclic_graph(deps):
        cycle = nx.find_cycle(deps)
        raise SpecError(f"states {' and '.join(sorted({a for a, _ in cycle}))} read each other in a cycle", g.states[cycle[0][0]].loc)
    order = [scans[n] for n in nx.lexicographical_topological_sort(deps, key=lambda n: list(g.states).index(n))]
    chained = deps.number_of_edges() > 0
    softmax_between = chained and any(
        g.is_fn(n, "normalize", "softmax")
        for s in order for q in s.inputs() for n in nx.ancestors(g.g, q) | {q}
        if any(r in read_of for r in nx.ancestors(g.g, n))
    )  # fmt: skip
    if softmax_between:
        rule = "slot-softmax"
    else:
        rule = "delta" if any(s.rule == "delta" for s in order) else "additive"
    denominators = []
    for n in g.g.nodes:
        if g.is_fn(n, "binary", "div"):
            num, den = g.args(n)
            states = {read_of[a] for a in nx.ancestors(g.g, den) | {den} if a in read_of}
            for st in sorted(states):
                if scans[st].value_dim is None:
                    denominators.append(st)
    return Classification(
        scans=order,
        update_rule=rule,
        composition="single" if len(order) == 1 else ("chained" if chained else "parallel"),
        stats=sorted(n for n in g.g.nodes if g.op(n) == "stat"),
        side_branches=sorted(n for n in g.g.nodes if g.op(n) == "block_attention"),
        denominators=sorted(set(denominators)),
    )
