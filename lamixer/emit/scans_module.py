"""A package's Triton wiring: its rendered kernels, their host code, and scans.py, the one module that calls them.

The kernels are rendered exactly as lamixer's triton backend renders them, float32 accumulation
only (a package runs float64 calls on its torch fallback): chunk_additive for an additive scan with
every decay of the additive rule (none, scalar, along the key or the value dim), scan_delta for the delta rule, and
the recurrent kernel that runs every scan for inference on short sequences (decoding).

THIS IS THE PIECE TO RE-POINT when lamixer's kernel host code moves: today it lives in
lamixer/backends/triton.py (the additive families), triton_delta.py (the delta rule) and
recurrent.py, so `host_files` copies the definitions a package needs from each (and the
configuration from lamixer/autotune.py), unchanged, into <kernels>/host.py, host_delta.py and
host_recurrent.py. A definition that disappears or is renamed there, or one the copies start to use
without copying it, stops `lamixer compile` with an error naming this file.
"""
from __future__ import annotations

import ast
import builtins
import inspect
import symtable
import textwrap
from dataclasses import dataclass

from ..backends import recurrent, triton_delta
from ..backends import triton as triton_backend
from ..passes.pipeline import Compiled
from ..tuning import autotune
from . import source as src

ACC = "float32"


def unsupported(compiled: Compiled) -> list[str]:
    """Why the chunk templates cannot run a spec's scans (empty when they can): the triton backend's reasons."""
    return triton_backend.unsupported(compiled)


def chunk_config(scan) -> tuple[str, str, str]:
    """(template, decay, read) of a classified scan's chunk kernels, as the triton backend picks them."""
    if scan.rule == "delta":
        return (triton_delta.FAMILY, *triton_delta.template_config(scan))
    decay, read = triton_backend.template_config(scan)
    return (triton_backend.FAMILY, decay, read)


def chunk_configs(compiled: Compiled) -> list[tuple[str, str, str]]:
    """The (template, decay, read) chunk kernel configurations a spec's scans train on (empty when the templates cannot run it)."""
    if unsupported(compiled):
        return []
    return sorted({chunk_config(s) for s in compiled.classification.scans})


def normalisers(compiled: Compiled) -> set[str]:
    """The vector states the chunk kernels carry as a normaliser of the scan they are fusable with (one vector state
    beside matrix states: runtime.scan.scan_group, chunk_additive's `ones`)."""
    found = set()
    for group in compiled.plan.fusable:
        vectors = [st for st in group if compiled.classification.scan(st).value_dim is None]
        if len(vectors) == 1 and len(group) > 1:
            found.add(vectors[0])
    return found


def carries_normaliser(compiled: Compiled, state: str) -> bool:
    """Whether the chunk kernels of `state`'s scan carry a normaliser (a vector state of its group: normalisers)."""
    carried = normalisers(compiled)
    return state not in carried and any(state in g and carried & set(g) for g in compiled.plan.fusable)


def chunk_modules(compiled: Compiled) -> list[str]:
    """The chunk kernel modules a spec trains on, by name: <template>_<decay>_<read>, with _ones where the scan
    carries a normaliser (whose own scan then runs on none of its own)."""
    if unsupported(compiled):
        return []
    carried = normalisers(compiled)
    return sorted({"_".join(chunk_config(s)) + ("_ones" if carries_normaliser(compiled, s.state) else "")
                   for s in compiled.classification.scans if s.state not in carried})  # fmt: skip


def recurrent_configs(compiled: Compiled) -> list[tuple[str, str, str]]:
    """The (rule, decay, reads) recurrent kernel configurations a spec's scans decode on (empty for a scan without reads)."""
    scans = compiled.classification.scans
    if not scans or any(not s.reads for s in scans):
        return []
    return sorted({recurrent.template_config(s) for s in scans})


def configs(compiled: Compiled) -> list[str]:
    """The rendered kernel modules a spec runs on, by module name: its chunk kernels, then its recurrent ones."""
    return chunk_modules(compiled) + [f"recurrent_{'_'.join(c)}" for c in recurrent_configs(compiled)]


def kernel_module(name: str) -> str:
    """The source of one rendered kernel module, by its name from `configs`."""
    if name.startswith("recurrent_"):
        rule, decay, reads = name[len("recurrent_") :].split("_", 2)
        return triton_backend.render("recurrent", rule=rule, decay=decay, reads=reads, acc=ACC)
    ones = name.endswith("_ones")
    family, decay, read = name.removesuffix("_ones").rsplit("_", 2)
    return triton_backend.render(family, **triton_backend.template_args(decay, read, ACC, ones))


# ---- host code, copied from lamixer ----
@dataclass(frozen=True)
class _Host:
    """One host module of a package's kernels: what it copies (lamixer module, names, each in file order) around its own code."""

    file: str
    copies: tuple
    custom_ops: int  # how many torch.library custom ops the copies register
    own: str  # the module's own code, after its docstring: imports and what replaces lamixer's autotuning and loading
    own_doc: str  # what the own code does, for the docstring
    rewrites: tuple[tuple[str, str], ...] = ()  # imports inside copied functions, pointed at the package's modules
    tail: str = ""


_NAMESPACE = 'NAMESPACE = __name__.replace(".", "_")  # custom ops\' namespace: this copy\'s own, whoever else is imported\n'
_NAMESPACE_DOC = "NAMESPACE registers the custom ops under this module's import name"
_DEFAULT_DOC = "scan_config gives every call the default configuration (lamixer's tuned ones live in lamixer's cache, not here)"

HOSTS = (
    _Host(
        "host.py",
        ((triton_backend, ("_ACC", "MAX_HEAD_DIM", "_read_mode", "template_args",
                           "FAMILY", "STRIP_DECAYS", "FLOAT32_DOTS", "_strip_args",
                           "STRIP", "diagonal_span", "_chunks", "_chunk_cumsum", "_snapshot_dtype", "PRECISION", "_chunk_forward",
                           "chunk_scan", "_chunk_backward_impl", "chunk_scan_backward", "_chunk_save", "_chunk_grads",
                           "_chunk_setup_context", "_EagerChunkScan", "launch_problems", "run_scan_op", "run_chunk_scan",
                           "state_key_block", "walk_key_blocks", "state_stages", "ACC_PRECISIONS", "bf16_interpreted", "_acc_precision", "_launch",
                           "triton_cdiv", "triton_scan")),
         (autotune, ("Config", "_pow2", "default_config"))),
        custom_ops=2,
        own_doc=f"kernels() imports the rendered modules beside this file; {_DEFAULT_DOC}; {_NAMESPACE_DOC}",
        own=f'''import importlib
import os
from dataclasses import dataclass

import torch

from ..runtime.scan import ScanOperands

{_NAMESPACE}

def kernels(family: str, acc: str, **config):
    """The rendered kernel module of one configuration: <family>_<config values>.py beside this file ({ACC} only)."""
    if acc != {src.text(ACC)}:
        raise ValueError(f"these kernels accumulate in {ACC}, not {{acc}}")
    name = "_".join([family, *(k if v is True else v for k, v in config.items())])
    module = importlib.import_module(f".{{name}}", __package__)
    module.NAME = f"{{name}}_{{acc}}"
    return module


def scan_config(decay, read, acc, dtype, B, T, H, K, V, device, ones=False):
    """The additive kernels' configuration: the default."""
    return default_config(decay, K, V)
''',
        tail="\n\ntriton_scan.normaliser = True  # takes ScanOperands.z0 (runtime.scan.scan_group)\n"
             "\nfrom . import host_delta as triton_delta  # noqa: E402  (the delta rule's host code; it uses the helpers above)\n",
    ),
    _Host(
        "host_delta.py",
        ((triton_delta, ("FAMILY", "SEGMENT", "SOLVE_HALF", "CHUNK_BLOCK", "default_config", "_forward", "_delta_forward", "delta_scan", "_delta_backward", "delta_scan_backward",
                         "_segment_suffix_sums", "_decay_grad", "_setup_context", "_grads", "_backward", "_EagerDeltaScan", "triton_delta_scan")),),
        custom_ops=2,
        own_doc=f"tb is host.py, as lamixer's triton backend is to its delta rule; {_DEFAULT_DOC}; {_NAMESPACE_DOC}",
        own=f'''import torch

from ..runtime import fuse
from ..runtime.scan import ScanOperands
from . import host as tb
from .host import Config, _pow2

{_NAMESPACE}

def scan_config(decay, read, acc, dtype, B, T, H, K, V, device, ones=False):
    """The delta kernels' configuration: the default."""
    return default_config(decay, K, V)
''',
    ),
    _Host(
        "host_recurrent.py",
        ((recurrent, ("MAX_T", "MAX_HEAD_DIM", "_read_mode", "_READS", "_reads", "_multiprocessors", "WARPS", "WIDEST",
                      "blocks", "_strides", "_kernel", "launch", "recurrent_scan", "scan")),),
        custom_ops=1,
        own_doc=f"{_NAMESPACE_DOC}; _kernel imports kernels() and _ACC from host.py",
        own=f'''import functools

import torch

from ..runtime.scan import STATES_IN_PLACE, KeyForm, ScanOperands
from .host import _pow2

{_NAMESPACE}''',
        rewrites=(("from .triton import _ACC, kernels", "from .host import _ACC, kernels"),),
    ),
)  # fmt: skip


def _copy(module, names: tuple[str, ...]) -> list[str]:
    """The top-level definitions of `names` in module's source, unchanged and in file order (a decorated function with
    its decorators; `@x.register_fake` functions and `x.register_autograd(...)` calls go with x)."""
    text = inspect.getsource(module)
    lines = text.splitlines()
    found, parts = [], []
    for node in ast.parse(text).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            name = node.name
            if name == "_" and node.decorator_list:  # a registration: @chunk_scan.register_fake
                name = ast.unparse(node.decorator_list[0]).split(".")[0]
                found.remove(name) if name in found else None
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            name = targets[0].id if isinstance(targets[0], ast.Name) else None
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            name = ast.unparse(node.value.func).split(".")[0]
            found.remove(name) if name in found else None
        else:
            continue
        if name in names:
            first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            parts.append("\n".join(lines[first - 1 : node.end_lineno]))
            found.append(name)
    missing = [n for n in names if n not in found]
    if missing or len(found) != len(names):
        raise RuntimeError(f"{module.__name__} no longer defines {', '.join(missing) or 'its host code as expected'}: "
                           "re-point lamixer/emit/kernels.py, the compiled packages' Triton wiring")  # fmt: skip
    return parts


def _source_file(module) -> str:
    return "lamixer/" + module.__name__.split(".", 1)[1].replace(".", "/") + ".py"


def host_source(host: _Host) -> str:
    """<kernels>/<host.file>: the kernels' host code, copied from lamixer (see the module docstring)."""
    copied = [part for module, names in host.copies for part in _copy(module, names)]
    for i, part in enumerate(copied):  # each copy registers its custom ops under its own module's name
        part = part.replace('custom_op("lamixer::', 'custom_op(f"{NAMESPACE}::')
        for old, new in host.rewrites:
            part = part.replace(old, new)
        copied[i] = part
    where = _source_file(host.copies[0][0])
    if sum(part.count("{NAMESPACE}::") for part in copied) != host.custom_ops:
        raise RuntimeError(f"{where} registers other custom ops now: re-point lamixer/emit/kernels.py")
    for old, new in host.rewrites:
        if not any(new in part for part in copied):
            raise RuntimeError(f"{where} no longer has `{old}`: re-point lamixer/emit/kernels.py")
    origins = "; ".join(f"from {_source_file(module)}: {', '.join(names)}" for module, names in host.copies)
    head = f'''"""Host code of the generated Triton kernels beside this file: launches, torch.library custom ops, autograd.

Copied by lamixer compile, unchanged but for the custom ops' namespace and the imports inside functions,
{_wrap(origins)}.
{_wrap(f"What comes before the copies is this file's own: {host.own_doc}.")}
"""
from __future__ import annotations

'''
    source = head + host.own.rstrip("\n") + "\n\n\n" + "\n\n\n".join(copied) + "\n" + host.tail
    missing = _undefined(source)
    if missing:
        raise RuntimeError(f"the host code copied from {where} uses {', '.join(missing)}, which it does not copy: "
                           "re-point lamixer/emit/kernels.py, the compiled packages' Triton wiring")  # fmt: skip
    return source


def host_files() -> dict[str, str]:
    """<kernels>/host*.py by file name."""
    return {host.file: host_source(host) for host in HOSTS}


def _undefined(source: str) -> list[str]:
    """Global names the module's code reads but neither defines, imports nor finds among the builtins."""
    top = symtable.symtable(source, "host.py", "exec")
    defined = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported()} | set(dir(builtins))
    used: set[str] = set()

    def walk(table):
        for sym in table.get_symbols():
            if table.get_type() != "module" and sym.is_global() and sym.is_referenced():
                used.add(sym.get_name())
            elif table.get_type() == "module" and sym.is_referenced():
                used.add(sym.get_name())
        for child in table.get_children():
            walk(child)

    walk(top)
    return sorted(used - defined)


def _wrap(text: str, width: int = 100) -> str:
    return "\n".join(textwrap.wrap(text, width))


def scans_module(compiled: Compiled, runtime: str, kernels: str) -> str:
    """<package>/scans.py. kernels: the kernel package's module path from it (".kernels" or "..kernels")."""
    chunk = chunk_modules(compiled)
    rec = [f"recurrent_{'_'.join(c)}" for c in recurrent_configs(compiled)]
    where = kernels.lstrip(".")
    missing = unsupported(compiled)
    trains = f"{', '.join(chunk)} for training and long sequences" if chunk else f"no chunk kernels ({'; '.join(missing)})"
    about = (f"The kernels in {where}/ are rendered from lamixer's templates for this spec's classification and run as lamixer's "
             f"triton backend runs them: {trains}; {', '.join(rec)} for inference on sequences of at most {recurrent.MAX_T} tokens "
             f"(decoding). Their host code is {where}/host*.py.")  # fmt: skip
    m = src.Module(f"""{src.doc(compiled.name)}'s scans on the generated Triton kernels: the package's one point of contact with them.

{_wrap(src.doc(about))}
""", runtime)  # fmt: skip
    m.use("functools")
    m.use("os")
    m.use("torch")
    m.use(kernels, "host")
    m.use(kernels, "host_recurrent")
    m.use(runtime + ".call", "pick_backend")
    m.use(runtime + ".call", "remember")
    m.use(runtime + ".scan", "torch_scan")
    scans = compiled.classification.scans
    checks = list(dict.fromkeys((s.state, d) for s in scans for d in (s.key_dim, s.value_dim) if d is not None))
    key_dims = list(dict.fromkeys(s.key_dim for s in scans))
    m.write(
        f"CHUNK_MISSING = ({''.join(src.text(r) + ', ' for r in missing).rstrip(' ')})  # why the chunk kernels cannot run this spec"
        if missing else "CHUNK_MISSING = ()  # the chunk kernels run every scan of this spec",
        "",
        "",
        "def serves(call) -> bool:",
        '    """Whether the recurrent kernel runs this call\'s scans: no gradient is asked for, no sequence is longer than',
        '    host_recurrent.MAX_T and every key dim fits a program\'s registers (float32 calls and narrower)."""',
        "    if call.longest > host_recurrent.MAX_T or call.compute_dtype == torch.float64:",
        "        return False",
        "    if torch.is_grad_enabled() and (any(t.requires_grad for t in call.inputs.values())",
        "                                    or any(s.requires_grad for s in call.initial_state.values())):  # fmt: skip",
        "        return False",
        f"    return {' and '.join(f'call.sizes[{src.text(d)}] <= host_recurrent.MAX_HEAD_DIM' for d in key_dims)}",
        "",
        "",
        "def unsupported(call) -> list[str]:",
        '    """Why the chunk kernels cannot run this call (empty when they can)."""',
        "    reasons = list(CHUNK_MISSING)",
        "    if call.compute_dtype == torch.float64:",
        '        reasons.append("the kernels here accumulate in float32; float64 calls run on the torch fallback")',
        f"    for state, dim in [{', '.join(f'({src.text(s)}, {src.text(d)})' for s, d in checks)}]:",
        "        if call.sizes[dim] > host.MAX_HEAD_DIM:",
        '            reasons.append(f"state {state}: {dim} = {call.sizes[dim]} is above the kernels\' {host.MAX_HEAD_DIM}")',
        "    return reasons",
        "",
        "",
        "def choose(call, backend):",
        '    """The scan function for scan_group: the recurrent kernel for inference on short sequences, else the chunk kernels,',
        '    in the inputs\' dtype when it is bf16 or fp16, else in float32; torch_scan when backend "auto" finds they cannot',
        '    run the call (or no GPU); an ArgumentError when backend "triton" insists. Worked out once per call signature."""',
        '    key = ("scan", backend, torch.is_grad_enabled(), call.longest <= host_recurrent.MAX_T, os.environ.get("TRITON_INTERPRET") == "1")',
        "    found = None if call.memo is None else call.memo.get(key)",
        "    if found is None:",
        "        found = _choose(call, backend)",
        "        if call.memo is not None:",
        "            remember(call.memo, key, found)",
        "    return found",
        "",
        "",
        "def _choose(call, backend):",
        "    recurrent = serves(call)",
        "    missing = ([] if recurrent else unsupported(call)) + (host.launch_problems(call.device) if backend == \"triton\" else [])",
        f"    if pick_backend({src.text(compiled.name)}, backend, call, missing) == \"torch\":",
        "        return torch_scan",
        "    dtype = call.out_dtype if call.out_dtype in (torch.bfloat16, torch.float16) else call.compute_dtype",
        '    if dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1" and not host.bf16_interpreted():',
        "        dtype = torch.float32  # Triton 3.6's CPU interpreter multiplies bf16 dot operands as raw bits (lamixer.emulate)",
        "    return functools.partial(host_recurrent.scan if recurrent else host.triton_scan, dtype=dtype)",
        "",
        "",
        "def chunked(scan) -> bool:",
        '    """Whether choose() picked the chunk kernels (whose per-token work runtime/fuse.py fuses on a GPU)."""',
        "    return isinstance(scan, functools.partial) and scan.func is host.triton_scan",
    )
    return m.text()
