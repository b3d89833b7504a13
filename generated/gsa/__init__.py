"""gsa: Gated Slot Attention (Zhang et al., 2024); compiled by lamixer (see README.md).

    o, final_state = gsa(q, k, v, s, g, output_final_state=True)
    layer = Layer(hidden_size=1024, num_heads=4)
    y = layer(x)
"""
from ..runtime.blocks import LayerState
from ..runtime.errors import ArgumentError, LamixerError
from .layer import Layer
from .mixer import gsa

__all__ = ["ArgumentError", "LamixerError", "Layer", "LayerState", "gsa"]
