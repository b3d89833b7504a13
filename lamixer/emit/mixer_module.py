"""A spec's mixer as a Python module: its per-token work written out from the kernel plan, line by line.

The module holds the mixer's call (the spec's inputs as named parameters, then scale, initial_state,
output_final_state, cu_seqlens and backend, as lamixer.Mixer takes them), its default scale, and
`forward`: one line per node of the plan, over [B, T, H, *dims] tensors in the compute dtype, and one
scan_group call per scan. It evaluates exactly what lamixer's torch backend evaluates (the same
ops, in the same order, on the same runtime), without walking a graph.

Values keep three leading axes (batch, time, head; 1 where a value does not vary along one) and
their named feature dims; numbers (constants, dim sizes, the scale) stay Python numbers until an
operation needs a tensor.
"""
from __future__ import annotations

import re

from ..ir.graph import VALUE_LEAVES
from ..passes.pipeline import Compiled
from ..runtime.call import Operand
from ..tools.explain import default_scale_text, expr
from . import scans_module as kernels_mod
from . import source as src
from .source import Module, Names

_NUMBERS = ("const", "dim", "scale")
CALL_ARGUMENTS = ("scale", "initial_state", "output_final_state", "cu_seqlens", "backend", "stats", "window", "output_stats", "output_window")
# module-level names of a mixer module, which no spec name may take
MODULE_NAMES = ("SIGNATURE", "BACKENDS", "BINDINGS", "TRITON_MISSING", "forward", "default_scale", "torch", "F", "ops", "Operand", "Signature",
                "bind", "check", "check_flags", "pick_backend", "results", "scan_group", "stat", "block_attention", "attention_dtype", "torch_scan", "scans", "fuse",
                "statistic", "extras", "attach", "STATES_IN_PLACE",
                # and what the package's __init__ exports beside the mixer, or its submodules
                "Layer", "LayerState", "ArgumentError", "LamixerError", "mixer", "layer", "runtime", "kernels")  # fmt: skip


class _Value:
    """A node's value in the generated code: its expression, whether it is a Python number, its leading axes."""

    def __init__(self, code: str, number: bool, lead: tuple[str, str, str] = ("1", "1", "1")):
        self.code, self.number, self.lead = code, number, lead


def _max_lead(*vals: _Value) -> tuple[str, str, str]:
    return tuple(next((v.lead[i] for v in vals if not v.number and v.lead[i] != "1"), "1") for i in range(3))


class MixerWriter:
    def __init__(self, compiled: Compiled, module: Module, function_name: str):
        self.c, self.m = compiled, module
        self.g, self.plan, self.nodes = compiled.graph, compiled.plan, compiled.plan.nodes
        self.function_name = function_name
        self.names = Names(MODULE_NAMES + (function_name, "call", "scan", "attention", "dtype", "device"))
        # spec names first, so they keep theirs; then the shape locals; temporaries take what is left
        self.dims = {d: self.names.claim(d) for d in self.g.dims}
        self.spec_names: dict[int, str] = {}
        for n in self.plan.order:
            d = self.nodes[n]
            if d["op"] in ("input", "param"):
                self.spec_names[n] = self.names.claim(d["name"])
            elif "let" in d:
                self.spec_names[n] = self.names.claim(d["let"])
        self.states = {s: self.names.claim(s) for s in self.g.states}
        out = self.nodes[self.g.output]["args"][0]
        if out not in self.spec_names and self.nodes[out]["op"] not in VALUE_LEAVES:
            self.spec_names[out] = self.names.claim(self.g.output_name)
        self.B, self.T, self.H = (self.names.claim(x) for x in ("B", "T", "H"))
        self.scale = self.names.claim("scale")
        self.env: dict[int, _Value] = {}
        self.lines: list[str] = []
        # what a call may carry besides the states (runtime/carry.py): each statistic (its value, groups), each window
        self.carried_stats: list[tuple[str, tuple[str, ...]]] = []
        self.carried_windows: list[str] = []
        # write keys the scans make from their strengths (ScanGroup.strengths) and nothing else reads: not written out
        used = {a for n in self.plan.order for a in self.nodes[n]["args"]}
        self.unread = {w.key for g in self.plan.groups if g.strengths for w in compiled.classification.scan(g.states[0]).writes
                       if w.key not in used}  # fmt: skip

    # ---- values ----
    def tensor(self, v: _Value) -> str:
        """A value as a tensor (a number becomes a [1, 1, 1] tensor in the compute dtype)."""
        return v.code if not v.number else self.m.uses(f"ops.filled({v.code}, dtype, device)")

    def sizes(self, dims) -> list[str]:
        return [self.dims[d] for d in dims]

    def full(self, n: int) -> str:
        """Node n's value expanded to [B, T, H, *dims] (as is when it already is)."""
        v = self.env[n]
        if not v.number and v.lead == ("B", "T", "H"):
            return v.code
        return f"{self.tensor(v)}.expand({', '.join([self.B, self.T, self.H, *self.sizes(self.nodes[n]['dims'])])})"

    def assign(self, n: int, code: str, lead, comment: str = "") -> None:
        name = self.spec_names.get(n) or self.names.claim(f"t{n}")
        note = src.shape(lead, self.nodes[n]["dims"]) + (f": {comment}" if comment else "")
        self.lines.append(f"{name} = {self.m.uses(code)}  # {note}")
        self.env[n] = _Value(name, False, lead)

    # ---- nodes ----
    def leaf(self, n: int) -> None:
        d = self.nodes[n]
        op = d["op"]
        if op in _NUMBERS:
            code = {"const": lambda: src.number(d["value"]), "dim": lambda: self.dims[d["name"]], "scale": lambda: self.scale}[op]()
            if n in self.spec_names:  # a let-bound number keeps its name
                self.lines.append(f"{self.spec_names[n]} = {code}")
                code = self.spec_names[n]
            self.env[n] = _Value(code, True)
        elif op == "input":
            self.assign(n, f"call.inputs[{src.text(d['name'])}].to(dtype)", ("B", "T", "H"))
        elif op == "param":
            lead = ("1", "1", "H") if d["per_head"] else ("1", "1", "1")
            index = "None, None" if d["per_head"] else "None, None, None"
            self.assign(n, f"call.inputs[{src.text(d['name'])}].to(dtype)[{index}]", lead)
        else:  # the head index h
            self.assign(n, f"torch.arange({self.H}, dtype=dtype, device=device).reshape(1, 1, {self.H})", ("1", "1", "H"))

    def pointwise(self, n: int) -> None:
        d = self.nodes[n]
        op, dims = d["op"], d["dims"]
        vals = [self.env[a] for a in d["args"]]
        arg_dims = [self.nodes[a]["dims"] for a in d["args"]]
        lead = _max_lead(*vals)
        if op == "unary":
            x = self.tensor(vals[0])
            if "decay_of" in d:  # a decay factor the scans take the log of: checked positive, as lamixer's backends check it
                state, where, arguments = d["decay_of"]
                note = f"({src.text(state)}, {src.text(where)}, {src.names(arguments) if arguments else '()'})"
                self.lines.append(self.m.uses(f"ops.check_decay({x}, {note})"))
            self.assign(n, src.unary(d["fn"], x), lead)
        elif op == "binary":
            a, b = vals
            if a.number and b.number:  # one operand a tensor, as the torch backend has it
                a = _Value(self.tensor(a), False)
            if d["fn"] in ("max", "min"):  # torch.maximum and minimum take tensors only
                a, b = (_Value(self.tensor(v), False) for v in (a, b))
            x, y = (v.code if v.number else src.align(v.code, da, dims) for v, da in zip((a, b), arg_dims))
            self.assign(n, src.binary(d["fn"], x, y), lead)
        elif op == "reduce":
            if not arg_dims[0]:  # a scalar reduces to itself
                self.env[n] = vals[0]
                return
            self.assign(n, f"ops.reduce({src.text(d['fn'])}, {vals[0].code}, {len(arg_dims[0])})", lead)
        elif op == "normalize":
            self.assign(n, f"ops.normalize({src.text(d['fn'])}, {self.tensor(vals[0])})", lead)
        elif op == "dot":
            a, b = (self.tensor(v) for v in vals)
            axes = tuple(range(-len(arg_dims[0]), 0))
            self.assign(n, f"({a} * {src.align(b, arg_dims[1], arg_dims[0])}).sum({axes if len(axes) > 1 else axes[0]})", lead)
        elif op == "outer":
            a, b = (src.align(self.tensor(v), da, dims) for v, da in zip(vals, arg_dims))
            self.assign(n, f"{a} * {b}", lead)
        elif op == "matmul":  # contract the last dim of the first with the first of the second
            dx, dy = arg_dims
            union = dx + tuple(x for x in dy if x not in dx)
            a, b = (src.align(self.tensor(v), da, union) for v, da in zip(vals, arg_dims))
            self.assign(n, f"({a} * {b}).sum({union.index(dx[-1]) - len(union)})", lead)
        else:
            raise AssertionError(op)

    def stat(self, n: int) -> None:
        d = self.nodes[n]
        self.m.use(self.m.runtime + ".carry", "statistic")
        lead = ("B" if "batch" in d["groups"] else "1", "1", "H" if "head" in d["groups"] else "1")
        scope = f"per {', '.join(d['groups'])}" if d["groups"] else "over the whole input"
        self.assign(n, f"statistic(call, {src.text(d['name'])}, {src.text(d['fn'])}, {self.full(d['args'][0])}, {src.names(d['groups'])})", lead,
                    f"{d['fn']} {scope} unless given, stop-gradient")  # fmt: skip
        self.carried_stats.append((self.env[n].code, d["groups"]))

    def block_attention(self, n: int) -> None:
        d = self.nodes[n]
        self.m.use(self.m.runtime + ".carry", "block_attention")
        self.m.use(self.m.runtime + ".scan", "attention_dtype")
        q, k, v, scale, *residual = d["args"]  # the plan's epilogue: a residual and a weight (passes/epilogue.py)
        size = str(d["size"]) if isinstance(d["size"], int) else self.dims[d["size"]]
        args = ", ".join([self.full(q), self.full(k), self.full(v), self.env[scale].code, size, "attention_dtype(call)", "attention"]
                         + ([self.full(residual[0]), repr(d["weight"])] if residual else []))  # fmt: skip
        index = len(self.carried_windows)
        name, window = self.spec_names.get(n) or self.names.claim(f"t{n}"), self.names.claim(f"window{index}")
        if residual:
            self.lines.append(f"# {d['weight']!r} * (the attention + {self.env[residual[0]].code}), added and scaled as the kernel stores it")
        self.lines.append(f"{name}, {window} = {self.m.uses(f'block_attention(call, {index}, {args})')}"
                          f"  # {src.shape(('B', 'T', 'H'), d['dims'])}: causal softmax in blocks of {d['size']}, its window if asked")  # fmt: skip
        self.env[n] = _Value(name, False, ("B", "T", "H"))
        self.carried_windows.append(window)

    def scan(self, state: str) -> None:
        """One scan_group call: the plan's scan group of `state` (several states: values side by side)."""
        group = self.plan.group(state)
        index = self.plan.groups.index(group)
        scans = [self.c.classification.scan(name) for name in group.states]
        s = scans[0]
        fused = " (one scan, values side by side)" if len(group.states) > 1 else ""
        self.lines.append(f"# scan {' + '.join(group.states)}{fused}: {s.describe()}, chunk {group.chunk}")
        if not s.plain:
            self.substeps(s, group.decay.kind, group.chunk, index, group.strengths)
            return
        self.m.use(self.m.runtime + ".scan", "scan_group")

        def operand(n: int | None) -> str:
            return "None" if n is None else self.tensor(self.env[n])

        outs = []
        for t in scans:
            names = []
            for r in t.reads:
                name = self.spec_names.get(r.node) or self.names.claim(f"{t.state}_read")
                self.env[r.node] = _Value(name, False, ("B", "T", "H"))
                names.append(name)
            outs.append(f"[{', '.join(names)}]")
        reads = ", ".join(f"({operand(r.query)}, {src.text(p)})" for r, p in zip(s.reads, group.reads))
        when = "; ".join(f"{expr(self.g, r.query)} @ {s.state} {r.when}" for r in s.reads)
        self.lines += [
            f"[{', '.join(outs)}], [{', '.join(self.states[st] for st in group.states)}] = scan_group(",
            f"    scan[{index}][0], ({self.B}, {self.T}, {self.H}),",
            f"    key={'None' if group.strengths else operand(s.write_key)},",
            f"    values=[{', '.join('None' if t.value_dim is None else operand(t.write_value) for t in scans)}],",
            f"    erase={operand(s.erase_key)},",
            f"    log_decay={operand(s.log_decay)},",
            f"    decay={src.text(group.decay.kind)},",
            f"    reads=[{reads}],{'  # ' + when if when else ''}",
            f"    h0=[{', '.join(f'call.initial_state[{src.text(st)}]' for st in group.states)}],",
            "    cu_seqlens=call.cu_seqlens,",
            f"    chunk={group.chunk},",
            f"    normaliser=scan[{index}][1],",
            *([f"    strength={operand(group.strengths[0])},  # the write key is -strength * erase"] if group.strengths else []),
            *([f"    divide={group.divide!r},  # {self._divided(group)}"] if group.divide is not None else []),
            ")",
        ]
        self.done.update(group.states)

    def _divided(self, group) -> str:
        """What a folded division (ScanGroup.divide) gives, in the spec's terms."""
        (matrix,) = (st for st in group.states if st != group.normaliser)
        return f"{matrix}'s read / ({group.normaliser}'s read + {group.divide!r}), divided as the scan stores it"

    def substeps(self, s, decay: str, chunk: int, index: int, strengths: tuple[int, ...]) -> None:
        """One substep_scan call (lamixer.runtime.substeps): a scan whose token update is several writes, or one no
        kernel runs; a vector state runs as a one-column matrix, as the torch backend runs it."""
        self.m.use(self.m.runtime + ".substeps", "substep_scan")

        def operand(n: int | None) -> str:
            return "None" if n is None else self.tensor(self.env[n])

        names = []
        for r in s.reads:
            name = self.spec_names.get(r.node) or self.names.claim(f"{s.state}_read")
            self.env[r.node] = _Value(name, False, ("B", "T", "H"))
            names.append(name)
        one = "torch.ones((1, 1, 1, 1), dtype=dtype, device=device)"
        value = (lambda w: one) if s.value_dim is None else (lambda w: operand(w.value))
        writes = [f"({'None' if strengths else operand(w.key)}, {value(w)}, {operand(w.erase)}, {operand(w.log_decay)}, {w.erase_before_decay})"
                  for w in s.writes]  # fmt: skip
        h0 = f"call.initial_state[{src.text(s.state)}]"
        axis = -1 if s.value_dim is None else -2 if s.key_dim is None else None
        state = self.states[s.state]
        self.lines += [
            f"[{', '.join(names)}], {state} = substep_scan(",
            f"    scan[{index}][0], ({self.B}, {self.T}, {self.H}),",
            f"    writes=[{', '.join(writes)}],  # (key, value, erase, log decay, erase before decay) per write, in order",
            f"    decay={src.text(decay)},",
            f"    reads=[{', '.join(f'({operand(r.query)}, {r.step}, {src.text(r.position)})' for r in s.reads)}],",
            f"    h0={h0 if axis is None else f'{h0}.unsqueeze({axis})'},",
            "    cu_seqlens=call.cu_seqlens,",
            f"    chunk={chunk},",
            *([f"    strengths=[{', '.join(operand(n) for n in strengths)}],  # each write's key is -strength * erase"] if strengths else []),
            ")",
        ]
        if axis is not None:
            self.lines.append(f"{state} = {state}.squeeze({axis})")
        if s.value_dim is None:
            self.lines += [f"{name} = {name}.squeeze(-1)" for name in names]
        self.done.add(s.state)

    def forward(self) -> list[str]:
        """The body of forward(call, scan)."""
        self.done: set[str] = set()
        for n in self.plan.order:
            op = self.nodes[n]["op"]
            if n in self.plan.read_scan:
                if self.plan.read_scan[n] not in self.done:
                    self.scan(self.plan.read_scan[n])
            elif op in VALUE_LEAVES:
                self.leaf(n)
            elif op == "stat":
                self.stat(n)
            elif op == "block_attention":
                self.block_attention(n)
            elif op != "output" and n not in self.unread:
                self.pointwise(n)
        for s in self.c.classification.scans:
            if s.state not in self.done:
                self.scan(s.state)
        o = self.full(self.nodes[self.g.output]["args"][0])
        head = [f"{', '.join([self.B, self.T, self.H])} = call.batch, call.length, call.heads"]
        used = [d for d, local in self.dims.items() if any(re.search(rf"\b{local}\b", line.split("#")[0]) for line in self.lines)]
        if used:
            head.append(f"{', '.join(self.dims[d] for d in used)} = {', '.join(f'call.sizes[{src.text(d)}]' for d in used)}")
        if any(self.nodes[n]["op"] == "scale" for n in self.plan.order):
            head.append(f"{self.scale} = call.scale")
        uses_device = any("device=device" in line or "dtype, device)" in line for line in self.lines)  # a fill's (ops.filled)
        head.append("dtype, device = call.compute_dtype, call.device" if uses_device else "dtype = call.compute_dtype")
        # o in the caller's dtype here, where torch.compile fuses the cast into the last per-token kernel
        finals = f"[{', '.join(self.states[s] for s in self.g.states)}]"
        if self.carried_stats or self.carried_windows:
            self.m.use(self.m.runtime + ".carry", "extras")
            stats = ", ".join(f"({code}, {src.names(groups)})" for code, groups in self.carried_stats)
            finals += f" + extras(call, [{', '.join(self.carried_windows)}], [{stats}])"
        return head + self.lines + [f"return {o}.to(call.out_dtype), {finals}"]


def default_scale(compiled: Compiled, module: Module) -> list[str]:
    """The body of default_scale(sizes): the scale when the call gives none, from the call's dim sizes."""
    g, plan = compiled.graph, compiled.plan
    names = Names(("sizes", "torch"))
    env: dict[int, _Value] = {}
    lines = []
    for n in plan.scale_order:
        d = plan.nodes[n]
        if d["op"] == "const":
            env[n] = _Value(src.number(d["value"]), True)
        elif d["op"] == "dim":
            env[n] = _Value(f"sizes[{src.text(d['name'])}]", True)
        else:
            vals = [env[a] for a in d["args"]]
            if d["op"] == "binary" and all(v.number for v in vals) or d["op"] == "unary" or d["fn"] in ("max", "min"):
                vals = [_Value(module.uses(f"torch.tensor({v.code}, dtype=torch.float64)") if v.number else v.code, False) for v in vals]
            code = src.unary(d["fn"], vals[0].code) if d["op"] == "unary" else src.binary(d["fn"], vals[0].code, vals[1].code)
            name = names.claim(f"t{n}")
            lines.append(f"{name} = {module.uses(code)}")
            env[n] = _Value(name, False)
    result = env[g.scale_default]
    return lines + [f"return {result.code}" if plan.nodes[g.scale_default]["op"] == "const" else f"return float({result.code})"]


def _operand(op: Operand) -> str:
    """An operand of the compiled signature as a literal: its declared domain with it where it has one, so a package
    checks the inputs' values as lamixer does (runtime/call.py: check_domains)."""
    domain = f", domain=({src.number(op.domain[0])}, {src.number(op.domain[1])})" if op.domain != Operand.domain else ""
    return f"Operand({src.text(op.name)}, {src.text(op.kind)}, {src.names(op.dims)}, {op.per_head}{domain})"


def _size(size: int | str) -> str:
    """A block attention's size as a literal: a number, or a dim's name."""
    return src.text(size) if isinstance(size, str) else str(size)


def _layout(dims, per_head=False, lead=("B", "T", "H")) -> str:
    return src.shape(lead if lead else (("H",) if per_head else ()), dims)


def module(compiled: Compiled, runtime: str, has_kernels: bool) -> str:
    """The text of <package>/mixer.py. runtime: the runtime's module path from it (".runtime" or "..runtime");
    has_kernels: whether scans.py runs its scans on Triton kernels (else why not is kernels.unsupported's)."""
    g = compiled.graph
    title = f"{g.name}: {g.title}" if g.title else g.name
    fn = Names(MODULE_NAMES).claim(g.name)
    triton_missing = [] if has_kernels else kernels_mod.unsupported(compiled)
    scans = "runtime/scan.py" + ("; on CUDA, the Triton kernels through scans.py" if has_kernels else "; no Triton kernels cover this spec")
    m = Module(f"""{src.doc(title)}

Generated by lamixer from `{src.spec_file(compiled)}`; do not edit. `{fn}(...)` is the mixer; `forward`
is its kernel plan written out: the per-token work one line per node, each scan one scan_group call
({scans}).
""", runtime)
    w = MixerWriter(compiled, m, fn)
    body = w.forward()
    for name in ("Operand", "Signature", "bind", "check", "check_flags", "results"):
        m.use(runtime + ".call", name)
    if not has_kernels:
        m.use(runtime + ".call", "pick_backend")
    else:
        m.use(runtime, "fuse")
        m.use(runtime + ".scan", "STATES_IN_PLACE")
    m.use(runtime + ".scan", "torch_scan")
    params = Names(MODULE_NAMES + CALL_ARGUMENTS + (fn, "call", "scan", "fused", "attention"), builtin_names=False)  # the call's body calls no builtin
    args = {op.name: params.claim(op.name) for op in g.operands}
    operands = "".join(f"\n        {_operand(op)}," for op in compiled.signature.operands)
    states = "".join(f"\n        ({src.text(n)}, {src.names(s.dims)})," for n, s in g.states.items())
    sig = compiled.signature
    carries = bool(sig.stats or sig.blocks)  # given statistics, block attention's window (runtime/carry.py)
    carried = ([f"    stats=({''.join(f'({src.text(n)}, {src.names(gr)}), ' for n, gr in sig.stats).rstrip(' ')}),"] if sig.stats else []) + \
        ([f"    blocks=({''.join(f'({_size(b[0])}, {src.text(b[1])}, {src.text(b[2])}), ' for b in sig.blocks).rstrip(' ')}),"] if sig.blocks else [])
    m.write("SIGNATURE = Signature(", f"    {src.text(g.name)},", f"    operands=({operands}\n    ),", f"    states=({states}\n    ),",
            f"    uses_scale={g.uses_scale},", *carried, ")", 'BACKENDS = ("auto", "torch", "triton")',
            "BINDINGS: dict = {}  # what the checks of earlier calls found, per call signature (runtime/call.py: bind)")  # fmt: skip
    if not has_kernels:
        m.write(f"TRITON_MISSING = ({''.join(src.text(r) + ', ' for r in triton_missing).rstrip(' ')})  # why the torch fallback runs every call")
    out_dims = g.dims_of(g.output)
    shapes: dict[str, list[str]] = {}
    for op in g.operands:
        shapes.setdefault(_layout(op.dims, op.per_head, None if op.kind == "param" else ("B", "T", "H")), []).append(args[op.name])
    inputs = "; ".join(f"{', '.join(names)} {layout}" for layout, names in shapes.items())
    state_text = ", ".join(f"{n} {src.shape(('N', 'H'), s.dims)}" for n, s in g.states.items())
    scale_text = default_scale_text(compiled)
    several = len(g.states) > 1
    call_doc = f"""o, final_state = {fn}({', '.join(args.values())}): {src.doc(g.title or g.name)}.

    {inputs} -> {g.output_name} {src.shape(('B', 'T', 'H'), out_dims)}
    initial_state, final_state: {state_text}{' (a tuple, in this order)' if several else ''}; N is B, or the number of packed sequences
    scale: a number (default {scale_text}); cu_seqlens: the [N + 1] offsets of packed sequences in one batch row (B = 1)
    backend: "auto" (the Triton kernels on CUDA when they can run the call, else torch), "torch" or "triton"
    Returns o in the first input's dtype and, with output_final_state=True, the final state(s) in float32
    (float64 for float64 inputs); computes in float32 (float64 for float64 inputs)."""
    signature = ", ".join(args.values())
    lines = [
        "",
        "",
        f'def {fn}({signature}, *, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None, backend="auto"'
        f'{", stats=None, window=None, output_stats=False, output_window=False" if carries else ""}):',
        f'    """{call_doc}\n    """',
        "    check_flags(backend, BACKENDS, output_final_state)",
        f"    call = bind(SIGNATURE, BINDINGS, ({', '.join(args.values())}{',' if len(args) == 1 else ''}), {{}}, scale, initial_state, cu_seqlens, None,",
        f"                lambda: check(SIGNATURE, {{{', '.join(f'{src.text(n)}: {a}' for n, a in args.items())}}}, scale, initial_state, cu_seqlens, default_scale))",
    ]
    if carries:
        m.use(runtime + ".carry", "attach")
        lines.append("    call = attach(SIGNATURE, call, stats, window, output_stats, output_window)")
    if not has_kernels:
        lines += ["    pick_backend(SIGNATURE.name, backend, call, list(TRITON_MISSING))  # refuses backend=\"triton\"",
                  f"    o, finals = forward(call, [(torch_scan, False)] * {len(compiled.plan.groups)})"]  # fmt: skip
    else:
        attention = ", attention" if sig.blocks else ""  # block attention's kernel, when the scans' are Triton's
        lines += [
            f"    scan, fused{attention} = [(torch_scan, False)] * {len(compiled.plan.groups)}, False{', None' if sig.blocks else ''}",
            '    if backend != "torch":',
            "        from . import scans",
            "",
            "        scan = scans.choose(call, backend)",
            "        fused = scans.fused(scan, call)",
            *(["        attention = scans.attention(scan)"] if sig.blocks else []),
            "    # on a GPU, torch.compile fuses the per-token work around the kernels (a compiled copy per in-place mode)",
            f"    o, finals = fuse.run(forward, SIGNATURE.name, call, scan{attention}, when=fused, version=STATES_IN_PLACE.get())",
        ]
    lines += ["    return results(call, o, finals, output_final_state, SIGNATURE)" if carries else "    return results(call, o, finals, output_final_state)", "", ""]
    lines += ["def default_scale(sizes):", f'    """The scale when the call gives none: {scale_text}, for the call\'s dim sizes."""']
    lines += ["    " + line for line in default_scale(compiled, m)]
    lines += ["", "", f"def forward(call, scan{', attention=None' if sig.blocks else ''}):",
              '    """The kernel plan on a bound call, with scan[i] = (what runs scan group i, whether it carries the group\'s normaliser)'
              + ("" if sig.blocks else ":"),
              ("    and attention block attention's kernel (None: torch's SDPA): " if sig.blocks else "    ")
              + '(o, [final state of each state]) in the compute dtype."""']  # fmt: skip
    lines += ["    " + line if line else "" for line in body]
    m.write(*lines)
    return m.text()
