"""The public Python API: load a spec, call the mixer."""
from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path

import torch

from .backends.binding import BACKENDS, Call, bind, remember
from .errors import ArgumentError
from .kernels.recurrent import MAX_T
from .parallel.slicing import bind_slice
from .passes.pipeline import Compiled, compile_spec
from .runtime.call import check_flags, pick_backend, results, warn
from .runtime.carry import attach

SPEC_SUFFIX = ".lam"


def shipped_specs() -> list[str]:
    """Names of the specs in the shipped library."""
    root = resources.files("lamixer").joinpath("specs")
    return sorted(p.name[: -len(SPEC_SUFFIX)] for p in root.iterdir() if p.name.endswith(SPEC_SUFFIX))


def shipped_source(name: str) -> str:
    return resources.files("lamixer").joinpath("specs", name + SPEC_SUFFIX).read_text()


class Mixer:
    """A compiled token mixer; call it on tensors laid out as [B, T, H, D]."""

    def __init__(self, compiled: Compiled):
        self.compiled = compiled

    @property
    def name(self) -> str:
        return self.compiled.name

    @property
    def title(self) -> str:
        return self.compiled.graph.title

    @property
    def inputs(self) -> list[str]:
        """Tensor arguments in call order (per-token inputs and params as declared)."""
        return [op.name for op in self.compiled.graph.operands]

    @property
    def states(self) -> list[str]:
        return list(self.compiled.graph.states)

    def __repr__(self) -> str:
        return f"Mixer({self.name!r}: {', '.join(self.inputs)} -> {self.compiled.graph.output_name}; states {', '.join(self.states)})"

    def __call__(self, *tensors, scale=None, initial_state=None, output_final_state: bool = False, cu_seqlens=None,
                 backend: str = "auto", stats=None, window=None, output_stats: bool = False, output_window: bool = False,
                 context_parallel=None, **named):  # fmt: skip
        """o, final_state = mixer(q, k, v, ...). final_state is None unless output_final_state; a tuple for several states.

        stats: given values of the spec's statistics by name (else each is the whole input's); window: block
        attention's lamixer.Window to continue from. output_window=True and output_stats=True add, in this order, the
        Window after the call and the statistics used ({name: value}) to what the call returns (runtime/carry.py).
        context_parallel: a torch.distributed ProcessGroup whose ranks each pass a slice of the time axis
        (lamixer/parallel, docs/context_parallel.md)."""
        check_flags(backend, BACKENDS, output_final_state)
        compute = torch.float64 if backend == "interpret" else None
        if context_parallel is None:
            call = bind(self.compiled, tensors, named, scale, initial_state, cu_seqlens, compute)
        else:
            call = bind_slice(self.compiled, tensors, named, scale, initial_state, cu_seqlens, compute, backend, context_parallel,
                              output_final_state, window is not None or output_window)  # fmt: skip
        call = attach(self.compiled.signature, call, stats, window, output_stats, output_window)
        if call.memo is None:
            impl = self._backend(call, backend)
        else:  # the choice depends on nothing but the signature, the grad mode and whether the recurrent kernel takes the length
            key = (backend, torch.is_grad_enabled(), call.longest <= MAX_T)
            impl = call.memo.get(key) or remember(call.memo, key, self._backend(call, backend))
        o, finals = impl.run(self.compiled, call)
        if call.context_parallel is not None:
            o = call.context_parallel.settle(o)
        return results(call, o, finals, output_final_state, self.compiled.signature)

    def _backend(self, call: Call, backend: str):
        """The backend module that runs this call; an ArgumentError when Triton kernels are asked for and cannot run it."""
        if backend in ("auto", "triton"):
            from .backends import triton as triton_backend

            # inference on short sequences runs every scan on the recurrent kernel, those the chunk templates lack included
            missing = [] if triton_backend.serves(self.compiled, call) else triton_backend.unsupported(self.compiled, call.sizes)
            if backend == "triton":
                missing += triton_backend.launch_problems(call.device)
            chosen = pick_backend(self.name, backend, call, missing)
            if backend == "auto" and chosen == "torch" and call.device.type == "cuda":
                _warn_fallback(self.compiled, missing)
            backend = chosen
        if backend == "interpret":
            from .backends import interpret as impl
        elif backend == "triton":
            from .backends import triton as impl
        else:
            from .backends import evaluate as impl
        return impl


_FELL_BACK: set[tuple[str, str]] = set()  # (spec name, source hash) of the specs whose fallback has been reported


def _warn_fallback(compiled: Compiled, missing: list[str]) -> None:
    """Say once per spec why backend="auto" runs a CUDA call on the torch backend: it is several times slower than
    the kernels, and nothing else would tell."""
    key = (compiled.name, compiled.source_hash)
    if key in _FELL_BACK:
        return
    _FELL_BACK.add(key)
    warn(f"{compiled.name} runs on the torch backend (chunkwise PyTorch), not on Triton kernels: {'; '.join(missing)}. "
         'backend="torch" says so and silences this')


@functools.lru_cache(maxsize=256)
def _compile_cached(source: str, filename: str) -> Compiled:
    return compile_spec(source, filename)


def loads(source: str, filename: str = "<spec>") -> Mixer:
    """A mixer from spec text."""
    if not isinstance(source, str):
        raise ArgumentError("source", f"spec text must be a string, got {type(source).__name__}")
    if not isinstance(filename, str):
        raise ArgumentError("filename", f"must be a string, got {type(filename).__name__}")
    return Mixer(_compile_cached(source, filename))


def load(spec: str | Path) -> Mixer:
    """A mixer from a shipped spec name (e.g. "gla") or a path to a spec file."""
    if not isinstance(spec, (str, Path)):
        raise ArgumentError("spec", f"must be a shipped spec name or a path, got {type(spec).__name__}")
    name = str(spec)
    if name in shipped_specs():
        return loads(shipped_source(name), f"{name}{SPEC_SUFFIX}")
    path = Path(name)
    if not path.is_file():
        raise ArgumentError("spec", f"{name!r} is neither a shipped spec ({', '.join(shipped_specs())}) nor a file")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ArgumentError("spec", f"cannot read {name!r}: {e}") from None
    return loads(text, str(path))
