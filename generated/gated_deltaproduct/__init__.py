"""gated_deltaproduct: Gated DeltaProduct, n_h = 2 (Siems et al., 2025); compiled by lamixer (see README.md).

    o, final_state = gated_deltaproduct(q, k1, v1, beta1, k2, v2, beta2, g, output_final_state=True)
    layer = Layer(hidden_size=1024, num_heads=4)
    y = layer(x)
"""
from ..runtime.blocks import LayerState
from ..runtime.errors import ArgumentError, LamixerError
from .layer import Layer
from .mixer import gated_deltaproduct

__all__ = ["ArgumentError", "LamixerError", "Layer", "LayerState", "gated_deltaproduct"]
