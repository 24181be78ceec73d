"""`python -m trainer.node.launch <torchrun flags> -m trainer train ...`: torchrun that keeps exit status 75.

torchrun exits 1 whenever a worker exits non-zero; the job's task and Slurm (RequeueExit=75) need to tell a
preemption (the workers saved a checkpoint and exited 75) from a failure, so this passes the first failure's 75
back, and a worker ended by SIGTERM (before train handles it) as 143, like a shell.

torchrun also answers a SIGTERM to itself by tearing its workers down and exiting 1, however they
ended: here a SIGTERM (and a first SIGINT) is passed on to the workers instead, which checkpoint and
exit 75, and so does this launcher. A second SIGINT aborts as torchrun does.
"""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from torch.distributed.elastic.multiprocessing import api
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import get_args_parser, run

from trainer import EXIT_PREEMPTED


def workers() -> list[int]:
    """This launcher's child processes (Linux /proc): torchrun's workers."""
    found = []
    for task in Path("/proc/self/task").glob("*/children"):
        try:
            found += [int(c) for c in task.read_text().split()]
        except OSError:
            pass
    return found


def pass_stop_signals_on(api) -> None:
    """Make torchrun's signal handler (installed when its workers start) pass SIGTERM and a first SIGINT on
    to the workers rather than end the run; other signals, and a second SIGINT, end it as before."""
    terminate = api._terminate_process_handler
    interrupts = [0]

    def handler(signum, frame):
        if signum == signal.SIGINT:
            interrupts[0] += 1
        if signum == signal.SIGTERM or (signum == signal.SIGINT and interrupts[0] == 1):
            for pid in workers():
                try:
                    os.kill(pid, signum)
                except ProcessLookupError:
                    pass
            return
        terminate(signum, frame)

    api._terminate_process_handler = handler


def main(argv: list[str]) -> int:
    pass_stop_signals_on(api)
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
