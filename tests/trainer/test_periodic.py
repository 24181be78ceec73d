"""The one periodic loop (trainer.periodic): the calls, their order with the waits, errors, close and its final
call. The loop's own waits are recorded by an Event that answers at once, so nothing here depends on timing."""
from __future__ import annotations

import threading

import pytest

from trainer.periodic import Periodic


class Recorded(threading.Event):
    """An Event whose wait returns at once, telling whether it is set, and records the seconds asked for."""

    def __init__(self):
        super().__init__()
        self.log: list = []

    def wait(self, timeout=None):
        self.log.append(("wait", timeout))
        return self.is_set()


def calls_until(stopped: Recorded, n: int, fail_first: bool = False):
    """A callable that records its calls and sets ``stopped`` at the n-th (the first raises with fail_first)."""
    def fn():
        stopped.log.append("call")
        calls = stopped.log.count("call")
        if calls == n:
            stopped.set()
        if fail_first and calls == 1:
            raise ValueError("away for a moment")
    return fn


def test_a_call_after_each_interval_none_before_the_first():
    stopped = Recorded()
    Periodic(calls_until(stopped, 3), 5.0, "t", stopped=stopped).run()
    assert stopped.log == [("wait", 5.0), "call", ("wait", 5.0), "call", ("wait", 5.0), "call", ("wait", 5.0)]


def test_at_once_calls_before_the_first_wait_and_not_at_all_once_stopped():
    stopped = Recorded()
    Periodic(calls_until(stopped, 2), 5.0, "t", at_once=True, stopped=stopped).run()
    assert stopped.log == ["call", ("wait", 5.0), "call", ("wait", 5.0)]
    Periodic(calls_until(stopped, 1), 5.0, "t", at_once=True, stopped=stopped).run()  # stopped already
    assert stopped.log[4:] == [("wait", 5.0)]


def test_an_error_goes_to_on_error_and_the_calls_go_on():
    stopped, errors = Recorded(), []
    Periodic(calls_until(stopped, 3, fail_first=True), 1.0, "t", on_error=errors.append, stopped=stopped).run()
    assert stopped.log.count("call") == 3
    assert [str(e) for e in errors] == ["away for a moment"]


def test_without_on_error_an_error_ends_the_loop():
    stopped = Recorded()
    with pytest.raises(ValueError, match="away for a moment"):
        Periodic(calls_until(stopped, 3, fail_first=True), 1.0, "t", stopped=stopped).run()
    assert stopped.log == [("wait", 1.0), "call"]


def test_next_wait_sets_each_wait():
    class Backoff(Periodic):
        def next_wait(self):
            return self.interval_s * 2 ** stopped.log.count("call")

    stopped = Recorded()
    Backoff(calls_until(stopped, 3), 1.0, "t", stopped=stopped).run()
    assert [entry[1] for entry in stopped.log if entry != "call"] == [1.0, 2.0, 4.0, 8.0]


def test_on_its_thread_it_calls_every_interval_and_close_ends_it_with_the_final_call():
    order, third = [], threading.Event()

    def fn():
        order.append("call")
        if order.count("call") == 3:
            third.set()

    p = Periodic(fn, 0.01, "periodic-test", final=lambda: order.append("final")).start()
    assert p.name == "periodic-test" and p.daemon
    assert third.wait(30), "fewer than three calls"
    p.close()
    assert not p.is_alive()
    assert order[-1] == "final" and order.count("final") == 1 and order.count("call") >= 3


def test_close_interrupts_a_long_interval_at_once():
    calls = []
    p = Periodic(lambda: calls.append("call"), 3600.0, "t", final=lambda: calls.append("final")).start()
    closing = threading.Thread(target=p.close)
    closing.start()
    closing.join(30)  # a close that waited for the interval would still be running
    assert not closing.is_alive() and not p.is_alive()
    assert calls == ["final"]


def test_close_without_start_makes_the_final_call_and_what_it_raises_reaches_the_caller():
    def final():
        raise OSError("bucket away")

    with pytest.raises(OSError, match="bucket away"):
        Periodic(lambda: None, 1.0, "t", final=final).close()
    Periodic(lambda: None, 1.0, "t").close()  # no final: nothing to do
