"""Backends: `interpret` (the token-by-token oracle), `torch` (chunkwise PyTorch)."""
