"""Rendering the Triton templates (templates.py) and the on-disk cache the rendered kernels are imported from (cache.py)."""
