"""simple_gla: Scalar-gated linear attention (GLA with one gate per head, Mamba-2 style); compiled by lamixer (see README.md).

    o, final_state = simple_gla(q, k, v, g, output_final_state=True)
    layer = Layer(hidden_size=1024, num_heads=4)
    y = layer(x)
"""
from ..runtime.blocks import LayerState
from ..runtime.errors import ArgumentError, LamixerError
from .layer import Layer
from .mixer import simple_gla

__all__ = ["ArgumentError", "LamixerError", "Layer", "LayerState", "simple_gla"]
