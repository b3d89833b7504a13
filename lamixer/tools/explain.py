"""Human-readable summaries of a compiled spec: one row for `lamixer list`, a report for `explain`."""
from __future__ import annotations

from ..kernels.recurrent import MAX_T
from ..passes.pipeline import Compiled


def _shape(dims, per_head=False) -> str:
    dims = (["H"] if per_head else []) + list(dims)
    return "[" + ",".join(dims) + "]"


def _decay(s) -> str:
    return {"key": f"along {s.key_dim}", "value": f"along {s.value_dim}"}.get(s.decay, s.decay)


_INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/", "pow": "^"}


def expr(g, n: int, depth: int = 4, top: bool = True) -> str:
    """A node as spec-like text, naming let-bound values (deep subexpressions elided)."""
    d = g.node(n)
    op = d["op"]
    if "let" in d and not top:
        return d["let"]
    if op in ("input", "param", "dim", "state_in"):
        return d["name"]
    if op == "const":
        return f"{d['value']:g}"
    if op in ("head", "scale"):
        return "h" if op == "head" else "scale"
    if depth == 0:
        return "..."
    args = [expr(g, a, depth - 1, False) for a in d["args"]]
    if op == "binary" and d["fn"] in _INFIX:
        if d["fn"] == "sub" and g.is_fn(d["args"][0], "const") and g.node(d["args"][0])["value"] == 0:
            return f"-{args[1]}"
        return f"({args[0]} {_INFIX[d['fn']]} {args[1]})"
    if op == "matmul":
        return f"({args[0]} @ {args[1]})"
    if op in ("unary", "binary", "reduce", "normalize", "stat"):
        if top and "let" in d:
            return d["let"]
        return f"{d['fn']}({', '.join(args)})"
    return f"{op}({', '.join(args)})"


def summary(c: Compiled) -> dict[str, str]:
    g, cls = c.graph, c.classification
    extras = []
    if cls.stats:
        extras.append("whole-input stats")
    if cls.side_branches:
        extras.append("block softmax")
    if cls.denominators:
        extras.append("denominator")
    if any(r.written is False for s in cls.scans for r in s.reads):
        extras.append("read before update")
    return {
        "name": g.name,
        "inputs": " ".join(op.name + _shape(op.dims, op.per_head) for op in g.operands),
        "states": " ".join(n + _shape(s.dims) for n, s in g.states.items()),
        "rule": cls.update_rule,
        "decay": _decay(cls.scans[0]) if len(cls.scans) == 1 else "; ".join(f"{s.state}: {_decay(s)}" for s in cls.scans),
        "composition": cls.composition,
        "extras": ", ".join(extras) or "-",
    }


def default_scale_text(compiled: Compiled) -> str:
    """The default scale as the spec (or the language's rule, lowered like a spec's) writes it."""
    text = expr(compiled.graph, compiled.graph.scale_default)
    depth = 0  # without the parentheses around the whole
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0 and i < len(text) - 1:
            return text
    return text[1:-1] if text.startswith("(") else text


def report(c: Compiled) -> list[str]:
    g, cls, plan = c.graph, c.classification, c.plan
    lines = [f"mixer {g.name}: {g.title}" if g.title else f"mixer {g.name}", ""]
    lines.append("call:   " + ", ".join(op.name + _shape(op.dims, op.per_head) for op in g.operands) + " -> " + g.output_name + _shape(g.dims_of(g.output)))
    lines.append("states: " + ", ".join(n + _shape(s.dims) for n, s in g.states.items()))
    lines.append("scale:  " + default_scale_text(c) + " unless the call gives one")
    lines.append(f"graph:  {g.g.number_of_nodes()} nodes, {g.g.number_of_edges()} edges")
    lines.append("")
    lines.append(f"update rule: {cls.update_rule}; composition: {cls.composition}")
    for s in cls.scans:
        lines.append(f"  state {s.state}[{s.key_dim}{', ' + s.value_dim if s.value_dim else ''}]: {s.describe()}")
        for r in s.reads:
            lines.append(f"    read {s.state + ' whole' if r.query is None else f'{expr(g, r.query)} @ {s.state}'} ({r.when})")
        if len(s.writes) == 1:
            lines.extend(_write(g, s, s.writes[0], "    "))
        for i, w in enumerate(s.writes if len(s.writes) > 1 else ()):
            lines.append(f"    sub-step {i + 1}:")
            lines.extend(_write(g, s, w, "      "))
    if cls.denominators:
        lines.append(f"  normalization: divides by reads of {', '.join(cls.denominators)}")
    for n in cls.stats:
        d = g.node(n)
        lines.append(f"  statistic: {d['fn']} {'per ' + ', '.join(d['groups']) if d['groups'] else 'over the whole input'} (line {d['loc'].line})")
    for n in cls.side_branches:
        lines.append(f"  side branch: block-diagonal causal softmax attention, block {g.node(n)['size']} (line {g.node(n)['loc'].line})")
    if plan.fusable:
        lines.append("  fusable scans: " + "; ".join(" + ".join(f) for f in plan.fusable) + " (same keys, decay and queries)")
    lines.append("")
    lines.append("plan:")
    lines.extend(f"  {i + 1}. {stage}" for i, stage in enumerate(plan.stages(g, cls)))
    lines.append("")
    lines.extend(_kernels(c))
    return lines


def _write(g, s, w, indent: str) -> list[str]:
    """One write of a state's token update, with the decays just above it."""
    key = "1" if w.key is None else expr(g, w.key)
    lines = [f"{indent}write key {key}" + (f", value {expr(g, w.value)}" if w.value is not None else "")]
    if w.erase is not None:
        seen = "before its decay" if w.erase_before_decay else "as the write finds it"
        lines.append(f"{indent}delta correction: the value is b + c @ {s.state} ({seen}) with c = {expr(g, w.erase)}")
    if w.log_decay is not None:
        lines.append(f"{indent}log decay {expr(g, w.log_decay)}")
    return lines


def _kernels(c: Compiled) -> list[str]:
    """Which generated kernels the triton backend runs for each scan group (the kernel plan's), or why it cannot."""
    groups = c.plan.groups
    missing = [r for g in groups for r in g.missing]
    if missing:
        lines = ["triton kernels: none (the torch backend runs what the recurrent kernel does not): " + "; ".join(missing)]
    else:
        lines = ["triton kernels:"]
        for g in groups:
            lines.append(f"  scan {' + '.join(g.states)}: {g.train.module}_float32_{{{', '.join(g.train.names)}}}")
            if g.normaliser is not None:
                lines.append(f"    {g.normaliser}: carried by these kernels as their normaliser (its own [K] state; reads: score rows summed)")
            if g.divide is not None:
                lines.append(f"    the output kernel stores the read divided by the normaliser's read + {g.divide:g}")
            if g.strengths:
                strengths = ", ".join(expr(c.graph, n) for n in g.strengths)
                lines.append(f"    write keys: -strength * erase key, strength {strengths} (the chunk kernels scale their products by it: no write key tensor)")
        for n in c.classification.side_branches:
            lines.append(f"  block attention (line {c.graph.node(n)['loc'].line}): block_attention_{{fwd_kernel, dq_kernel, dkv_kernel}}"
                         " (torch's SDPA where a call continues a window)")
    if any(g.decode is None for g in groups):
        return lines + (["recurrent kernel: none (" + "; ".join(missing or ["a scan without reads"]) + ")"] if groups else [])
    lines.append(f"recurrent kernel (inference, sequences of at most {MAX_T} tokens):")
    lines.extend(f"  scan {' + '.join(g.states)}: {g.decode.module}_float32_kernel" for g in groups)
    return lines


def _role(c: Compiled, group, n: int) -> str:
    """What scan operand node n is to its group: the name `explain --json` lists a finished operand under."""
    s = c.classification.scan(group.states[0])
    roles = {s.write_key: "write key", s.erase_key: "erase key"}
    roles.update({w.log_decay: "log decay" for w in s.writes if w.log_decay is not None})
    roles.update({c.classification.scan(st).write_value: f"value of {st}" for st in group.states})
    roles.update({r.query: "query" if len(s.reads) == 1 else f"query {i}" for i, r in enumerate(s.reads)})
    roles.update({st: "strength" if len(group.strengths) == 1 else f"strength {i}" for i, st in enumerate(group.strengths)})
    return roles[n]


def _kernels_json(k) -> dict | None:
    return None if k is None else {"template": k.template, "args": dict(k.args), "kernels": list(k.names), "module": k.module}


def plan_json(c: Compiled) -> dict:
    """The kernel plan as plain data (`lamixer explain SPEC --json`)."""
    nodes = c.plan.nodes
    scans = []
    for g in c.plan.groups:
        finished = {when: {_role(c, g, n): form.as_dict(nodes) for n, form in forms}
                    for when, forms in (("train", g.finished_train), ("decode", g.finished_decode))}  # fmt: skip
        scans.append({
            "states": list(g.states), "family": g.family, "decay": g.decay.as_dict(), "read": g.read if g.read else list(g.reads),
            "normaliser": g.normaliser, "divide": g.divide, "key_dim": g.key_dim, "value_dims": list(g.value_dims), "finished": finished,
            "kernels": {"train": _kernels_json(g.train), "decode": _kernels_json(g.decode)},
            "config_key": g.train.module if g.train else None, "torch_chunk": g.chunk, "missing": list(g.missing),
            "substeps": [step.as_dict() for step in g.substeps], "read_steps": list(g.read_steps),
            "strengths": [expr(c.graph, n) for n in g.strengths],
        })  # fmt: skip
    # a residual by the name the plan gives it (a folded division's read takes the division's name: passes/normalised.py)
    attention = [{"line": d["loc"].line, "residual": _named(c, d["args"][4]) if len(d["args"]) > 4 else None, "weight": d.get("weight", 1.0)}
                 for n in c.plan.order if (d := nodes[n])["op"] == "block_attention"]  # fmt: skip
    return {"spec": c.name, "title": c.graph.title, "scans": scans, "block_attention": attention}


def _named(c: Compiled, n: int) -> str:
    """Plan node n by its `let` name in the plan's node table, else as spec-like text."""
    return c.plan.nodes[n].get("let") or expr(c.graph, n)


def draw(c: Compiled, path: str) -> None:
    """Draw the IR graph, layered by dataflow depth (png, svg or pdf through matplotlib; json as node-link data)."""
    import json

    import networkx as nx

    g = c.graph
    if path.endswith(".json"):
        data = nx.node_link_data(g.g, edges="edges")
        for node in data["nodes"]:
            node["loc"] = f"{node['loc'].line}:{node['loc'].col}"
            node["label"] = g.label(node["id"])
        with open(path, "w") as f:
            json.dump(data, f, indent=1, default=str)
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    G = g.g.copy()
    for layer, nodes in enumerate(nx.topological_generations(G)):
        for n in nodes:
            G.nodes[n]["layer"] = layer
    pos = nx.multipartite_layout(G, subset_key="layer", align="horizontal")
    pos = {n: (x, -y) for n, (x, y) in pos.items()}
    width = max(8, 1.2 * max(len(list(l)) for l in nx.topological_generations(G)))
    fig, ax = plt.subplots(figsize=(width, 1.0 + 0.9 * (max(d["layer"] for _, d in G.nodes(data=True)) + 1)))
    colors = ["#f4b183" if G.nodes[n]["op"] in ("state_in", "state_out") else "#9dc3e6" if G.nodes[n]["op"] in ("input", "param") else "#e2f0d9" for n in G]
    nx.draw_networkx(G, pos, ax=ax, labels={n: g.label(n) for n in G}, node_color=colors, node_size=900, font_size=6, arrowsize=8)
    ax.set_title(f"{g.name}: IR dataflow")
    ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)
