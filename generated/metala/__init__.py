"""metala: MetaLA: unified optimal linear approximation to softmax attention (Chou et al., 2024); compiled by lamixer (see README.md).

    o, final_state = metala(q, g, v, w_aug, output_final_state=True)
    layer = Layer(hidden_size=1024, num_heads=4)
    y = layer(x)
"""
from ..runtime.blocks import LayerState
from ..runtime.errors import ArgumentError, LamixerError
from .layer import Layer
from .mixer import metala

__all__ = ["ArgumentError", "LamixerError", "Layer", "LayerState", "metala"]
