"""`gpufleet jobs`: training jobs on a cluster's queue, handed to the trainer's own commands.

The trainer package owns the job format and its checks; this forwards the words after
``gpufleet jobs submit`` to ``python -m trainer submit`` unchanged.
"""
from __future__ import annotations

import argparse

from infra import cli


def _submit(argv: list[str]) -> int:
    import trainer.__main__

    return trainer.__main__.main(["submit", *argv])


SUBCOMMANDS = {  # name -> (run(argv) -> int, help)
    "submit": (_submit, "queue one job, or a sweep of jobs; takes the flags of `python -m trainer submit` "
                        "(`gpufleet jobs submit --help` lists them)"),
}


def configure(parser: argparse.ArgumentParser) -> None:
    commands = cli.add_commands(parser, "jobs_command")
    for name, (_, help) in SUBCOMMANDS.items():
        cli.add_passthrough(commands, name, help)


def run(args: argparse.Namespace) -> int:
    return SUBCOMMANDS[args.jobs_command][0](args.argv)
