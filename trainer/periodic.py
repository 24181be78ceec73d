"""The one loop of the trainer's background work: something done every few seconds until stopped (metrics
flushed, a record updated, output shipped, a stop notice polled, DOWN nodes healed)."""
from __future__ import annotations

import threading
from typing import Callable


class Periodic(threading.Thread):
    """Calls ``fn`` every ``interval_s`` seconds until ``stopped`` is set: on a daemon thread of its own (:meth:`start`,
    :meth:`close`), or in the caller's thread (:meth:`run`).

    - ``at_once``: the first call comes at once, not after the first interval.
    - ``on_error``: a call's exception is handed to it and the calls go on; without it, the exception ends the loop
      (on a thread: with Python's report of it).
    - ``final``: :meth:`close` calls it once the loop has ended (the last flush); what it raises reaches close's caller.
    - ``stopped``: an Event of the caller's (a signal handler sets it), else a new one.
    """

    def __init__(self, fn: Callable[[], object], interval_s: float, name: str, *, at_once: bool = False,
                 on_error: Callable[[Exception], None] | None = None, final: Callable[[], object] | None = None,
                 stopped: threading.Event | None = None):
        super().__init__(name=name, daemon=True)
        self.fn, self.interval_s, self.at_once = fn, interval_s, at_once
        self.on_error, self.final = on_error, final
        self.stopped = stopped if stopped is not None else threading.Event()

    def next_wait(self) -> float:
        """Seconds until the next call: ``interval_s`` (a subclass may back off)."""
        return self.interval_s

    def run(self) -> None:
        if self.at_once and not self.stopped.is_set():
            self._call()
        while not self.stopped.wait(self.next_wait()):
            self._call()

    def _call(self) -> None:
        try:
            self.fn()
        except Exception as exc:
            if self.on_error is None:
                raise
            self.on_error(exc)

    def start(self) -> "Periodic":
        super().start()
        return self

    def close(self) -> None:
        """No more calls: the one under way ends, then the final call (also when the loop never started)."""
        self.stopped.set()
        if self.is_alive():
            self.join()
        if self.final is not None:
            self.final()
