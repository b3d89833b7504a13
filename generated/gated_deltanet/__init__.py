"""gated_deltanet: Gated DeltaNet (Yang et al., 2025); compiled by lamixer (see README.md).

    o, final_state = gated_deltanet(q, k, v, g, beta, output_final_state=True)
    layer = Layer(hidden_size=1024, num_heads=4)
    y = layer(x)
"""
from ..runtime.blocks import LayerState
from ..runtime.errors import ArgumentError, LamixerError
from .layer import Layer
from .mixer import gated_deltanet

__all__ = ["ArgumentError", "LamixerError", "Layer", "LayerState", "gated_deltanet"]
