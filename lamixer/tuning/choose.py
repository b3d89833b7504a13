"""Which configuration a scan group's chunk kernels launch with: the tuned one for this GPU, versions, dtype and
shape, else the family's default. Never a search: tuning happens only when asked for (`lamixer autotune`)."""
from __future__ import annotations

import torch

from ..kernels import additive, delta
from ..kernels.config import Config, default_config, delta_default_config
from ..kernels.launch import pow2
from ..passes.kernel_plan import Kernels, ScanGroup
from ..render.templates import source_hash
from .config_cache import device_name, entry_key, lookup, shape_bucket

DEFAULTS = {additive.FAMILY: default_config, delta.FAMILY: delta_default_config}

# configurations chosen in this process, so a call pays for the cache lookup once per shape
_chosen: dict[tuple, Config] = {}
# the last configuration eager calls chose per kernel and head dims: what torch.compile traces (see choose)
_traced: dict[tuple, Config] = {}
# how many times the choices were forgotten: a mixer's calls keep their choices per signature (Call.memo) under this
# number, so that a configuration stored after a call is what the next call of that signature launches
_generation = 0


def default(group: ScanGroup, K: int, V: int) -> Config:
    """The group's chunk kernels' default configuration."""
    return DEFAULTS[group.train.template](group.decay.kind, K, V)


def usable(group: ScanGroup, config: Config, V: int) -> bool:
    """Whether a tuned configuration may launch the group's kernels: those carrying a normaliser take output blocks of
    at least additive.ONES_BLOCK (an entry of their plain form may be narrower)."""
    return group.normaliser is None or config.BV >= min(additive.ONES_BLOCK, pow2(V))


def entry_hashes(group: ScanGroup, acc: str = "float32") -> list[str]:
    """The kernel sources whose tuned entries serve the group, in order: its own, then, for kernels carrying a
    normaliser, their plain form's (the same kernels but for a [K] vector per chunk), and for a per-head constant
    decay, its scalar form's (the same kernels reading the decay per token: a [BT] load and cumsum per chunk more);
    none for a group without chunk kernels."""
    if group.train is None:
        return []
    forms = [group.train]
    if group.normaliser is not None:
        forms.append(Kernels(group.train.template, tuple(kv for kv in group.train.args if kv[0] != "ones"), group.train.names))
    if dict(group.train.args).get("decay") == "constant":
        forms += [Kernels(k.template, tuple((n, "scalar" if n == "decay" else v) for n, v in k.args), k.names) for k in forms]
    return [source_hash(k.template, **k.render_args(acc)) for k in forms]


def choose(group: ScanGroup, dtype: torch.dtype, B, T, H, K, V, device: torch.device) -> Config:
    """The tuned configuration of the group's chunk kernels for this GPU, dtype and shape bucket, else the default.

    While torch.compile traces, no cache file is read and no template rendered (neither can be traced): the
    configuration is the one an eager call chose for this shape bucket (runtime/fuse.py runs a signature's first
    call eagerly for this), else, when the length or batch is symbolic or no eager call came first, the one eager
    calls last chose for these head dims, else the default."""
    dims = (group.train.module, dtype, K, V, str(device))
    bucket = shape_bucket(B, T, H, K, V) if all(isinstance(n, int) for n in (B, T, H, K, V)) else None  # None: symbolic
    if torch.compiler.is_compiling():
        found = _chosen.get((*dims, bucket)) if bucket is not None else None
        found = found if found is not None else _traced.get(dims)
        return found if found is not None else default(group, K, V)
    key = (*dims, bucket)
    if key not in _chosen:
        found = None
        for h in entry_hashes(group):
            found = lookup(entry_key(device_name(device), h, dtype, bucket))
            if found is not None:
                break
        _chosen[key] = found if found is not None and usable(group, found, V) else default(group, K, V)
    _traced[dims] = _chosen[key]
    return _chosen[key]


def forget() -> None:
    """Drop the configurations chosen so far (after the cache changed), those calls of every mixer remembered too."""
    global _generation
    _chosen.clear()
    _traced.clear()
    _generation += 1


def generation() -> int:
    """The number of forget() calls so far: part of every key under which a call's configuration is remembered."""
    return _generation
