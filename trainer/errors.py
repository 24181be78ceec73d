"""The one user-error type of the trainer package, and the argument parser that raises it."""
from __future__ import annotations

import argparse


class UsageError(Exception):
    """Bad user input (flag, config key, URI). str(exc) is the one line the CLI prints before exiting 2."""


class Fault(Exception):
    """A runtime fault outside the user's input (an endpoint that refuses connections, a full disk).
    str(exc) is the one line the CLI prints before exiting 1."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse that raises UsageError instead of printing usage and exiting, so a bad flag is one line."""

    def error(self, message: str):
        raise UsageError(message)


def one_line(exc: Exception) -> str:
    """The one line of a UsageError or Fault, also when a DataLoader worker raised it: torch raises it again in
    the main process with the worker's traceback as its message, whose last line is the worker's exception."""
    text = str(exc)
    head, _, rest = text.partition("\n")
    if rest and head.startswith(f"Caught {type(exc).__name__} in DataLoader worker"):
        last = rest.rstrip("\n").rsplit("\n", 1)[-1]
        prefix = f"{type(exc).__module__}.{type(exc).__qualname__}: "
        if last.startswith(prefix):
            return last[len(prefix):]
    return text
