"""lamixer.Layer: a spec's `layer` section, interpreted.

Everything a layer does comes from the lowered layer section (lamixer.ir.LayerInfo) and the options
it declares; this module knows no mixer by name. The building blocks, the order of the steps and what
every layer does around them (state, checks, decoding) are lamixer.runtime.blocks'; `lamixer compile`
writes the same steps out as a package's layer module (lamixer/emit/layer_module.py).
"""
from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn

from .api import Mixer, load
from .backends.binding import BACKENDS
from .errors import ArgumentError
from .frontend import syntax as S
from .ir import graph as ir
from .ir.lower import HIDDEN, canonical_fn
from .parallel.shard import check_group
from .parallel.slicing import layer_slice
from .runtime import ops
from .runtime.blocks import (
    SHIFT,
    LayerBase,
    LayerState,
    check_rotary,
    draw,
    initial_value,
    inv_softplus,
    lerp,
    norm_module,
    option,
    output_gate,
    output_norm,
    positions,
    projection,
    rotate,
    short_conv,
    short_conv_module,
    size,
    token_shift,
    whole,
)
from .runtime.call import check_backend
from .runtime.carry import Window, block_size
from .runtime.running import RunningStats, momentum_value

__all__ = ["SHIFT", "Layer", "LayerState", "Window"]

Value = tuple[torch.Tensor, tuple[str, ...]]  # a tensor whose trailing axes are the named dims


# ---- expressions of the layer section (already checked by lamixer.lower) ----
_NUMBERS: dict[str, torch.Tensor] = {}  # keyed by the exact bits (0.0 and -0.0 differ)


def _number(value: float) -> torch.Tensor:
    """A number as a 0-d float64 tensor, made once per value (nothing writes into it)."""
    if torch.compiler.is_compiling():
        return torch.tensor(value, dtype=torch.float64)
    key = value.hex()
    found = _NUMBERS.get(key)
    if found is None:
        if len(_NUMBERS) >= 1024:
            _NUMBERS.clear()
        found = _NUMBERS[key] = torch.tensor(value, dtype=torch.float64)
    return found


def _evaluate(e: S.Expr, env: dict[str, Value], draw=None) -> Value:
    """Evaluate an elementwise layer expression, broadcasting by dim name as the mixer does."""
    if isinstance(e, S.Num):
        return _number(float(e.value)), ()
    if isinstance(e, S.Name):
        return env[e.id]
    if isinstance(e, S.Neg):
        x, d = _evaluate(e.operand, env, draw)
        return -x, d
    if isinstance(e, S.BinOp):
        return _binary(e.op, _evaluate(e.left, env, draw), _evaluate(e.right, env, draw))
    if e.fn in ("uniform", "log_uniform", "normal"):
        lo, hi = (float(_evaluate(a, env, draw)[0]) for a in e.args)
        return draw(e.fn, lo, hi), ()
    args = [_evaluate(a, env, draw) for a in e.args]
    if len(args) == 2:
        return _binary(e.fn, *args)
    (x, d), fn = args[0], canonical_fn(e.fn)
    return (inv_softplus(x) if fn == "inv_softplus" else ops.UNARY[fn](x)), d


def _binary(fn: str, a: Value, b: Value) -> Value:
    (x, dx), (y, dy) = a, b
    want = ir.broadcast(dx, dy)
    # a 0-d number stays 0-d, so it takes the other operand's dtype instead of promoting it to float64
    x = x if x.dim() == 0 else ops.align(x, dx, want)
    y = y if y.dim() == 0 else ops.align(y, dy, want)
    return ops.BINARY[fn](x, y), want



class Layer(LayerBase):
    """A token-mixing layer built from a spec's `layer` section.

        layer = lamixer.Layer("gla", hidden_size=1024, num_heads=4)
        y = layer(x)                                    # x [B, T, hidden]
        y, state = layer(prompt, return_state=True)
        y_t, state = layer.step(x_t, state)             # x_t [B, hidden]

    options override the section's `option` defaults, or the size of a dim that has a default (`M=32`).
    context_parallel: a torch.distributed ProcessGroup whose ranks each pass a slice of the time axis of x
    (docs/context_parallel.md): convolutions and token shifts see the previous ranks' last tokens.
    """

    def __init__(self, spec: str | Path | Mixer, hidden_size: int, num_heads: int, *, backend: str = "auto", context_parallel=None,
                 **options):  # fmt: skip
        super().__init__()
        if context_parallel is not None:
            check_group(context_parallel)
        self.context_parallel = context_parallel
        self.mixer = spec if isinstance(spec, Mixer) else load(spec)
        graph = self.mixer.compiled.graph
        if graph.layer is None:
            raise ArgumentError("spec", f"{self.mixer.name} has no layer section: add `layer` and its statements to the spec")
        self.info: ir.LayerInfo = graph.layer
        self.spec_name = self.mixer.name
        self.hidden_size = whole(hidden_size, "hidden_size", "hidden_size")
        self.num_heads = whole(num_heads, "num_heads", "num_heads")
        self.backend = check_backend(backend, BACKENDS)
        self.options = self._options(graph, options)
        self.sizes = self._sizes(graph)
        self.spec_key = f"{self.mixer.name}:{self.mixer.compiled.source_hash}"
        self._running(graph)
        self.state_dims = tuple(s.dims for s in graph.states.values())
        self.shifted = bool(self.info.shifts)
        self.value_dims = graph.dims_of(graph.output)
        self._build()
        self._fixed: dict[str, Value] | None = None  # see _inputs

    # -- construction --
    def _options(self, graph: ir.Graph, given: dict) -> dict[str, float]:
        values = dict(self.info.options)
        sized = {d: n for d, n in graph.dims.items() if n is not None}
        for key, value in given.items():
            if key not in values and key not in sized:
                known = ", ".join(list(values) + list(sized)) or "none"
                raise ArgumentError(key, f"{self.mixer.name}'s layer has no option '{key}' (its options: {known})")
            values[key] = option(key, value)
        for d, n in sized.items():
            if d not in self.info.sizes:
                values[d] = whole(values.get(d, n), f"the size of dim '{d}'", d)
        return values

    def _constants(self) -> dict[str, Value]:
        return {k: (torch.tensor(float(v), dtype=torch.float64), ()) for k, v in self.options.items()}

    def _sizes(self, graph: ir.Graph) -> dict[str, int]:
        env = self._constants()
        env[HIDDEN] = (torch.tensor(float(self.hidden_size), dtype=torch.float64), ())
        env[ir.HEAD_DIM] = (torch.tensor(float(self.num_heads), dtype=torch.float64), ())
        sizes: dict[str, int] = {}
        for dim in graph.dims:
            if dim not in self.info.sizes:
                sizes[dim] = int(self.options[dim])
            else:
                sizes[dim] = size(dim, _evaluate(self.info.sizes[dim], env)[0], self.mixer.name, self.hidden_size, self.num_heads, self.options)
        return sizes

    def _count(self, value: int | str) -> int:
        return value if isinstance(value, int) else whole(self.options[value], f"option '{value}'", value)

    def _width(self, dims: tuple[str, ...], shared: bool = False) -> int:
        return math.prod(self.sizes[d] for d in dims) * (1 if shared else self.num_heads)

    def _build(self) -> None:
        info, hidden = self.info, self.hidden_size
        self.widths = {p.name: self._width(p.dims, p.shared) for p in info.projs}
        self.proj = nn.ModuleDict({p.name: projection(hidden, self.widths[p.name], None if p.rank is None else self._count(p.rank), p.activation, p.bias)
                                   for p in info.projs})  # fmt: skip
        self.conv = nn.ModuleDict({c.name: short_conv_module(hidden if c.name == HIDDEN else self.widths[c.name], self._count(c.kernel)) for c in info.convs})
        # token shift: per channel mix mu of x_t and x_{t-1}, plus a low-rank data-dependent part
        self.shift_mu = nn.ParameterDict({s.name: nn.Parameter(torch.full((hidden,), 0.5)) for s in info.shifts})
        ranked = [s for s in info.shifts if s.rank is not None]
        self.shift_lora = nn.ModuleDict({s.name: projection(hidden, hidden, self._count(s.rank), "tanh", False) for s in ranked})
        self.shift_mu_x = nn.Parameter(torch.full((hidden,), 0.5)) if ranked else None
        self.params = nn.ParameterDict({name: nn.Parameter(self._init(p)) for name, p in info.params.items()})
        heads, width = self.num_heads, self._width(self.value_dims)
        self.post = nn.ModuleList(nn.Linear(hidden, width, bias=False) if p.kind == "gate" else norm_module(width // heads if p.per_head else width, p.fn)
                                  for p in info.post)  # fmt: skip
        self.o_proj = nn.Linear(width, hidden, bias=False)
        if self.running_stats:
            stats = {d["name"]: (d["fn"], "head" in d["groups"]) for _, d in ir.stats(self.mixer.compiled.graph) if d["name"] in self.running_stats}
            self.stats = RunningStats(stats, self.num_heads, self.momentum)
        operands = {op.name: op for op in self.mixer.compiled.graph.operands}
        for r in info.rotary:
            dim = operands[r.name].dims[0]
            check_rotary(r.name, dim, self.sizes[dim])

    def _running(self, graph: ir.Graph) -> None:
        """Which statistics the layer keeps running estimates of (the section's `running`, unless its option is 0) and
        with what momentum; the layer decodes when it keeps them all (block attention decodes through its window)."""
        running, stats = self.info.running, {d["name"]: d for _, d in ir.stats(graph)}
        on = running is not None and (running.switch is None or self.options[running.switch] != 0)
        self.running_stats = tuple(n for n in running.stats if n in stats) if on else ()
        if on:
            m = running.momentum
            self.momentum = momentum_value(self.options[m] if isinstance(m, str) else m, m if isinstance(m, str) else None)
        self.stat_batches = {n: "batch" in stats[n]["groups"] for n in self.running_stats}
        self.stateful = set(stats) <= set(self.running_stats)
        self.windows = tuple((block_size(d["size"], self.sizes), self.sizes[graph.dims_of(d["args"][1])[0]], self.sizes[graph.dims_of(d["args"][2])[0]])
                             for _, d in ir.blocks(graph))  # fmt: skip

    def _init(self, p: ir.LayerParamInfo) -> torch.Tensor:
        """A param's initial value from its init expression, drawn in float64 with torch's generator."""
        shape = ((self.num_heads,) if p.per_head else ()) + tuple(self.sizes[d] for d in p.dims)
        env = {**self._constants(), **{d: (torch.tensor(float(n), dtype=torch.float64), ()) for d, n in self.sizes.items()}}
        return initial_value(_evaluate(p.init, env, lambda fn, a, b: draw(fn, a, b, shape))[0], shape)

    # -- running --
    def forward(self, x=None, state=None, cu_seqlens=None, return_state=False, *extra, **unknown):
        """y = layer(x) (LayerBase.forward); under context parallelism x is this rank's slice of the time axis and
        cu_seqlens the whole batch's packed offsets, the same on every rank."""
        if self.context_parallel is None or extra or unknown:  # (LayerBase names a stray argument)
            return super().forward(x, state, cu_seqlens, return_state, *extra, **unknown)
        shard = layer_slice(self, x, state, cu_seqlens, return_state, self.context_parallel)
        offset = torch.tensor(shard.before_piece, dtype=torch.int64, device=x.device)  # where each piece's rotation starts
        return self._mix(x, None, shard.local_cu, {}, offset, False, shard)[0]  # (the mixer's output settles the collectives)

    def _mix(self, x, state, cu, caches, offset, return_state, shard=None):
        inputs = self._inputs(x, state, cu, caches, offset, shard)
        mixer_params = {name: self.params[name] for name, p in self.info.params.items() if p.of_mixer}
        o, finals, *more = self.mixer(**inputs, **mixer_params, initial_state=None if state is None else state.mixer,
                                      output_final_state=return_state, cu_seqlens=cu if shard is None else None, backend=self.backend,
                                      context_parallel=shard, **self._carry(state, offset, return_state))  # fmt: skip
        self._carried(more, caches, return_state)
        return self.o_proj(self._output(o, x)), finals

    def _conv(self, name: str, x: torch.Tensor, state: LayerState | None, cu, caches: dict, shard=None) -> torch.Tensor:
        if name not in self.conv:
            return x
        cache = shard.cache(x, self.conv[name].kernel_size[0] - 1) if shard is not None else None if state is None else state.conv[name]
        y, caches[name] = short_conv(self.conv[name], x, cache, cu)
        act = next(c.activation for c in self.info.convs if c.name == name)
        return y if act is None else ops.UNARY[act](y)

    def _inputs(self, x: torch.Tensor, state: LayerState | None, cu, caches: dict, offset: torch.Tensor, shard=None) -> dict[str, torch.Tensor]:
        """The mixer's per-token inputs [B, T, H, *dims]: projections, convolutions, maps in order, rotations (shard: a
        context-parallel call's lamixer.parallel Shard, whose previous ranks' last tokens the convolutions see)."""
        B, T, H = x.shape[0], x.shape[1], self.num_heads
        h = self._conv(HIDDEN, x, state, cu, caches, shard)
        if self._fixed is None:  # the options' and dims' values, made once: a layer's sizes never change
            self._fixed = {**self._constants(), **{d: (_number(float(n)), ()) for d, n in self.sizes.items()}}
        env: dict[str, Value] = dict(self._fixed)
        for name, p in self.info.params.items():
            if not p.of_mixer:
                env[name] = (self.params[name], p.dims)
        mixes = self._shifted(h, state, cu, caches, shard)
        for p in self.info.projs:
            y = self._conv(p.name, self.proj[p.name](mixes.get(p.name, h)), state, cu, caches, shard)
            shape = [self.sizes[d] for d in p.dims]
            y = y.reshape(B, T, 1, *shape).expand(B, T, H, *shape) if p.shared else y.reshape(B, T, H, *shape)
            env[p.name] = (y, p.dims)
        for m in self.info.maps:
            value, dims = _evaluate(m.value, env)
            env[m.name] = (ops.align(value, dims, m.dims).expand(B, T, H, *[self.sizes[d] for d in m.dims]), m.dims)
        if self.info.rotary:
            pos = positions(B, T, cu, offset, x.device)
            for r in self.info.rotary:
                env[r.name] = (rotate(env[r.name][0], pos, float(self._count(r.base))), env[r.name][1])
        return {op.name: env[op.name][0] for op in self.mixer.compiled.graph.operands if op.kind == "input"}

    def _shifted(self, h: torch.Tensor, state: LayerState | None, cu, caches: dict, shard=None) -> dict[str, torch.Tensor]:
        """Each shifted projection's input: h + (h_{t-1} - h) * mix, mix = mu (+ tanh(h_mix A) B when low-rank)."""
        if not self.info.shifts:
            return {}
        cache = shard.cache(h, 1) if shard is not None else None if state is None else state.conv[SHIFT]
        delta, caches[SHIFT] = token_shift(h, cache, cu)
        base = lerp(h, delta, self.shift_mu_x) if self.shift_mu_x is not None else None
        return {s.name: lerp(h, delta, self.shift_mu[s.name] + (self.shift_lora[s.name](base) if s.name in self.shift_lora else 0)) for s in self.info.shifts}

    def _output(self, o: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Norms and output gates in the order the section writes them, then flatten the heads."""
        B, T, H, V = o.shape
        for p, module in zip(self.info.post, self.post):
            o = output_gate(o, module, x, ops.UNARY[p.fn]) if p.kind == "gate" else output_norm(p.fn, o, module, p.per_head)
        return o.reshape(B, T, H * V)
