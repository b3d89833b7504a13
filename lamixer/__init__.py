"""lamixer: a compiler for linear-attention token mixers.

    mixer = lamixer.load("gla")
    o, final_state = mixer(q, k, v, g, output_final_state=True)

The API loads on first use (PEP 562): `import lamixer` alone imports neither torch nor the compiler, so the command
line answers `lamixer --help` and a mistyped option at once. The errors are plain classes and load eagerly.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from .errors import ArgumentError, LamixerError, SpecError
from .hf import register_on_import as _register_hf  # imports nothing of transformers (nor torch) until used

if TYPE_CHECKING:  # what the lazy names below resolve to, for type checkers and editors
    from .api import Mixer, load, loads, shipped_specs
    from .layer import Layer, LayerState, Window

__all__ = ["ArgumentError", "Layer", "LayerState", "LamixerError", "Mixer", "SpecError", "Window", "load", "loads", "shipped_specs"]
__version__ = "0.1.0"

_LAZY = {"Mixer": "api", "load": "api", "loads": "api", "shipped_specs": "api", "Layer": "layer", "LayerState": "layer", "Window": "layer"}


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value  # once loaded, a plain module attribute
        return value
    try:  # lamixer.api, lamixer.tools, ...: a submodule, as an eager package would have had it already imported
        return importlib.import_module(f".{name}", __name__)
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{name}":
            raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


_register_hf()  # transformers' Auto classes know model_type "lamixer" once transformers is imported
