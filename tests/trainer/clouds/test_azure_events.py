"""The Scheduled Events watcher against a fake Azure metadata endpoint on loopback."""
from __future__ import annotations

import pytest

from tests.trainer.fake_scheduled_events import FakeScheduledEvents
from trainer.clouds.azure import MetadataUnavailable, ScheduledEventsWatcher, stop_events
from trainer.loop.stop import StopNotice


@pytest.fixture
def fake():
    with FakeScheduledEvents() as f:
        yield f


@pytest.fixture
def watch(fake):
    watchers = []

    def start(**kw):
        w = ScheduledEventsWatcher(StopNotice(), base_url=fake.base_url, interval_s=0.01, **kw)
        watchers.append(w)
        w.start()
        return w

    yield start
    for w in watchers:
        w.stopped.set()
        w.join(5)


def test_quiet_while_nothing_is_scheduled_for_this_vm(fake, watch):
    fake.schedule("Preempt", resources=["gpufleet-azure-nodes_7"])  # another VM of the set
    fake.schedule("Freeze")  # a pause of seconds: no reason to stop
    w = watch()
    fake.wait_for_gets(5)
    assert not w.notice.is_set() and fake.rejected == 0


@pytest.mark.parametrize("event_type", ["Preempt", "Terminate"])
def test_eviction_of_this_vm_sets_the_notice_without_approving_it(fake, watch, event_type):
    w = watch()
    fake.wait_for_gets(2)
    fake.schedule(event_type)
    w.join(10)  # the notice ends the watch: no polling after it
    assert not w.is_alive() and w.notice.is_set() and event_type in w.notice.reason
    assert fake.approved == []  # approving would start the eviction before the checkpoint


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_off_azure_it_backs_off_and_never_sets_the_notice(monkeypatch):
    # Nothing listens on this port: every poll fails fast.
    w = ScheduledEventsWatcher(StopNotice(), base_url=f"http://127.0.0.1:{_closed_port()}", interval_s=1.0,
                               max_backoff_s=8.0)
    waits = []

    def wait(delay):
        waits.append(delay)
        if len(waits) == 6:
            w.stopped.set()
        return w.stopped.is_set()

    monkeypatch.setattr(w.stopped, "wait", wait)
    w.run()
    assert waits == [2.0, 4.0, 8.0, 8.0, 8.0, 8.0]
    assert not w.notice.is_set()
    with pytest.raises(MetadataUnavailable):
        w.poll()


def test_stop_events_filters_by_type_and_vm():
    doc = {"Events": [
        {"EventId": "a", "EventType": "Preempt", "Resources": ["vm_1"]},
        {"EventId": "b", "EventType": "Freeze", "Resources": ["vm_1"]},
        {"EventId": "c", "EventType": "Terminate", "Resources": ["vm_2"]},
        {"EventId": "d", "EventType": "Redeploy", "Resources": ["vm_1", "vm_2"]},
    ]}
    assert [e["EventId"] for e in stop_events(doc, "vm_1")] == ["a", "d"]
    assert [e["EventId"] for e in stop_events(doc, None)] == ["a", "c", "d"]
    assert stop_events({"DocumentIncarnation": 0, "Events": []}, "vm_1") == []
