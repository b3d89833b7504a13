"""The rendered-kernel cache: each rendered source written once under its hash and imported from there (Triton's JIT
reads kernel source from files)."""
from __future__ import annotations

import functools
import importlib.util
import os
import tempfile
from pathlib import Path

from .templates import config_name, digest, render


def cache_dir() -> Path:
    path = Path(os.environ.get("LAMIXER_CACHE", Path.home() / ".cache" / "lamixer")) / "kernels"
    path.mkdir(parents=True, exist_ok=True)
    return path


@functools.cache
def kernels(family: str, **config):
    """The module of rendered kernels for one configuration (written atomically, imported once)."""
    source = render(family, **config)
    key = digest(source)
    path = cache_dir() / f"{family}_{key}.py"
    if not path.exists() or path.read_text() != source:
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(source)
        os.replace(tmp, path)
    spec = importlib.util.spec_from_file_location(f"lamixer_kernels_{family}_{key}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.NAME = config_name(family, config)
    return module
