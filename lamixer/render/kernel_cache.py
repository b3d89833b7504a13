"""The rendered-kernel cache: each rendered source written once under its hash and imported from there (Triton's JIT
reads kernel source from files).

A cache that cannot be used (a file where a folder should be, a folder refusing writes, a kernel file of other bytes that
cannot be replaced) never fails a call: the kernels go to a temporary folder of this process instead, with one warning.
"""
from __future__ import annotations

import atexit
import functools
import importlib.util
import os
import shutil
import tempfile
import warnings
from pathlib import Path

import platformdirs

from .templates import config_name, digest, render


def cache_root() -> Path:
    """Where lamixer caches: $LAMIXER_CACHE, else the platform's user cache folder (honouring XDG_CACHE_HOME)."""
    explicit = os.environ.get("LAMIXER_CACHE")
    return Path(explicit) if explicit else platformdirs.user_cache_path("lamixer")


def cache_dir() -> Path:
    return cache_root() / "kernels"


_fallback: Path | None = None  # this process's own kernel folder, made once the cache failed


def _fallback_dir(problem: OSError) -> Path:
    global _fallback
    if _fallback is None:
        _fallback = Path(tempfile.mkdtemp(prefix="lamixer-kernels-"))
        atexit.register(shutil.rmtree, _fallback, True)
        warnings.warn(f"the kernel cache {cache_dir()} cannot be used ({problem}); this process renders its kernels into {_fallback}", stacklevel=4)
    return _fallback


def _holding(folder: Path, name: str, source: str) -> Path:
    """folder/name holding source: the file already there when its bytes are source's, else one written atomically (a
    concurrent reader sees the old file or the new one). Raises OSError when neither can be had."""
    path = folder / name
    data = source.encode()
    try:
        if path.read_bytes() == data:
            return path
    except OSError:  # missing, a folder, unreadable: written below
        pass
    folder.mkdir(parents=True, exist_ok=True)
    write_atomically(path, data)
    return path


def write_atomically(path: Path, data: bytes) -> None:
    """path holding data, written to a temporary file beside it and renamed over it: a concurrent reader sees the old
    file or the new one, never part of one."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _kernel_file(name: str, source: str) -> Path:
    try:
        return _holding(cache_dir(), name, source)
    except OSError as e:
        return _holding(_fallback_dir(e), name, source)


@functools.cache
def kernels(family: str, **config):
    """The module of rendered kernels for one configuration (written atomically, imported once)."""
    source = render(family, **config)
    key = digest(source)
    path = _kernel_file(f"{family}_{key}.py", source)
    spec = importlib.util.spec_from_file_location(f"lamixer_kernels_{family}_{key}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.NAME = config_name(family, config)
    return module
