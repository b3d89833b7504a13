"""Block attention epilogues: the sum and constant factor that end a block attention's value, folded into its kernel.

LLN writes `out o = (o_lln + block_attention(q, k, v, ...)) / 2`. Evaluated as written, the attention's result is
added and halved in a pass of its own, and the backward makes a halved copy of the output's gradient for the
attention, which a compiled backward makes beside the scans' gradients, at the mixer's peak. Folded, the attention
stores weight * (attention + residual) itself: no pass, and its backward reads the output's gradient as it comes.

The plan's node table (not the IR, which the interpreter evaluates as written) takes the fold: for a block attention
whose one reader is `x + attention` (or `attention + x`, x of the attention's dims), the attention node takes x as a
fifth operand, its `residual`; a constant factor on that sum (`s * c`, `c * s`, `s / c`, c a number, s read by that
alone) becomes its `weight`. The folded node keeps the attention's id (a call's window is indexed by it) and takes
the last folded node's place in the order; what read that node reads the attention.
"""
from __future__ import annotations

from .order import Order


def fold_epilogues(plan: Order) -> None:
    """Fold each block attention's trailing sum and constant factor into it (in place, on plan.order and plan.nodes)."""
    for n in [n for n in plan.order if plan.nodes[n]["op"] == "block_attention"]:
        readers = plan.readers()
        s = _fold_residual(plan, n, readers)
        if s is not None:
            f = _fold_weight(plan, n, s, readers)
            plan.fold(n, [s] if f is None else [s, f])


def _fold_residual(plan: Order, n: int, readers: dict[int, list[int]]) -> int | None:
    """The sum node folded into attention n as its residual (its operands become the attention's), or None."""
    nodes = plan.nodes
    if len(readers.get(n, [])) != 1:
        return None
    s = readers[n][0]
    d = nodes[s]
    if d["op"] != "binary" or d["fn"] != "add" or n not in d["args"] or d["args"][0] == d["args"][1]:
        return None
    x = d["args"][1] if d["args"][0] == n else d["args"][0]
    if nodes[x]["dims"] != nodes[n]["dims"]:
        return None
    nodes[n] = {**nodes[n], "args": (*nodes[n]["args"], x), "weight": 1.0}
    return s


def _fold_weight(plan: Order, n: int, s: int, readers: dict[int, list[int]]) -> int | None:
    """The constant-factor node on sum s folded into attention n as its weight, or None."""
    nodes = plan.nodes
    if len(readers.get(s, [])) != 1:
        return None
    f = readers[s][0]
    d = nodes[f]
    if d["op"] != "binary" or d["fn"] not in ("mul", "div") or d["args"][0] == d["args"][1]:
        return None
    c = d["args"][1] if d["args"][0] == s else d["args"][0]
    constant = nodes[c]["op"] == "const" and not nodes[c]["dims"]
    if not constant or (d["fn"] == "div" and (d["args"][0] != s or nodes[c]["value"] == 0)):
        return None
    value = float(nodes[c]["value"])
    nodes[n] = {**nodes[n], "weight": value if d["fn"] == "mul" else 1.0 / value}
    return f
