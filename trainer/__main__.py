"""`python -m trainer train|convert|agent|preflight|submit|shards|rendezvous`; user errors become one line on stderr and exit 2."""
from __future__ import annotations

import importlib
import logging
import sys

from trainer import EXIT_USAGE
from trainer.errors import UsageError

COMMANDS = {  # command -> module whose main(argv) -> int runs it
    "train": "trainer.loop.cli",
    "convert": "trainer.loop.convert",
    "agent": "trainer.node.agent",
    "preflight": "trainer.node.preflight",
    "submit": "trainer.jobs.submit",
    "shards": "trainer.loop.shards",
    "rendezvous": "trainer.node.rendezvous",
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
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
