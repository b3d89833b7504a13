"""lamixer: a compiler for linear-attention token mixers.

    mixer = lamixer.load("gla")
    o, final_state = mixer(q, k, v, g, output_final_state=True)
"""
from .api import Mixer, load, loads, shipped_specs
from .errors import ArgumentError, LamixerError, SpecError
from .layer import Layer, LayerState

__all__ = ["ArgumentError", "Layer", "LayerState", "LamixerError", "Mixer", "SpecError", "load", "loads", "shipped_specs"]
__version__ = "0.1.0"

from .hf import register_on_import as _register_hf  # noqa: E402  (lamixer.hf builds on the API above)

_register_hf()  # transformers' Auto classes know model_type "lamixer" once transformers is imported
