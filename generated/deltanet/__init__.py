"""deltanet: DeltaNet: linear attention with the delta rule (Schlag et al., 2021; Yang et al., 2024); compiled by lamixer (see README.md).

    o, final_state = deltanet(q, k, v, beta, output_final_state=True)
    layer = Layer(hidden_size=1024, num_heads=4)
    y = layer(x)
"""
from ..runtime.blocks import LayerState
from ..runtime.errors import ArgumentError, LamixerError
from .layer import Layer
from .mixer import deltanet

__all__ = ["ArgumentError", "LamixerError", "Layer", "LayerState", "deltanet"]
