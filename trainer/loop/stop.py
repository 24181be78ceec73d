"""Graceful stop: a thread-safe notice and the signal handlers that set it. No torch: the cloud modules' stop-notice
watchers build on it, and Slurm's power-saving programs load those (the ranks' per-step agreement on stopping is
trainer.loop.parallel.agree)."""
from __future__ import annotations

import signal
import threading
from typing import Callable


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

