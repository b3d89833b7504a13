"""Rendering the Triton templates (lamixer/kernels/templates) with jinja2: one source per family and render arguments."""
from __future__ import annotations

import functools
import hashlib
import math
from importlib import resources

import jinja2
import torch

TEMPLATE_VERSION = 1


def floored(log_decay: str, acc: str, keep_nan: bool = True) -> str:
    """The templates' load of a log decay (an expression) in the accumulator's dtype, at least the log of its smallest
    normal number. The kernels difference cumulative log decays, and a decay of exactly 0 (log -inf: a gate that
    reaches 0) made -inf - -inf NaN; floored, its factor is 0 to float precision and the differences stay finite.
    keep_nan: a NaN stays NaN (a GPU's plain maximum returns the floor for it: a silent finite decay,
    templates/causal.jinja); a gradient kernel may leave it out where it costs registers."""
    floor = math.log(torch.finfo(getattr(torch, acc)).tiny)
    nan = ", propagate_nan=tl.PropagateNan.ALL" if keep_nan else ""
    return f"tl.maximum({log_decay}.to(tl.{acc}), {floor!r}{nan})"


@functools.cache
def environment() -> jinja2.Environment:
    root = resources.files("lamixer").joinpath("kernels/templates")
    env = jinja2.Environment(loader=jinja2.FunctionLoader(lambda name: root.joinpath(name).read_text()),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True)  # fmt: skip
    env.globals["floored"] = floored
    return env


def digest(source: str) -> str:
    return hashlib.sha256(f"{TEMPLATE_VERSION}\n{source}".encode()).hexdigest()[:16]


def config_name(family: str, config: dict) -> str:
    """<family>_<config values>, a flag set to True by its name (ones): the kernels' names, and their module's."""
    return "_".join([family, *(k if v is True else str(v) for k, v in config.items())])


def render(family: str, **config) -> str:
    return environment().get_template(f"{family}.py.jinja").render(name=config_name(family, config), **config)


@functools.cache
def source_hash(family: str, **config) -> str:
    """The hash of one configuration's rendered source: what tuned configurations are keyed on."""
    return digest(render(family, **config))
