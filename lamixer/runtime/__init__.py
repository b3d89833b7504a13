"""The torch-only half of lamixer: what runs a compiled mixer, shared with the packages it writes.

These modules import nothing but torch and the standard library (and each other, relatively).
lamixer runs on them, and `lamixer compile` copies them verbatim into every package it writes, so
a compiled package and lamixer's own torch backend are the same code:

    errors.py  the errors a call raises (lamixer.errors builds its spec errors on them)
    ops.py     the meaning of the IR's primitive operations on tensors
    call.py    binding a call's tensors to a mixer's signature: shapes, dtypes, states, results
    scan.py    the chunkwise scans, block attention and whole-input statistics, packed sequences included
    blocks.py  a layer's building blocks (projections, convolutions, token shift, rotary, norms) and
               what every layer does around its spec's own steps (state, checks, decoding)
"""
