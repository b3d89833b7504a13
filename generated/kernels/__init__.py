"""Triton kernels rendered by lamixer (one module per configuration) and their host code."""
