"""Where the host code beside this file finds its rendered kernels: the modules `lamixer compile` rendered here,
one per template and configuration, float32 accumulation only."""
import importlib


def kernels(family: str, acc: str, **config):
    """The rendered kernel module of one configuration: <family>_<config values>.py beside this file."""
    if acc != "float32":
        raise ValueError(f"these kernels accumulate in float32, not {acc}")
    name = "_".join([family, *(k if v is True else v for k, v in config.items())])
    module = importlib.import_module(f".{name}", __package__)
    module.NAME = f"{name}_{acc}"
    return module
