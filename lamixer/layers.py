"""Layers built from a spec's `layer` section: hidden state -> the mixer's inputs -> mixer -> hidden state.

Everything a layer does comes from the lowered layer section (lamixer.ir.LayerInfo) and the options
it declares; this module knows no mixer by name. The pipeline, in this order:

    x [B, T, hidden] --conv hidden--> --shift--> --proj--> --conv value--> --map (as written)-->
        --rotary--> mixer inputs
    mixer(..., initial_state, cu_seqlens) -> o [B, T, H, V] --norm / out_gate (as written)--> o_proj -> y

The state a layer carries between calls (LayerState) is the mixer's recurrent state(s), the last
kernel-1 inputs of every short convolution (and the token shift's last input) and the number of
tokens seen, per sequence.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from . import ir, ops
from . import syntax as S
from .call import BACKENDS, check_cu_seqlens
from .errors import ArgumentError, LamixerError
from .lower import HIDDEN, canonical_fn
from .mixer import Mixer, load

NORM_EPS = 1e-5
SHIFT = "@shift"  # the token shift's cache in LayerState.conv (no input can be named so)
Value = tuple[torch.Tensor, tuple[str, ...]]  # a tensor whose trailing axes are the named dims


@dataclass
class LayerState:
    """What a layer carries from one call to the next, for N sequences."""

    spec: str  # the spec's name and source hash: a state fits only the layer it came from
    batch: int  # N, the number of sequences
    mixer: tuple[torch.Tensor, ...]  # the mixer's states in declaration order, [N, H, ...] each
    conv: dict[str, torch.Tensor] = field(default_factory=dict)  # conv cache [N, channels, kernel - 1]
    position: torch.Tensor | None = None  # [N] tokens seen so far per sequence (where rotary continues)


# ---- expressions of the layer section (already checked by lamixer.lower) ----
def _inv_softplus(x: torch.Tensor) -> torch.Tensor:
    return x + torch.log(-torch.expm1(-x))


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
    return (_inv_softplus(x) if fn == "inv_softplus" else ops.UNARY[fn](x)), d


def _binary(fn: str, a: Value, b: Value) -> Value:
    (x, dx), (y, dy) = a, b
    want = dy if set(dx) <= set(dy) else dx
    # a 0-d number stays 0-d, so it takes the other operand's dtype instead of promoting it to float64
    x = x if x.dim() == 0 else ops.align(x, dx, want)
    y = y if y.dim() == 0 else ops.align(y, dy, want)
    return ops.BINARY[fn](x, y), want


# ---- argument checks ----
def _whole(value, what: str, argument: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not float(value).is_integer() or value < 1:
        raise ArgumentError(argument, f"{what} must be a whole number >= 1, got {value!r}")
    return int(value)


# ---- building blocks ----
def _projection(hidden: int, width: int, rank: int | None, activation: str | None, bias: bool) -> nn.Module:
    if rank is None:
        return nn.Linear(hidden, width, bias=bias)
    # low rank: hidden -> rank -> width; the up-projection carries the bias (GLA's gate)
    layers: list[nn.Module] = [nn.Linear(hidden, rank, bias=False)]
    if activation is not None:
        layers.append(_Activation(activation))
    layers.append(nn.Linear(rank, width, bias=bias))
    return nn.Sequential(*layers)


class _Activation(nn.Module):
    def __init__(self, fn: str):
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.UNARY[self.fn](x)


def _causal(fn, keep: int, x: torch.Tensor, cache: torch.Tensor, cu: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """fn over time of x [B, T, C] that sees the `keep` inputs before each token, continuing from
    cache [N, C, keep]; returns fn's output [B, T, C] and the new cache.

    fn maps [b, C, keep + t] to [b, C, t]. Packed sequences go one by one so nothing reaches across
    a boundary."""
    xt = x.transpose(1, 2)
    if cu is None:
        parts, caches = [(xt, cache)], None
    else:
        bounds = cu.tolist()
        parts = [(xt[:, :, s:e], cache[n : n + 1]) for n, (s, e) in enumerate(zip(bounds, bounds[1:]))]
    ys, new = [], []
    for seq, past in parts:
        full = torch.cat([past.to(seq.dtype), seq], dim=2)
        ys.append(fn(full))
        new.append(full[:, :, full.shape[2] - keep :])
    caches = torch.cat(new, dim=0)
    return torch.cat(ys, dim=2).transpose(1, 2), caches


def _previous(full: torch.Tensor) -> torch.Tensor:
    """x_{t-1} for every token, given the one input before the first."""
    return full[:, :, :-1]


def _positions(B: int, T: int, cu: torch.Tensor | None, offset: torch.Tensor, device) -> torch.Tensor:
    """Each token's position in its own sequence, continuing from offset [N]: [B, T] (B = 1 when packed)."""
    t = torch.arange(T, device=device)
    if cu is None:
        return t[None, :] + offset[:, None]
    seq = torch.searchsorted(cu[1:], t, right=True)  # which packed sequence each token is in
    return (t - cu[seq] + offset[seq])[None, :]


def _rotate(x: torch.Tensor, pos: torch.Tensor, base: float) -> torch.Tensor:
    """Rotary embedding of x [B, T, H, D]: pairs (i, i + D/2) turned by pos * base^(-2i/D)."""
    half = x.shape[-1] // 2
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    inv_freq = base ** (-torch.arange(half, device=x.device, dtype=dtype) * 2 / x.shape[-1])
    angle = (pos.to(dtype)[..., None] * inv_freq)[:, :, None, :]  # [B, T, 1, D/2]
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def _norm(kind: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """RMSNorm or LayerNorm over the last axis, in float32 at least (bf16 squares lose too much)."""
    dtype = x.dtype
    x = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    if kind == "rmsnorm":
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + NORM_EPS) * weight.to(x.dtype)
    else:
        y = F.layer_norm(x, x.shape[-1:], weight.to(x.dtype), bias.to(x.dtype), NORM_EPS)
    return y.to(dtype)


class Layer(nn.Module):
    """A token-mixing layer built from a spec's `layer` section.

        layer = lamixer.Layer("gla", hidden_size=1024, num_heads=4)
        y = layer(x)                                    # x [B, T, hidden]
        y, state = layer(prompt, return_state=True)
        y_t, state = layer.step(x_t, state)             # x_t [B, hidden]

    options override the section's `option` defaults, or the size of a dim that has a default (`M=32`).
    """

    def __init__(self, spec: str | Path | Mixer, hidden_size: int, num_heads: int, *, backend: str = "auto", **options):
        super().__init__()
        self.mixer = spec if isinstance(spec, Mixer) else load(spec)
        graph = self.mixer.compiled.graph
        if graph.layer is None:
            raise ArgumentError("spec", f"{self.mixer.name} has no layer section: add `layer` and its statements to the spec")
        self.info: ir.LayerInfo = graph.layer
        self.hidden_size = _whole(hidden_size, "hidden_size", "hidden_size")
        self.num_heads = _whole(num_heads, "num_heads", "num_heads")
        if not isinstance(backend, str) or backend not in BACKENDS:
            raise ArgumentError("backend", f"must be one of {', '.join(BACKENDS)}, got {backend!r}")
        self.backend = backend
        self.options = self._options(graph, options)
        self.sizes = self._sizes(graph)
        self.spec_key = f"{self.mixer.name}:{self.mixer.compiled.source_hash}"
        # a whole-input statistic or block attention sees the entire input, so it cannot be carried in a state
        self.stateful = not any(d["op"] in ("stat", "block_attention") for _, d in graph.g.nodes(data=True))
        self.value_dims = graph.dims_of(graph.output)
        self._build()
        self._fixed: dict[str, Value] | None = None  # see _inputs
        self._shapes: dict[int, dict[str, tuple[int, ...]]] = {}  # see _check_state

    # -- construction --
    def _options(self, graph: ir.Graph, given: dict) -> dict[str, float]:
        values = dict(self.info.options)
        sized = {d: n for d, n in graph.dims.items() if n is not None}
        for key, value in given.items():
            if key not in values and key not in sized:
                known = ", ".join(list(values) + list(sized)) or "none"
                raise ArgumentError(key, f"{self.mixer.name}'s layer has no option '{key}' (its options: {known})")
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
                raise ArgumentError(key, f"must be a finite number, got {value!r}")
            values[key] = float(value)
        for d, n in sized.items():
            if d not in self.info.sizes:
                values[d] = _whole(values.get(d, n), f"the size of dim '{d}'", d)
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
                continue
            value = float(_evaluate(self.info.sizes[dim], env)[0])
            if not (math.isfinite(value) and value >= 1 and abs(value - round(value)) < 1e-9):
                chosen = ", ".join(f"{k}={v:g}" for k, v in self.options.items())
                raise ArgumentError("hidden_size", f"dim {dim} of {self.mixer.name} comes out as {value:g}, not a whole number >= 1, "
                                    f"for hidden_size={self.hidden_size}, num_heads={self.num_heads}" + (f", {chosen}" if chosen else ""))  # fmt: skip
            sizes[dim] = round(value)
        return sizes

    def _count(self, value: int | str) -> int:
        return value if isinstance(value, int) else _whole(self.options[value], f"option '{value}'", value)

    def _width(self, dims: tuple[str, ...], shared: bool = False) -> int:
        return math.prod(self.sizes[d] for d in dims) * (1 if shared else self.num_heads)

    def _build(self) -> None:
        info, hidden = self.info, self.hidden_size
        self.widths = {p.name: self._width(p.dims, p.shared) for p in info.projs}
        self.proj = nn.ModuleDict({p.name: _projection(hidden, self.widths[p.name], None if p.rank is None else self._count(p.rank), p.activation, p.bias)
                                   for p in info.projs})  # fmt: skip
        self.conv = nn.ModuleDict()
        for c in info.convs:
            channels = hidden if c.name == HIDDEN else self.widths[c.name]
            self.conv[c.name] = nn.Conv1d(channels, channels, self._count(c.kernel), groups=channels, bias=False)
        # token shift: per channel mix mu of x_t and x_{t-1}, plus a low-rank data-dependent part
        self.shift_mu = nn.ParameterDict({s.name: nn.Parameter(torch.full((hidden,), 0.5)) for s in info.shifts})
        ranked = [s for s in info.shifts if s.rank is not None]
        self.shift_lora = nn.ModuleDict({s.name: _projection(hidden, hidden, self._count(s.rank), "tanh", False) for s in ranked})
        self.shift_mu_x = nn.Parameter(torch.full((hidden,), 0.5)) if ranked else None
        self.params = nn.ParameterDict({name: nn.Parameter(self._init(p)) for name, p in info.params.items()})
        heads, width = self.num_heads, self._width(self.value_dims)
        self.post = nn.ModuleList()
        for p in info.post:
            if p.kind == "gate":
                self.post.append(nn.Linear(hidden, width, bias=False))
            else:
                n = width // heads if p.per_head else width
                norm = nn.Module()
                norm.weight = nn.Parameter(torch.ones(n))
                norm.bias = nn.Parameter(torch.zeros(n)) if p.fn == "layernorm" else None
                self.post.append(norm)
        self.o_proj = nn.Linear(width, hidden, bias=False)
        operands = {op.name: op for op in self.mixer.compiled.graph.operands}
        for r in info.rotary:
            dim = operands[r.name].dims[0]
            if self.sizes[dim] % 2:
                raise ArgumentError("hidden_size", f"rotary turns pairs of features, but {r.name} has an odd {dim} = {self.sizes[dim]}")

    def _init(self, p: ir.LayerParamInfo) -> torch.Tensor:
        """A param's initial value from its init expression, drawn in float64 with torch's generator."""
        shape = ((self.num_heads,) if p.per_head else ()) + tuple(self.sizes[d] for d in p.dims)

        def draw(fn: str, a: float, b: float) -> torch.Tensor:
            if fn == "normal":
                return torch.randn(shape, dtype=torch.float64) * b + a
            if fn == "log_uniform":
                return torch.exp(torch.empty(shape, dtype=torch.float64).uniform_(math.log(a), math.log(b)))
            return torch.empty(shape, dtype=torch.float64).uniform_(a, b)

        env = {**self._constants(), **{d: (torch.tensor(float(n), dtype=torch.float64), ()) for d, n in self.sizes.items()}}
        value = _evaluate(p.init, env, draw)[0]
        return value.expand(shape).clone().to(torch.get_default_dtype())

    # -- running --
    def extra_repr(self) -> str:
        sizes = ", ".join(f"{d}={n}" for d, n in self.sizes.items())
        return f"{self.mixer.name}, hidden_size={self.hidden_size}, num_heads={self.num_heads}, {sizes}"

    def _check_x(self, x, name: str, rank: int) -> None:
        layout = "[B, T, hidden]" if rank == 3 else "[B, hidden]"
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            raise ArgumentError(name, f"must be a floating-point tensor {layout}")
        if x.dim() != rank or x.shape[-1] != self.hidden_size or 0 in x.shape:
            raise ArgumentError(name, f"must have shape {layout} with hidden = {self.hidden_size}, got {list(x.shape)}")

    def _check_state(self, state, N: int) -> None:
        if not isinstance(state, LayerState):
            raise ArgumentError("state", f"must be a lamixer.LayerState from this layer, got {type(state).__name__}")
        if state.spec != self.spec_key:
            raise ArgumentError("state", f"comes from a layer of another spec ({state.spec.split(':')[0]}), not {self.mixer.name}")
        if state.batch != N:
            raise ArgumentError("state", f"holds {state.batch} sequences, but the input has {N}")
        if not isinstance(state.position, torch.Tensor) or tuple(state.position.shape) != (N,):
            raise ArgumentError("state", f"needs position, the tokens each of its {N} sequences has seen ([N] integers)")
        need = self._shapes.get(N)
        if need is None:  # the shapes of initial_state(N), worked out once per N
            want = self.initial_state(N, device="meta")
            need = {**{f"mixer[{i}]": s.shape for i, s in enumerate(want.mixer)}, **{f"conv[{k}]": c.shape for k, c in want.conv.items()}}
            self._shapes = {**(self._shapes if len(self._shapes) < 64 else {}), N: need}
        got = {**{f"mixer[{i}]": s for i, s in enumerate(state.mixer)}, **{f"conv[{k}]": c for k, c in state.conv.items()}}
        for key in set(got) | set(need):
            if key not in got or key not in need or got[key].shape != need[key]:
                have = list(got[key].shape) if key in got else "nothing"
                should = list(need[key]) if key in need else "nothing"
                raise ArgumentError("state", f"{key} is {have}, but this layer's is {should} (a state of a layer built with other sizes?)")

    def initial_state(self, batch: int, device=None, dtype: torch.dtype = torch.float32) -> LayerState:
        """A zero state for `batch` sequences (what state=None means)."""
        g = self.mixer.compiled.graph
        mixer = tuple(torch.zeros((batch, self.num_heads, *[self.sizes[d] for d in info.dims]), device=device, dtype=dtype) for info in g.states.values())
        conv = {name: torch.zeros(batch, c.in_channels, c.kernel_size[0] - 1, device=device, dtype=dtype) for name, c in self.conv.items()}
        if self.info.shifts:
            conv[SHIFT] = torch.zeros(batch, self.hidden_size, 1, device=device, dtype=dtype)
        return LayerState(self.spec_key, batch, mixer, conv, torch.zeros(batch, dtype=torch.int64, device=device))

    def forward(self, x: torch.Tensor, state: LayerState | None = None, cu_seqlens: torch.Tensor | None = None, return_state: bool = False):
        """y = layer(x); y, state = layer(x, state, return_state=True). x is [B, T, hidden]; packed sequences: B = 1 and cu_seqlens."""
        self._check_x(x, "x", 3)
        if not isinstance(return_state, bool):
            raise ArgumentError("return_state", f"must be True or False, got {return_state!r}")
        B, T, _ = x.shape
        cu = None if cu_seqlens is None else check_cu_seqlens(cu_seqlens, B, T, x.device)
        N = B if cu is None else len(cu) - 1
        if not self.stateful and (state is not None or return_state):
            raise LamixerError(f"{self.mixer.name} uses whole-input statistics or block attention: it runs on whole sequences only, "
                               "so it takes no state and returns none")  # fmt: skip
        if state is not None:
            self._check_state(state, N)
        elif return_state:
            state = self.initial_state(N, x.device, x.dtype if x.dtype == torch.float64 else torch.float32)
        caches: dict[str, torch.Tensor] = {}
        offset = state.position.to(x.device) if state is not None else torch.zeros(N, dtype=torch.int64, device=x.device)
        inputs = self._inputs(x, state, cu, caches, offset)
        mixer_params = {name: self.params[name] for name, p in self.info.params.items() if p.of_mixer}
        o, finals = self.mixer(**inputs, **mixer_params, initial_state=None if state is None else state.mixer,
                               output_final_state=return_state, cu_seqlens=cu, backend=self.backend)  # fmt: skip
        y = self.o_proj(self._output(o, x))
        if not return_state:
            return y
        finals = finals if isinstance(finals, tuple) else (finals,)
        return y, LayerState(self.spec_key, N, finals, caches, offset + T if cu is None else offset + (cu[1:] - cu[:-1]))

    def step(self, x_t: torch.Tensor, state: LayerState | None = None) -> tuple[torch.Tensor, LayerState]:
        """Decode one token per sequence: x_t [B, hidden] -> (y_t [B, hidden], the next state)."""
        self._check_x(x_t, "x_t", 2)
        y, state = self.forward(x_t[:, None], state, return_state=True)
        return y[:, 0], state

    def _conv(self, name: str, x: torch.Tensor, state: LayerState | None, cu, caches: dict) -> torch.Tensor:
        if name not in self.conv:
            return x
        conv = self.conv[name]
        N = x.shape[0] if cu is None else len(cu) - 1
        cache = state.conv[name] if state is not None else x.new_zeros(N, conv.in_channels, conv.kernel_size[0] - 1)
        y, caches[name] = _causal(conv, conv.kernel_size[0] - 1, x, cache, cu)
        act = next(c.activation for c in self.info.convs if c.name == name)
        return y if act is None else ops.UNARY[act](y)

    def _inputs(self, x: torch.Tensor, state: LayerState | None, cu, caches: dict, offset: torch.Tensor) -> dict[str, torch.Tensor]:
        """The mixer's per-token inputs [B, T, H, *dims]: projections, convolutions, maps in order, rotations."""
        B, T, H = x.shape[0], x.shape[1], self.num_heads
        h = self._conv(HIDDEN, x, state, cu, caches)
        if self._fixed is None:  # the options' and dims' values, made once: a layer's sizes never change
            self._fixed = {**self._constants(), **{d: (_number(float(n)), ()) for d, n in self.sizes.items()}}
        env: dict[str, Value] = dict(self._fixed)
        for name, p in self.info.params.items():
            if not p.of_mixer:
                env[name] = (self.params[name], p.dims)
        mixes = self._shifted(h, state, cu, caches)
        for p in self.info.projs:
            y = self._conv(p.name, self.proj[p.name](mixes.get(p.name, h)), state, cu, caches)
            shape = [self.sizes[d] for d in p.dims]
            y = y.reshape(B, T, 1, *shape).expand(B, T, H, *shape) if p.shared else y.reshape(B, T, H, *shape)
            env[p.name] = (y, p.dims)
        for m in self.info.maps:
            value, dims = _evaluate(m.value, env)
            env[m.name] = (ops.align(value, dims, m.dims).expand(B, T, H, *[self.sizes[d] for d in m.dims]), m.dims)
        if self.info.rotary:
            pos = _positions(B, T, cu, offset, x.device)
            for r in self.info.rotary:
                env[r.name] = (_rotate(env[r.name][0], pos, float(self._count(r.base))), env[r.name][1])
        return {op.name: env[op.name][0] for op in self.mixer.compiled.graph.operands if op.kind == "input"}

    def _shifted(self, h: torch.Tensor, state: LayerState | None, cu, caches: dict) -> dict[str, torch.Tensor]:
        """Each shifted projection's input: h + (h_{t-1} - h) * mix, mix = mu (+ tanh(h_mix A) B when low-rank)."""
        if not self.info.shifts:
            return {}
        N = h.shape[0] if cu is None else len(cu) - 1
        cache = state.conv[SHIFT] if state is not None else h.new_zeros(N, h.shape[-1], 1)
        prev, caches[SHIFT] = _causal(_previous, 1, h, cache, cu)
        delta = prev - h
        base = h + delta * self.shift_mu_x if self.shift_mu_x is not None else None
        out = {}
        for s in self.info.shifts:
            mix = self.shift_mu[s.name] + (self.shift_lora[s.name](base) if s.name in self.shift_lora else 0)
            out[s.name] = h + delta * mix
        return out

    def _output(self, o: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Norms and output gates in the order the section writes them, then flatten the heads."""
        B, T, H, V = o.shape
        for p, module in zip(self.info.post, self.post):
            if p.kind == "gate":
                o = o * ops.UNARY[p.fn](module(x)).reshape(B, T, H, V)
            elif p.per_head:
                o = _norm(p.fn, o, module.weight, module.bias)
            else:
                o = _norm(p.fn, o.reshape(B, T, H * V), module.weight, module.bias).reshape(B, T, H, V)
        return o.reshape(B, T, H * V)
