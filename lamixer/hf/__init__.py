"""Hugging Face transformers models built from lamixer specs (`pip install lamixer[hf]`).

    from lamixer.hf import LamixerConfig, LamixerForCausalLM
    config = LamixerConfig(spec="gla", vocab_size=32000, hidden_size=1024, num_heads=4, num_layers=24)
    model = LamixerForCausalLM(config)

Importing this package imports nothing from transformers: the classes load on first use. register()
makes AutoConfig, AutoModel and AutoModelForCausalLM know model_type "lamixer"; `import lamixer` has
it run as soon as transformers is imported (register_on_import), so a program that never imports
transformers never pays for importing it (about 3 s on a 2-core CPU).
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

_EXPORTS = {
    "LamixerConfig": "configuration",
    "LamixerCache": "cache",
    "LamixerModel": "modeling",
    "LamixerForCausalLM": "modeling",
    "LamixerPreTrainedModel": "modeling",
}
__all__ = [*_EXPORTS, "register"]

_registered = False
_loading = False  # a class of this package is being loaded: transformers' first import inside it registers after it


def __getattr__(name: str):
    global _loading
    if name in _EXPORTS:
        _loading = True
        try:
            value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        finally:
            _loading = False
        globals()[name] = value  # once loaded, a plain module attribute
        register_on_import()
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register() -> None:
    """Make transformers' Auto classes build lamixer models from a config of model_type "lamixer" (AutoConfig,
    AutoModel, AutoModelForCausalLM, and their from_pretrained). Safe to call again: it registers once."""
    global _registered
    if _registered:
        return
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    from .configuration import LamixerConfig
    from .modeling import LamixerForCausalLM, LamixerModel

    AutoConfig.register(LamixerConfig.model_type, LamixerConfig, exist_ok=True)
    AutoModel.register(LamixerConfig, LamixerModel, exist_ok=True)
    AutoModelForCausalLM.register(LamixerConfig, LamixerForCausalLM, exist_ok=True)
    _registered = True


class _RegisterAfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when transformers is first imported, it lets the import run, then registers."""

    def find_spec(self, name, path, target=None):
        if name != "transformers":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_register(module):
            exec_module(module)
            if _loading:  # imported by one of this package's modules: registering now would import it half-made
                return
            try:
                register()
            except Exception as e:  # a broken transformers install must not break the user's import of it
                warnings.warn(f"lamixer could not register its models with transformers: {type(e).__name__}: {e}", stacklevel=2)

        spec.loader.exec_module = exec_then_register
        return spec


def register_on_import() -> None:
    """register() now if transformers is imported already, else right after it is (nothing when it is not installed)."""
    if "transformers" in sys.modules:
        register()
    elif importlib.util.find_spec("transformers") is not None and not any(isinstance(f, _RegisterAfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegisterAfterImport())
