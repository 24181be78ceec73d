"""Azure Scheduled Events: the watcher that turns a coming eviction of this VM into a StopNotice, and
the approval that lets Azure go ahead once the job's checkpoint is safe and its message handed back.

Both read ``GET {base}/metadata/scheduledevents?api-version=2020-07-01`` with ``Metadata: true``
(base http://169.254.169.254, a parameter). Approval is ``POST`` ``{"StartRequests": [{"EventId"}]}``.
The watcher never approves: approval starts the eviction at once, so it is the last step of the
node's stop path (``approve_stop_events``), as completing the lifecycle action is on AWS. Events
nobody approves still happen at their NotBefore time. Off Azure nothing answers: the watcher backs
off up to ``max_backoff_s`` and logs once.
"""
from __future__ import annotations

import json
import logging
import threading
import urllib.error
import urllib.request

log = logging.getLogger("gpufleet.azure_events")

DEFAULT_BASE = "http://169.254.169.254"
EVENTS = "/metadata/scheduledevents?api-version=2020-07-01"
VM_NAME = "/metadata/instance/compute/name?api-version=2021-02-01&format=text"
# Preempt: spot eviction (>= 30 s notice). Terminate: scale-in or delete (terminateNotificationProfile).
# Reboot/Redeploy: planned maintenance that kills the process. Freeze (a pause of seconds) is ignored.
STOP_EVENTS = frozenset({"Preempt", "Terminate", "Reboot", "Redeploy"})


class MetadataUnavailable(Exception):
    """No Azure instance metadata service answers here."""


def stop_events(document: dict, vm_name: str | None) -> list[dict]:
    """The events of a Scheduled Events document that stop this VM (every stopping one if the name is unknown)."""
    return [e for e in document.get("Events", [])
            if e.get("EventType") in STOP_EVENTS and (vm_name is None or vm_name in e.get("Resources", []))]


class ScheduledEvents:
    """The metadata endpoints, over a proxy-free opener (the metadata service must never be proxied)."""

    def __init__(self, base_url: str = DEFAULT_BASE, timeout_s: float = 5.0):
        self.base = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        self._vm_name: str | None = None

    def _request(self, path: str, body: dict | None = None) -> bytes:
        req = urllib.request.Request(f"{self.base}{path}", headers={"Metadata": "true"})
        if body is not None:
            req.data = json.dumps(body).encode()
            req.add_header("Content-Type", "application/json")
        try:
            with self._opener.open(req, timeout=self.timeout_s) as resp:
                return resp.read()
        except urllib.error.HTTPError as exc:
            raise MetadataUnavailable(f"{path}: HTTP {exc.code}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise MetadataUnavailable(f"no Azure metadata service at {self.base}: {exc}") from None

    def vm_name(self) -> str:
        if self._vm_name is None:
            self._vm_name = self._request(VM_NAME).decode().strip()
        return self._vm_name

    def stopping(self) -> list[dict]:
        """This VM's stopping events now listed."""
        return stop_events(json.loads(self._request(EVENTS)), self.vm_name() or None)

    def approve(self, event_ids: list[str]) -> None:
        self._request(EVENTS, {"StartRequests": [{"EventId": i} for i in event_ids]})


def approve_stop_events(base_url: str = DEFAULT_BASE) -> list[str]:
    """Approve this VM's scheduled stopping events (Azure may then proceed at once); their ids.

    Call it last, once the checkpoint is safe and the job handed back. Off Azure: nothing, [].
    """
    events = ScheduledEvents(base_url)
    try:
        ids = [e["EventId"] for e in events.stopping() if e.get("EventStatus", "Scheduled") == "Scheduled"]
        if ids:
            events.approve(ids)
            log.info("approved scheduled events %s", ", ".join(ids))
        return ids
    except MetadataUnavailable as exc:
        log.info("no scheduled events approved: %s", exc)
        return []


class ScheduledEventsWatcher(threading.Thread):
    """Polls every ``interval_s`` and sets ``notice`` on the first stopping event of this VM."""

    def __init__(self, notice, base_url: str = DEFAULT_BASE, interval_s: float = 2.0, max_backoff_s: float = 300.0):
        super().__init__(name="azure-scheduled-events", daemon=True)
        self.notice = notice
        self.events = ScheduledEvents(base_url)
        self.interval_s = interval_s
        self.max_backoff_s = max_backoff_s
        self.stopped = threading.Event()

    def poll(self) -> list[dict]:
        """Read the events once; set the notice if one stops this VM; return those events."""
        events = self.events.stopping()
        if events and not self.notice.is_set():
            first = events[0]
            reason = f"azure {first['EventType']} not before {first.get('NotBefore') or 'now'}"
            log.warning("stop notice: %s", reason)
            self.notice.set(reason)
        return events

    def run(self) -> None:
        delay = self.interval_s
        while not self.stopped.is_set():
            try:
                self.poll()
            except MetadataUnavailable as exc:
                if delay == self.interval_s:
                    log.info("%s; retrying with backoff", exc)
                delay = min(delay * 2, self.max_backoff_s)
            else:
                delay = self.interval_s
            self.stopped.wait(delay)


def start_watcher(notice, settings: dict, base_url: str = DEFAULT_BASE, interval_s: float = 2.0) -> ScheduledEventsWatcher:
    """Start the watcher (``settings``, node.json, is part of the ``trainer.notices`` contract; unused here)."""
    watcher = ScheduledEventsWatcher(notice, base_url=base_url, interval_s=interval_s)
    watcher.start()
    return watcher
