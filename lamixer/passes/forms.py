"""What the language can express of a state's update and its reads, as errors name it.

A spec outside the language gets a located error that says which forms there are and which one is
nearest to what was written; the texts live here so that every such error lists the same forms.
"""
from __future__ import annotations

_UPDATE = ("a token updates a state by decays `{S} = f * {S}` (f a scalar or a vector over one of its dims), then writes in "
           "order, each `{S} = {S} + outer(a, b)` or `{S} = {S} + outer(a, b + c @ {S})`, where c @ {S} reads the state as the "
           "write finds it or as it was before the decays just above the write; decay and writes may share a line: "
           "`{S} = exp(w) * {S} + outer(b, a @ {S}) + outer(k, v)`")  # fmt: skip

_READ = ("a state is read as `x @ {S}` (x a vector over its first dim), or a vector state whole (`out o = hs` for `state hs[V]`), before "
         "its update, after its decays or after any of its writes")  # fmt: skip


def update(state: str) -> str:
    """The forms of a token's update, written for `state`."""
    return _UPDATE.format(S=state)


def read(state: str) -> str:
    """The forms of a read, written for `state`."""
    return _READ.format(S=state)
