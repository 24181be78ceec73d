"""A stand-in for the EC2 instance metadata service (IMDSv2 only) on 127.0.0.1, over real HTTP: the
demo's nodes (and the tests) get their instance identity and spot notices from it.

PUT /latest/api/token needs the TTL header and returns a token; every GET needs a live token
(401 otherwise) and answers 404 for items not set. Items change while it runs (``set``,
``spot_interruption``).
"""
from __future__ import annotations

import json
import secrets
import threading
import time

from infra.demo.loopback_http import LoopbackServer, QuietHandler


class FakeImds(LoopbackServer):
    def __init__(self, instance_id: str = "i-0123456789abcdef0", instance_type: str = "g5.xlarge",
                 private_ip: str = "10.0.0.10", region: str = "eu-west-1"):
        self.items: dict[str, str] = {
            "meta-data/instance-id": instance_id,
            "meta-data/instance-type": instance_type,
            "meta-data/local-ipv4": private_ip,
            "meta-data/autoscaling/target-lifecycle-state": "InService",
            "dynamic/instance-identity/document": json.dumps(
                {"instanceId": instance_id, "instanceType": instance_type, "region": region,
                 "privateIp": private_ip}),
        }
        self.tokens: dict[str, float] = {}   # token -> expiry (monotonic)
        self.token_requests = 0
        self.gets: list[str] = []
        self.rejected = 0
        self._lock = threading.Lock()
        super().__init__(self._handler())

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def set(self, path: str, value: str) -> None:
        with self._lock:
            self.items[path] = value

    def spot_interruption(self, action: str = "terminate") -> None:
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 120))
        self.set("meta-data/spot/instance-action", json.dumps({"action": action, "time": when}))

    def revoke_tokens(self) -> None:
        with self._lock:
            self.tokens.clear()

    def _handler(self):
        fake = self

        class Handler(QuietHandler):
            def do_PUT(self):
                if self.path != "/latest/api/token":
                    return self._reply(404)
                ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds", "")
                if not ttl.isdigit() or not 1 <= int(ttl) <= 21600:
                    return self._reply(400, "missing or invalid X-aws-ec2-metadata-token-ttl-seconds")
                token = secrets.token_urlsafe(24)
                with fake._lock:
                    fake.token_requests += 1
                    fake.tokens[token] = time.monotonic() + int(ttl)
                self._reply(200, token)

            def do_GET(self):
                token = self.headers.get("X-aws-ec2-metadata-token", "")
                with fake._lock:
                    live = fake.tokens.get(token, 0) > time.monotonic()
                    if not live:
                        fake.rejected += 1
                    path = self.path.removeprefix("/latest/")
                    fake.gets.append(path)
                    value = fake.items.get(path)
                if not live:
                    return self._reply(401)
                if value is None:
                    return self._reply(404, "Not Found")
                self._reply(200, value)

        return Handler
