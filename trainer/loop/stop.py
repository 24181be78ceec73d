"""Graceful stop: a thread-safe notice, signal handlers that set it, and the per-step agreement of all ranks."""
from __future__ import annotations

import signal
import threading
from typing import Callable

import torch
import torch.distributed as dist


class StopNotice:
    """Set by a signal handler or a watcher thread; read by the training loop.

    No locks: a signal handler runs between bytecodes of the main thread, even inside another handler or
    a lock acquisition, so taking a lock there can deadlock (a second SIGTERM during the first handler
    did). Single attribute stores are atomic under the GIL; the first reason wins.
    """

    def __init__(self) -> None:
        self._set = False
        self.reason: str | None = None
        self.interrupts = 0  # SIGINTs seen (a terminal's Ctrl-C)

    def set(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
        self._set = True

    def is_set(self) -> bool:
        return self._set


def install_signal_handlers(notice: StopNotice) -> Callable[[], None]:
    """SIGTERM and SIGINT set the notice; a second SIGINT (two interactive interrupts, whatever else set the
    notice) interrupts at once. Returns a restore function.

    Only the main thread may install handlers; elsewhere this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handle(signum, frame):
        if signum == signal.SIGINT:
            notice.interrupts += 1
            if notice.interrupts > 1:
                raise KeyboardInterrupt
        notice.set(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGTERM, signal.SIGINT)}

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    return restore


def ignore_stop_signals() -> None:
    """From here to the process's exit, SIGTERM and SIGINT change nothing (the run's outcome is decided)."""
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)


def agree(loss: torch.Tensor, notice: StopNotice) -> torch.Tensor:
    """One collective per optimizer step: returns [loss summed over ranks, number of ranks asked to stop].

    The all-reduce is queued, not waited for: the caller reads the result a step later, so the
    device never idles for it. All ranks read the same numbers and so stop after the same step.
    """
    flag = loss.new_ones((), dtype=torch.float32) if notice.is_set() else loss.new_zeros((), dtype=torch.float32)
    stats = torch.stack([loss.detach().float(), flag])  # made on the device: no host-to-device copy
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(stats, op=dist.ReduceOp.SUM)
    return stats
