"""A fake Azure instance metadata service for Scheduled Events on 127.0.0.1, over real HTTP.

Answers the VM name and the events document, both only with the `Metadata: true` header (400
otherwise, as Azure does); a POST of StartRequests approves events, which then leave the document.
"""
from __future__ import annotations

import json
import threading
from urllib.parse import parse_qs, urlparse

from infra.demo.loopback_http import LoopbackServer, QuietHandler


class FakeScheduledEvents(LoopbackServer):
    def __init__(self, vm_name: str = "gpufleet-azure-nodes_3"):
        self.vm_name = vm_name
        self.events: list[dict] = []
        self.incarnation = 1
        self.approved: list[str] = []
        self.gets = 0
        self.rejected = 0
        self.polled = threading.Condition()
        super().__init__(self._handler())

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def schedule(self, event_type: str, resources: list[str] | None = None, event_id: str | None = None) -> str:
        with self.polled:
            event_id = event_id or f"EV-{len(self.events) + len(self.approved) + 1}"
            self.events.append({
                "EventId": event_id, "EventStatus": "Scheduled", "EventType": event_type,
                "ResourceType": "VirtualMachine", "Resources": resources if resources is not None else [self.vm_name],
                "NotBefore": "Mon, 30 Nov 2026 05:00:00 GMT", "Description": "", "EventSource": "Platform",
                "DurationInSeconds": -1})
            self.incarnation += 1
            return event_id

    def wait_for_gets(self, n: int, timeout_s: float = 10.0) -> None:
        with self.polled:
            if not self.polled.wait_for(lambda: self.gets >= n, timeout_s):
                raise AssertionError(f"watcher polled {self.gets} times, expected {n}")

    def _handler(self):
        fake = self

        class Handler(QuietHandler):
            content_type = "application/json"

            def _checked(self) -> tuple[str, dict] | None:
                url = urlparse(self.path)
                if self.headers.get("Metadata") != "true":
                    with fake.polled:
                        fake.rejected += 1
                    self._reply(400, json.dumps({"error": "Bad request. Required metadata header not specified"}))
                    return None
                return url.path, parse_qs(url.query)

            def do_GET(self):
                checked = self._checked()
                if checked is None:
                    return
                path, query = checked
                if path == "/metadata/instance/compute/name" and query.get("format") == ["text"]:
                    return self._reply(200, fake.vm_name, "text/plain")
                if path == "/metadata/scheduledevents" and query.get("api-version") == ["2020-07-01"]:
                    with fake.polled:
                        doc = {"DocumentIncarnation": fake.incarnation, "Events": list(fake.events)}
                        fake.gets += 1
                        fake.polled.notify_all()
                    return self._reply(200, json.dumps(doc))
                self._reply(404, json.dumps({"error": "Not found"}))

            def do_POST(self):
                checked = self._checked()
                if checked is None:
                    return
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                ids = [r["EventId"] for r in body.get("StartRequests", [])]
                with fake.polled:
                    fake.approved.extend(ids)
                    fake.events = [e for e in fake.events if e["EventId"] not in ids]
                    fake.incarnation += 1
                self._reply(200, "")

        return Handler
