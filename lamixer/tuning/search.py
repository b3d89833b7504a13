"""`lamixer autotune`: a coordinate descent over a spec's chunk kernel configurations, each checked, then timed."""
from __future__ import annotations

import functools
import time
from dataclasses import asdict, dataclass

import torch

from ..backends import triton as triton_backend
from ..backends.binding import bind
from ..kernels.config import Config
from ..runtime.call import results
from ..tools.check import forward_backward, random_call, rel_rms
from . import choose
from .config_cache import device_name, entry_key, lookup, shape_bucket, store
from .space import SPACES


def describe(config: Config) -> str:
    return ", ".join(f"{k}={v}" for k, v in asdict(config).items())


@dataclass
class Trial:
    config: Config
    error: float | None  # worst relative error against the torch backend (None: the candidate failed to run)
    ms: float | None  # forward + backward time (None: not timed, because it was wrong or failed)
    note: str = ""


def configured(mixer, configs: dict[str, Config]):
    """mixer's call on the triton backend with each chunk template in `configs` launched with its configuration
    there (the candidate being tried), the other templates with their own."""

    def call(*, initial_state=None, output_final_state: bool = False, cu_seqlens=None, scale=None, backend: str = "triton", **tensors):
        bound = bind(mixer.compiled, (), tensors, scale, initial_state, cu_seqlens)
        o, finals = triton_backend.run(mixer.compiled, bound, configs)
        return results(bound, o, finals, output_final_state)

    return call


def _step(call, leaves: dict, h0: tuple, do: torch.Tensor) -> None:
    """The timed work: one forward and backward on the triton backend."""
    o, _ = call(**leaves, initial_state=h0 if len(h0) > 1 else h0[0], output_final_state=True)
    o.backward(do)


def search_space(mixer, size: int) -> tuple[str, list[Config]]:
    """The chunk template `tune` searches for a spec (its first scan group's) and that template's candidates, default
    first; each template has its own axes, and a spec's groups on another template keep their configurations."""
    group = mixer.compiled.plan.groups[0]
    space = SPACES[group.train.template](group.decay.kind, size, size)
    return group.train.template, [c for c in space if choose.usable(group, c, size)]


# errors after which the process's CUDA context is unusable: every later launch fails the same way (H200, Triton
# 3.6: gated_deltanet's 16-wide value blocks faulted and the next two candidates failed with it)
CONTEXT_FAULTS = ("illegal memory access", "unspecified launch failure", "misaligned address", "illegal instruction")


def entry_keys(mixer, template: str, B: int, T: int, H: int, size: int, dtype: torch.dtype, device) -> list[str]:
    """The tuning cache's keys a configuration of `template`'s kernels is stored under for this shape: one per
    kernel source of the mixer's groups on that template (the calls of that shape bucket read them)."""
    bucket = shape_bucket(B, T, H, size, size)
    keys: list[str] = []
    for g in mixer.compiled.plan.groups:
        if g.train is not None and g.train.template == template:
            key = entry_key(device_name(torch.device(device)), choose.entry_hashes(g)[0], dtype, bucket)
            keys += [key] if key not in keys else []
    return keys


def tune(mixer, B: int, T: int, H: int, size: int, dtype: torch.dtype, device: str, limit: int | None = None, on_trial=None,
         budget_s: float | None = None) -> tuple[list[Trial], list[str]]:  # fmt: skip
    """Try candidates on random inputs: check each against the torch backend, then time it; store the fastest.

    A coordinate descent: from the cached configuration (else the default) it tries the one-setting changes of the
    fastest configuration so far, in the space's order, until none is left untried (a local optimum), `limit`
    trials are done or `budget_s` seconds have passed (checked between trials; the first trial always runs); so the
    changes that pay combine (a first search tries the default's one-setting changes, then those of whichever beat it).

    Returns the trials and the cache keys written. Timing uses triton.testing.do_bench on a GPU (the
    only meaningful place); under the CPU interpreter it uses wall time, for testing the machinery, and
    the winner goes to the interpreter's own cache file, never to the one GPU runs read (config_cache.cache_file).
    """
    missing = triton_backend.unsupported(mixer.compiled)
    if missing:
        raise ValueError("; ".join(missing))
    tensors, states = random_call(mixer, B=B, T=T, H=H, size=size, dtype=dtype, device=device, distinct=False)
    states = tuple(s.float() for s in states)
    reference = forward_backward(mixer, {k: v.float() for k, v in tensors.items()}, states, "torch")
    leaves = {k: v.detach().clone().requires_grad_() for k, v in tensors.items()}
    h0 = tuple(s.detach().clone().requires_grad_() for s in states)
    do = torch.randn_like(reference["o"]).to(dtype)
    tol = 1e-3 if dtype == torch.float32 else 1e-2
    tuned, space = search_space(mixer, size)
    keys = entry_keys(mixer, tuned, B, T, H, size, dtype, device)  # the entries the winner is stored under
    trials: list[Trial] = []
    best: Trial | None = None
    untried = list(space)
    start = lookup(keys[0]) if keys else None  # a search goes on from where an earlier one ended
    config = start if start in untried else untried[0]
    started = time.perf_counter()
    while config is not None and (limit is None or len(trials) < limit) and not (trials and budget_s is not None and time.perf_counter() - started > budget_s):
        untried.remove(config)
        call = configured(mixer, {tuned: config})  # the spec's groups on other templates keep their own
        try:
            got = forward_backward(mixer, tensors, states, "triton", call=call)
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
                trials.append(Trial(config, error, _time(functools.partial(_step, call, leaves, h0, do), device)))
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
    choose.forget()
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
