"""EC2 instance metadata (IMDSv2) client and the interruption watcher.

The base URL is botocore's own ``AWS_EC2_METADATA_SERVICE_ENDPOINT`` (default 169.254.169.254);
``AWS_EC2_METADATA_DISABLED=true`` turns the client off, as it does botocore's. Off EC2 every call
fails fast with :class:`ImdsUnavailable` and the watcher backs off, so it costs next to nothing.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
import urllib.error
import urllib.request

log = logging.getLogger("gpufleet.imds")

DEFAULT_ENDPOINT = "http://169.254.169.254/"
TOKEN_TTL_S = 21600
SPOT_ACTION = "meta-data/spot/instance-action"
REBALANCE = "meta-data/events/recommendations/rebalance"
LIFECYCLE = "meta-data/autoscaling/target-lifecycle-state"


class ImdsUnavailable(Exception):
    """No instance metadata service answers (not on EC2, disabled, or unreachable)."""


class Imds:
    """IMDSv2: a session token from PUT /latest/api/token, cached and renewed before it expires."""

    def __init__(self, endpoint: str | None = None, timeout_s: float = 1.0, token_ttl_s: int = TOKEN_TTL_S):
        self.endpoint = (endpoint or os.environ.get("AWS_EC2_METADATA_SERVICE_ENDPOINT") or DEFAULT_ENDPOINT)
        self.base = self.endpoint.rstrip("/") + "/latest/"
        self.disabled = os.environ.get("AWS_EC2_METADATA_DISABLED", "").lower() == "true"
        self.timeout_s = timeout_s
        self.token_ttl_s = token_ttl_s
        self._token: str | None = None
        self._token_expires = 0.0
        self._lock = threading.Lock()

    def _open(self, req: urllib.request.Request) -> bytes:
        if self.disabled:
            raise ImdsUnavailable("instance metadata disabled by AWS_EC2_METADATA_DISABLED")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return resp.read()
        except urllib.error.HTTPError:
            raise
        except (urllib.error.URLError, OSError) as exc:
            raise ImdsUnavailable(f"no instance metadata service at {self.endpoint}: {exc}") from None

    def token(self) -> str:
        with self._lock:
            # Renew early so that a token never expires between check and use.
            margin = min(60.0, self.token_ttl_s / 2)
            if self._token is None or time.monotonic() > self._token_expires - margin:
                req = urllib.request.Request(
                    self.base + "api/token", method="PUT",
                    headers={"X-aws-ec2-metadata-token-ttl-seconds": str(self.token_ttl_s)})
                try:
                    self._token = self._open(req).decode()
                except urllib.error.HTTPError as exc:
                    raise ImdsUnavailable(f"IMDS token request refused: HTTP {exc.code}") from None
                self._token_expires = time.monotonic() + self.token_ttl_s
            return self._token

    def get(self, path: str) -> str | None:
        """GET /latest/<path>; None when the item does not exist (404)."""
        for attempt in (1, 2):
            req = urllib.request.Request(self.base + path, headers={"X-aws-ec2-metadata-token": self.token()})
            try:
                return self._open(req).decode()
            except urllib.error.HTTPError as exc:
                if exc.code == 404:
                    return None
                if exc.code == 401 and attempt == 1:
                    with self._lock:
                        self._token = None  # revoked or expired early: fetch a new one once
                    continue
                raise ImdsUnavailable(f"IMDS {path}: HTTP {exc.code}") from None
        raise AssertionError("unreachable")

    def available(self) -> bool:
        try:
            self.token()
            return True
        except ImdsUnavailable:
            return False

    def instance_id(self) -> str | None:
        return self.get("meta-data/instance-id")

    def instance_type(self) -> str | None:
        return self.get("meta-data/instance-type")

    def private_ip(self) -> str | None:
        return self.get("meta-data/local-ipv4")

    def region(self) -> str | None:
        doc = self.get("dynamic/instance-identity/document")
        return json.loads(doc)["region"] if doc else None


def interruption(spot_action: str | None, lifecycle_state: str | None) -> str | None:
    """The stop reason the metadata shows, or None.

    A spot ``instance-action`` (terminate, stop or hibernate in about two minutes) and an autoscaling
    target state of ``Terminated`` (scale-in or rebalancing reached this instance) both mean: stop now.
    """
    if spot_action:
        try:
            action = json.loads(spot_action)
            return f"spot {action.get('action', 'interruption')} at {action.get('time', '?')}"
        except ValueError:
            return "spot interruption"
    if lifecycle_state == "Terminated":
        return "autoscaling lifecycle: Terminated"
    return None


class Watcher:
    """Polls the three interruption items every ``interval_s`` and sets ``notice`` on the first one.

    A rebalance recommendation is logged, not acted on: it is advice that may never turn into an
    interruption, and when the group rebalances, the scale-in shows up as the lifecycle state.
    """

    def __init__(self, notice, imds: Imds | None = None, interval_s: float = 5.0, max_backoff_s: float = 300.0):
        self.notice = notice
        self.imds = imds or Imds()
        self.interval_s = interval_s
        self.max_backoff_s = max_backoff_s
        self.stopped = threading.Event()
        self._rebalance_seen = False

    def poll(self) -> str | None:
        reason = interruption(self.imds.get(SPOT_ACTION), self.imds.get(LIFECYCLE))
        if reason is None and not self._rebalance_seen and self.imds.get(REBALANCE):
            self._rebalance_seen = True
            log.warning("EC2 rebalance recommendation: interruption risk is elevated; continuing")
        return reason

    def run(self) -> None:
        delay = self.interval_s
        while not self.stopped.is_set() and not self.notice.is_set():
            try:
                reason = self.poll()
            except ImdsUnavailable as exc:
                if delay == self.interval_s:
                    log.info("%s; retrying with backoff", exc)
                delay = min(delay * 2, self.max_backoff_s)
            else:
                delay = self.interval_s
                if reason:
                    log.warning("stop notice: %s", reason)
                    self.notice.set(reason)
                    return
            self.stopped.wait(delay)

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.run, name="imds-watcher", daemon=True)
        thread.start()
        return thread
