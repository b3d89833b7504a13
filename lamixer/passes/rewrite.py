"""Rewrite rules that bring every read of a state into the form `x @ S_version`.

A read of an expression of states, such as RWKV's r @ (S + outer(u * k, v)), is distributed
until each `@` meets a state version directly: x @ (A + B) -> x @ A + x @ B,
x @ outer(a, b) -> dot(x, a) * b, x @ (f * A) -> (x * f) @ A for f over the contracted dim.
"""
from __future__ import annotations

import networkx as nx

from ..ir import graph as ir


def _is_version(g: ir.Graph, n: int) -> bool:
    d = g.node(n)
    return d["op"] == "state_in" or "version_of" in d


def _touches_state(g: ir.Graph, n: int) -> bool:
    states = set(g.state_in.values())
    return n in states or bool(nx.ancestors(g.g, n) & states)


def _rewrite_one(g: ir.Graph, m: int) -> int | None:
    """A replacement node for matmul m, or None when no rule applies."""
    x, r = g.args(m)
    loc, dx, dr = g.node(m)["loc"], g.dims_of(x), g.dims_of(r)
    d = g.node(r)
    if len(dx) != 1 or _is_version(g, r) or (d["op"] != "outer" and not _touches_state(g, r)):
        return None
    op, args = d["op"], d["args"]
    out = g.dims_of(m)

    def mm(y: int, a: int) -> int:
        return g.add("matmul", (y, a), g.dims_of(y)[:-1] + g.dims_of(a)[1:], loc)

    def bin(fn: str, a: int, b: int, dims) -> int:
        return g.add("binary", (a, b), dims, loc, fn=fn)

    if op == "outer":
        a, b = args
        return bin("mul", g.add("dot", (x, a), (), loc), b, g.dims_of(b))
    if op == "binary" and d["fn"] in ("add", "sub"):
        a, b = args
        if g.dims_of(a) == dr and g.dims_of(b) == dr:
            return bin(d["fn"], mm(x, a), mm(x, b), out)
        if g.dims_of(b) == dr and not g.dims_of(a) and g.is_fn(a, "const") and g.node(a)["value"] == 0 and d["fn"] == "sub":
            return bin("sub", a, mm(x, b), out)
        return None
    if op == "binary" and d["fn"] in ("mul", "div"):
        a, b = args
        mat, f = (a, b) if g.dims_of(a) == dr else (b, a)
        if g.dims_of(mat) != dr or (d["fn"] == "div" and mat != a):
            return None
        df = g.dims_of(f)
        if df == () or df == dr[1:2]:  # a scalar, or a factor over the kept dim
            return bin(d["fn"], mm(x, mat), f, out)
        if df == dr[:1] and d["fn"] == "mul":  # a factor over the contracted dim moves onto the query
            return mm(bin("mul", x, f, dx), mat)
    return None


def distribute_reads(g: ir.Graph) -> None:
    """Apply the rules until no `@` reads an expression of states (or an outer product)."""
    changed = True
    while changed:
        changed = False
        for m in g.order():
            if m in g.g and g.op(m) == "matmul":
                new = _rewrite_one(g, m)
                if new is not None:
                    for succ in list(g.g.successors(m)):
                        g.replace_args(succ, tuple(new if a == m else a for a in g.args(succ)))
                    if g.output == m:
                        g.output = new
                    g.g.remove_node(m)
                    changed = True
                    break
    g.prune()
