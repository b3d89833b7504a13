"""Normalised reads: a scan's read divided by its normaliser's read, folded into the scan.

A normalised linear attention writes `o = (q @ S) / (q @ z + eps)`, z the vector state the chunk kernels carry
beside S (the group's normaliser). Evaluated as written, the scan stores q @ S and q @ z, and a pass of its own
reads both to divide: a read and a write of the whole output. Folded, the scan's output kernel, which holds both
reads' rows, stores the quotient itself; its backward turns the quotient's gradient into the two reads'.

The plan's node table (not the IR, which the interpreter evaluates as written) takes the fold: for a group of one
matrix state S and its normaliser z, each read once, where S's read has one reader `r_S / d`, and d is z's read or
`r_z + c` (either order, c a number) read by that division alone, the group's `divide` is c (0 for `r_S / r_z`), the
division and the sum leave the node table, S's read takes the division's place and `let` (Order.fold), and what read
the division reads S's read. Every scan implementation gives the quotient (runtime/scan.py: scan_group divides where the implementation
does not carry the normaliser itself).
"""
from __future__ import annotations

import dataclasses

from .classify import Classification
from .order import Order


def fold_normalised_reads(plan: Order, cls: Classification) -> None:
    """Fold each group's division of its matrix read by its normaliser's into the group (in place, on plan.groups,
    plan.order and plan.nodes; plan a KernelPlan)."""
    for i, group in enumerate(plan.groups):
        if group.normaliser is None or len(group.states) != 2:
            continue
        (matrix,) = (st for st in group.states if st != group.normaliser)
        reads, z_reads = cls.scan(matrix).reads, cls.scan(group.normaliser).reads
        if len(reads) != 1 or len(z_reads) != 1:
            continue
        found = _division(plan.nodes, plan.readers(), reads[0].node, z_reads[0].node)
        if found is not None:
            folded, eps = found
            plan.fold(reads[0].node, folded)
            plan.groups[i] = dataclasses.replace(group, divide=eps)


def _division(nodes: dict[int, dict], readers: dict[int, list[int]], r_s: int, r_z: int) -> tuple[list[int], float] | None:
    """(the nodes folded, the division last, eps) where r_s's one reader is r_s / (r_z [+ eps]), else None."""
    if len(readers.get(r_s, [])) != 1:
        return None
    division = readers[r_s][0]
    d = nodes[division]
    if d["op"] != "binary" or d["fn"] != "div" or d["args"][0] != r_s or d["args"][1] == r_s or d["dims"] != nodes[r_s]["dims"]:
        return None
    den = d["args"][1]
    if den == r_z:
        return ([division], 0.0) if readers.get(r_z) == [division] else None
    e = nodes[den]
    if e["op"] != "binary" or e["fn"] != "add" or r_z not in e["args"] or e["args"][0] == e["args"][1]:
        return None
    c = e["args"][1] if e["args"][0] == r_z else e["args"][0]
    if nodes[c]["op"] != "const" or nodes[c]["dims"] or readers.get(den) != [division] or readers.get(r_z) != [den]:
        return None
    return [den, division], float(nodes[c]["value"])
