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
