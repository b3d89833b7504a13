"""A layer's building blocks, and what every layer does around its spec's own steps.

A layer maps a hidden state to a hidden state, in this order:

    x [B, T, hidden] --conv hidden--> --shift--> --proj--> --conv value--> --map (as written)-->
        --rotary--> mixer inputs
    mixer(..., initial_state, cu_seqlens) -> o [B, T, H, V] --norm / out_gate (as written)--> o_proj -> y

LayerBase holds what does not depend on the spec (argument and state checks, the state carried
between calls, decoding a token); a subclass supplies the spec's steps as `_mix`. lamixer.Layer
interprets a spec's layer section that way; a package from `lamixer compile` has them written out.

The state a layer carries between calls (LayerState) is the mixer's recurrent state(s), the last
kernel-1 inputs of every short convolution (and the token shift's last input), each block attention's
keys and values of the current block, and the number of tokens seen, per sequence.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from . import ops
from .call import check_cu_seqlens
from .carry import Window
from .errors import ArgumentError, LamixerError
from .scan import states_in_place

NORM_EPS = 1e-5
SHIFT = "@shift"  # the token shift's cache in LayerState.conv (no input can be named so)
WINDOW = "@block{}.{}"  # block attention i's keys and values of the current block in LayerState.conv


@dataclass
class LayerState:
    """What a layer carries from one call to the next, for N sequences."""

    spec: str  # the spec's name and source hash: a state fits only the layer it came from
    batch: int  # N, the number of sequences
    mixer: tuple[torch.Tensor, ...]  # the mixer's states in declaration order, [N, H, ...] each
    # conv cache [N, channels, kernel - 1]; block attention's current block [N, H, size, D] (WINDOW)
    conv: dict[str, torch.Tensor] = field(default_factory=dict)
    position: torch.Tensor | None = None  # [N] tokens seen so far per sequence (where rotary continues)


# ---- options, sizes and initial values ----
def whole(value, what: str, argument: str) -> int:
    """value as an int, or an ArgumentError unless it is a whole number >= 1."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not float(value).is_integer() or value < 1:
        raise ArgumentError(argument, f"{what} must be a whole number >= 1, got {value!r}")
    return int(value)


def option(name: str, value) -> float:
    """An option's value as a float, or an ArgumentError unless it is a finite number."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
        raise ArgumentError(name, f"must be a finite number, got {value!r}")
    return float(value)


def size(dim: str, value, spec: str, hidden_size: int, num_heads: int, options: dict[str, float]) -> int:
    """A dim's size from its `size` expression, or an ArgumentError unless it comes out a whole number >= 1."""
    value = float(value)
    if not (math.isfinite(value) and value >= 1 and abs(value - round(value)) < 1e-9):
        chosen = ", ".join(f"{k}={v:g}" for k, v in options.items())
        raise ArgumentError("hidden_size", f"dim {dim} of {spec} comes out as {value:g}, not a whole number >= 1, "
                            f"for hidden_size={hidden_size}, num_heads={num_heads}" + (f", {chosen}" if chosen else ""))  # fmt: skip
    return round(value)


def inv_softplus(x: torch.Tensor) -> torch.Tensor:
    """log(exp(x) - 1): the bias whose softplus is x."""
    return x + torch.log(-torch.expm1(-x))


def draw(fn: str, a: float, b: float, shape: tuple[int, ...]) -> torch.Tensor:
    """A random initial value in float64 from torch's generator: normal(mean a, std b), uniform(a, b) or log_uniform(a, b)."""
    if fn == "normal":
        return torch.randn(shape, dtype=torch.float64) * b + a
    if fn == "log_uniform":
        return torch.exp(torch.empty(shape, dtype=torch.float64).uniform_(math.log(a), math.log(b)))
    return torch.empty(shape, dtype=torch.float64).uniform_(a, b)


def initial_value(value, shape: tuple[int, ...]) -> torch.Tensor:
    """A param's initial value (a number or a float64 tensor) broadcast to its shape, in torch's default dtype."""
    return torch.as_tensor(value, dtype=torch.float64).expand(shape).clone().to(torch.get_default_dtype())


def check_rotary(name: str, dim: str, n: int) -> None:
    if n % 2:
        raise ArgumentError("hidden_size", f"rotary turns pairs of features, but {name} has an odd {dim} = {n}")


# ---- modules ----
def projection(hidden: int, width: int, rank: int | None, activation: str | None, bias: bool) -> nn.Module:
    """hidden -> width, a Linear, or through `rank` (low rank, with an optional activation between the factors)."""
    if rank is None:
        return nn.Linear(hidden, width, bias=bias)
    # low rank: hidden -> rank -> width; the up-projection carries the bias (GLA's gate)
    layers: list[nn.Module] = [nn.Linear(hidden, rank, bias=False)]
    if activation is not None:
        layers.append(Activation(activation))
    layers.append(nn.Linear(rank, width, bias=bias))
    return nn.Sequential(*layers)


class Activation(nn.Module):
    def __init__(self, fn: str):
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.UNARY[self.fn](x)


def short_conv_module(channels: int, kernel: int) -> nn.Conv1d:
    """A depthwise causal convolution over time (no bias)."""
    return nn.Conv1d(channels, channels, kernel, groups=channels, bias=False)


def norm_module(n: int, kind: str) -> nn.Module:
    """The weight (and, for layernorm, bias) of a norm over n features, starting at 1 (and 0)."""
    norm = nn.Module()
    norm.weight = nn.Parameter(torch.ones(n))
    norm.bias = nn.Parameter(torch.zeros(n)) if kind == "layernorm" else None
    return norm


# ---- steps ----
def causal(fn, keep: int, x: torch.Tensor, cache: torch.Tensor, cu: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """fn over time of x [B, T, C] that sees the `keep` inputs before each token, continuing from
    cache [N, C, keep]; returns fn's output [B, T, C] and the new cache.

    fn maps [b, C, keep + t] to [b, C, t]. Packed sequences go one by one so nothing reaches across
    a boundary."""
    xt = x.transpose(1, 2)
    if cu is None:
        parts = [(xt, cache)]
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


def _sequences(x: torch.Tensor, cu: torch.Tensor | None) -> int:
    return x.shape[0] if cu is None else len(cu) - 1


def short_conv(conv: nn.Conv1d, x: torch.Tensor, cache: torch.Tensor | None, cu: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The causal convolution of x [B, T, C], continuing from cache [N, C, kernel - 1] (None: zeros): (y, the new cache)."""
    keep = conv.kernel_size[0] - 1
    cache = x.new_zeros(_sequences(x, cu), conv.in_channels, keep) if cache is None else cache
    return causal(conv, keep, x, cache, cu)


def token_shift(h: torch.Tensor, cache: torch.Tensor | None, cu: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """h_{t-1} - h_t for every token of h [B, T, C], continuing from cache [N, C, 1] (None: zeros): (delta, the new cache)."""
    cache = h.new_zeros(_sequences(h, cu), h.shape[-1], 1) if cache is None else cache
    prev, cache = causal(_previous, 1, h, cache, cu)
    return prev - h, cache


def lerp(h: torch.Tensor, delta: torch.Tensor, mix) -> torch.Tensor:
    """A token shift's input: h + (h_{t-1} - h) * mix, per channel."""
    return h + delta * mix


def positions(B: int, T: int, cu: torch.Tensor | None, offset: torch.Tensor, device) -> torch.Tensor:
    """Each token's position in its own sequence, continuing from offset [N]: [B, T] (B = 1 when packed)."""
    t = torch.arange(T, device=device)
    if cu is None:
        return t[None, :] + offset[:, None]
    seq = torch.searchsorted(cu[1:], t, right=True)  # which packed sequence each token is in
    return (t - cu[seq] + offset[seq])[None, :]


def rotate(x: torch.Tensor, pos: torch.Tensor, base: float) -> torch.Tensor:
    """Rotary embedding of x [B, T, H, D]: pairs (i, i + D/2) turned by pos * base^(-2i/D)."""
    half = x.shape[-1] // 2
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    inv_freq = base ** (-torch.arange(half, device=x.device, dtype=dtype) * 2 / x.shape[-1])
    angle = (pos.to(dtype)[..., None] * inv_freq)[:, :, None, :]  # [B, T, 1, D/2]
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def norm(kind: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """RMSNorm or LayerNorm over the last axis, in float32 at least (bf16 squares lose too much)."""
    dtype = x.dtype
    x = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    if kind == "rmsnorm":
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + NORM_EPS) * weight.to(x.dtype)
    else:
        y = F.layer_norm(x, x.shape[-1:], weight.to(x.dtype), bias.to(x.dtype), NORM_EPS)
    return y.to(dtype)


def output_norm(kind: str, o: torch.Tensor, module: nn.Module, per_head: bool) -> torch.Tensor:
    """A norm of the mixer's output o [B, T, H, V]: over each head's V features, or over all H * V."""
    if per_head:
        return norm(kind, o, module.weight, module.bias)
    B, T, H, V = o.shape
    return norm(kind, o.reshape(B, T, H * V), module.weight, module.bias).reshape(B, T, H, V)


def output_gate(o: torch.Tensor, gate: nn.Module, x: torch.Tensor, activation) -> torch.Tensor:
    """o [B, T, H, V] times activation(gate(x)), a gate projected from the layer's input x [B, T, hidden]."""
    return o * activation(gate(x)).reshape(o.shape)


def _no_other_arguments(method: str, names: tuple[str, ...], extra: tuple, unknown: dict) -> None:
    """An ArgumentError, not Python's TypeError, for an argument a layer's method does not take."""
    if unknown:
        name = next(iter(unknown))
        raise ArgumentError(name, f"a layer's {method}() has no argument '{name}' (it takes {', '.join(names)})")
    if extra:
        raise ArgumentError(f"#{len(names) + len(extra)}", f"a layer's {method}() takes at most {len(names)} arguments ({', '.join(names)}), "
                                                           f"got {len(names) + len(extra)}")  # fmt: skip


class LayerBase(nn.Module):
    """What every layer does around its spec's steps: argument and state checks, the carried state, decoding.

    A subclass sets spec_name, spec_key (name and source hash), hidden_size, num_heads, sizes (dim -> size),
    state_dims (each mixer state's dims), stateful (False when the mixer sees whole inputs: a statistic the layer
    keeps no running estimate of), shifted (it has a token shift), conv (a ModuleDict of short convolutions),
    windows ((size, key dim, value dim) of each block attention) and stats (runtime.running.RunningStats, or None;
    stat_batches: which of its statistics are per batch), and implements _mix, calling the mixer with _carry()'s
    arguments and handing what they add to its results to _carried.
    """

    def __init__(self):
        super().__init__()
        self._shapes: dict[int, dict[str, tuple[int, ...]]] = {}  # see _check_state
        self.windows: tuple[tuple[int, int, int], ...] = ()
        self.stats: nn.Module | None = None  # a subclass with running statistics sets its RunningStats last
        self.stat_batches: dict[str, bool] = {}

    def _mix(self, x, state, cu_seqlens, caches: dict, offset, return_state: bool):
        """The spec's steps: x [B, T, hidden] -> (y [B, T, hidden], the mixer's final states or None), filling caches."""
        raise NotImplementedError

    def _carry(self, state: LayerState | None, offset: torch.Tensor, return_state: bool) -> dict:
        """The mixer call's arguments beside the tensors and states (runtime/carry.py): in training the statistics it
        uses are reported (to update the running estimates), in eval the estimates are given; block attention
        continues the state's window and returns the next when a state is returned."""
        out: dict = {}
        if self.stats is not None:
            out["output_stats" if self.training else "stats"] = True if self.training else self.stats.estimates()
        if self.windows and state is not None:
            blocks = range(len(self.windows))
            out["window"] = Window(offset, tuple(state.conv[WINDOW.format(i, "keys")] for i in blocks),
                                   tuple(state.conv[WINDOW.format(i, "values")] for i in blocks))  # fmt: skip
        if self.windows and return_state:
            out["output_window"] = True
        return out

    def _carried(self, more: tuple, caches: dict, return_state: bool) -> None:
        """Take what _carry's arguments added to the mixer's results: the next window into caches, the statistics the
        call used into the running estimates."""
        more = list(more)
        if self.windows and return_state:
            window = more.pop(0)
            for i in range(len(self.windows)):
                caches[WINDOW.format(i, "keys")], caches[WINDOW.format(i, "values")] = window.keys[i], window.values[i]
        if self.stats is not None and self.training:
            self.stats.update(more.pop(0), self.stat_batches)

    def extra_repr(self) -> str:
        sizes = ", ".join(f"{d}={n}" for d, n in self.sizes.items())
        return f"{self.spec_name}, hidden_size={self.hidden_size}, num_heads={self.num_heads}, {sizes}"

    def _check_x(self, x, name: str, rank: int) -> None:
        layout = "[B, T, hidden]" if rank == 3 else "[B, hidden]"
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            raise ArgumentError(name, f"must be a floating-point tensor {layout}")
        if x.dim() != rank or x.shape[-1] != self.hidden_size or 0 in x.shape:
            raise ArgumentError(name, f"must have shape {layout} with hidden = {self.hidden_size}, got {list(x.shape)}")
        weight = next(getattr(self, "proj", self).parameters(), None)  # what x meets first (a model may keep its gates' params in float32)
        if weight is not None and x.device != weight.device:
            raise ArgumentError(name, f"is on {x.device}, but the layer is on {weight.device}")
        if weight is not None and x.dtype != weight.dtype and not torch.is_autocast_enabled(x.device.type):
            raise ArgumentError(name, f"is {x.dtype}, but the layer's parameters are {weight.dtype}: convert one (or run under torch.autocast)")

    def _check_state(self, state, N: int) -> None:
        if not isinstance(state, LayerState):
            raise ArgumentError("state", f"must be a LayerState from this layer, got {type(state).__name__}")
        if state.spec != self.spec_key:
            raise ArgumentError("state", f"comes from a layer of another spec ({state.spec.split(':')[0]}), not {self.spec_name}")
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
        mixer = tuple(torch.zeros((batch, self.num_heads, *[self.sizes[d] for d in dims]), device=device, dtype=dtype) for dims in self.state_dims)
        conv = {name: torch.zeros(batch, c.in_channels, c.kernel_size[0] - 1, device=device, dtype=dtype) for name, c in self.conv.items()}
        if self.shifted:
            conv[SHIFT] = torch.zeros(batch, self.hidden_size, 1, device=device, dtype=dtype)
        for i, (size, dk, dv) in enumerate(self.windows):
            conv[WINDOW.format(i, "keys")] = torch.zeros(batch, self.num_heads, size, dk, device=device, dtype=dtype)
            conv[WINDOW.format(i, "values")] = torch.zeros(batch, self.num_heads, size, dv, device=device, dtype=dtype)
        return LayerState(self.spec_key, batch, mixer, conv, torch.zeros(batch, dtype=torch.int64, device=device))

    def forward(self, x: torch.Tensor | None = None, state: LayerState | None = None, cu_seqlens: torch.Tensor | None = None, return_state: bool = False,
                *extra, **unknown):  # fmt: skip
        """y = layer(x); y, state = layer(x, state, return_state=True). x is [B, T, hidden]; packed sequences: B = 1 and cu_seqlens."""
        _no_other_arguments("forward", ("x", "state", "cu_seqlens", "return_state"), extra, unknown)
        self._check_x(x, "x", 3)
        if not isinstance(return_state, bool):
            raise ArgumentError("return_state", f"must be True or False, got {return_state!r}")
        B, T, _ = x.shape
        cu = None if cu_seqlens is None else check_cu_seqlens(cu_seqlens, B, T, x.device)
        N = B if cu is None else len(cu) - 1
        if not self.stateful and (state is not None or return_state):
            raise LamixerError(f"{self.spec_name} uses whole-input statistics (it keeps no running estimates of them): it runs on "
                               "whole sequences only, so it takes no state and returns none")  # fmt: skip
        if state is not None:
            self._check_state(state, N)
        elif return_state:
            state = self.initial_state(N, x.device, x.dtype if x.dtype == torch.float64 else torch.float32)
        caches: dict[str, torch.Tensor] = {}
        offset = state.position.to(x.device) if state is not None else torch.zeros(N, dtype=torch.int64, device=x.device)
        y, finals = self._mix(x, state, cu, caches, offset, return_state)
        if not return_state:
            return y
        finals = finals if isinstance(finals, tuple) else (finals,)
        return y, LayerState(self.spec_key, N, finals, caches, offset + T if cu is None else offset + (cu[1:] - cu[:-1]))

    def step(self, x_t: torch.Tensor | None = None, state: LayerState | None = None, *extra, **unknown) -> tuple[torch.Tensor, LayerState]:
        """Decode one token per sequence: x_t [B, hidden] -> (y_t [B, hidden], the next state)."""
        _no_other_arguments("step", ("x_t", "state"), extra, unknown)
        self._check_x(x_t, "x_t", 2)
        y, state = self.forward(x_t[:, None], state, return_state=True)
        return y[:, 0], state

    def decoder(self, batch: int, state: LayerState | None = None) -> GraphedDecoder:
        """`step` for a fixed batch of sequences, its state held and updated in place, captured once in a CUDA graph on
        a CUDA device: see GraphedDecoder."""
        return GraphedDecoder(self, batch, state)


class GraphedDecoder:
    """Decoding with the host's work paid once: on a CUDA device the layer's one-token step is captured in a CUDA
    graph for `batch` sequences, its state held in the decoder's own tensors and updated in place.

        dec = layer.decoder(batch)        # or layer.decoder(batch, state) to continue a state, e.g. a prefill's
        y_t = dec.step(x_t)               # x_t [batch, hidden] -> y_t [batch, hidden]

    A step copies x_t in and replays the captured kernels: no Python op, no argument binding, no kernel launch
    from the host but the graph's. The mixer's recurrent kernel writes its states over the decoder's own
    (runtime.scan.STATES_IN_PLACE), so a step moves the state once, as a plain step does. Elsewhere (a CPU layer)
    the same object runs each step eagerly. y_t is the decoder's output tensor, overwritten by the next step
    (clone it to keep it); `state` is the carried LayerState (its tensors too are updated in place), `reset`
    starts over. The layer's parameters are read by the replay as they are then: change them in place, not by
    reassigning."""

    def __init__(self, layer: LayerBase, batch: int, state: LayerState | None = None):
        batch = whole(batch, "the batch", "batch")
        if not layer.stateful:
            raise LamixerError(f"{layer.spec_name} runs on whole sequences only: it has no one-token step to capture")
        p = next(layer.parameters(), None)
        device, dtype = (p.device, p.dtype) if p is not None else (torch.device("cpu"), torch.float32)
        self.layer, self.batch = layer, batch
        self.x = torch.zeros(batch, layer.hidden_size, device=device, dtype=dtype)
        self.state = layer.initial_state(batch, device, torch.float64 if dtype == torch.float64 else torch.float32)
        self.reset(state)  # the decoder's state: what `state` holds, copied in
        self.graph = None
        if device.type == "cuda":
            with torch.no_grad():
                # warm-up off the capture, steps as the captured one (states in place): fills every per-signature
                # cache first, and a mixer's fused copy compiles at the second (runtime/fuse.py)
                side = torch.cuda.Stream(device)
                side.wait_stream(torch.cuda.current_stream(device))
                with torch.cuda.stream(side):
                    for _ in range(2):
                        self._advance()
                torch.cuda.current_stream(device).wait_stream(side)
                self.reset(state)  # the warm-up's steps moved the state on
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    self._advance()
                self.graph = graph

    def _advance(self) -> None:
        """One step of self.x into self.y and self.state (what the graph captures)."""
        with states_in_place(), torch.no_grad():  # the mixer's recurrent kernel updates self.state's tensors itself
            self.y, new = self.layer.step(self.x, self.state)
            for mine, theirs in zip(_tensors(self.state), _tensors(new)):
                if mine.data_ptr() != theirs.data_ptr():  # the rest (conv caches, position, fused states)
                    mine.copy_(theirs)

    def reset(self, state: LayerState | None = None) -> None:
        """Start over from `state` (zeros when None) for the next step."""
        if state is not None:
            self.layer._check_state(state, self.batch)
        source = state if state is not None else self.layer.initial_state(self.batch, self.x.device, self.state.mixer[0].dtype if self.state.mixer else torch.float32)
        with torch.no_grad():
            for mine, theirs in zip(_tensors(self.state), _tensors(source)):
                mine.copy_(theirs)

    def step(self, x_t: torch.Tensor) -> torch.Tensor:
        """One token per sequence: x_t [batch, hidden] -> y_t [batch, hidden] (the decoder's tensor: see the class)."""
        self.layer._check_x(x_t, "x_t", 2)
        if x_t.shape[0] != self.batch:
            raise ArgumentError("x_t", f"must hold the decoder's {self.batch} sequences, got {x_t.shape[0]}")
        self.x.copy_(x_t)
        if self.graph is not None:
            self.graph.replay()
        else:
            self._advance()
        return self.y


def _tensors(state: LayerState) -> list[torch.Tensor]:
    """A state's tensors in a fixed order: the mixer's, the conv caches by name, the position."""
    return [*state.mixer, *(state.conv[k] for k in sorted(state.conv)), state.position]
