"""The errors a call can raise: every mistake in a call's arguments is an ArgumentError naming the argument."""
from __future__ import annotations


class LamixerError(Exception):
    """Base class of every error lamixer raises for bad user input."""


class ArgumentError(LamixerError):
    """A bad argument in a call: the message names the argument."""

    def __init__(self, argument: str, message: str):
        self.argument = argument
        super().__init__(f"argument '{argument}': {message}")
