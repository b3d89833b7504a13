"""The IR verifier, run between passes: structure, operand wiring and dims of every node."""
from __future__ import annotations

import networkx as nx

from ..ir import graph as ir


class IRError(AssertionError):
    """An internal invariant of the IR is broken: a bug in a pass, never a user's mistake."""


def _expected_dims(g: ir.Graph, n: int) -> tuple[str, ...] | None:
    op, args = g.op(n), g.args(n)
    dims = [g.dims_of(a) for a in args]
    if op in ("reduce", "dot", "stat"):
        return ()
    if op in ("unary", "normalize", "output", "state_out"):
        return dims[0]
    if op == "binary":
        return ir.broadcast(*dims)
    if op == "outer":
        return dims[0] + dims[1]
    if op == "matmul":
        return dims[0][:-1] + dims[1][1:]
    if op == "block_attention":
        return dims[2]
    return None


def verify(g: ir.Graph) -> None:
    G = g.g
    if not nx.is_directed_acyclic_graph(G):
        raise IRError("the IR has a cycle")
    for n, d in G.nodes(data=True):
        if d["op"] not in ir.OPS:
            raise IRError(f"node {n} has unknown op {d['op']!r}")
        args = d["args"]
        if set(G.predecessors(n)) != set(args):
            raise IRError(f"node {n} ({d['op']}): edges do not match its operands")
        if d["op"] in ir.LEAF_OPS and args:
            raise IRError(f"leaf node {n} ({d['op']}) has operands")
        want = _expected_dims(g, n)
        if want is not None and set(want) != set(d["dims"]):
            raise IRError(f"node {n} ({d['op']}) has dims {d['dims']}, expected {want}")
        if d["op"] == "binary":
            a, b = (set(g.dims_of(x)) for x in args)
            if not (a <= b or b <= a):
                raise IRError(f"node {n}: operands of dims {a} and {b} do not broadcast")
        if d["op"] == "matmul" and g.dims_of(args[0])[-1:] != g.dims_of(args[1])[:1]:
            raise IRError(f"node {n}: matmul contracts mismatched dims")
    if g.output is None or g.op(g.output) != "output":
        raise IRError("the IR has no output node")
    for name in g.states:
        if g.op(g.state_in[name]) != "state_in" or g.op(g.state_out[name]) != "state_out":
            raise IRError(f"state {name} lacks its state_in/state_out nodes")
