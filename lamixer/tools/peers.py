"""Peers: other libraries' kernels that `lamixer bench` times beside a spec's, each described as data.

An entry says how to call a peer on the spec's inputs (competitors.json holds FLA's for the shipped specs; a user
describes their own kernel the same way, `lamixer bench SPEC --peer FN --peer-args MAPPING`):

    {"fn": "MODULE:FUNCTION" or "PATH/TO/FILE.py:FUNCTION", "args": [...], "kwargs": {...}, "layout": "bthd"}

args are positional, each the name of one of the spec's inputs (NAME:float32 converts it to that dtype first; without
args, every input in the spec's order); in
kwargs a string names an input likewise and anything else (a number, true, false, null) is passed as it is. layout:
"bthd", lamixer's [B, T, H, D] (the default), or "bhtd", head first: the per-token inputs, the output and its gradient
go to the peer transposed (copies made once, outside the timed calls). The peer returns o, or a tuple whose first
item is o. Nothing in an entry is evaluated as Python: FUNCTION is looked up by name in the imported module.
"""
from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import json
import re
import sys
from collections.abc import Callable
from importlib import resources
from pathlib import Path

import torch

from ..errors import ArgumentError

LAYOUTS = ("bthd", "bhtd")
DTYPES = ("float32", "float64", "bfloat16", "float16")  # what NAME:DTYPE may convert an input to
_KEYS = {"fn", "args", "kwargs", "layout"}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def shipped() -> dict:
    """Each shipped spec's peers in flash-linear-attention (competitors.json beside this file): {"chunk", "decode"}."""
    table = json.loads(resources.files("lamixer").joinpath("tools/competitors.json").read_text())
    return {name: entry for name, entry in table.items() if not name.startswith("_")}


COMPETITORS = shipped()


# ---- a user's peer: the callable and the mapping, checked before anything runs ----


@functools.cache
def resolve(target: str) -> Callable:
    """The callable `target` names: MODULE:FUNCTION (importable from sys.path) or PATH/TO/FILE.py:FUNCTION; FUNCTION
    may be dotted (Class.method). Imported once per process. An ArgumentError naming 'peer' when it cannot be found."""
    where, sep, name = target.rpartition(":")
    if not sep or not where or not all(_NAME.fullmatch(part) for part in name.split(".")):
        raise ArgumentError("peer", f"{target!r}: write MODULE:FUNCTION or PATH/TO/FILE.py:FUNCTION")
    module = _module(where)
    found = module
    for part in name.split("."):
        if not hasattr(found, part):
            raise ArgumentError("peer", f"{where} has no {name!r}")
        found = getattr(found, part)
    if not callable(found):
        raise ArgumentError("peer", f"{where}:{name} is not callable (its type is {type(found).__name__})")
    return found


def _module(where: str):
    """A module by dotted name, or a Python file by path (imported under a name of its own, so that what inspects
    its functions' source, as Triton's JIT does, finds the file)."""
    is_file = where.endswith(".py") or "/" in where or "\\" in where
    try:
        if not is_file:
            return importlib.import_module(where)
        path = Path(where)
        if not path.is_file():
            raise ArgumentError("peer", f"{where}: no such file")
        name = "lamixer_peer_" + hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        sys.path.insert(0, str(path.resolve().parent))  # its own imports find the modules beside it, as `python FILE` would
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]  # half imported: a later attempt starts afresh
            raise
        finally:
            sys.path.remove(str(path.resolve().parent))
        return module
    except ArgumentError:
        raise
    except ModuleNotFoundError as e:
        raise ArgumentError("peer", f"cannot import {where}: {e}") from None
    except (Exception, SystemExit) as e:  # the peer's own code failed while importing: say what it raised, in one line
        raise ArgumentError("peer", f"importing {where} raised {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None


def mapping(text: str | None, inputs: list[str]) -> dict:
    """How the spec's `inputs` map onto a peer's arguments, as an entry's {"args", "kwargs", "layout"}: from a JSON
    object in an entry's format (inline, or a .json file), or a comma-separated list of NAME[:DTYPE] (positional)
    and KEY=NAME[:DTYPE] or KEY=JSON-VALUE (keyword) items; None: no args (so every input, positional, in the spec's
    order). An ArgumentError naming 'peer_args' for anything that does not name the spec's inputs."""
    if text is None:
        return {}
    source = text.strip()
    if source.endswith(".json") and Path(source).is_file():
        try:
            source = Path(source).read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise ArgumentError("peer_args", f"cannot read {source}: {e}") from None
    entry = _json_entry(source) if source.startswith("{") else _list_entry(source)
    check(entry, inputs, "peer_args")
    return {k: entry[k] for k in ("args", "kwargs", "layout") if k in entry}


def _json_entry(source: str) -> dict:
    try:
        entry = json.loads(source)
    except json.JSONDecodeError as e:
        raise ArgumentError("peer_args", f"not valid JSON: {e}") from None
    if not isinstance(entry, dict):
        raise ArgumentError("peer_args", "a JSON mapping must be an object: {\"args\": [...], \"kwargs\": {...}}")
    unknown = set(entry) - (_KEYS - {"fn"})
    if unknown:
        raise ArgumentError("peer_args", f"unknown key(s) {', '.join(sorted(unknown))}: an entry has args, kwargs and layout")
    return entry


def _list_entry(source: str) -> dict:
    args, kwargs = [], {}
    for item in (part.strip() for part in source.split(",")):
        if not item:
            raise ArgumentError("peer_args", f"an empty item in {source!r}")
        key, sep, value = item.partition("=")
        if not sep:
            args.append(item)
            continue
        key, value = key.strip(), value.strip()
        if not _NAME.fullmatch(key) or key in kwargs:
            raise ArgumentError("peer_args", f"{item!r}: a keyword must be an identifier, given once")
        kwargs[key] = value if _NAME.fullmatch(value.partition(":")[0]) and value not in ("true", "false", "null") else _literal(item, value)
    return {"args": args, "kwargs": kwargs}


def _literal(item: str, value: str):
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        raise ArgumentError("peer_args", f"{item!r}: the value is neither an input's name nor a JSON number, true, false or null") from None


def check(entry: dict, inputs: list[str], argument: str) -> None:
    """That an entry's args and kwargs name only the spec's inputs, with known dtypes, and its layout is one of LAYOUTS."""
    args, kwargs = entry.get("args", []), entry.get("kwargs", {})
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise ArgumentError(argument, "args must be a list and kwargs an object")
    if entry.get("layout", "bthd") not in LAYOUTS:
        raise ArgumentError(argument, f"layout {entry.get('layout')!r} is not one of {', '.join(LAYOUTS)}")
    for i, a in enumerate(args):
        if not isinstance(a, str):
            raise ArgumentError(argument, f"positional argument {i} is {a!r}: each must name an input")
    for key in kwargs:
        if not _NAME.fullmatch(str(key)):
            raise ArgumentError(argument, f"{key!r} is not a keyword")
    for a in [*args, *(v for v in kwargs.values() if isinstance(v, str))]:
        name, _, dtype = a.partition(":")
        if name not in inputs:
            raise ArgumentError(argument, f"{name!r} is none of the spec's inputs ({', '.join(inputs)})")
        if dtype and dtype not in DTYPES:
            raise ArgumentError(argument, f"{a!r}: the dtype must be one of {', '.join(DTYPES)}")


# ---- calling a peer ----


def _argument(value, tensors: dict):
    """A peer's argument: a string names one of the call's tensors (NAME:float32 converts it), anything else is itself."""
    if not isinstance(value, str):
        return value
    name, _, dtype = value.partition(":")
    return tensors[name].to(getattr(torch, dtype)) if dtype else tensors[name]


def peer_call(entry: dict, tensors: dict, h0=None):
    """Call a peer as its entry says, on the call's tensors (by name, in call order; laid out as the entry's layout:
    see lay_out); h0: a decode call's initial state. Returns what the peer returns."""
    fn = resolve(entry["fn"])
    kwargs = {k: _argument(v, tensors) for k, v in entry.get("kwargs", {}).items()}
    if h0 is not None:
        kwargs.update(initial_state=h0, output_final_state=True)
    return fn(*(_argument(a, tensors) for a in entry.get("args", list(tensors))), **kwargs)


def output(result) -> torch.Tensor:
    """o from what a peer returns (o, or a tuple or list whose first item is o)."""
    o = result[0] if isinstance(result, (tuple, list)) else result
    if not isinstance(o, torch.Tensor):
        raise TypeError(f"the peer returned {type(o).__name__}, not a tensor or a tuple starting with one")
    return o


def per_token(mixer) -> set[str]:
    """The mixer's per-token inputs ([B, T, H, ...]), which a head-first layout transposes."""
    return {op.name for op in mixer.compiled.graph.operands if op.kind == "input"}


def lay_out(entry: dict, mixer, tensors: dict) -> dict:
    """The call's tensors as the peer takes them: as they are for "bthd"; for "bhtd" each per-token input as a new
    contiguous [B, H, T, ...] leaf (its gradient comes back through to_bthd)."""
    if entry.get("layout", "bthd") == "bthd":
        return tensors
    tokens = per_token(mixer)
    return {k: v.detach().transpose(1, 2).contiguous().requires_grad_(v.requires_grad) if k in tokens else v for k, v in tensors.items()}


def to_layout(entry: dict, x: torch.Tensor) -> torch.Tensor:
    """A [B, T, H, ...] tensor (the output's gradient) in the peer's layout."""
    return x if entry.get("layout", "bthd") == "bthd" else x.transpose(1, 2).contiguous()


def to_bthd(entry: dict, x: torch.Tensor | None) -> torch.Tensor | None:
    """A per-token tensor from the peer's layout back in lamixer's."""
    return x if x is None or entry.get("layout", "bthd") == "bthd" else x.transpose(1, 2)
