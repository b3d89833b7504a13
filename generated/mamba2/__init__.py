"""mamba2: Mamba-2 selective state space model, SSD form (Dao and Gu, 2024); compiled by lamixer (see README.md).

    o, final_state = mamba2(x, B, C, dt, A_log, D, dt_bias, output_final_state=True)
    layer = Layer(hidden_size=1024, num_heads=4)
    y = layer(x)
"""
from ..runtime.blocks import LayerState
from ..runtime.errors import ArgumentError, LamixerError
from .layer import Layer
from .mixer import mamba2

__all__ = ["ArgumentError", "LamixerError", "Layer", "LayerState", "mamba2"]
