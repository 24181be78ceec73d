"""Watchers that turn platform stop notices into a StopNotice."""
from __future__ import annotations

import logging
import threading

from trainer.clouds import adapter, node_cloud
from trainer.loop.stop import StopNotice
from trainer.periodic import Periodic

POLL_S = 2.0  # spot gives two minutes' warning; a few seconds of polling latency is plenty

log = logging.getLogger("gpufleet.notices")


class MetadataUnavailable(Exception):
    """No instance metadata service answers (off a cloud, disabled, or a blip). Each cloud raises a subclass of
    its own, which its ``explain`` tells in one line."""


class NoticeWatcher(Periodic):
    """The one stop-notice watcher: the cloud's :meth:`poll` (the reason of a stop notice, or None) every
    ``interval_s``; the first notice sets ``notice`` and ends the watch. While the metadata service is unavailable
    (MetadataUnavailable) the delay doubles up to ``max_backoff_s``, and only the first failure of a run of them is
    logged. ``stopped`` ends it early. A cloud subclasses it with its ``poll`` and nothing else."""

    def __init__(self, notice: StopNotice, interval_s: float = POLL_S, max_backoff_s: float = 300.0,
                 name: str = "notice-watcher"):
        super().__init__(self._round, interval_s, name, at_once=True)
        self.notice, self.max_backoff_s = notice, max_backoff_s
        self.delay = interval_s

    def poll(self) -> str | None:
        raise NotImplementedError

    def check(self) -> str | None:
        """Poll once; set the notice on the first stop notice. The reason, or None."""
        reason = self.poll()
        if reason and not self.notice.is_set():
            log.warning("stop notice: %s", reason)
            self.notice.set(reason)
        return reason

    def _round(self) -> None:
        if self.notice.is_set():  # this watcher's or another's: the watch is over
            self.stopped.set()
            return
        try:
            self.check()
        except MetadataUnavailable as exc:
            if self.delay == self.interval_s:
                log.info("%s; retrying with backoff", exc)
            self.delay = min(self.delay * 2, self.max_backoff_s)
        else:
            self.delay = self.interval_s

    def next_wait(self) -> float:
        return self.delay


def start_watchers(notice: StopNotice, settings: dict) -> list[threading.Thread]:
    """Start the watchers that apply to this node (settings: /etc/gpufleet/node.json, may be empty).

    Only a cloud node (node.json names its cloud) or an explicit metadata endpoint variable starts one
    (trainer.clouds.node_cloud): off a cloud no metadata address is contacted. AWS: the IMDS watcher (spot
    instance-action); Azure: the Scheduled Events watcher; Tencent: the spot reclamation watcher.
    """
    cloud = node_cloud(settings)
    if cloud is None:
        return []
    return [adapter(cloud).start_watcher(notice, settings, interval_s=POLL_S)]
