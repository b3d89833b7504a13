"""The oracle: walks the IR token by token, literally, in float64.

It knows nothing of classifications, chunks or kernel plans: a state update is evaluated as the
matrix algebra the spec wrote (S * exp(g) + outer(k, v), k @ S, ...), one token after another.
Every fast backend is judged against it.
"""
from __future__ import annotations

import networkx as nx
import torch

from ..ir import graph as ir
from ..passes.pipeline import Compiled
from ..runtime import carry, ops
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

    def run(self, nodes: list[int], t: int, pos: list[int], states: dict[str, torch.Tensor]) -> dict[int, torch.Tensor]:
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

    def block_attention(self, n: int, args: list[torch.Tensor], pos: list[int]) -> torch.Tensor:
        """Each row's token attends to its block's tokens so far, itself included (pos: each row's place in its
        sequence; a row's block starts over where pos is a multiple of the size)."""
        q, k, v, scale = args
        size = self.g.node(n)["size"]
        size = size if isinstance(size, int) else self.call.sizes[size]
        rows = self.block.setdefault(n, [[] for _ in pos])
        H = self.call.heads
        q, k, v = (x.expand(len(pos), H, x.shape[-1]) for x in (q, k, v))
        scale = scale.expand(len(pos), H)
        outs = []
        for r, p in enumerate(pos):
            if p % size == 0:
                rows[r] = []
            rows[r].append((k[r], v[r]))
            keys = torch.stack([kk for kk, _ in rows[r]], -2)  # [H, j, D]
            vals = torch.stack([vv for _, vv in rows[r]], -2)
            scores = (q[r].unsqueeze(-2) * keys).sum(-1) * scale[r].unsqueeze(-1)  # [H, j]
            outs.append((torch.softmax(scores, -1).unsqueeze(-1) * vals).sum(-2))
        return torch.stack(outs)

    def start_blocks(self, window, index: dict[int, int], rows: list[int], counts: list[int]) -> None:
        """Each block attention's current block as the window holds it for sequences `rows` (count[r] tokens so far)."""
        for n, i in index.items():
            keys, vals = window.keys[i], window.values[i]
            self.block[n] = [[(keys[s, :, j].to(self.call.compute_dtype), vals[s, :, j].to(self.call.compute_dtype)) for j in range(c)]
                             for s, c in zip(rows, counts)]  # fmt: skip

    def window(self, n: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Block attention n's window after the last token: each row's current block, zeros after it ([R, H, size, D])."""
        out = []
        for part in (0, 1):
            rows = []
            for block in self.block[n]:
                held = [kv[part] for kv in block] if len(block) < size else []  # a full block leaves an empty window
                width = block[0][part].shape[-1]
                x = torch.zeros(self.call.heads, size, width, dtype=self.call.compute_dtype, device=self.call.device)
                if held:
                    x[:, : len(held)] = torch.stack(held, 1)
                rows.append(x)
            out.append(torch.stack(rows))
        return out[0], out[1]


def _segments(call: Call) -> list[tuple[int, int, int]]:
    """(batch row, start, end) of every sequence."""
    if call.cu_seqlens is None:
        return [(b, 0, call.length) for b in range(call.batch)]
    cu = call.cu_seqlens.tolist()
    return [(0, cu[i], cu[i + 1]) for i in range(len(cu) - 1)]


def run(compiled: Compiled, call: Call) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """o [B, T, H, V] and the final states [N, H, *dims], both in the compute dtype (then what the call asked for
    beside them: runtime/carry.py's extras)."""
    g = compiled.graph
    order = g.order()
    segs = _segments(call)
    packed = call.cu_seqlens is not None
    stats = _statistics(compiled, call, order, segs)
    blocks = {n: i for i, (n, _) in enumerate(ir.blocks(g))}
    sizes = {n: carry.block_size(d["size"], call.sizes) for n, d in ir.blocks(g)}
    position = [0] * (len(segs) if packed else call.batch) if call.window is None else call.window.position.tolist()
    names = list(g.states)
    outs, finals = [], {name: [] for name in names}
    windows: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {n: [] for n in blocks}
    for i, (_, start, end) in enumerate(segs if packed else [(None, 0, call.length)]):
        rows = slice(i, i + 1) if packed else slice(None)
        seq_rows = [i] if packed else list(range(call.batch))  # the sequences this pass runs, one per row
        seq_stats = {s: v[rows] if packed and v.shape[0] > 1 else v for s, v in stats.items()}
        ev = _Token(compiled, call, seq_stats)
        if call.window is not None:
            for n in blocks:
                ev.start_blocks(call.window, {n: blocks[n]}, seq_rows, [position[r] % sizes[n] for r in seq_rows])
        states = {name: call.initial_state[name][rows] for name in names}
        seq_out = []
        for t in range(start, end):
            env = ev.run(order, t, [position[r] + t - start for r in seq_rows], states)
            states = {name: env[g.state_out[name]] for name in names}
            seq_out.append(env[g.output])
        outs.append(torch.stack(seq_out, 1))
        for name in names:
            finals[name].append(states[name])
        for n in blocks if call.output_window else ():
            windows[n].append(ev.window(n, sizes[n]))
    o, last = torch.cat(outs, 1), [torch.cat(finals[name], 0) for name in names]
    if not (call.output_window or call.output_stats):
        return o, last
    window = [(torch.cat([w[0] for w in windows[n]]), torch.cat([w[1] for w in windows[n]])) for n in blocks] if call.output_window else []
    return o, last + carry.extras(call, window, []) + ([_reported(call, stats[n], g.node(n)["groups"]) for n, _ in ir.stats(g)] if call.output_stats else [])


def _statistics(compiled: Compiled, call: Call, order: list[int], segs) -> dict[int, torch.Tensor]:
    """Every statistic as [rows|1, H|1] (rows: batch rows, or packed sequences for one per batch): the call's given
    value, else the whole input's: its argument evaluated at every token, then reduced."""
    g = compiled.graph
    packed = call.cu_seqlens is not None
    stats: dict[int, torch.Tensor] = {}
    for s in [n for n in order if g.op(n) == "stat"]:
        fn, groups = g.node(s)["fn"], g.node(s)["groups"]
        given = carry.interpret_stat(call, g.node(s)["name"], groups)
        if given is not None:
            stats[s] = given
            continue
        arg = g.args(s)[0]
        sub = [n for n in order if n in nx.ancestors(g.g, arg) | {arg}]
        ev = _Token(compiled, call, stats)
        shape = (call.batch, call.heads, *[call.sizes[d] for d in g.dims_of(arg)])
        vals = torch.stack([ev.run(sub, t, [t] * call.batch, {})[arg].expand(shape) for t in range(call.length)], 1)
        carry.check_spread(call, g.node(s)["name"], fn, vals, groups)
        if packed and "batch" in groups:  # a packed batch: each sequence is a batch row
            stats[s] = torch.cat([ops.stat(fn, vals[:, a:e], groups) for _, a, e in segs], 0)
        else:
            stats[s] = ops.stat(fn, vals, groups)
    return stats


def _reported(call: Call, value: torch.Tensor, groups: tuple[str, ...]) -> torch.Tensor:
    """A statistic [rows|1, H|1] in its own shape ([N] leading per batch, [H] per head)."""
    rows = call.batch if call.cu_seqlens is None else call.cu_seqlens.numel() - 1
    return (value.expand(rows, -1) if "batch" in groups else value[:1]).reshape(((rows,) if "batch" in groups else ()) + ((call.heads,) if "head" in groups else ()))
