"""The oracle: walks the IR token by token, literally, in float64.

It knows nothing of classifications, chunks or kernel plans: a state update is evaluated as the
matrix algebra the spec wrote (S * exp(g) + outer(k, v), k @ S, ...), one token after another.
Every fast backend is judged against it.
"""
from __future__ import annotations

import networkx as nx
import torch

from ..passes.pipeline import Compiled
from ..runtime import ops
from .binding import Call


class _Token:
    """Per-token evaluation of a node subset; values are [B|1, H|1, *dims]."""

    def __init__(self, compiled: Compiled, call: Call, stats: dict[int, torch.Tensor]):
        self.g = compiled.graph
        self.call = call
        self.stats = stats
        H = call.heads
        dt = call.compute_dtype
        self.const = lambda v: torch.tensor(float(v), dtype=dt, device=call.device).reshape(1, 1)
        self.head = torch.arange(H, dtype=dt, device=call.device).reshape(1, H)
        self.block: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        # inputs and parameters in the compute dtype once per call: converted per token, a parameter's gradient
        # would be summed over the tokens in the caller's dtype (a bf16 sum of thousands of terms)
        self.converted: dict[str, torch.Tensor] = {}

    def operand(self, name: str) -> torch.Tensor:
        if name not in self.converted:
            self.converted[name] = self.call.inputs[name].to(self.call.compute_dtype)
        return self.converted[name]

    def leaf(self, n: int, t: int, states: dict[str, torch.Tensor]) -> torch.Tensor:
        d, call = self.g.node(n), self.call
        op = d["op"]
        if op == "input":
            return self.operand(d["name"])[:, t]
        if op == "param":
            p = self.operand(d["name"])
            return p.unsqueeze(0) if d["per_head"] else p.reshape(1, 1, *p.shape)
        if op == "const":
            return self.const(d["value"])
        if op == "dim":
            return self.const(call.sizes[d["name"]])
        if op == "head":
            return self.head
        if op == "scale":
            return self.const(call.scale)
        if op == "stat":
            return self.stats[n]
        if op == "state_in":
            return states[d["name"]]
        raise AssertionError(op)

    def run(self, nodes: list[int], t: int, pos: int, states: dict[str, torch.Tensor]) -> dict[int, torch.Tensor]:
        g, env = self.g, {}
        for n in nodes:
            d = g.node(n)
            if d["op"] in ("input", "param", "const", "dim", "head", "scale", "stat", "state_in"):
                env[n] = self.leaf(n, t, states)
            elif d["op"] == "block_attention":
                env[n] = self.block_attention(n, [env[a] for a in d["args"]], pos)
            else:
                env[n] = ops.apply(d, [env[a] for a in d["args"]], [g.dims_of(a) for a in d["args"]])
        return env

    def block_attention(self, n: int, args: list[torch.Tensor], pos: int) -> torch.Tensor:
        q, k, v, scale = args
        size = self.g.node(n)["size"]
        size = size if isinstance(size, int) else self.call.sizes[size]
        if pos % size == 0:
            self.block[n] = []
        self.block[n].append((k, v))
        keys = torch.stack([kk for kk, _ in self.block[n]], -2)  # [B, H, j, D]
        vals = torch.stack([vv for _, vv in self.block[n]], -2)
        scores = (q.unsqueeze(-2) * keys).sum(-1) * scale  # [B, H, j]
        return (torch.softmax(scores, -1).unsqueeze(-1) * vals).sum(-2)


def _segments(call: Call) -> list[tuple[int, int, int]]:
    """(batch row, start, end) of every sequence."""
    if call.cu_seqlens is None:
        return [(b, 0, call.length) for b in range(call.batch)]
    cu = call.cu_seqlens.tolist()
    return [(0, cu[i], cu[i + 1]) for i in range(len(cu) - 1)]


def run(compiled: Compiled, call: Call) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """o [B, T, H, V] and the final states [N, H, *dims], both in the compute dtype."""
    g = compiled.graph
    order = g.order()
    segs = _segments(call)
    packed = call.cu_seqlens is not None
    # whole-input statistics first: evaluate each stat's argument at every token, then reduce
    stats: dict[int, torch.Tensor] = {}
    for s in [n for n in order if g.op(n) == "stat"]:
        arg = g.args(s)[0]
        sub = [n for n in order if n in nx.ancestors(g.g, arg) | {arg}]
        ev = _Token(compiled, call, stats)
        shape = (call.batch, call.heads, *[call.sizes[d] for d in g.dims_of(arg)])
        vals = torch.stack([ev.run(sub, t, t, {})[arg].expand(shape) for t in range(call.length)], 1)
        fn, groups = g.node(s)["fn"], g.node(s)["groups"]
        if packed and "batch" in groups:  # a packed batch: each sequence is a batch row
            stats[s] = torch.cat([ops.stat(fn, vals[:, a:e], groups) for _, a, e in segs], 0)
        else:
            stats[s] = ops.stat(fn, vals, groups)
    names = list(g.states)
    outs, finals = [], {name: [] for name in names}
    for i, (_, start, end) in enumerate(segs if packed else [(None, 0, call.length)]):
        rows = slice(i, i + 1) if packed else slice(None)
        seq_stats = {s: v[rows] if packed and v.shape[0] > 1 else v for s, v in stats.items()}
        ev = _Token(compiled, call, seq_stats)
        states = {name: call.initial_state[name][rows] for name in names}
        seq_out = []
        for t in range(start, end):
            env = ev.run(order, t, t - start, states)
            states = {name: env[g.state_out[name]] for name in names}
            seq_out.append(env[g.output])
        outs.append(torch.stack(seq_out, 1))
        for name in names:
            finals[name].append(states[name])
    return torch.cat(outs, 1), [torch.cat(finals[name], 0) for name in names]
