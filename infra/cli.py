"""`gpufleet`: the project's one command, usable from any directory once `make venv` installed it.

    gpufleet preview (--stack NAME | --config-file F) [--format table|json|markdown] [--diff BASE.json] ...
    gpufleet catalog list|refresh
    gpufleet jobs submit --queue-url URL ... -- <train flags>
    gpufleet demo [--jobs N] [--steps N] ...

Each command is one entry of COMMANDS: a module that exposes ``configure(parser)`` (its flags, on the
parser this file builds) and ``run(args) -> int``. A command is added by adding its entry.
A command whose flags belong to another program (``jobs submit``) is a passthrough: it gets the
remaining words as ``args.argv`` untouched.

The command boundary: a user error is one line on stderr and exit 2; Ctrl-C exits 130 without a traceback.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Callable

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for Ctrl-C
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: the reader went away (`gpufleet catalog list | head`)

# name -> (module with configure(parser) and run(args) -> int, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "preview": ("infra.preview.__main__", "offline preview of a stack: resources, policy verdicts, monthly cost"),
    "catalog": ("infra.catalog", "the GPU instance catalog: list it, or compare it with EC2"),
    "jobs": ("infra.jobs", "training jobs on a cluster's queue"),
    "demo": ("infra.demo", "the cluster in a box: moto for the account, two local nodes, a sweep, a spot notice"),
    "box": ("infra.box.cli", "the cluster in a box, a real Slurm on this machine: up, down, env, status, notice"),
}


class UsageError(Exception):
    """Bad command-line arguments; str() is one line."""


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every flag's help ends with its default, unless it has none."""

    def _get_help_string(self, action):
        return action.help if action.default is None else super()._get_help_string(action)


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose errors raise UsageError (one line, with the usage folded in) instead of exiting,
    and whose help shows every flag's choices and default."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        raise UsageError(f"{message} ({' '.join(self.format_usage().split())})")


def add_commands(parser: argparse.ArgumentParser, dest: str) -> argparse._SubParsersAction:
    """The subcommand table of ``parser`` (a required choice whose help lists every command)."""
    return parser.add_subparsers(dest=dest, required=True, metavar="COMMAND",
                                 title="commands", parser_class=ArgumentParser)


def add_passthrough(commands: argparse._SubParsersAction, name: str, help: str) -> argparse.ArgumentParser:
    """A leaf command whose words after ``name`` (``--help`` included) reach ``run`` as ``args.argv``."""
    parser = commands.add_parser(name, help=help, description=help, add_help=False)
    parser.set_defaults(passthrough=name)
    return parser


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog="gpufleet", description="GPU training clusters with Pulumi: preview a stack "
                            "offline, read the instance catalog, submit training jobs.",
                            epilog="`gpufleet COMMAND --help` lists the flags of a command.")
    commands = add_commands(parser, "command")
    for name, (module, help) in COMMANDS.items():
        mod = importlib.import_module(module)
        sub = commands.add_parser(name, help=help, description=help)
        sub.set_defaults(run=mod.run)
        mod.configure(sub)
    return parser


def guarded(fn: Callable[[], int]) -> int:
    """Run a command: UsageError -> one line, exit 2; Ctrl-C -> exit 130 quietly."""
    try:
        return fn()
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(file=sys.stderr)  # end the line the terminal's ^C left
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        return EXIT_BROKEN_PIPE


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)

    def run() -> int:
        parser = build_parser()
        args, extra = parser.parse_known_args(argv)
        name = getattr(args, "passthrough", None)
        if name is not None:
            # Only command words stand before a passthrough's name (no parser above it takes flags).
            args.argv = argv[argv.index(name) + 1:]
        elif extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        return args.run(args)

    return guarded(run)


if __name__ == "__main__":  # `python -m infra.cli`: run the importable module, so its UsageError is the one raised
    from infra.cli import main as _main

    raise SystemExit(_main())
