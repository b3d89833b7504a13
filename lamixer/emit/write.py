"""What `lamixer compile` writes: a standalone package per spec, or several sharing their runtime (lamixer/emit/package.py)."""
from __future__ import annotations

from pathlib import Path

from ..passes.pipeline import Compiled
from .package import files


def write(specs: list[Compiled], out_dir: str | Path) -> list[Path]:
    """Write the packages of `specs` into out_dir (one spec: standalone; several: sharing runtime/ and kernels/); return the files written."""
    root = Path(out_dir)
    written = []
    top = root.resolve().name if root.resolve().name.isidentifier() else "DIR"  # what the shared layout is imported as
    for rel, text in files(specs, shared=len(specs) > 1, top=top).items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return written
