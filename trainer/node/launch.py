"""`python -m trainer.node.launch <torchrun flags> -m trainer train ...`: torchrun that keeps exit status 75.

torchrun exits 1 whenever a worker exits non-zero; the agent needs to tell a preemption (the
workers saved a checkpoint and exited 75) from a failure, so this passes the first failure's 75
back, and a worker ended by SIGTERM (before train handles it) as 143, like a shell.
"""
from __future__ import annotations

import signal
import sys

from trainer import EXIT_PREEMPTED


def main(argv: list[str]) -> int:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    try:
        run(get_args_parser().parse_args(argv))
    except ChildFailedError as exc:
        _, first = exc.get_first_failure()
        if first.exitcode in (EXIT_PREEMPTED, -signal.SIGTERM):
            return EXIT_PREEMPTED if first.exitcode == EXIT_PREEMPTED else 128 + signal.SIGTERM
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
