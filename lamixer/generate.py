"""The generated code of specs, as files: what `lamixer compile` writes and generated/ keeps.

Today that is every scan's rendered Triton kernels (exactly the source the triton backend runs:
the chunk kernels and the recurrent one), one file per kernel configuration in <out>/kernels/
(specs that classify alike share them), and
per spec a README with its classification, plan and kernels. The standalone package (wrappers,
torch fallback, layer) comes next.
"""
from __future__ import annotations

from pathlib import Path

from .backends import recurrent
from .backends import triton as triton_backend
from .compiler import Compiled
from .explain import report


def _family(scan) -> tuple[str, str, str]:
    """(template, decay, read) a classified scan's kernels are rendered with."""
    if scan.rule == "delta":
        return (triton_backend.triton_delta.FAMILY, *triton_backend.triton_delta.template_config(scan))
    decay, read = triton_backend.template_config(scan)
    return (triton_backend.family(decay), decay, read)


def write(specs: list[Compiled], out_dir: str | Path) -> list[Path]:
    """Write <out_dir>/kernels/*.py and <out_dir>/<spec>/README.md; return the files written."""
    root = Path(out_dir)
    (root / "kernels").mkdir(parents=True, exist_ok=True)
    written: dict[Path, str] = {}
    for compiled in specs:
        missing = triton_backend.unsupported(compiled)
        configs = [] if missing else sorted({_family(s) for s in compiled.classification.scans})
        kernel_files = []
        for family, decay, read in configs:
            path = root / "kernels" / f"{family}_{decay}_{read}.py"
            written[path] = triton_backend.render(family, decay=decay, read=read, acc="float32")
            kernel_files.append(path.name)
        readme = [f"# {compiled.name}: generated code", "", f"Compiled by lamixer from `{Path(compiled.filename).name}`.",
                  "The classification and plan:", "", "```", *report(compiled), "```", ""]  # fmt: skip
        if missing:
            readme.append("No Triton chunk kernels are generated for this spec yet (the torch backend trains it): " + "; ".join(missing) + ".")
        else:
            readme.append("Kernels (float32 accumulation; the backend renders float64 ones the same way for the CPU checks):")
            readme += [f"- [`kernels/{name}`](../kernels/{name})" for name in kernel_files]
        recurrent_files = []
        for config in sorted({recurrent.template_config(s) for s in compiled.classification.scans}):
            path = root / "kernels" / f"recurrent_{'_'.join(config)}.py"
            written[path] = triton_backend.render("recurrent", **dict(zip(("rule", "decay", "reads"), config)), acc="float32")
            recurrent_files.append(path.name)
        readme += ["", f"The recurrent kernel, for inference on sequences of at most {recurrent.MAX_T} tokens (decoding):"]
        readme += [f"- [`kernels/{name}`](../kernels/{name})" for name in recurrent_files]
        written[root / compiled.name / "README.md"] = "\n".join(readme) + "\n"
    for path, text in written.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return list(written)
