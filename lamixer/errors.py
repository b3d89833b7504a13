"""Every mistake a user can make raises a subclass of LamixerError, located in the spec or the call."""
from __future__ import annotations

import unicodedata
from dataclasses import dataclass

from .runtime.errors import ArgumentError, LamixerError

__all__ = ["ArgumentError", "LamixerError", "Loc", "SpecError"]


@dataclass(frozen=True)
class Loc:
    """A position in a spec file (1-based line and column)."""

    line: int
    col: int


def _visible(line: str) -> str:
    """A source line as a terminal shows it safely: control characters (an escape sequence would act on the terminal)
    as their control pictures, one column each, so the caret stays under its column."""
    return "".join(chr(0x2400 + ord(ch)) if ord(ch) < 0x20 else "\u2421" if ch == "\x7f" else "\ufffd" if unicodedata.category(ch) == "Cc" else ch
                   for ch in line)  # fmt: skip


class SpecError(LamixerError):
    """A mistake in a spec: the message names file:line:column and shows the line with a caret."""

    def __init__(self, message: str, loc: Loc | None = None, source: str = "", filename: str = "<spec>"):
        self.message = message
        self.loc = loc
        self.source = source
        self.filename = filename
        super().__init__(self._render())

    def _render(self) -> str:
        if self.loc is None:
            return f"{self.filename}: {self.message}"
        head = f"{self.filename}:{self.loc.line}:{self.loc.col}: {self.message}"
        lines = self.source.split("\n")  # as the parser counts lines (splitlines would also split at \f)
        if not 1 <= self.loc.line <= len(lines):
            return head
        text = _visible(lines[self.loc.line - 1].expandtabs(1))
        caret = " " * (max(self.loc.col, 1) - 1) + "^"
        return f"{head}\n    {text}\n    {caret}"

    def located(self, source: str, filename: str) -> SpecError:
        """The same error, attached to the text it was found in."""
        return SpecError(self.message, self.loc, source, filename)

