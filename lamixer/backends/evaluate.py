"""The torch backend: the kernel plan evaluated over whole [B, T, H, *dims] tensors.

Per-token work runs node by node on all tokens at once (lamixer.runtime.ops); each state is one
chunkwise scan (lamixer.runtime.scan), run as the classification says (never by a mixer's name).
`lamixer compile` writes the same evaluation out as straight-line code (lamixer/emit/mixer_module.py).
"""
from __future__ import annotations

import functools

import torch

from ..ir.graph import CALL_CONSTANTS, VALUE_LEAVES
from ..parallel import mixer as parallel
from ..passes.classify import Scan
from ..passes.kernel_plan import Form
from ..passes.pipeline import Compiled
from ..runtime import ops, recompute
from ..runtime.carry import block_attention, extras, statistic
from ..runtime.scan import KeyForm, ScanOperands, attention_dtype, scan_group, torch_scan
from ..runtime.substeps import substep_scan
from .binding import Call, remember

__all__ = ["ScanOperands", "run", "torch_scan"]




class _Program:
    """What evaluating the plan needs beyond the call's tensors, worked out once per spec and set of direct
    operands: the nodes to evaluate in order, what each is, and the scan groups. Per-call work walks no graph."""

    def __init__(self, compiled: Compiled, direct: dict[int, Form], decoding: bool = False):
        self.c, self.nodes, self.direct = compiled, compiled.plan.nodes, direct
        plan, nodes = compiled.plan, self.nodes
        # per state, its writes' strengths where its scan takes them (ScanGroup.strengths): not where a kernel finishes
        # a write key from the caller's tensors itself, nor where the recurrent kernel (decoding) finishes an erase key
        # (it takes the write keys made: ScanOperands.with_write_keys); the chunk kernels make the write keys from the
        # strengths and the erase keys they finish
        self.strengths = {}
        for group in plan.groups:
            writes = compiled.classification.scan(group.states[0]).writes
            if group.strengths and not any(w.key in direct or (decoding and w.erase in direct) for w in writes):
                self.strengths[group.states[0]] = group.strengths
        needed = self._needed()
        # call constants: made of constants, dims, the head index and the scale only (e.g. RetNet's decay, a read-out
        # scale): the same for every call of one signature and scale, so computed once for it
        self.constant: list[int] = []  # in evaluation order
        for n in plan.order:
            d = nodes[n]
            if d["op"] in CALL_CONSTANTS or (d["op"] in ("unary", "binary") and n not in plan.read_scan
                                               and all(a in self.constant for a in d["args"])):  # fmt: skip
                self.constant.append(n)
        self.steps: list[tuple[int, str]] = []
        for n in plan.order:
            if n not in needed:
                continue
            op = nodes[n]["op"]
            kind = ("scan" if n in plan.read_scan else "constant" if n in self.constant else "leaf" if op in VALUE_LEAVES
                    else op if op in ("stat", "block_attention", "output") else "op")  # fmt: skip
            self.steps.append((n, kind))
        self.constants = [n for n, kind in self.steps if kind == "constant"]
        # work per token outside the scans (what torch.compile could fuse); none when the scans read the inputs
        # directly and the output is a scan's read
        self.per_token_work = any(kind in ("op", "stat", "block_attention") for _, kind in self.steps)
        # direct operands whose per-head factor is a call constant (or a sign alone): computed with the constants
        self.constant_factors = [n for n, d in direct.items() if d.scaled and (d.factor is None or d.factor in self.constant)]
        self.factors_key = tuple(self.constant_factors)
        self.groups = {st: (group, [compiled.classification.scan(name) for name in group.states]) for group in plan.groups for st in group.states}
        # each block attention's place in a call's window, and the statistics in the order a call reports them
        # (from the plan's node table, not the graph: a first call may build this under torch.compile's tracing,
        # which cannot enter networkx)
        self.blocks = {n: i for i, n in enumerate(sorted(n for n in nodes if nodes[n]["op"] == "block_attention"))}
        self.stats = sorted(n for n in nodes if nodes[n]["op"] == "stat")
        self.prologues = self._prologues()  # scan operand -> (its per-token work in order, what that work reads)
        self.in_prologue = {m for work, _ in self.prologues.values() for m in work}
        self.releases = self._releases()  # step index -> the values no later step reads, dropped after it
        # inputs a scan does not read itself: converted to the compute dtype where read, never held (one elementwise
        # pass per reader against a float32 copy held from the first reader to the last; block attention and
        # prologues take the caller's tensor as it is)
        scanned = {r for s in self.c.classification.scans for r in self._scan_reads(s)}
        self.lazy = {n for n, kind in self.steps if kind == "leaf" and self.nodes[n]["op"] == "input" and n not in scanned}

    def _scan_reads(self, s: Scan) -> list[int]:
        """The values a scan reads from a call's environment: its operands, a direct operand's factor instead, a
        prologue's reads but inputs (it takes the caller's tensors) instead of its work."""
        out = []
        for a in self.scan_inputs(s):
            d = self.direct.get(a)
            work = [r for r in self.prologues[a][1] if self.nodes[r]["op"] != "input"] if a in self.prologues else None
            out += (work if work is not None else [] if d is not None else [a]) + (
                [d.factor] if d is not None and d.factor is not None else [])  # fmt: skip
        return out

    def _releases(self) -> dict[int, tuple[int, ...]]:
        """For each step, the per-token values whose last reader it is: a call drops them from its environment there, so
        the forward holds at once only what is still to be read (autograd keeps what the backward needs itself). A
        scan reads its operands, its direct operands' factors and its prologues' reads at its group's first read; the
        output, statistics (a call may report them) and constants are kept."""
        last: dict[int, int] = {}
        first_read: dict[str, int] = {}
        for i, (n, kind) in enumerate(self.steps):
            if kind == "scan":
                state = self.c.plan.read_scan[n]
                group = self.groups[state][1]
                at = first_read.setdefault(self.groups[state][0].states[0], i)
                for r in (r for s in group for r in self._scan_reads(s)):
                    last[r] = max(last.get(r, at), at)
            else:
                for a in self.nodes[n]["args"]:
                    last[a] = i
        unread = {r for s in self.c.classification.scans if not s.reads for r in self._scan_reads(s)}  # run after every step
        keep = unread | set(self.stats) | set(self.constant) | {self.c.graph.output}
        out: dict[int, list[int]] = {}
        for n, i in last.items():
            if n not in keep:
                out.setdefault(i, []).append(n)
        return {i: tuple(ns) for i, ns in out.items()}

    def _prologues(self) -> dict[int, tuple[tuple[int, ...], tuple[int, ...]]]:
        """The per-token work that only makes a scan's operand (a feature map, a gate), for each such operand: the nodes
        used by nothing but the operand's own work, and the nodes outside it that work reads. A call recomputes it in
        the backward (runtime/recompute.py) when it reads only inputs and values without a time axis (params,
        statistics, constants and what is made of them): what it would keep is several times those."""
        kinds = dict(self.steps)
        users: dict[int, set] = {}
        for n, kind in self.steps:
            if kind != "scan":
                for a in self.nodes[n]["args"]:
                    users.setdefault(a, set()).add(n)
        timeless: set[int] = set()  # values without a time axis: params, constants, statistics and what is made of them
        for n, kind in self.steps:
            if kind in ("constant", "stat") or (kind == "leaf" and self.nodes[n]["op"] != "input") or (
                    kind == "op" and all(a in timeless for a in self.nodes[n]["args"])):  # fmt: skip
                timeless.add(n)
        operands = {n for s in self.c.classification.scans for n in self.scan_inputs(s) if n not in self.direct and kinds.get(n) == "op"}
        out = {}
        for n in sorted(operands):
            if users.get(n):  # also used outside the scans: evaluated as it is
                continue
            work, grown = {n}, True
            while grown:
                grown = False
                for m in list(work):
                    for a in self.nodes[m]["args"]:
                        if a not in work and kinds.get(a) == "op" and a not in operands and users.get(a, set()) <= work:
                            work.add(a)
                            grown = True
            reads = {a for m in work for a in self.nodes[m]["args"] if a not in work}
            if reads <= timeless | {a for a in reads if self.nodes[a]["op"] == "input"}:
                out[n] = (tuple(m for m, _ in self.steps if m in work), tuple(sorted(reads)))
        return out

    def scan_inputs(self, s: Scan) -> list[int]:
        """The nodes scan s reads: its writes' operands, a strength in place of a write key where its scan takes
        strengths, and its queries."""
        strengths = self.strengths.get(s.state)
        if not strengths:
            return s.inputs()
        writes = [n for w, st in zip(s.writes, strengths) for n in (w.log_decay, st, w.value, w.erase) if n is not None]
        return writes + [r.query for r in s.reads if r.query is not None]

    def _scan_deps(self, s: Scan) -> list[int]:
        deps = []
        for n in self.scan_inputs(s):
            d = self.direct.get(n)  # a direct operand needs only its factor
            deps += [n] if d is None else [d.factor] if d.factor is not None else []
        return deps

    def _needed(self) -> set[int]:
        """The nodes to evaluate: what the output and the scans need, less what direct operands replace."""
        plan, nodes = self.c.plan, self.nodes
        need = {self.c.graph.output}
        for s in self.c.classification.scans:
            need.update(self._scan_deps(s))
        for n in reversed(plan.order):
            if n in need:
                need.update(self._scan_deps(self.c.classification.scan(plan.read_scan[n])) if n in plan.read_scan else nodes[n]["args"])
        return need


def program(compiled: Compiled, direct: dict[int, Form] | None = None, decoding: bool = False) -> _Program:
    """The spec's evaluation program for these direct operands (made once, kept with the compiled spec); decoding:
    they are the recurrent kernel's (_Program)."""
    direct = direct or {}
    key = ("program", decoding, tuple((n, direct[n]) for n in sorted(direct)))  # sorted by node alone: torch.compile sorts ints, not tuples
    found = compiled.cache.get(key)
    return found if found is not None else remember(compiled.cache, key, _Program(compiled, direct, decoding))


def _converted(d: dict, x: torch.Tensor, dt: torch.dtype) -> torch.Tensor:
    """An input or param leaf's tensor in the compute dtype, a param shaped to broadcast over [B, T, H, *dims]."""
    x = x.to(dt)
    if d["op"] == "input":
        return x
    return x.reshape(1, 1, *x.shape) if d["per_head"] else x.reshape(1, 1, 1, *x.shape)


def _prologue(nodes: dict, work: tuple[int, ...], reads: tuple[int, ...], dt: torch.dtype, out: torch.dtype | None,
              *values: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """A scan operand's per-token work (_Program._prologues) on the values of what it reads (an input or param leaf's
    as the caller gave it), computed in dt, returned in `out` (None: dt); the last node of `work` is the operand.
    Reads nothing else: the backward keeps its arguments to run it again (runtime/recompute.py)."""
    env = {a: _converted(nodes[a], v, dt) if nodes[a]["op"] in ("input", "param") else v for a, v in zip(reads, values)}
    for m in work:
        args = nodes[m]["args"]
        env[m] = ops.apply(nodes[m], [env[a] for a in args], [nodes[a]["dims"] for a in args])
    return env[work[-1]] if out is None else env[work[-1]].to(out)


class _Evaluator:
    """Vectorised evaluation of the plan over [B, T, H, *dims] tensors.

    Packed sequences (cu_seqlens) share the per-token work; only the scans, block attention and
    batch-grouped statistics see the sequence boundaries.
    """

    def __init__(self, compiled: Compiled, call: Call, scan_impl, direct: dict[int, Form] | None = None,
                 prog: _Program | None = None, attention=None):  # fmt: skip
        self.c, self.call = compiled, call
        self.prog = prog if prog is not None else program(compiled, direct)
        self.nodes = compiled.plan.nodes  # plain data: nothing below touches the graph library
        self.scan_impl = scan_impl
        self.attention = attention  # block attention's kernel (runtime.scan.block_attention's `kernel`), or None
        # scan operands the kernels read straight from the caller's tensors: node -> Form
        self.direct = self.prog.direct
        self.env: dict[int, torch.Tensor] = {}
        self.finals: dict[str, torch.Tensor] = {}
        self.windows: dict[int, tuple | None] = {}  # block attention node -> its window after the call (when asked)
        self.B, self.T = call.batch, call.length

    def value(self, n: int) -> torch.Tensor:
        """Node n's value: an input's converted where it is read (_Program.lazy), the others' from the environment."""
        return self.env[n] if n in self.env else self.leaf(n)

    def full(self, n: int) -> torch.Tensor:
        """Node n's value expanded to [B, T, H, *dims]."""
        sizes = [self.call.sizes[d] for d in self.nodes[n]["dims"]]
        return self.value(n).expand(self.B, self.T, self.call.heads, *sizes)

    def leaf(self, n: int) -> torch.Tensor:
        d, call = self.nodes[n], self.call
        dt, dev = call.compute_dtype, call.device
        op = d["op"]
        if op in ("input", "param"):
            return _converted(d, call.inputs[d["name"]], dt)
        if op == "head":
            return torch.arange(call.heads, dtype=dt, device=dev).reshape(1, 1, -1)
        value = {"const": lambda: d["value"], "dim": lambda: call.sizes[d["name"]], "scale": lambda: call.scale}[op]()
        return ops.filled(value, dt, dev)

    def constants(self) -> dict:
        """The call constants' values (and the constant factors of direct operands), once per signature and scale."""
        call, prog = self.call, self.prog
        key = ("constants", call.scale, prog.factors_key)
        found = call.memo.get(key) if call.memo is not None else None
        if found is not None:
            return found
        values: dict = {}
        for n in prog.constant:
            d = self.nodes[n]
            if d["op"] in CALL_CONSTANTS:
                values[n] = self.leaf(n)
            else:
                args = d["args"]
                values[n] = ops.apply(d, [values[a] for a in args], [self.nodes[a]["dims"] for a in args])
        for n in prog.constant_factors:
            f = self.direct[n].factor
            values[("factor", n)] = self._factor(values[f] if f is not None else None, self.direct[n].negate)
        return values if call.memo is None else remember(call.memo, key, values)

    def run(self, constants: dict | None = None) -> None:
        nodes, plan = self.nodes, self.c.plan
        consts = constants if constants is not None else self.constants() if self.prog.constants or self.prog.constant_factors else {}
        self.consts = consts
        releases = self.prog.releases
        for i, (n, kind) in enumerate(self.prog.steps):
            for done in releases.get(i - 1, ()):
                self.env.pop(done, None)
            if n in self.prog.in_prologue or n in self.prog.lazy:  # made with its scan (prologue), or where read
                continue
            if kind == "scan":
                if plan.read_scan[n] not in self.finals:
                    self.scan(plan.read_scan[n])
            elif kind == "constant":
                self.env[n] = consts[n]
            elif kind == "leaf":
                self.env[n] = self.leaf(n)
            elif kind == "stat":
                self.env[n] = self.stat(n)
            elif kind == "block_attention":
                self.env[n] = self.block_attention(n)
            elif kind == "output":
                self.env[n] = self.value(nodes[n]["args"][0])
            else:
                args = nodes[n]["args"]
                self.env[n] = ops.apply(nodes[n], [self.value(a) for a in args], [nodes[a]["dims"] for a in args])
        for scan in self.c.classification.scans:
            if scan.state not in self.finals:
                self.scan(scan.state)

    def extras(self) -> list[torch.Tensor]:
        """What the call asked for beside o and the final states (runtime/carry.py: extras)."""
        stats = []
        if self.call.output_stats:
            for n in self.prog.stats:
                if n not in self.env:  # a statistic only a direct operand needed
                    self.evaluate_up_to(n)
                stats.append((self.env[n], self.nodes[n]["groups"]))
        report = extras if self.call.context_parallel is None else parallel.extras  # (every sequence of the group's)
        return report(self.call, [self.windows.get(n) for n in self.prog.blocks], stats)

    def evaluate_up_to(self, target: int) -> None:
        """Evaluate target and what it needs that is not evaluated yet."""
        need, todo = set(), [target]
        while todo:
            n = todo.pop()
            if n not in self.env and n not in need:
                need.add(n)
                todo.extend(self.nodes[n]["args"])
        for n in self.c.plan.order:
            if n in need:
                op = self.nodes[n]["op"]
                self.env[n] = (self.leaf(n) if op in VALUE_LEAVES else self.stat(n) if op == "stat"
                               else ops.apply(self.nodes[n], [self.env[a] for a in self.nodes[n]["args"]], [self.nodes[a]["dims"] for a in self.nodes[n]["args"]]))  # fmt: skip

    def stat(self, n: int) -> torch.Tensor:
        node = self.nodes[n]
        reduce = statistic if self.call.context_parallel is None else parallel.statistic  # over the group's ranks
        return reduce(self.call, node["name"], node["fn"], self.full(node["args"][0]), node["groups"])

    def block_attention(self, n: int) -> torch.Tensor:
        q, k, v, scale, *residual = self.nodes[n]["args"]  # the plan's epilogue: a residual and a weight (passes/epilogue.py)
        size = self.nodes[n]["size"]
        size = size if isinstance(size, int) else self.call.sizes[size]
        call = self.call
        number = call.scale if self.nodes[scale]["op"] == "scale" else None  # the attention kernel scales by a number itself
        dtype = attention_dtype(call)

        def operand(n: int) -> torch.Tensor:  # an input already in the attention's dtype goes as the caller gave it
            x = call.inputs.get(self.nodes[n]["name"]) if self.nodes[n]["op"] == "input" else None
            return x if x is not None and x.dtype == dtype and x.dim() == 4 else self.full(n)

        attend = block_attention if call.context_parallel is None else parallel.block_attention
        o, self.windows[n] = attend(call, self.prog.blocks[n], operand(q), operand(k), operand(v), self.value(scale) if number is None else number,
                                    size, dtype, self.attention, self.full(residual[0]) if residual else None,
                                    self.nodes[n].get("weight", 1.0))  # fmt: skip
        return o.to(call.compute_dtype)

    def prologue(self, scans: list[Scan], dtype: torch.dtype | None = None) -> list[tuple]:
        """The operands of `scans` made by per-token work of their own (_Program._prologues), each evaluated so that the
        backward recomputes it, as (value, function, arguments) for recompute.rebuilt; a key, query or value in `dtype`
        when given (the kernels' operand dtype: the conversion is then recomputed with the rest, never kept), a log
        decay as it is (the kernels read it in the compute dtype)."""
        made = []
        # decays and strengths stay in the compute dtype (the kernels read them in their accumulator's)
        kept = {w.log_decay for s in scans for w in s.writes} | {n for s in scans for n in self.prog.strengths.get(s.state, ())}
        for s in scans:
            for n in self.prog.scan_inputs(s):
                if n in self.prog.prologues and n not in self.env:
                    work, reads = self.prog.prologues[n]
                    args = tuple(self.call.inputs[self.nodes[a]["name"]] if self.nodes[a]["op"] in ("input", "param") else self.env[a]
                                 for a in reads)  # fmt: skip
                    fn = functools.partial(_prologue, self.nodes, work, reads, self.call.compute_dtype, None if n in kept else dtype)
                    self.env[n] = recompute.recomputed(fn, *args)
                    made.append((self.env[n], fn, args))
        return made

    def operand(self, n: int | None) -> torch.Tensor | None:
        """A scan operand: a node's value, or a direct operand's input tensor (its form left to the kernel)."""
        if n is None:
            return None
        return self.call.inputs[self.direct[n].input] if n in self.direct else self.env[n]

    def factor(self, n: int) -> torch.Tensor | None:
        """A direct operand's per-head factor, its sign included, as [H] (None when it has none)."""
        d = self.direct.get(n)
        if d is None or not d.scaled:
            return None
        found = self.consts.get(("factor", n))
        return found if found is not None else self._factor(self.env[d.factor], d.negate)

    def _factor(self, x: torch.Tensor | None, negate: bool = False) -> torch.Tensor:
        H, dt = self.call.heads, self.call.compute_dtype
        x = torch.ones(H, dtype=dt, device=self.call.device) if x is None else x.to(dt).reshape(-1).expand(H)
        return (-x if negate else x).contiguous()

    def forms(self, scan: Scan) -> dict[str, KeyForm]:
        """The KeyForms of a scan's direct key-side operands that the kernel finishes (ScanOperands.forms): only those
        more than a plain input or a query's factor."""
        out = {}
        for name, n in (("a", scan.write_key), ("c", scan.erase_key), *((f"q{i}", r.query) for i, r in enumerate(scan.reads))):
            d = self.direct.get(n)
            if d is not None and (d.norm or d.token is not None or (name in ("a", "c") and d.scaled)):
                token = self.call.inputs[d.token] if d.token is not None else None
                out[name] = KeyForm(d.norm, token, self.factor(n) if name in ("a", "c") else None)
        return out

    def scan(self, state: str) -> None:
        """Run the scan group of `state`: one scan, or several sharing keys, decay and queries with their values side
        by side, on the implementation the backend chose for the group (scan_impl: one for every group, or a
        {group states: (implementation, whether it carries the group's normaliser, its operand dtype or None)} mapping)."""
        group, scans = self.prog.groups[state]
        s = scans[0]
        impl, normaliser, dtype = self.scan_impl[group.states] if isinstance(self.scan_impl, dict) else (self.scan_impl, False, None)
        if self.call.context_parallel is not None:  # a slice of the time axis: composed with the other ranks' slices
            impl = functools.partial(parallel.scan, impl, self.call.context_parallel)
        made = self.prologue(scans, dtype)
        if not s.plain:
            with recompute.rebuilt(made):
                self.substeps(group, s, impl)
            return
        operand, call = self.operand, self.call
        strengths = self.prog.strengths.get(s.state)
        with recompute.rebuilt(made):
            reads, finals = scan_group(
                impl, (self.B, self.T, call.heads), None if strengths else operand(s.write_key),
                [None if t.value_dim is None else operand(t.write_value) for t in scans], operand(s.erase_key), operand(s.log_decay),
                group.decay.kind, [(operand(r.query), p) for r, p in zip(s.reads, group.reads)],
                [call.initial_state[t.state] for t in scans], call.cu_seqlens, group.chunk, [self.factor(r.query) for r in s.reads],
                self.forms(s), normaliser, operand(strengths[0]) if strengths else None, group.divide,
            )  # fmt: skip
        for t, outs, final in zip(scans, reads, finals):
            for r, o in zip(t.reads, outs):
                self.env[r.node] = o
            self.finals[t.state] = final

    def substeps(self, group, s: Scan, impl) -> None:
        """A scan whose token update is several writes, or one the kernels lack (lamixer.runtime.substeps): alone in its
        group. A vector state runs as a one-column matrix: [K, 1] written with b = 1 when read as x @ z, [1, D] written
        with a = 1 when read whole."""
        operand, call = self.operand, self.call
        h0 = call.initial_state[s.state]
        h0 = h0.unsqueeze(-1) if s.value_dim is None else h0.unsqueeze(-2) if s.key_dim is None else h0
        one = h0.new_ones(1, 1, 1, 1) if s.value_dim is None else None
        strengths = self.prog.strengths.get(s.state)
        writes = [(None if strengths else operand(w.key), one if one is not None else operand(w.value), operand(w.erase), operand(w.log_decay),
                   w.erase_before_decay) for w in s.writes]  # fmt: skip
        reads = [(operand(r.query), r.step, r.position) for r in s.reads]
        # direct queries' factors and norms, which the kernels finish (the other operands are assembled in torch); no
        # assignment expression in the comprehension: dynamo's trace split there into three graphs
        forms = {f"q{i}": KeyForm(True) for i, r in enumerate(s.reads) if r.query in self.direct and self.direct[r.query].norm}
        outs, final = substep_scan(impl, (self.B, self.T, call.heads), writes, group.decay.kind, reads, h0, call.cu_seqlens, group.chunk,
                                   [operand(n) for n in strengths] if strengths else None, [self.factor(r.query) for r in s.reads],
                                   forms)  # fmt: skip
        axis = -1 if s.value_dim is None else -2 if s.key_dim is None else None
        for r, o in zip(s.reads, outs):
            self.env[r.node] = o.squeeze(-1) if s.value_dim is None else o
        self.finals[s.state] = final if axis is None else final.squeeze(axis)


def run(compiled: Compiled, call: Call, scan_impl=torch_scan, direct=None, prog: _Program | None = None,
        attention=None, constants: dict | None = None) -> tuple[torch.Tensor, list[torch.Tensor]]:  # fmt: skip
    """o [B, T, H, V] and the final states [N, H, *dims], in the compute dtype (prog: program(compiled, direct), when
    the caller keeps it; scan_impl: as _Evaluator.scan takes it; attention: block attention's kernel, None for SDPA;
    constants: call_constants' for this call, when the caller made them)."""
    ev = _Evaluator(compiled, call, scan_impl, direct, prog, attention)
    ev.run(constants)
    finals = [ev.finals[n] for n in compiled.graph.states]
    return ev.env[compiled.graph.output], finals + ev.extras() if call.output_stats or call.output_window else finals


def call_constants(compiled: Compiled, call: Call, prog: _Program) -> dict:
    """The call's constants (the plan's nodes made of constants, dims, the head index and the scale alone, and the
    direct operands' per-head factors made of them), once per signature and scale (Call.memo). A caller compiling
    the evaluation passes them in: made inside a compiled graph they are small kernels every call."""
    if not (prog.constants or prog.constant_factors):
        return {}
    return _Evaluator(compiled, call, None, prog.direct, prog).constants()

