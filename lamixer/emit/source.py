"""Writing Python source safely: identifiers, numbers, tensor expressions over named dims.

Nothing from a spec reaches the generated code but identifiers the grammar has checked
([A-Za-z_][A-Za-z0-9_]*, renamed here when Python or the generated code already uses the name)
and numbers written with repr. Expressions are spelled from lamixer.runtime.ops itself: a
primitive is written as the torch function (or operator) that ops maps it to, so the generated
code means what the interpreter and the torch backend mean.
"""
from __future__ import annotations

import builtins
import json
import keyword
import math
from pathlib import PurePath

import torch
import torch.nn.functional as F

from ..runtime import ops

# the operators Python writes torch's elementwise functions as
_OPERATORS = {torch.add: "+", torch.sub: "-", torch.mul: "*", torch.div: "/", torch.pow: "**"}


class Names:
    """Identifiers of one generated scope: a wanted name is kept unless Python or the scope already uses it."""

    def __init__(self, reserved=(), builtin_names: bool = True):
        """reserved: names the scope's own code uses; builtin_names: whether that code calls builtins (float, ...)."""
        self.taken = set(keyword.kwlist) | (set(dir(builtins)) if builtin_names else set()) | set(reserved)

    def claim(self, want: str) -> str:
        if not want.isidentifier():
            raise ValueError(f"not an identifier: {want!r}")
        name = want
        while name in self.taken:
            name += "_"
        self.taken.add(name)
        return name


def number(x: float) -> str:
    """A float as a Python expression (an operand: negative numbers come parenthesized)."""
    x = float(x)
    if math.isnan(x):
        return 'float("nan")'
    if math.isinf(x):
        return 'float("inf")' if x > 0 else '(-float("inf"))'
    text = repr(x)
    return f"({text})" if text.startswith("-") else text


def spec_file(compiled) -> str:
    """The file a compiled spec came from, by name (a shipped spec's `gla.lam`), for docstrings and READMEs."""
    return doc(PurePath(compiled.filename).name)


def text(s: str) -> str:
    """A string literal (double-quoted)."""
    return json.dumps(str(s))


def names(seq) -> str:
    """A tuple of strings as a literal."""
    items = [text(x) for x in seq]
    return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"


def wrap(text: str, width: int = 100) -> str:
    """Prose wrapped for a docstring."""
    import textwrap

    return "\n".join(textwrap.wrap(text, width))


def doc(s: str) -> str:
    """Text to place in a docstring or a comment: backslashes and quotes escaped, one line, and every other character
    Python's source or a reader's terminal could take for more than text (a NUL, an escape) written as its escape."""
    line = " ".join(str(s).replace("\\", "\\\\").replace('"""', '\\"\\"\\"').splitlines())
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1].replace("\\", "\\\\") for ch in line)


def function(fn, key: str) -> str:
    """How generated code calls the torch function ops maps `key` to: torch.NAME or F.NAME (imported as such),
    else through ops itself."""
    for prefix, module in (("torch", torch), ("F", F)):
        for name in (key, getattr(fn, "__name__", "")):
            if name and getattr(module, name, None) is fn:
                return f"{prefix}.{name}"
    return f"ops.UNARY[{text(key)}]" if ops.UNARY.get(key) is fn else f"ops.BINARY[{text(key)}]"


def unary(fn: str, x: str) -> str:
    return f"{function(ops.UNARY[fn], fn)}({x})"


def is_operator(fn: str) -> bool:
    """Whether generated code writes the binary primitive fn as a Python operator."""
    return ops.BINARY[fn] in _OPERATORS


def binary(fn: str, a: str, b: str) -> str:
    f = ops.BINARY[fn]
    if f in _OPERATORS:
        return f"{a} {_OPERATORS[f]} {b}"
    return f"{function(f, fn)}({a}, {b})"


def align(x: str, have: tuple[str, ...], want: tuple[str, ...]) -> str:
    """x's trailing feature axes, dims `have`, laid out as `want` (have is a subset): the static ops.align."""
    if have == want:
        return x
    kept = [d for d in want if d in have]
    perm = [have.index(d) for d in kept]
    if perm != sorted(perm):
        n = len(have)
        if n == 2:
            x = f"{x}.transpose(-1, -2)"
        else:
            x = f"{x}.movedim({tuple(range(-n, 0))}, {tuple(p - n for p in perm)})"
    if len(kept) == len(want):
        return x
    return f"{x}[..., {', '.join(':' if d in have else 'None' for d in want)}]"


def shape(lead, dims) -> str:
    return "[" + ", ".join([*lead, *dims]) + "]"


class Module:
    """A generated module's text: its docstring, the imports its code uses (collected as it is written), its body.

    runtime is where lamixer.runtime's copy lives, relative to the module (".runtime" or "..runtime")."""

    def __init__(self, doc: str, runtime: str):
        self.doc = doc
        self.runtime = runtime
        self.plain: set[tuple[str, str | None]] = set()  # import module [as alias]
        self.froms: dict[str, set[str]] = {}  # from module import names
        self.body: list[str] = []

    def use(self, module: str, name: str | None = None, alias: str | None = None) -> None:
        """Record `import module [as alias]` (name None) or `from module import name`."""
        if name is None:
            self.plain.add((module, alias))
        else:
            self.froms.setdefault(module, set()).add(name)

    def uses(self, code: str) -> str:
        """Record what a spelled expression (torch.X, F.X, ops.X) needs imported; return it."""
        for prefix, need in (("torch.", ("torch", None, None)), ("F.", ("torch.nn.functional", None, "F")),
                             ("ops.", (self.runtime, "ops", None))):  # fmt: skip
            if prefix in code:
                self.use(*need)
        return code

    def write(self, *lines: str) -> None:
        self.body.extend(lines)

    def text(self) -> str:
        def names(n) -> str:  # constants, classes, functions, as isort orders them
            return ", ".join(sorted(n, key=lambda x: (0 if x.isupper() else 1 if x[0].isupper() else 2, x)))

        def group(of) -> list[str]:
            plain = sorted(f"import {m}" + (f" as {a}" if a else "") for m, a in self.plain if of(m))
            return plain + [f"from {m} import {names(n)}" for m, n in sorted(self.froms.items()) if of(m)]

        third = ("torch", "triton")
        local = sorted((m for m in self.froms if m.startswith(".")), key=lambda m: (-(len(m) - len(m.lstrip("."))), m))
        groups = [group(lambda m: not m.startswith(".") and m.split(".")[0] not in third),
                  group(lambda m: m.split(".")[0] in third), [f"from {m} import {names(self.froms[m])}" for m in local]]  # fmt: skip
        head = [f'"""{self.doc}"""', "from __future__ import annotations", ""]
        for g in groups:
            head += g + [""] if g else []
        return "\n".join(head + [*self.body]).rstrip("\n") + "\n"
