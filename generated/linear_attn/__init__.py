"""linear_attn: Linear attention (Katharopoulos et al., 2020); compiled by lamixer (see README.md).

    o, final_state = linear_attn(q, k, v, output_final_state=True)
    layer = Layer(hidden_size=1024, num_heads=4)
    y = layer(x)
"""
from ..runtime.blocks import LayerState
from ..runtime.errors import ArgumentError, LamixerError
from .layer import Layer
from .mixer import linear_attn

__all__ = ["ArgumentError", "LamixerError", "Layer", "LayerState", "linear_attn"]
