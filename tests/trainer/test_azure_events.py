"""The Scheduled Events watcher against a fake Azure metadata endpoint on loopback."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.conftest import ROOT
from tests.trainer.fake_scheduled_events import FakeScheduledEvents
from trainer.clouds.azure import MetadataUnavailable, ScheduledEventsWatcher, approve_stop_events, stop_events
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
    fake.wait_for_gets(fake.gets + 2)
    assert w.notice.is_set() and event_type in w.notice.reason
    assert fake.approved == []  # approving would start the eviction before the checkpoint


def test_stop_path_checkpoints_then_approves_only_this_vms_events(fake):
    """A real trainer-like process sees the notice and exits 75; then the node approves its own events."""
    other = fake.schedule("Preempt", resources=["gpufleet-azure-nodes_7"])
    ours = fake.schedule("Preempt")
    script = textwrap.dedent(f"""
        import sys
        import time
        from trainer.clouds.azure import start_watcher
        from trainer.loop.stop import StopNotice
        notice = StopNotice()
        start_watcher(notice, {{"cloud": "azure"}}, base_url={fake.base_url!r}, interval_s=0.01)
        deadline = time.monotonic() + 10
        while not notice.is_set():
            if time.monotonic() > deadline:
                sys.exit("no stop notice")
            time.sleep(0.01)
        print(notice.reason)
        sys.exit(75)
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 75, proc.stderr
    assert "Preempt" in proc.stdout and fake.approved == []
    assert approve_stop_events(fake.base_url) == [ours]
    assert fake.approved == [ours] and [e["EventId"] for e in fake.events] == [other]
    assert approve_stop_events(fake.base_url) == []  # nothing approved twice


def test_approval_off_azure_does_nothing():
    assert approve_stop_events(f"http://127.0.0.1:{_closed_port()}") == []


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
