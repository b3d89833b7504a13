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
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path

import torch

CACHE_VERSION = 2  # 2: configurations of eight settings (scan_additive's split gone)


@dataclass(frozen=True)
class Config:
    """A launch configuration. chunk_additive (the additive rule) uses BT, BV (value block of the chunk-parallel
    kernels), BW and BK (value block and key rows of a program of the two sequential state walks: BK < K splits
    the key dim over programs), num_warps (of the chunk-parallel kernels), num_stages, and BG / warps_grad for its
    gradient kernel (0: BV / num_warps); scan_delta (the delta rule) the same but for BK, the key block of its
    per-chunk kernels (its two sequential passes hold whole key rows)."""

    BT: int  # chunk length (divides the 64-token segment of scan_delta's d(log decay))
    BV: int
    BK: int
    num_warps: int
    num_stages: int
    BW: int = 32  # chunk_additive: value block of the state walks
    BG: int = 0  # chunk_additive: value block of the gradient kernel (0: BV)
    warps_grad: int = 0  # the gradient kernel's warps (0: num_warps)

    def as_list(self) -> list[int]:
        return [self.BT, self.BV, self.BK, self.num_warps, self.num_stages, self.BW, self.BG, self.warps_grad]

    @staticmethod
    def from_list(values) -> Config:
        return Config(*(int(v) for v in values))


def _pow2(n: int, lo: int = 16) -> int:
    """The next power of two at least n and lo (Triton block shapes are powers of two, dots at least 16)."""
    return max(lo, 1 << (max(n, 1) - 1).bit_length())


def default_config(decay: str, K: int, V: int) -> Config:
    # chunk_additive: a whole key row per program; a decay along the key dim adds 16-row strips of work. Without
    # one, the gradient kernel takes 32-wide value blocks on 8 warps and the output kernel 128-wide on 4 (below): measured
    # on the H200 (simple_gla, K = V = 128, bf16) grads 1285 -> 1136 us, while the output kernel at the gradient
    # kernel's setting went 307 -> 733 us
    # Above K = 128 the chunk-parallel kernels' tiles outgrow an H200 block's shared memory (232448 bytes) at 64-token
    # chunks and two stages (grads_bwd: 245760 bytes at bf16, 311296 to 393216 at float32; bench/sm90.py --D 256):
    # 32-token chunks, one stage, 32-wide value blocks in the gradient kernel (at most 176128)
    # A decay along the key dim: the walks split the key dim, each key's decay computed once instead of once per value
    # block (H200, gla bf16 T = 8192, walks forward / reverse: 128 key rows by 32 values 805 / 843 us, 64 by 64 446 /
    # 503, 64 by 128 334 / 408, 32 by 128 361 / 382), and one stage (the gradient kernel 1143 -> 1107 us). At K = 256
    # the unsplit walks spill 11 KB at float32, 32 rows by 128 values none (compiled for sm_90, not timed)
    if K > 128:
        walk = (min(32, _pow2(K)), min(128, _pow2(V))) if decay == "key" else (_pow2(K), min(32, _pow2(V)))
        return Config(32, min(64, _pow2(V)), walk[0], 8, 1, walk[1], min(32, _pow2(V)), 8)
    if decay == "key":
        return Config(64, min(64, _pow2(V)), min(32, _pow2(K)), 8, 1, min(128, _pow2(V)))
    # The output kernel of a scalar decay (or none) reads q and a once per value block: 128-wide blocks read them once
    # for V = 128 (H200, simple_gla bf16 T = 8192, 4 warps, 2 stages: output_fwd 305 -> 269 us, forward 0.496 ->
    # 0.464 ms; 8 warps 438; h200_2026-11-30/s7_tune/probe_fwd); a decay along the value dim holds float32 states
    # there: 64 wide (128 spills 560 bytes, compiled for sm_90 at bf16, K = V = 128)
    BV = min(64 if decay == "value" else 128, _pow2(V))
    return Config(64, BV, _pow2(K), 4, 2, min(32, _pow2(V)), min(32, _pow2(V)), 8)


def candidates(decay: str, K: int, V: int) -> list[Config]:
    """chunk_additive's search space, default first: the chunk-parallel kernels' value block and warps, the walks'
    value block and key rows, pipeline stages, and the gradient kernel's value block and warps."""
    out = [default_config(decay, K, V)]
    wide = K > 128  # 32-token chunks and one stage, as the default: more overflows an H200 block's shared memory
    # the walks' key rows per program: a decay along the key dim is computed once per key row and program
    # and value block (wider when the key dim is split)
    walk_keys = sorted({min(32, _pow2(K)), min(64, _pow2(K)), _pow2(K)}) if decay == "key" else [_pow2(K)]
    walk_values = sorted({min(w, _pow2(V)) for w in ((32, 64, 128) if decay == "key" else (16, 32, 64))})
    for BV in sorted({min(32, _pow2(V)), min(64, _pow2(V)), min(128, _pow2(V))}):
        for warps in (4, 8):
            for BK in walk_keys:
                for BW in walk_values:
                    for stages in (1,) if wide else (1, 2, 3):
                        # the gradient kernel's own value block and warps (0: the chunk-parallel kernels')
                        for BG in sorted({0, min(32, _pow2(V)), min(64, _pow2(V))}):
                            for warps_grad in (0, 4, 8):
                                c = Config(32 if wide else 64, BV, BK, warps, stages, BW, BG, warps_grad)
                                if c not in out:
                                    out.append(c)
    return nearest_first(out)


def nearest_first(space: list[Config]) -> list[Config]:
    """The default first, then the others by how many settings they change from it (the order `tune` tries each
    configuration's one-setting changes in)."""
    base = space[0].as_list()
    return space[:1] + sorted(space[1:], key=lambda c: sum(a != b for a, b in zip(c.as_list(), base)))


def shape_bucket(B: int, T: int, H: int, K: int, V: int) -> str:
    """Shapes that tune alike share an entry: exact head dims, powers of two for length and batch x heads."""
    return f"K{K}-V{V}-T{_pow2(T, 64)}-BH{_pow2(B * H, 1)}"


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


def entry_key(device: str, kernel_hash: str, dtype: torch.dtype, bucket: str) -> str:
    return "|".join([device, kernel_hash, str(dtype).replace("torch.", ""), bucket])


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


def describe(config: Config) -> str:
    return ", ".join(f"{k}={v}" for k, v in asdict(config).items())


@dataclass
class Trial:
    config: Config
    error: float | None  # worst relative error against the torch backend (None: the candidate failed to run)
    ms: float | None  # forward + backward time (None: not timed, because it was wrong or failed)
    note: str = ""


def _step(mixer, leaves: dict, h0: tuple, do: torch.Tensor) -> None:
    """The timed work: one forward and backward on the triton backend."""
    o, _ = mixer(**leaves, initial_state=h0 if len(h0) > 1 else h0[0], output_final_state=True, backend="triton")
    o.backward(do)


def search_space(mixer, size: int) -> tuple[str, list[Config]]:
    """The template family `tune` searches for a spec (its first scan's) and that family's candidates, default first;
    each family has its own axes, and a spec's scans of another family keep their configurations."""
    from ..backends import triton as tb
    from ..emit.scans_module import chunk_config, normalisers

    family, decay, _ = chunk_config(mixer.compiled.classification.scans[0])
    space = (tb.triton_delta.candidates if family == tb.triton_delta.FAMILY else candidates)(decay, size, size)
    if family == tb.FAMILY and normalisers(mixer.compiled):  # kernels carrying a normaliser: output blocks >= ONES_BLOCK
        space = [c for c in space if c.BV >= min(tb.ONES_BLOCK, _pow2(size))]
    return family, space


# errors after which the process's CUDA context is unusable: every later launch fails the same way (H200, Triton
# 3.6: gated_deltanet's 16-wide value blocks faulted and the next two candidates failed with it)
CONTEXT_FAULTS = ("illegal memory access", "unspecified launch failure", "misaligned address", "illegal instruction")


def tune(mixer, B: int, T: int, H: int, size: int, dtype: torch.dtype, device: str, limit: int | None = None, on_trial=None) -> tuple[list[Trial], list[str]]:
    """Try candidates on random inputs: check each against the torch backend, then time it; store the fastest.

    A coordinate descent: from the cached configuration (else the default) it tries the one-setting changes of the
    fastest configuration so far, in the space's order, until none is left untried (a local optimum) or `limit`
    trials are done; so the changes that pay combine (a first search tries the default's one-setting changes, then
    those of whichever beat it).

    Returns the trials and the cache keys written. Timing uses triton.testing.do_bench on a GPU (the
    only meaningful place); under the CPU interpreter it uses wall time, for testing the machinery.
    """
    from ..backends import triton as tb
    from ..tools.check import forward_backward, random_call, rel_rms

    missing = tb.unsupported(mixer.compiled)
    if missing:
        raise ValueError("; ".join(missing))
    tensors, states = random_call(mixer, B=B, T=T, H=H, size=size, dtype=dtype, device=device, distinct=False)
    states = tuple(s.float() for s in states)
    reference = forward_backward(mixer, {k: v.float() for k, v in tensors.items()}, states, "torch")
    leaves = {k: v.detach().clone().requires_grad_() for k, v in tensors.items()}
    h0 = tuple(s.detach().clone().requires_grad_() for s in states)
    do = torch.randn_like(reference["o"]).to(dtype)
    tol = 1e-3 if dtype == torch.float32 else 1e-2
    from ..emit.scans_module import carries_normaliser, chunk_config, normalisers

    tuned, space = search_space(mixer, size)
    K = size
    acc = "float32"
    keys = []  # the entries the winner is stored under: one per kernel source of the searched family
    carried = normalisers(mixer.compiled)  # vector states the chunk kernels carry beside a matrix state's scan
    for s in mixer.compiled.classification.scans:
        if chunk_config(s)[0] == tuned and s.state not in carried:
            family = tb.triton_delta if s.rule == "delta" else tb
            ones = {"ones": True} if carries_normaliser(mixer.compiled, s.state) else {}  # (chunk_additive's form only)
            key = entry_key(device_name(torch.device(device)), family.kernel_hash(*family.template_config(s), acc, **ones), dtype,
                            shape_bucket(B, T, H, K, size))  # fmt: skip
            keys += [key] if key not in keys else []
    trials: list[Trial] = []
    best: Trial | None = None
    untried = list(space)
    start = lookup(keys[0]) if keys else None  # a search goes on from where an earlier one ended
    config = start if start in untried else untried[0]
    while config is not None and (limit is None or len(trials) < limit):
        untried.remove(config)
        tb.CONFIG_OVERRIDE, tb.OVERRIDE_FAMILY = config, tuned  # the spec's scans of other families keep their own
        try:
            got = forward_backward(mixer, tensors, states, "triton")
            error = max(rel_rms(got[k], reference[k]) for k in reference)
        except Exception as e:  # a configuration the compiler or the GPU rejects (registers, shared memory)
            trials.append(Trial(config, None, None, f"{type(e).__name__}: {str(e).splitlines()[0][:80]}"))
            if any(fault in str(e) for fault in CONTEXT_FAULTS):
                trials[-1] = Trial(config, None, None, trials[-1].note + " (the GPU context is lost: search stopped)")
                if on_trial:
                    on_trial(trials[-1])
                break
        else:
            if not error < tol:
                trials.append(Trial(config, error, None, "wrong: not timed"))
            else:
                trials.append(Trial(config, error, _time(lambda: _step(mixer, leaves, h0, do), device)))
        finally:
            tb.CONFIG_OVERRIDE = tb.OVERRIDE_FAMILY = None
        t = trials[-1]
        if t.ms is not None and (best is None or t.ms < best.ms):
            best = t  # stored at once: a search cut short keeps the fastest configuration it found
            for key in keys:
                store(key, best.config, {describe(x.config): x.ms for x in trials if x.ms is not None})
        if on_trial:
            on_trial(t)
        # next: an untried one-setting change of the fastest so far (of the start before any is timed), in the
        # space's order; none left is a local optimum
        centre = best.config if best is not None else (start if start in space else space[0])
        config = next((c for c in untried if _distance(c, centre) == 1), None)
    tb._chosen.clear()
    tb._traced.clear()
    return trials, keys if best is not None else []


def _distance(a: Config, b: Config) -> int:
    """How many settings two configurations differ in."""
    return sum(x != y for x, y in zip(a.as_list(), b.as_list()))


def _time(fn, device: str) -> float:
    if device.startswith("cuda"):
        import triton

        return triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median")
    fn()
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3
