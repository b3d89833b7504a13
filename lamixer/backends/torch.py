"""Chunkwise PyTorch, generated from the classification (never from a mixer's name).

Per-token work is evaluated on whole [B, T, H, *dims] tensors; each state is one chunked scan of
S_t = D_t S_{t-1} + a_t (b_t + S'^T c_t)^T with the decay D_t along the key dim (scalar decay is
its one-column case) or along the value dim. Within a chunk, with B_t the cumulative log decay:
  additive  U = b
  delta     (I - tril(M, -1)) U = b + (c e^B) S_0,  M_ij = sum_k c_ik a_jk e^(B_ik - B_jk)
  reads     o_i = (q_i e^(Bq_i)) S_0 + sum_j sum_k q_ik a_jk e^(Bq_ik - B_jk) U_j   (j <= i, or j < i)
  state     S_C = e^(B_C) S_0 + (a e^(B_C - B))^T U
Every exponent is a sum of log decays over a segment of ordered positions, summed directly (never
as a difference of prefix sums), so it never overflows for decays <= 1 and its gradient does not
cancel under strong decay. Differentiable by autograd.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .. import ops
from ..call import Call, remember
from ..compiler import Compiled
from ..passes.classify import Scan


def _pad_chunks(x: torch.Tensor, C: int) -> torch.Tensor:
    """[B, H, T, D] -> [B, H, N, C, D], zero-padded at the end (a zero token leaves a state unchanged)."""
    T = x.shape[2]
    N = -(-T // C)
    x = F.pad(x, (0, 0, 0, N * C - T))
    return x.reshape(*x.shape[:2], N, C, x.shape[-1])


def _segsum(g: torch.Tensor) -> torch.Tensor:
    """seg[.., i, j, :] = sum of g over j < s <= i (for j <= i), built without differences of prefix sums.

    A difference of cumulative sums would cancel: under strong decay the gradient of a small
    segment would be the rounding noise of two large ones.
    """
    C = g.shape[-2]
    after_j = torch.ones(C, C, dtype=torch.bool, device=g.device).triu(1)  # [j, s]: s > j
    x = torch.where(after_j.unsqueeze(-1), g.unsqueeze(-3), torch.zeros((), dtype=g.dtype, device=g.device))
    return x.cumsum(-2).transpose(-2, -3)  # [.., i, j, :]


def _decay_exp(x: torch.Tensor) -> torch.Tensor:
    """exp of a (non-positive) log decay, flushed to 0 below the smallest normal number.

    Learned gates forget hard; their decays would otherwise be subnormal floats, which CPUs multiply
    tens of times slower (a GLA layer trained 6x slower) for a contribution below 1e-38.
    """
    floor = math.log(torch.finfo(x.dtype).tiny)
    return torch.exp(torch.where(x < floor, torch.full_like(x, float("-inf")), x))


def _suffix(g: torch.Tensor) -> torch.Tensor:
    """sum of g over s > j within the chunk, as [.., C, D]."""
    return F.pad(g[..., 1:, :], (0, 0, 0, 1)).flip(-2).cumsum(-2).flip(-2)


def _decay_weights(seg: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """exp of the segment sums where mask (over [i, j]) holds, else 0."""
    mask = mask.unsqueeze(-1)
    return _decay_exp(torch.where(mask, seg, torch.full_like(seg, float("-inf"))))


def _pair(x: torch.Tensor, a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """sum_k x_ik a_jk w_ijk over [.., C, C]; w has one column (scalar decay) or K."""
    if w.shape[-1] == 1:
        return (x @ a.transpose(-1, -2)) * w.squeeze(-1)
    return torch.einsum("...ik,...jk,...ijk->...ij", x, a, w)


def chunk_scan(a, b, c, gk, gv, reads, h0, C):
    """One state's scan over [B, H, T, *] tensors; returns ([o per read, [B, H, T, V]], final state [B, H, K, V]).

    a, c: [B, H, T, K] write and erase keys (c None: additive); b: [B, H, T, V];
    gk: [B, H, T, 1 or K] log decay on the key side, or gv: [B, H, T, V] on the value side;
    reads: [(q [B, H, T, K], decayed, written)]; h0: [B, H, K, V].
    """
    T = a.shape[2]
    dev, dt = a.device, a.dtype
    ar = torch.arange(C, device=dev)
    incl, strict = ar[:, None] >= ar[None, :], ar[:, None] > ar[None, :]
    a, b = _pad_chunks(a, C), _pad_chunks(b, C)
    qs = [(_pad_chunks(q, C), dec, wr) for q, dec, wr in reads]
    g = _pad_chunks(gk if gv is None else gv, C)
    Bc = g.cumsum(-2)  # decay from the chunk start through token i: [B, H, N, C, D]
    Bx = Bc - g  # ... up to token i, exclusive
    seg = _segsum(g)  # decay between a write at j and a read at i: [B, H, N, C, C, D]
    seg_x = F.pad(seg[..., :-1, :, :], (0, 0, 0, 0, 1, 0))  # the same, excluding token i itself
    last = Bc[..., -1:, :]  # the whole chunk's decay: [B, H, N, 1, D]
    to_end = _decay_exp(_suffix(g))  # decay from a write at j to the chunk's end
    read_parts = []
    for q, dec, wr in qs:
        w = _decay_weights(seg if dec else seg_x, incl if wr else strict)
        read_parts.append((q, _decay_exp(Bc if dec else Bx), w))
    decay_all = _decay_exp(last)  # [B, H, N, 1, D]
    if gv is None:
        a_end = a * to_end
        if c is None:
            U = b
            delta_S = a_end.transpose(-1, -2) @ U  # each chunk's contribution to the state: [B, H, N, K, V]
            S, starts = h0, []
            for n in range(a.shape[2]):  # the only sequential part: one fused multiply-add per chunk
                starts.append(S)
                S = torch.addcmul(delta_S[:, :, n], decay_all[:, :, n].transpose(-1, -2), S)
        else:
            c = _pad_chunks(c, C)
            L = torch.eye(C, dtype=dt, device=dev) - _pair(c, a, _decay_weights(seg, strict))
            rhs = torch.cat([b, c * _decay_exp(Bc)], -1)
            sol = torch.linalg.solve_triangular(L, rhs, upper=False, unitriangular=True)
            U0, W = sol[..., : b.shape[-1]], sol[..., b.shape[-1] :]  # U = U0 + W S_0
            S, starts, Us = h0, [], []
            for n in range(a.shape[2]):
                starts.append(S)
                Us.append(torch.baddbmm(U0[:, :, n].flatten(0, 1), W[:, :, n].flatten(0, 1), S.flatten(0, 1)).view_as(U0[:, :, n]))
                S = decay_all[:, :, n].transpose(-1, -2) * S + a_end[:, :, n].transpose(-1, -2) @ Us[-1]
            U = torch.stack(Us, 2)
        S0 = torch.stack(starts, 2)  # the state entering each chunk: [B, H, N, K, V]
        outs = [(q * eq) @ S0 + _pair(q, a, w) @ U for q, eq, w in read_parts]
    else:
        delta_S = a.transpose(-1, -2) @ (b * to_end)
        S, starts = h0, []
        for n in range(a.shape[2]):
            starts.append(S)
            S = torch.addcmul(delta_S[:, :, n], decay_all[:, :, n], S)
        S0 = torch.stack(starts, 2)
        outs = [(q @ S0) * eq + torch.einsum("...ij,...ijv,...jv->...iv", q @ a.transpose(-1, -2), w, b) for q, eq, w in read_parts]
    return [o.flatten(2, 3)[:, :, :T] for o in outs], S


def block_attention(q, k, v, scale, size: int) -> torch.Tensor:
    """Causal softmax attention within blocks of `size` tokens: [B, T, H, D] -> [B, T, H, Dv]. Each block is one
    batch row of torch's scaled_dot_product_attention (a fused kernel on a GPU: no [size, size] scores kept)."""
    B, T, H, _ = q.shape
    size = min(size, T)  # blocks start at the first token: a block longer than the sequence is the sequence
    nb = -(-T // size)

    def blocks(x):  # [B * nb, H, size, D], a view where no padding is needed
        x = F.pad(x, (0, 0, 0, 0, 0, nb * size - T)) if nb * size != T else x
        return x.reshape(B * nb, size, H, x.shape[-1]).transpose(1, 2)

    q = q * scale  # one number (a 0-d tensor)
    out = F.scaled_dot_product_attention(blocks(q), blocks(k), blocks(v), is_causal=True, scale=1.0)  # [B * nb, H, size, Dv]
    return out.transpose(1, 2).reshape(B, nb * size, H, -1)[:, :T]


LEAVES = ("input", "param", "const", "dim", "head", "scale")
CONSTANT_LEAVES = ("const", "dim", "head", "scale")  # values fixed by the call's sizes and scale


class _Program:
    """What evaluating the plan needs beyond the call's tensors, worked out once per spec and set of direct
    operands: the nodes to evaluate in order, what each is, and the scan groups. Per-call work walks no graph."""

    def __init__(self, compiled: Compiled, direct: dict[int, tuple[str, int | None]]):
        self.c, self.nodes, self.direct = compiled, compiled.plan.nodes, direct
        plan, nodes = compiled.plan, self.nodes
        needed = self._needed()
        # call constants: made of constants, dims, the head index and the scale only (e.g. RetNet's decay, a read-out
        # scale): the same for every call of one signature and scale, so computed once for it
        self.constant: list[int] = []  # in evaluation order
        for n in plan.order:
            d = nodes[n]
            if d["op"] in CONSTANT_LEAVES or (d["op"] in ("unary", "binary") and n not in plan.read_scan
                                               and all(a in self.constant for a in d["args"])):  # fmt: skip
                self.constant.append(n)
        self.steps: list[tuple[int, str]] = []
        for n in plan.order:
            if n not in needed:
                continue
            op = nodes[n]["op"]
            kind = ("scan" if n in plan.read_scan else "constant" if n in self.constant else "leaf" if op in LEAVES
                    else op if op in ("stat", "block_attention", "output") else "op")  # fmt: skip
            self.steps.append((n, kind))
        self.constants = [n for n, kind in self.steps if kind == "constant"]
        # direct operands' per-head factors that are call constants, computed with the other constants
        self.constant_factors = [f for _, f in direct.values() if f is not None and f in self.constant]
        self.factors_key = tuple(self.constant_factors)
        self.groups = {s.state: [compiled.classification.scan(name) for name in next((g for g in plan.fusable if s.state in g), (s.state,))]
                       for s in compiled.classification.scans}  # fmt: skip

    def _scan_deps(self, s: Scan) -> list[int]:
        deps = []
        for n in s.inputs():
            _, replacement = self.direct.get(n, (None, n))  # a direct operand needs only its factor
            deps += [replacement] if replacement is not None else []
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


def program(compiled: Compiled, direct: dict[int, tuple[str, int | None]] | None = None) -> _Program:
    """The spec's evaluation program for these direct operands (made once, kept with the compiled spec)."""
    direct = direct or {}
    key = ("program", tuple(sorted(direct.items())))
    found = compiled.cache.get(key)
    return found if found is not None else remember(compiled.cache, key, _Program(compiled, direct))


class _Evaluator:
    """Vectorised evaluation of the plan over [B, T, H, *dims] tensors.

    Packed sequences (cu_seqlens) share the per-token work; only the scans, block attention and
    batch-grouped statistics see the sequence boundaries.
    """

    def __init__(self, compiled: Compiled, call: Call, scan_impl, direct: dict[int, tuple[str, int | None]] | None = None,
                 prog: _Program | None = None):  # fmt: skip
        self.c, self.call = compiled, call
        self.prog = prog if prog is not None else program(compiled, direct)
        self.nodes = compiled.plan.nodes  # plain data: nothing below touches the graph library
        self.scan_impl = scan_impl
        # scan operands the kernels read straight from the caller's tensors: node -> (input, per-head factor node)
        self.direct = self.prog.direct
        self.env: dict[int, torch.Tensor] = {}
        self.finals: dict[str, torch.Tensor] = {}
        self.B, self.T = call.batch, call.length
        self._segments = False  # worked out on first use: it reads cu_seqlens back from the device

    @property
    def segments(self) -> list[tuple[int, int]] | None:
        if self._segments is False:
            cu = self.call.cu_seqlens
            self._segments = None if cu is None else list(zip(cu[:-1].tolist(), cu[1:].tolist()))
        return self._segments

    def per_segment(self, fn, *xs: torch.Tensor, axis: int) -> list:
        """fn applied to each sequence's slice along the time axis (the whole when not packed)."""
        if self.segments is None:
            return [fn(*xs)]
        return [fn(*(x.narrow(axis, a, e - a) for x in xs)) for a, e in self.segments]

    def full(self, n: int) -> torch.Tensor:
        """Node n's value expanded to [B, T, H, *dims]."""
        sizes = [self.call.sizes[d] for d in self.nodes[n]["dims"]]
        return self.env[n].expand(self.B, self.T, self.call.heads, *sizes)

    def leaf(self, n: int) -> torch.Tensor:
        d, call = self.nodes[n], self.call
        dt, dev = call.compute_dtype, call.device
        op = d["op"]
        if op == "input":
            return call.inputs[d["name"]].to(dt)
        if op == "param":
            p = call.inputs[d["name"]].to(dt)
            return p.reshape(1, 1, *p.shape) if d["per_head"] else p.reshape(1, 1, 1, *p.shape)
        if op == "head":
            return torch.arange(call.heads, dtype=dt, device=dev).reshape(1, 1, -1)
        value = {"const": lambda: d["value"], "dim": lambda: call.sizes[d["name"]], "scale": lambda: call.scale}[op]()
        # a fill, not a copy from host memory: nothing waits on the device, and a CUDA graph can capture it
        return torch.full((1, 1, 1), float(value), dtype=dt, device=dev)

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
            if d["op"] in CONSTANT_LEAVES:
                values[n] = self.leaf(n)
            else:
                args = d["args"]
                values[n] = ops.apply(d, [values[a] for a in args], [self.nodes[a]["dims"] for a in args])
        for f in prog.constant_factors:
            values[("factor", f)] = self._factor(values[f])
        return values if call.memo is None else remember(call.memo, key, values)

    def run(self) -> None:
        nodes, plan = self.nodes, self.c.plan
        consts = self.constants() if self.prog.constants or self.prog.constant_factors else {}
        self.consts = consts
        for n, kind in self.prog.steps:
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
                self.env[n] = self.env[nodes[n]["args"][0]]
            else:
                args = nodes[n]["args"]
                self.env[n] = ops.apply(nodes[n], [self.env[a] for a in args], [nodes[a]["dims"] for a in args])
        for scan in self.c.classification.scans:
            if scan.state not in self.finals:
                self.scan(scan.state)

    def stat(self, n: int) -> torch.Tensor:
        node = self.nodes[n]
        x = self.full(node["args"][0])
        if self.segments is not None and "batch" in node["groups"]:  # each packed sequence is a batch row
            vals = self.per_segment(lambda xs: ops.stat(node["fn"], xs, node["groups"]).unsqueeze(1).expand(-1, xs.shape[1], -1), x, axis=1)
            return torch.cat(vals, 1)  # [1, T, H|1]: every token sees its sequence's value
        return ops.stat(node["fn"], x, node["groups"]).unsqueeze(1)  # [B|1, 1, H|1]

    def block_attention(self, n: int) -> torch.Tensor:
        q, k, v, scale = self.nodes[n]["args"]
        size = self.nodes[n]["size"]
        size = size if isinstance(size, int) else self.call.sizes[size]
        s = self.env[scale].reshape(())
        return torch.cat(self.per_segment(lambda *x: block_attention(*x, s, size), self.full(q), self.full(k), self.full(v), axis=1), 1)

    def operand(self, n: int | None, dim: str | None, widen: bool = False) -> torch.Tensor | None:
        """A scan operand as [B, T, H, D]: a vector over `dim`, or a scalar as one column (widen: broadcast over
        `dim` too); a direct operand as the caller's tensor, its factor left to the kernel."""
        if n is None:
            return None
        scalar = not self.nodes[n]["dims"]
        if n in self.direct:
            x = self.call.inputs[self.direct[n][0]]
            if not scalar:  # the caller's [B, T, H, D] tensor, as bind checked it
                return x
        else:
            x = self.env[n]
        if scalar:
            return x.unsqueeze(-1).expand(self.B, self.T, self.call.heads, self.call.sizes[dim] if widen else 1)
        return x.expand(self.B, self.T, self.call.heads, self.call.sizes[dim])

    def factor(self, n: int) -> torch.Tensor | None:
        """A direct operand's per-head factor as [H] (None when it has none)."""
        if n not in self.direct or self.direct[n][1] is None:
            return None
        f = self.direct[n][1]
        return self.consts[("factor", f)] if ("factor", f) in self.consts else self._factor(self.env[f])

    def _factor(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(self.call.compute_dtype).reshape(-1).expand(self.call.heads).contiguous()

    def scan(self, state: str) -> None:
        """Run the scan of `state`, together with the scans the plan found fusable with it: those share keys,
        decay and queries, so one scan with their values side by side computes them all."""
        scans = self.prog.groups[state]
        s = scans[0]
        a = self.operand(s.write_key, s.key_dim, widen=True)
        bs, h0s = [], []
        for t in scans:
            h0 = self.call.initial_state[t.state]
            if t.value_dim is None:  # a vector state is a one-column matrix state written with b = 1
                bs.append(a.new_ones(*a.shape[:3], 1))
                h0s.append(h0.unsqueeze(-1))
            else:
                bs.append(self.operand(t.write_value, t.value_dim, widen=True))
                h0s.append(h0)
        side = "value" if s.decay == "value" else "key"
        g = self.operand(s.log_decay, s.value_dim if side == "value" else s.key_dim)
        ops = ScanOperands(
            a=a, b=bs[0] if len(bs) == 1 else torch.cat(bs, -1), c=self.operand(s.erase_key, s.key_dim, widen=True), g=g, side=side,
            reads=[(self.operand(r.query, s.key_dim, widen=True), r.decayed, r.written) for r in s.reads],
            query_factors=[self.factor(r.query) for r in s.reads],
            h0=h0s[0] if len(h0s) == 1 else torch.cat(h0s, -1),
            cu_seqlens=self.call.cu_seqlens, chunk=self.c.plan.chunk[s.state],
        )  # fmt: skip
        outs, S = self.scan_impl(ops)
        if len(scans) == 1:  # the common case, without slicing
            for r, o in zip(s.reads, outs):
                self.env[r.node] = o.squeeze(-1) if s.value_dim is None else o
            self.finals[s.state] = S.squeeze(-1) if s.value_dim is None else S
            return
        widths = [b.shape[-1] for b in bs]
        for i, t in enumerate(scans):
            lo = sum(widths[:i])
            for r, o in zip(t.reads, outs):
                part = o[..., lo : lo + widths[i]]
                self.env[r.node] = part.squeeze(-1) if t.value_dim is None else part
            part = S[..., lo : lo + widths[i]]
            self.finals[t.state] = part.squeeze(-1) if t.value_dim is None else part


@dataclass
class ScanOperands:
    """One state's scan, every per-token operand as [B, T, H, D] (D = 1 for a scalar)."""

    a: torch.Tensor  # write key [.., K]
    b: torch.Tensor  # write value [.., V]
    c: torch.Tensor | None  # erase key [.., K] (delta rule), None for additive
    g: torch.Tensor | None  # log decay [.., 1 or K] on the key side, [.., V] on the value side
    side: str  # "key" | "value"
    reads: list[tuple[torch.Tensor, bool, bool]]  # (query [.., K], decayed, written)
    query_factors: list[torch.Tensor | None]  # per-head factors [H] the kernel applies to direct queries
    h0: torch.Tensor  # [N, H, K, V]
    cu_seqlens: torch.Tensor | None
    chunk: int


def torch_scan(ops: ScanOperands) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The chunked scan in PyTorch, one sequence at a time when packed: ([o per read], final state)."""
    a = ops.a
    g = ops.g if ops.g is not None else a.new_zeros(*a.shape[:3], 1)
    modes = [(dec, wr) for _, dec, wr in ops.reads]

    def one(h0, a, b, c, g, *qs):
        t = [x.transpose(1, 2) for x in (a, b, c, g, *qs)]  # -> [B, H, T, D]
        reads = [(q, dec, wr) for q, (dec, wr) in zip(t[4:], modes)]
        gk, gv = (t[3], None) if ops.side == "key" else (None, t[3])
        return chunk_scan(t[0], t[1], t[2] if ops.c is not None else None, gk, gv, reads, h0, ops.chunk)

    c = ops.c if ops.c is not None else a
    qs = [q for q, _, _ in ops.reads]
    if ops.cu_seqlens is None:
        results = [one(ops.h0, a, ops.b, c, g, *qs)]
    else:
        cu = ops.cu_seqlens.tolist()
        results = [one(ops.h0[i : i + 1], *(x[:, s:e] for x in (a, ops.b, c, g, *qs))) for i, (s, e) in enumerate(zip(cu[:-1], cu[1:]))]
    outs = [torch.cat([r[0][i] for r in results], 2).transpose(1, 2) for i in range(len(qs))]
    return outs, torch.cat([r[1] for r in results], 0)


def run(compiled: Compiled, call: Call, scan_impl=torch_scan, direct=None, prog: _Program | None = None) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """o [B, T, H, V] and the final states [N, H, *dims], in the compute dtype (prog: program(compiled, direct), when
    the caller keeps it)."""
    ev = _Evaluator(compiled, call, scan_impl, direct, prog)
    ev.run()
    return ev.env[compiled.graph.output], [ev.finals[n] for n in compiled.graph.states]
