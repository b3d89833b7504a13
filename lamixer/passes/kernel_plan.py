"""The kernel plan: for each group of scans, decided once at compile time, what every backend runs it on.

A scan group is one state's scan, or several that share keys, decay and queries and run as one scan
with their values side by side (LLN's S and z). For each group the plan fixes the update family, the
decay (its kind, the state dim it runs along, whether it is a per-head constant), each read's
position, the normaliser (a vector state the chunk kernels carry beside a matrix state), the
operands the kernels read from the caller's inputs and finish themselves, the templates that train
(chunk kernels) and decode (the recurrent kernel) and their render arguments, and the key tuned
configurations are stored under. Backends, the tuner, `explain` and `lamixer compile` read the plan;
nothing downstream derives these again from tensor shapes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from ..ir import graph as ir
from ..kernels import additive, delta, recurrent
from ..render.templates import config_name
from .classify import Classification, Scan
from .epilogue import fold_epilogues
from .normalised import fold_normalised_reads
from .order import Order, make_order

# Chunk lengths of the torch backend: a per-dim decay materialises [C, C, dim] score tensors.
CHUNK_SCALAR_DECAY = 64
CHUNK_VECTOR_DECAY = 8

_TEMPLATES = {additive.FAMILY: additive, delta.FAMILY: delta}  # a chunk template's host module


@dataclass(frozen=True)
class Decay:
    kind: str  # what the kernels run: "none" | "scalar" | "key" | "value" (a per-head constant: "scalar", but chunk_additive's own "constant" kernels, Kernels.args)
    axis: str | None  # the state dim a per-dim decay runs along (None: no decay, or one factor for the whole state)
    constant: bool  # free of per-token inputs: a per-head constant such as RetNet's

    def as_dict(self) -> dict:
        return {"kind": self.kind, "axis": self.axis, "constant": self.constant}


class Form(NamedTuple):
    """A scan operand the kernels read straight from the caller's input tensor and finish themselves:
    (-1 if negate) * factor_h * token_t * (l2norm(input) if norm else input). A NamedTuple: torch.compile traces
    calls whose cached evaluation programs are keyed by these."""

    input: str
    factor: int | None = None  # the node of a per-head constant, e.g. the read-out scale
    negate: bool = False
    norm: bool = False  # over the key dim
    token: str | None = None  # a per-token scalar input, e.g. a delta rule's write strength
    params: tuple[str, ...] = ()  # params the factor reads: while one of them needs a gradient, the operand is not finished in a kernel

    @property
    def scaled(self) -> bool:
        return self.factor is not None or self.negate

    def as_dict(self, nodes: dict[int, dict]) -> dict:
        factor = None if self.factor is None else _spell(self.factor, nodes)
        return {"input": self.input, "l2norm": self.norm, "factor": factor, "token": self.token, "negate": self.negate}


@dataclass(frozen=True)
class SubStep:
    """One write of a token's update as the scans run it: a sub-token of a chunked scan over n_writes * T of them."""

    decay: bool  # the decays just above the write apply at this sub-step
    erase: str | None  # where its read of the state sits: None (an additive write), "decayed" or "before decay"
    value: bool  # a value term beside the read (else the write is c @ S alone)

    def as_dict(self) -> dict:
        return {"decay": self.decay, "erase": self.erase, "value": self.value}


@dataclass(frozen=True)
class Kernels:
    """One template's kernels for a scan group: rendered with `args` plus the accumulator dtype."""

    template: str
    args: tuple[tuple[str, object], ...]
    names: tuple[str, ...]  # the kernels it renders, in launch order

    @property
    def module(self) -> str:
        """The rendered module's name (without the accumulator dtype): the key tuned configurations are stored under."""
        return config_name(self.template, dict(self.args))

    def render_args(self, acc: str) -> dict:
        return {**dict(self.args), "acc": acc}


@dataclass(frozen=True)
class ScanGroup:
    """What runs one group of scans."""

    states: tuple[str, ...]  # the group's states in declaration order; their values side by side in this order
    normaliser: str | None  # the vector state the chunk kernels carry beside the matrix ones (chunk_additive's `ones`)
    family: str  # the update rule: "additive" | "delta"
    decay: Decay
    reads: tuple[str, ...]  # each read's position: "before" (S_{t-1}), "mid" (after the decay), "after" (after the write)
    key_dim: str
    value_dims: tuple[str | None, ...]  # per state (None: a vector state)
    chunk: int  # the torch backend's chunk length
    train: Kernels | None  # the chunk kernels (None: `missing` says why)
    decode: Kernels | None  # the recurrent kernel (None: a scan without reads)
    missing: tuple[str, ...]  # why no chunk template covers the group
    # operands finished inside the kernels, by scan-operand node: the chunk kernels take plain inputs (values, decays,
    # a delta rule's strengths, read as the caller gave them: no conversion pass each way) and a query's
    # per-head factor (they split each key row over programs), the delta rule's also a query's l2norm (delta.QUERY_NORM:
    # its reads are linear in each query row, scaled after the products) and an erase key's l2norm with its sign or
    # per-head factor (delta.KEY_NORM: its forward's first kernel finishes them for the others); the recurrent kernel,
    # which holds whole key rows, also l2norms, per-token factors and signs of key-side operands
    finished_train: tuple[tuple[int, Form], ...] = ()
    finished_decode: tuple[tuple[int, Form], ...] = ()
    # the token's writes in order (one for the additive and delta rules), and the sub-step each read sits at
    substeps: tuple[SubStep, ...] = ()
    read_steps: tuple[int, ...] = ()
    # per write, the node of its strength s where the write key is s x and the erase key -x (DeltaNet's beta k and
    # -k): the scans then take s and the erase keys, and make the write keys -s c themselves (empty: not every write is so)
    strengths: tuple[int, ...] = ()
    # the matrix state's read divided by (the normaliser's read + divide), the plan's fold (passes/normalised.py):
    # every scan implementation returns the quotient as that read; None: the reads as they are
    divide: float | None = None

    @property
    def read(self) -> str | None:
        """The single read's position (None when the group has several reads, or none)."""
        return self.reads[0] if len(self.reads) == 1 else None

    @property
    def rendered_decay(self) -> str | None:
        """The decay kind the training kernels were rendered for where it is not decay.kind (a per-head constant on
        chunk_additive's "constant" kernels, which its host entry is then told), else None."""
        rendered = dict(self.train.args).get("decay") if self.train else None
        return rendered if rendered not in (None, self.decay.kind) else None


@dataclass
class KernelPlan(Order):
    groups: list[ScanGroup] = field(default_factory=list)

    def group(self, state: str) -> ScanGroup:
        """The group whose scan computes `state`."""
        return next(g for g in self.groups if state in g.states)

    @property
    def fusable(self) -> list[tuple[str, ...]]:
        """The groups of more than one state (one kernel, values side by side)."""
        return [g.states for g in self.groups if len(g.states) > 1]

    @property
    def chunk(self) -> dict[str, int]:
        return {st: g.chunk for g in self.groups for st in g.states}


def make_plan(g: ir.Graph, cls: Classification) -> KernelPlan:
    order = make_order(g, cls)
    plan = KernelPlan(**vars(order))
    plan.groups = [_group(g, cls, plan.nodes, states) for states in _fusable(cls)]
    fold_normalised_reads(plan, cls)
    fold_epilogues(plan)
    return plan


def _fusable(cls: Classification) -> list[tuple[str, ...]]:
    """Scans grouped: those with the same rule (additive), keys, decay and queries run as one."""
    groups: list[tuple[str, ...]] = []
    for i, a in enumerate(cls.scans):
        if any(a.state in grp for grp in groups):
            continue
        group = [a.state]
        for b in cls.scans[i + 1:]:
            same_reads = [(r.query, r.decayed, r.written) for r in a.reads] == [(r.query, r.decayed, r.written) for r in b.reads]
            if (a.plain and b.plain and a.rule == b.rule == "additive" and a.write_key == b.write_key and a.log_decay == b.log_decay
                    and a.decay in ("none", "constant", "scalar", "key") and b.decay == a.decay and same_reads):  # fmt: skip
                group.append(b.state)
        groups.append(tuple(group))
    return groups


def _decay(s: Scan) -> Decay:
    axis = s.key_dim if s.decay == "key" else s.value_dim if s.decay == "value" else None
    return Decay(s.kernel_decay, axis, s.decay == "constant")


def _normaliser(cls: Classification, states: tuple[str, ...]) -> str | None:
    """The one vector state of a group beside matrix states: the chunk kernels carry it as their normaliser."""
    vectors = [st for st in states if cls.scan(st).value_dim is None]
    return vectors[0] if len(vectors) == 1 and len(states) > 1 else None


def _group(g: ir.Graph, cls: Classification, nodes: dict[int, dict], states: tuple[str, ...]) -> ScanGroup:
    s = cls.scan(states[0])
    decay = _decay(s)
    reads = tuple(r.position for r in s.reads)
    normaliser = _normaliser(cls, states)
    missing = _missing(s)
    erase = _erase_flag(s, decay)
    train = None if missing else _train(s, decay, reads[0], normaliser is not None, erase)
    decoding = reads and not _update_missing(s)
    decode = Kernels(recurrent.FAMILY, (("rule", s.rule), ("decay", decay.kind), ("reads", "_".join(reads)), *erase), ("kernel",)) if decoding else None
    host = _TEMPLATES[train.template] if train is not None else None
    forms = _Forms(nodes, query_norm=host is not None and host.QUERY_NORM, key_norm=host is not None and host.KEY_NORM)
    return ScanGroup(states, normaliser, s.rule, decay, reads, s.key_dim, tuple(cls.scan(st).value_dim for st in states),
                     CHUNK_VECTOR_DECAY if decay.kind in ("key", "value") else CHUNK_SCALAR_DECAY, train, decode, tuple(missing),
                     tuple(forms.of(s, finished=False).items()), tuple(forms.of(s, finished=True).items()),
                     _substeps(s), tuple(r.step for r in s.reads), _strengths(s, nodes))  # fmt: skip


def _strengths(s: Scan, nodes: dict[int, dict]) -> tuple[int, ...]:
    """Per write, its strength: the node s (no dims: per token, per head or constant) where the write key is s * x and
    the erase key 0 - x, the same x; empty unless every write is so (a delta rule's beta k beside its -k)."""
    found = []
    for w in s.writes:
        if w.key is None or w.erase is None:
            return ()
        x, k = _negated(nodes, w.erase), nodes[w.key]
        if x is None or not (k["op"] == "binary" and k["fn"] == "mul" and x in k["args"]):
            return ()
        other = k["args"][1] if k["args"][0] == x else k["args"][0]
        if nodes[other]["dims"]:
            return ()
        found.append(other)
    return tuple(found)


def _negated(nodes: dict[int, dict], n: int) -> int | None:
    """x where node n is 0 - x (how the classifier writes a negation, e.g. the erase key of `v - k @ S`), else None."""
    d = nodes[n]
    zero = d["op"] == "binary" and d["fn"] == "sub" and nodes[d["args"][0]]["op"] == "const" and nodes[d["args"][0]]["value"] == 0
    return d["args"][1] if zero else None


def _substeps(s: Scan) -> tuple[SubStep, ...]:
    return tuple(SubStep(w.log_decay is not None, None if w.erase is None else "before decay" if w.erase_before_decay else "decayed",
                         w.value is not None or s.value_dim is None)
                 for w in s.writes)  # fmt: skip


def _erase_flag(s: Scan, decay: Decay) -> tuple[tuple[str, bool], ...]:
    """The render argument of a scan whose erases read the state before their sub-step's decay (RWKV-7's generalized
    delta rule): the kernels take it as one flag for every sub-token of the scan, which holds since a sub-token
    without an erase (c = 0) or without a decay of its own (log decay 0) is the same either way (_update_missing
    refuses a scan where it is not). Without a decay there is nothing to read before."""
    before = any(w.erase_before_decay for w in s.writes) and decay.kind != "none"
    return (("erase_before", True),) if before else ()


def _update_missing(s: Scan) -> list[str]:
    """Why no kernel, chunked or recurrent, covers a scan's token update (empty when they do): the recurrent kernel
    runs any number of writes (as sub-tokens, lamixer.runtime.substeps) and reads."""
    if any(w.key is None for w in s.writes):
        return [f"state {s.state}: a vector state read whole has no Triton template yet"]
    decayed = {w.erase_before_decay for w in s.writes if w.erase is not None and w.log_decay is not None}
    if len(decayed) > 1:
        return [f"state {s.state}: writes that read the state before their decays beside writes that read it after them have "
                "no Triton template yet"]  # fmt: skip
    return []


def _missing(s: Scan) -> list[str]:
    """Why no chunk template covers a scan (empty when one does). Several writes per token run as sub-tokens of the
    scan (lamixer.runtime.substeps), a write of a read alone with a zero value, on the same kernels."""
    if not s.reads:
        return [f"state {s.state}: a scan without reads (final state only) has no Triton template yet"]
    if len(s.reads) > 1:
        return [f"state {s.state}: more than one read of one state has no Triton template yet"]
    return _update_missing(s)


def _train(s: Scan, decay: Decay, read: str, ones: bool, erase: tuple[tuple[str, bool], ...]) -> Kernels:
    if s.rule == "delta":
        return Kernels(delta.FAMILY, (("decay", decay.kind), ("read", read), *erase), tuple(delta.kernel_names(decay.kind)))
    # chunk_additive reads a per-head constant once per sequence and head; sub-tokens (several writes per token) carry
    # a token's decay on its first alone, so theirs is a scalar decay
    kind = "constant" if decay.constant and len(s.writes) == 1 else decay.kind
    args = additive.template_args(kind, read, "", ones)
    args.pop("acc")
    return Kernels(additive.FAMILY, tuple(args.items()), tuple(additive.kernel_names(kind)))




class _Forms:
    """The scan operands kernels can read straight from the caller's tensors (Form), found on the IR."""

    def __init__(self, nodes: dict[int, dict], query_norm: bool = False, key_norm: bool = False):
        self.nodes = nodes
        self.query_norm = query_norm  # the chunk kernels l2-normalise a query themselves
        self.key_norm = key_norm  # and an erase key, with its sign or per-head factor

    def per_head_constant(self, n: int) -> tuple[str, ...] | None:
        """The params a per-head constant reads (empty: none), or None when n is not one."""
        d = self.nodes[n]
        if d["dims"]:
            return None
        if d["op"] == "param":
            return (d["name"],)
        if d["op"] in ir.CALL_CONSTANTS:
            return ()
        if d["op"] in ("unary", "binary"):
            found = [self.per_head_constant(a) for a in d["args"]]
            return None if any(f is None for f in found) else tuple(p for f in found for p in f)
        return None

    def plain_input(self, n: int) -> str | None:
        return self.nodes[n]["name"] if self.nodes[n]["op"] == "input" else None

    def form(self, n: int) -> Form | None:
        """n as a Form of any shape, or None."""
        d, nodes = self.nodes[n], self.nodes
        if self.plain_input(n):
            return Form(self.plain_input(n))
        if d["op"] == "normalize" and d["fn"] == "l2norm" and self.plain_input(d["args"][0]):
            return Form(self.plain_input(d["args"][0]), norm=True)
        if _negated(nodes, n) is not None:
            inner = self.form(_negated(nodes, n))
            return None if inner is None else Form(inner.input, inner.factor, not inner.negate, inner.norm, inner.token, inner.params)
        if d["op"] == "binary" and d["fn"] == "mul":
            for x, f in (d["args"], tuple(reversed(d["args"]))):
                inner = self.form(x)
                if inner is None:
                    continue
                params = self.per_head_constant(f)
                if inner.factor is None and params is not None:
                    return Form(inner.input, f, inner.negate, inner.norm, inner.token, params)
                if inner.token is None and self.plain_input(f) and not nodes[f]["dims"]:
                    return Form(inner.input, inner.factor, inner.negate, inner.norm, self.plain_input(f), inner.params)
        return None

    def key_side(self, n: int | None, query: bool, finished: bool, erase: bool = False) -> Form | None:
        found = self.form(n) if n is not None else None
        if found is None or (query and found.token is not None):
            return None
        if finished:
            return found
        if erase:  # the chunk kernels finish an erase key's l2norm with its factor and sign, where they do
            return found if self.key_norm and found.norm and found.token is None else None
        if found.negate or found.token is not None:
            return None
        if query:  # the chunk kernels take a query's per-head factor, and its l2norm where they finish it
            return found if self.query_norm or not found.norm else None
        return found if not found.norm and found.factor is None else None

    def of(self, s: Scan, finished: bool) -> dict[int, Form]:
        """The operands of scan s the kernels read from the caller's tensors; finished: the recurrent kernel's forms."""
        out: dict[int, Form] = {}
        if not s.plain:  # its writes run as sub-tokens (runtime/substeps.py), assembled in torch from the operands
            # but a log decay at one sub-step alone, which goes a row per token as it is: a plain input's as given
            decaying = [w.log_decay for w in s.writes if w.log_decay is not None]
            if len(s.writes) > 1 and len(decaying) == 1 and self.plain_input(decaying[0]):
                out[decaying[0]] = Form(self.plain_input(decaying[0]))
            # and the queries, a row per token too: where the kernels finish a query's l2norm (the delta rule's), its
            # forms as a plain scan's
            for r in s.reads if self.query_norm else ():
                found = self.key_side(r.query, True, finished)
                if found is not None:
                    out[r.query] = found
            return out
        for n in (s.write_value, s.log_decay, *_strengths(s, self.nodes)):
            if n is not None and self.plain_input(n):
                out[n] = Form(self.plain_input(n))
        keys = ((s.write_key, False, False), (s.erase_key, False, True), *((r.query, True, False) for r in s.reads))
        for n, query, erase in keys:
            found = self.key_side(n, query, finished, erase)
            if found is not None:
                out[n] = found
        return out


def _spell(n: int, nodes: dict[int, dict]) -> str:
    """A per-head constant written out (for `explain`)."""
    d = nodes[n]
    if d["op"] == "param" or d["op"] == "dim":
        return d["name"]
    if d["op"] == "const":
        return repr(d["value"])
    if d["op"] in ("scale", "head"):
        return d["op"]
    args = ", ".join(_spell(a, nodes) for a in d["args"])
    return f"{d['fn']}({args})"
