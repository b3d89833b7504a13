"""rwkv7: RWKV-7 (Goose) time mixing (Peng et al., 2025); compiled by lamixer (see README.md).

    o, final_state = rwkv7(r, w, k, v, kappa, alpha, r_k, output_final_state=True)
    layer = Layer(hidden_size=1024, num_heads=4)
    y = layer(x)
"""
from ..runtime.blocks import LayerState
from ..runtime.errors import ArgumentError, LamixerError
from .layer import Layer
from .mixer import rwkv7

__all__ = ["ArgumentError", "LamixerError", "Layer", "LayerState", "rwkv7"]
