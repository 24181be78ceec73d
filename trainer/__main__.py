"""`python -m trainer train|convert|preflight|submit|shards|controller|nodes|task|setup|credentials|container|dns`:
the command boundary.

A user error (UsageError, or a cloud SDK's missing credential) is one line on stderr and exit 2; a
runtime fault the clouds can name (an endpoint refusing connections) one line and exit 1; Ctrl-C exits
130 without a traceback. Any other exception is a bug and keeps its traceback.
"""
from __future__ import annotations

import importlib
import logging
import os
import sys

from trainer import EXIT_FAULT, EXIT_INTERRUPTED, EXIT_USAGE
from trainer.clouds import explain
from trainer.errors import Fault, UsageError, one_line

COMMANDS = {  # command -> module whose main(argv) -> int runs it
    "train": "trainer.loop.cli",
    "convert": "trainer.loop.convert",
    "preflight": "trainer.node.preflight",
    "submit": "trainer.jobs.submit",
    "shards": "trainer.loop.shards",
    "controller": "trainer.slurm.bridge",
    "nodes": "trainer.slurm.nodes",
    "task": "trainer.slurm.task",
    "setup": "trainer.slurm.setup",
    "credentials": "trainer.node.jobcreds",
    "container": "trainer.node.container",
    "dns": "trainer.node.dnsguard",
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    usage = f"usage: python -m trainer {{{','.join(COMMANDS)}}} [flags]  (<command> --help lists its flags)"
    if argv[:1] in (["-h"], ["--help"]):
        print(usage)
        return 0
    if not argv:
        print(f"error: no command; {usage}", file=sys.stderr)
        return EXIT_USAGE
    if argv[0] not in COMMANDS:
        print(f"error: unknown command {argv[0]!r}; expected one of {', '.join(COMMANDS)}", file=sys.stderr)
        return EXIT_USAGE
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return importlib.import_module(COMMANDS[argv[0]]).main(argv[1:])
    except KeyboardInterrupt:
        print(file=sys.stderr)  # end the line the terminal's ^C left
        return EXIT_INTERRUPTED
    except Exception as exc:
        told = exc if isinstance(exc, (UsageError, Fault)) else explain(exc)
        if told is None:
            raise
        print(f"error: {one_line(told)}", file=sys.stderr)
        return EXIT_USAGE if isinstance(told, UsageError) else EXIT_FAULT


if __name__ == "__main__":
    status = main()
    # A finished command ends here, skipping the interpreter's teardown: C++ threads of torch and the SDKs
    # destroyed at exit can abort ("terminate called without an active exception", SIGABRT) after the work
    # is done and its status decided. Everything the command wrote is flushed first.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
