"""Kernel configurations: sensible defaults, an on-disk cache of tuned ones, and the search that fills it.

A tuned configuration is keyed by the GPU's name, the Triton and torch versions, the rendered kernel
source's hash (which covers the template version and the scan's classification), the kernel dtype and
a bucketed shape. The cache is JSON written atomically under a file lock (concurrent tuners keep each
other's entries); a corrupt file, and an entry the kernels could not launch with, are ignored with a
warning. Without an entry the default is used at once: tuning only ever happens when asked for
(`lamixer autotune`).
"""
from __future__ import annotations

import json
import math
import os
import time
import warnings
from importlib import resources
from pathlib import Path

import torch
import triton
from filelock import FileLock

from ..kernels.config import Config
from ..kernels.launch import MAX_HEAD_DIM, pow2
from ..render.kernel_cache import cache_root, write_atomically

CACHE_VERSION = 3  # 3: keys carry the Triton and torch versions (2: configurations of eight settings)


def shape_bucket(B: int, T: int, H: int, K: int, V: int) -> str:
    """Shapes that tune alike share an entry: exact head dims, powers of two for length and batch x heads."""
    return f"K{K}-V{V}-T{pow2(T, 64)}-BH{pow2(B * H, 1)}"


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu-interpreter"


def cache_file() -> Path:
    """The user's tuning cache; under Triton's interpreter a file of its own, so that its timings, which mean nothing
    for a GPU, never reach the file GPU runs read."""
    return cache_root() / ("autotune-interpreter.json" if os.environ.get("TRITON_INTERPRET") == "1" else "autotune.json")


LOCK_TIMEOUT_S = 60  # a store waits this long for another process's (one store holds the lock for milliseconds)

BLOCKS = {1 << n for n in range(4, MAX_HEAD_DIM.bit_length())}  # block sizes: powers of two, dots take at least 16, a program at most a head dim
CHUNKS = {16, 32, 64}  # chunk lengths: whole 16-row blocks, at most four (scan_delta's in-kernel solve and strips)
WARPS = {1, 2, 4, 8, 16}
# the values each setting of a stored configuration may take (in Config's order); 0 in BG and warps_grad: "as BV, num_warps"
ALLOWED = {"BT": CHUNKS, "BV": BLOCKS, "BK": BLOCKS, "num_warps": WARPS, "num_stages": {1, 2, 3, 4}, "BW": BLOCKS, "BG": {0} | BLOCKS,
           "warps_grad": {0} | WARPS}  # fmt: skip


def invalid(entry) -> str | None:
    """Why a stored entry's configuration cannot launch the kernels (a hand-edited or damaged cache), None when it can."""
    values = entry.get("config") if isinstance(entry, dict) else None
    if not isinstance(values, list) or len(values) != len(ALLOWED):
        return f"its configuration is not a list of {len(ALLOWED)} settings"
    for (name, allowed), value in zip(ALLOWED.items(), values):
        # bool is an int to Python, and 64.0 == 64: only true integers pass
        if type(value) is not int or value not in allowed:
            return f"{name} = {value!r} is not one of {', '.join(map(str, sorted(allowed)))}"
    return None


def _valid(entries: dict, path) -> dict:
    """entries without the invalid ones, each ignored with a warning."""
    kept = {}
    for key, entry in entries.items():
        problem = invalid(entry)
        if problem is None:
            kept[key] = entry
        else:
            warnings.warn(f"ignoring the autotune entry {key!r} in {path}: {problem}", stacklevel=4)
    return kept


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
    """Shipped configurations (lamixer/tuning/configs/*.json), overridden by the user's cache; read once per process.
    Only valid entries: an invalid one is not taken for its key, nor for a neighbouring shape's (nearest_key)."""
    key = str(cache_file())
    if key not in _memo:
        entries: dict = {}
        shipped = resources.files("lamixer").joinpath("tuning/configs")
        if shipped.is_dir():
            for f in sorted(shipped.iterdir()):
                if f.name.endswith(".json"):
                    entries.update(_valid(_read(f), f))
        entries.update(_valid(_read(cache_file()), cache_file()))
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
    found = nearest_key(key)
    return Config.from_list(_entries()[found]["config"]) if found is not None else None


def store(key: str, config: Config, timings: dict) -> Path | None:
    """Add one entry to the user's cache and return its path; None, with a warning, when the cache cannot be written.

    The read-modify-write holds a file lock (another process's store between the read and the write would otherwise
    lose its entry), and the file is replaced atomically (a reader, which takes no lock, sees the old or the new one)."""
    path = cache_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(f"{path}.lock", timeout=LOCK_TIMEOUT_S):
            entries = _read(path)
            entries[key] = {"config": config.as_list(), "timings": timings, "when": time.strftime("%Y-%m-%d %H:%M:%S")}
            write_atomically(path, json.dumps({"version": CACHE_VERSION, "entries": entries}, indent=1, sort_keys=True).encode())
    except OSError as e:  # filelock's Timeout is one too
        warnings.warn(f"could not store the autotune entry {key!r} in {path}: {e}", stacklevel=2)
        return None
    finally:
        _memo.pop(str(path), None)
    return path


