"""The one user-error type of the trainer package."""
from __future__ import annotations


class UsageError(Exception):
    """Bad user input (flag, config key, URI). str(exc) is the one line the CLI prints before exiting 2."""
