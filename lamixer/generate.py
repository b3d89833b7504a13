"""The generated code of a spec, as files: what `lamixer compile` writes and generated/ keeps.

Today that is every scan's rendered Triton kernels (exactly the source the triton backend runs)
and a README naming them; the standalone package (wrappers, torch fallback, layer) comes next.
"""
from __future__ import annotations

from pathlib import Path

from .backends import triton as triton_backend
from .compiler import Compiled
from .explain import report


def write_kernels(compiled: Compiled, out_dir: str | Path) -> list[Path]:
    """Write <out_dir>/<spec name>/ and return the files written (unchanged files are rewritten identically)."""
    root = Path(out_dir) / compiled.name
    root.mkdir(parents=True, exist_ok=True)
    written = []
    missing = triton_backend.unsupported(compiled)
    configs = [] if missing else sorted({triton_backend.template_config(s) for s in compiled.classification.scans})
    for decay, read in configs:
        path = root / f"scan_additive_{decay}_{read}.py"
        path.write_text(triton_backend.render("scan_additive", decay=decay, read=read, acc="float32"))
        written.append(path)
    readme = [f"# {compiled.name}: generated code", "", f"Compiled by lamixer from `{Path(compiled.filename).name}`;",
              "regenerate with `lamixer compile SPEC -o generated`. The classification and plan:", "", "```",
              *report(compiled), "```", ""]  # fmt: skip
    if missing:
        readme.append("No Triton kernels are generated for this spec yet (the torch backend runs it): " + "; ".join(missing) + ".")
    else:
        readme.append("Kernels (float32 accumulation; the backend renders float64 ones the same way for the CPU checks):")
        readme += [f"- `{p.name}`" for p in written]
    path = root / "README.md"
    path.write_text("\n".join(readme) + "\n")
    return [*written, path]
