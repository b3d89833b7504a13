"""The torch backend: the kernel plan evaluated over whole [B, T, H, *dims] tensors.

Per-token work runs node by node on all tokens at once (lamixer.runtime.ops); each state is one
chunkwise scan (lamixer.runtime.scan), run as the classification says (never by a mixer's name).
`lamixer compile` writes the same evaluation out as straight-line code (lamixer/emit.py).
"""
from __future__ import annotations

import torch

from ..call import Call
from ..compiler import Compiled
from ..passes.classify import Scan
from ..runtime import ops
from ..runtime.scan import ScanOperands, block_attention, scan_group, stat, torch_scan

__all__ = ["ScanOperands", "run", "torch_scan"]


class _Evaluator:
    """Vectorised evaluation of the plan over [B, T, H, *dims] tensors.

    Packed sequences (cu_seqlens) share the per-token work; only the scans, block attention and
    batch-grouped statistics see the sequence boundaries.
    """

    def __init__(self, compiled: Compiled, call: Call, scan_impl, direct: dict[int, tuple[str, int | None]] | None = None):
        self.c, self.call = compiled, call
        self.nodes = compiled.plan.nodes  # plain data: nothing below touches the graph library
        self.scan_impl = scan_impl
        # scan operands the kernels read straight from the caller's tensors: node -> (input, per-head factor node)
        self.direct = direct or {}
        self.needed = self._needed()
        self.env: dict[int, torch.Tensor] = {}
        self.finals: dict[str, torch.Tensor] = {}
        self.B, self.T = call.batch, call.length

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
        return torch.tensor(float(value), dtype=dt, device=dev).reshape(1, 1, 1)

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

    def run(self) -> None:
        nodes, plan = self.nodes, self.c.plan
        for n in plan.order:
            if n not in self.needed:
                continue
            op = nodes[n]["op"]
            if n in plan.read_scan:
                if plan.read_scan[n] not in self.finals:
                    self.scan(plan.read_scan[n])
            elif op in ("input", "param", "const", "dim", "head", "scale"):
                self.env[n] = self.leaf(n)
            elif op == "stat":
                self.env[n] = self.stat(n)
            elif op == "block_attention":
                self.env[n] = self.block_attention(n)
            else:
                args = nodes[n]["args"]
                self.env[n] = ops.apply(nodes[n], [self.env[a] for a in args], [nodes[a]["dims"] for a in args])
        for scan in self.c.classification.scans:
            if scan.state not in self.finals:
                self.scan(scan.state)


    def stat(self, n: int) -> torch.Tensor:
        node = self.nodes[n]
        return stat(node["fn"], self.full(node["args"][0]), node["groups"], self.call.cu_seqlens)

    def block_attention(self, n: int) -> torch.Tensor:
        q, k, v, scale = self.nodes[n]["args"]
        size = self.nodes[n]["size"]
        size = size if isinstance(size, int) else self.call.sizes[size]
        return block_attention(self.full(q), self.full(k), self.full(v), self.env[scale], size, self.call.cu_seqlens)

    def operand(self, n: int | None) -> torch.Tensor | None:
        """A scan operand: a node's value, or a direct operand's input tensor (its factor left to the kernel)."""
        if n is None:
            return None
        return self.call.inputs[self.direct[n][0]] if n in self.direct else self.env[n]

    def factor(self, n: int) -> torch.Tensor | None:
        """A direct operand's per-head factor as [H] (None when it has none)."""
        if n not in self.direct or self.direct[n][1] is None:
            return None
        return self.env[self.direct[n][1]].to(self.call.compute_dtype).reshape(-1).expand(self.call.heads)

    def scan(self, state: str) -> None:
        """Run the scan of `state`, together with the scans the plan found fusable with it: those share keys,
        decay and queries, so one scan with their values side by side computes them all."""
        group = next((g for g in self.c.plan.fusable if state in g), (state,))
        scans = [self.c.classification.scan(name) for name in group]
        s = scans[0]
        reads, finals = scan_group(
            self.scan_impl, (self.B, self.T, self.call.heads), key=self.operand(s.write_key),
            values=[None if t.value_dim is None else self.operand(t.write_value) for t in scans],
            erase=self.operand(s.erase_key), log_decay=self.operand(s.log_decay), side="value" if s.decay == "value" else "key",
            reads=[(self.operand(r.query), r.decayed, r.written) for r in s.reads], h0=[self.call.initial_state[t.state] for t in scans],
            cu_seqlens=self.call.cu_seqlens, chunk=self.c.plan.chunk[s.state], query_factors=[self.factor(r.query) for r in s.reads],
        )  # fmt: skip
        for t, outs, final in zip(scans, reads, finals):
            for r, o in zip(t.reads, outs):
                self.env[r.node] = o
            self.finals[t.state] = final


def run(compiled: Compiled, call: Call, scan_impl=torch_scan, direct=None) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """o [B, T, H, V] and the final states [N, H, *dims], in the compute dtype."""
    ev = _Evaluator(compiled, call, scan_impl, direct)
    ev.run()
    return ev.env[compiled.graph.output], [ev.finals[n] for n in compiled.graph.states]
