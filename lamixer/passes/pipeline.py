"""The front half of the pipeline: spec text -> parsed, lowered, verified, classified, planned IR."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from ..errors import SpecError
from ..frontend.parser import parse
from ..ir import graph as ir
from ..ir.lower import lower
from ..runtime.call import Operand, Signature
from .classify import Classification, classify
from .kernel_plan import KernelPlan, make_plan
from .rewrite import distribute_reads
from .verify import verify


@dataclass
class Compiled:
    graph: ir.Graph
    classification: Classification
    plan: KernelPlan
    source: str
    filename: str
    # per-call work done once per call signature (bindings, backend choices, constants): see lamixer.runtime.call
    cache: dict = field(default_factory=dict, repr=False, compare=False)
    # what binding a call checks, as plain data (lamixer.runtime.call); made here, not on first use, so that
    # torch.compile tracing a first call finds it made
    signature: Signature = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        g = self.graph
        # the inputs' declared domains go with them: lamixer's calls and a compiled package's (which writes this
        # signature out) check them alike (lamixer.runtime.call.check_domains)
        operands = tuple(Operand(op.name, op.kind, op.dims, op.per_head, op.domain) for op in g.operands)
        self.signature = Signature(g.name, operands, tuple((name, s.dims) for name, s in g.states.items()), g.uses_scale,
                                   tuple((d["name"], d["groups"]) for _, d in ir.stats(g)),
                                   tuple((d["size"], g.dims_of(d["args"][1])[0], g.dims_of(d["args"][2])[0]) for _, d in ir.blocks(g)))  # fmt: skip

    @property
    def name(self) -> str:
        return self.graph.name

    @property
    def source_hash(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()[:16]


def compile_spec(source: str, filename: str = "<spec>") -> Compiled:
    """Run the front end and every pass; a user mistake raises a SpecError naming file:line:column."""
    spec = parse(source, filename)
    try:
        graph = lower(spec)
        verify(graph)
        distribute_reads(graph)
        verify(graph)
        cls = classify(graph)
        graph.prune(tuple(n for s in cls.scans for n in s.inputs()))
        verify(graph)
        plan = make_plan(graph, cls)
    except SpecError as e:
        raise e.located(source, filename) from None
    except RecursionError:
        raise SpecError("the spec nests expressions too deeply", None, source, filename) from None
    return Compiled(graph, cls, plan, source, filename)
