"""Kernel configurations: sensible defaults, an on-disk cache of tuned ones, and the search that fills it.

A tuned configuration is keyed by the GPU's name, the rendered kernel source's hash (which covers
the template version and the scan's classification), the kernel dtype and a bucketed shape. The
cache is JSON written atomically; a corrupt file is ignored with a warning. Without an entry the
default is used at once: tuning only ever happens when asked for (`lamixer autotune`).
"""
from __future__ import annotations

import json
import math
import os
import tempfile
import time
import warnings
from importlib import resources
from pathlib import Path

import torch
import triton

from ..kernels.config import Config
from ..kernels.launch import pow2

CACHE_VERSION = 3  # 3: keys carry the Triton and torch versions (2: configurations of eight settings)


def shape_bucket(B: int, T: int, H: int, K: int, V: int) -> str:
    """Shapes that tune alike share an entry: exact head dims, powers of two for length and batch x heads."""
    return f"K{K}-V{V}-T{pow2(T, 64)}-BH{pow2(B * H, 1)}"


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu-interpreter"


def cache_file() -> Path:
    root = Path(os.environ.get("LAMIXER_CACHE", Path.home() / ".cache" / "lamixer"))
    return root / "autotune.json"


def _read(path) -> dict:
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or data.get("version") != CACHE_VERSION or not isinstance(data.get("entries"), dict):
            raise ValueError("not a lamixer autotune cache of this version")
        return data["entries"]
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        warnings.warn(f"ignoring the autotune cache {path}: {e}", stacklevel=3)
        return {}


_memo: dict[str, dict] = {}


def _entries() -> dict:
    """Shipped configurations (lamixer/tuning/configs/*.json), overridden by the user's cache; read once per process."""
    key = str(cache_file())
    if key not in _memo:
        entries: dict = {}
        shipped = resources.files("lamixer").joinpath("tuning/configs")
        if shipped.is_dir():
            for f in sorted(shipped.iterdir()):
                if f.name.endswith(".json"):
                    entries.update(_read(f))
        entries.update(_read(cache_file()))
        _memo[key] = entries
    return _memo[key]


def versions() -> str:
    """The compiler stack a timing was made with: the same kernel source may compile to other code under another
    Triton, and torch's allocator and launch path change between releases."""
    return f"triton {triton.__version__}, torch {torch.__version__.split('+')[0]}"


def entry_key(device: str, kernel_hash: str, dtype: torch.dtype, bucket: str, stack: str | None = None) -> str:
    """An entry's key: GPU, compiler stack (versions() unless given), kernel source hash, dtype, shape bucket."""
    return "|".join([device, stack or versions(), kernel_hash, str(dtype).replace("torch.", ""), bucket])


def _bucket_sizes(bucket: str) -> tuple[str, float, float] | None:
    """A shape bucket's head dims and its length and batch x heads (log2), or None for a key of another form."""
    parts = bucket.split("-")
    try:
        return parts[0] + "-" + parts[1], _log2(parts[2], "T"), _log2(parts[3], "BH")
    except (IndexError, ValueError):
        return None


def _log2(field: str, prefix: str) -> float:
    if not field.startswith(prefix):
        raise ValueError(field)
    return math.log2(int(field[len(prefix):]))


def nearest_key(key: str) -> str | None:
    """key itself when it has an entry, else the entry of the same GPU, kernels, dtype and head dims whose length and
    batch x heads are nearest (in powers of two): a tuned configuration serves the shapes around the one it was tuned at."""
    entries = _entries()
    if key in entries:
        return key
    prefix, _, bucket = key.rpartition("|")
    want = _bucket_sizes(bucket)
    if want is None:
        return None
    near = []
    for other in entries:
        head, _, b = other.rpartition("|")
        have = _bucket_sizes(b) if head == prefix else None
        if have is not None and have[0] == want[0]:
            near.append((abs(have[1] - want[1]) + abs(have[2] - want[2]), other))
    return min(near)[1] if near else None


def lookup(key: str) -> Config | None:
    """The configuration stored for key, else for the nearest shape bucket of the same kernels (nearest_key), else None."""
    key = nearest_key(key) or key
    found = _entries().get(key)
    try:
        return Config.from_list(found["config"]) if found else None
    except (KeyError, TypeError, ValueError):
        warnings.warn(f"ignoring a malformed autotune entry {key!r}", stacklevel=2)
        return None


def store(key: str, config: Config, timings: dict) -> Path:
    """Add one entry to the user's cache, atomically (a concurrent reader sees the old or the new file)."""
    path = cache_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    entries = _read(path)
    entries[key] = {"config": config.as_list(), "timings": timings, "when": time.strftime("%Y-%m-%d %H:%M:%S")}
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump({"version": CACHE_VERSION, "entries": entries}, f, indent=1, sort_keys=True)
    os.replace(tmp, path)
    _memo.pop(str(path), None)
    return path
