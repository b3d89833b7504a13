"""The evaluation order: per-token work, statistics and state scans, each after everything it needs."""
from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from ..ir import graph as ir
from .classify import Classification


@dataclass
class Order:
    order: list[int]  # per-token nodes, stats and reads, each after everything it needs
    read_scan: dict[int, str]  # read node -> the state whose scan computes it
    nodes: dict[int, dict]  # every node's attributes as plain data: executing the plan needs no graph library
    scale_order: list[int]  # the default scale's expression, in evaluation order

    def readers(self) -> dict[int, list[int]]:
        """Every node's readers, over the whole node table (a scan's update reads nodes the order leaves out)."""
        out: dict[int, list[int]] = {}
        for m, d in self.nodes.items():
            for a in set(d["args"]):
                out.setdefault(a, []).append(m)
        return out

    def fold(self, into: int, folded: list[int]) -> None:
        """Nodes `folded` leave the plan, their work now node `into`'s (a kernel's fold): `into` takes the last one's
        place in the order and its `let` (its own no longer names its value), and what read the last one reads it."""
        end = folded[-1]
        node = {k: v for k, v in self.nodes[into].items() if k != "let"}
        if "let" in self.nodes[end]:
            node["let"] = self.nodes[end]["let"]
        self.nodes[into] = node
        self.order = [into if m == end else m for m in self.order if m != into and (m == end or m not in folded)]
        for m in folded:
            del self.nodes[m]
        for m, d in list(self.nodes.items()):
            if end in d["args"]:
                self.nodes[m] = {**d, "args": tuple(into if a == end else a for a in d["args"])}

    def stages(self, g: ir.Graph, cls: Classification) -> list[str]:
        """A readable listing of the plan, stage by stage (self: a KernelPlan, which knows the scan groups)."""
        lines, pending, listed = [], [], set()
        for n in self.order:
            if n in self.read_scan:
                if pending:
                    lines.append(f"per-token: {', '.join(pending)}")
                    pending = []
                st = self.read_scan[n]
                if st in listed:
                    continue
                group = self.group(st)
                listed.update(group.states)
                fused = " (one scan, values side by side)" if len(group.states) > 1 else ""
                divided = ""
                if group.divide is not None:
                    (matrix,) = (m for m in group.states if m != group.normaliser)
                    divided = f", {matrix}'s read divided by ({group.normaliser}'s read + {group.divide:g})"
                lines.append(f"scan {' + '.join(group.states)}{fused}: {cls.scan(st).describe()}, chunk {self.chunk[st]}{divided}")
            elif g.op(n) == "stat":
                node = g.node(n)
                scope = f"per {', '.join(node['groups'])}" if node["groups"] else "over the whole input"
                lines.append(f"stat: {node['fn']} {scope} (stop-gradient)")
            elif g.op(n) == "block_attention":
                d = self.nodes[n]
                residual = d["args"][4:]
                then = f", plus {self.nodes[residual[0]].get('let') or g.label(residual[0]).split(' [')[0]}, times {d['weight']:g}" if residual else ""
                pending.append(f"block_attention(size={d['size']}{then})")
            elif g.op(n) not in ("const", "dim", "head", "scale", "input", "param", "output"):
                pending.append(g.label(n).split(" [")[0])
        if pending:
            lines.append(f"per-token: {', '.join(pending)}")
        for st in cls.scans:
            if st.state not in listed:
                lines.append(f"scan {st.state}: {st.describe()}, chunk {self.chunk[st.state]} (final state only)")
        return lines


def make_order(g: ir.Graph, cls: Classification) -> Order:
    read_scan = {r.node: s.state for s in cls.scans for r in s.reads}
    by_state = {s.state: s for s in cls.scans}
    # every read of a scan waits for all of the scan's inputs (its queries included): one node per scan stands between
    # them, so r reads of n inputs cost n + r edges rather than n * r. Scan nodes are negative (the IR's are not): the
    # lexicographic sort takes one as soon as it is ready, which leaves the IR nodes in the order direct edges give.
    scan_node = {s.state: -1 - i for i, s in enumerate(cls.scans)}
    scan_of = {v: k for k, v in scan_node.items()}
    E = nx.DiGraph()
    stack = [g.output, *(n for s in cls.scans for n in s.inputs())]
    while stack:
        n = stack.pop()
        if n in E and E.nodes[n].get("seen"):
            continue
        E.add_node(n, seen=True)
        if n in read_scan:
            deps = [scan_node[read_scan[n]]]
        elif n in scan_of:
            deps = by_state[scan_of[n]].inputs()
        else:
            deps = g.args(n)
        for d in deps:
            E.add_edge(d, n)
            stack.append(d)
    order = [n for n in nx.lexicographical_topological_sort(E) if n not in scan_of]
    nodes = {n: dict(d) for n, d in g.g.nodes(data=True)}
    need = nx.ancestors(g.g, g.scale_default) | {g.scale_default}
    scale_order = [n for n in g.order() if n in need]
    return Order(order, read_scan, nodes, scale_order)
