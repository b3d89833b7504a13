"""kda: Kimi Delta Attention (Kimi Team, 2025); compiled by lamixer (see README.md).

    o, final_state = kda(q, k, v, g, beta, output_final_state=True)
    layer = Layer(hidden_size=1024, num_heads=4)
    y = layer(x)
"""
from ..runtime.blocks import LayerState
from ..runtime.errors import ArgumentError, LamixerError
from .layer import Layer
from .mixer import kda

__all__ = ["ArgumentError", "LamixerError", "Layer", "LayerState", "kda"]
