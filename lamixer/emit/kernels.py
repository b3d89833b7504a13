"""A package's Triton wiring: its rendered kernels, their host code, and scans.py, the one module that calls them.

THIS IS THE PIECE TO RE-POINT when the rendered kernel modules carry their own host code (launches,
custom ops, autograd): today the host code lives in lamixer/backends/triton.py, so `host_source`
copies the functions it needs from there (and the configuration from lamixer/autotune.py),
unchanged, into <kernels>/host.py. Once a rendered module is self-contained, host.py goes away and
`scans_module` calls the module's own entry point instead of host.triton_scan.

The kernels are rendered exactly as the triton backend renders them (chunk_additive or
scan_additive, as triton.family picks for the decay), float32 accumulation only: a package runs
float64 calls on its torch fallback.
"""
from __future__ import annotations

import ast
import builtins
import inspect
import symtable

from .. import autotune
from ..backends import triton as triton_backend
from ..compiler import Compiled
from . import source as src

ACC = "float32"

# what host.py copies (each in file order): from lamixer/backends/triton.py, then lamixer/autotune.py
_TRITON = ("SEGMENT", "_ACC", "MAX_HEAD_DIM", "_read_mode", "_segments", "additive_scan", "additive_scan_backward", "CHUNK_DECAYS", "STRIP",
           "_chunks", "_snapshot_dtype", "_precision", "chunk_scan", "chunk_scan_backward", "_chunk_setup_context", "_chunk_backward",
           "_setup_context", "_backward", "_acc_precision", "_launch", "_segment_suffix_sums", "_decay_grad", "triton_cdiv", "triton_scan")  # fmt: skip
_AUTOTUNE = ("Config", "_pow2", "default_config")
_CUSTOM_OPS = 4  # additive_scan, chunk_scan and their backwards


def unsupported(compiled: Compiled) -> list[str]:
    """Why the templates cannot run a spec's scans (empty when they can): the triton backend's reasons, and a scan
    nothing reads (its final state only), which the backend's check lets through but no template configuration fits."""
    reasons = triton_backend.unsupported(compiled)
    return reasons + [f"state {s.state}: a scan without reads (final state only) has no Triton template yet"
                      for s in compiled.classification.scans if not s.reads]  # fmt: skip


def configs(compiled: Compiled) -> list[tuple[str, str]]:
    """The (decay, read) kernel configurations a spec's scans run on (empty when the templates cannot run it)."""
    if unsupported(compiled):
        return []
    return sorted({triton_backend.template_config(s) for s in compiled.classification.scans})


def module_name(decay: str, read: str) -> str:
    """The rendered module of one configuration: <family>_<decay>_<read>, the family the triton backend picks."""
    return f"{triton_backend.family(decay)}_{decay}_{read}"


def kernel_module(decay: str, read: str) -> tuple[str, str]:
    """(module name, source) of one rendered kernel configuration."""
    return module_name(decay, read), triton_backend.render(triton_backend.family(decay), decay=decay, read=read, acc=ACC)


def _copy(module, names: tuple[str, ...]) -> list[str]:
    """The top-level definitions of `names` in module's source, unchanged and in file order (a decorated function with
    its decorators; `@x.register_fake` functions and `x.register_autograd(...)` calls go with x)."""
    text = inspect.getsource(module)
    lines = text.splitlines()
    found, parts = [], []
    for node in ast.parse(text).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            name = node.name
            if name == "_" and node.decorator_list:  # a registration: @additive_scan.register_fake
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


def host_source() -> str:
    """<kernels>/host.py: the kernels' host code, copied from lamixer (see the module docstring)."""
    copied = _copy(triton_backend, _TRITON) + _copy(autotune, _AUTOTUNE)
    for i, part in enumerate(copied):  # each copy registers its custom ops under its own module's name
        copied[i] = part.replace('custom_op("lamixer::', 'custom_op(f"{NAMESPACE}::')
    if sum(part.count("{NAMESPACE}::") for part in copied) != _CUSTOM_OPS:
        raise RuntimeError("lamixer/backends/triton.py registers other custom ops now: re-point lamixer/emit/kernels.py")
    head = f'''"""The host side of the generated Triton kernels beside this file: launches, torch.library custom ops, autograd.

Copied by lamixer compile, unchanged, from lamixer/backends/triton.py and lamixer/autotune.py:
{_wrap(", ".join(_TRITON + _AUTOTUNE))}.
Only `kernels`, `scan_config` and NAMESPACE are this file's own: the kernels are the modules beside
it, every call takes the default configuration, and the custom ops are registered under this
module's import name.
"""
from __future__ import annotations

import importlib
import os
from dataclasses import dataclass

import torch

from ..runtime.scan import ScanOperands

NAMESPACE = __name__.replace(".", "_")  # custom ops' namespace: this copy's own, whoever else is imported


def kernels(family: str, decay: str, read: str, acc: str):
    """The rendered kernel module of one configuration: <family>_<decay>_<read>.py beside this file ({ACC} only)."""
    if acc != {src.text(ACC)}:
        raise ValueError(f"these kernels accumulate in {ACC}, not {{acc}}")
    module = importlib.import_module(f".{{family}}_{{decay}}_{{read}}", __package__)
    module.NAME = f"{{family}}_{{decay}}_{{read}}_{{acc}}"
    return module


def scan_config(decay, read, acc, dtype, B, T, H, K, V, device):
    """The kernels' default configuration (lamixer's tuned ones live in lamixer's cache, not here)."""
    return default_config(decay, K, V)
'''
    source = head + "\n\n" + "\n\n\n".join(copied) + "\n"
    missing = _undefined(source)
    if missing:
        raise RuntimeError(f"the host code copied from lamixer/backends/triton.py uses {', '.join(missing)}, which it does not copy: "
                           "re-point lamixer/emit/kernels.py, the compiled packages' Triton wiring")  # fmt: skip
    return source


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
    import textwrap

    return "\n".join(textwrap.wrap(text, width))


def scans_module(compiled: Compiled, runtime: str, kernels: str) -> str:
    """<package>/scans.py. kernels: the kernel package's module path from it (".kernels" or "..kernels")."""
    m = src.Module(f"""{src.doc(compiled.name)}'s scans on the generated Triton kernels: the package's one point of contact with them.

The kernels ({", ".join(module_name(d, r) for d, r in configs(compiled))} in {kernels.lstrip(".")}/) are rendered from
lamixer's templates for this spec's classification; their host code is {kernels.lstrip(".")}/host.py.
""", runtime)  # fmt: skip
    m.use("functools")
    m.use("os")
    m.use("torch")
    m.use(kernels, "host")
    checks = list(dict.fromkeys((s.state, d) for s in compiled.classification.scans for d in (s.key_dim, s.value_dim) if d is not None))
    m.write(
        "",
        "def unsupported(call) -> list[str]:",
        '    """Why the kernels cannot run this call (empty when they can)."""',
        "    reasons = []",
        "    if call.compute_dtype == torch.float64:",
        '        reasons.append("the kernels here accumulate in float32; float64 calls run on the torch fallback")',
        f"    for state, dim in [{', '.join(f'({src.text(s)}, {src.text(d)})' for s, d in checks)}]:",
        "        if call.sizes[dim] > host.MAX_HEAD_DIM:",
        '            reasons.append(f"state {state}: {dim} = {call.sizes[dim]} is above the kernels\' {host.MAX_HEAD_DIM}")',
        "    return reasons",
        "",
        "",
        "def scan(call):",
        '    """The scan function for scan_group: the kernels in the inputs\' dtype when it is bf16 or fp16, else in float32."""',
        "    dtype = call.out_dtype if call.out_dtype in (torch.bfloat16, torch.float16) else call.compute_dtype",
        '    if dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1":',
        "        dtype = torch.float32  # Triton 3.6's CPU interpreter multiplies bf16 dot operands as raw bits",
        "    return functools.partial(host.triton_scan, dtype=dtype)",
    )
    return m.text()
