"""Watchers that turn platform stop notices into a StopNotice."""
from __future__ import annotations

import logging
import threading

from trainer.clouds import adapter, node_cloud
from trainer.loop.stop import StopNotice

POLL_S = 2.0  # spot gives two minutes' warning; a few seconds of polling latency is plenty

log = logging.getLogger("gpufleet.notices")


def poll_with_backoff(poll, unavailable: type[Exception], stopped: threading.Event, interval_s: float,
                      max_backoff_s: float, done=lambda: False) -> None:
    """A watcher's loop: ``poll()`` every ``interval_s`` until ``stopped`` is set or ``done()``; while the
    metadata service is ``unavailable`` (off a cloud, or a blip) the delay doubles up to ``max_backoff_s``, and
    only the first failure of a run of them is logged."""
    delay = interval_s
    while not stopped.is_set() and not done():
        try:
            poll()
        except unavailable as exc:
            if delay == interval_s:
                log.info("%s; retrying with backoff", exc)
            delay = min(delay * 2, max_backoff_s)
        else:
            delay = interval_s
        stopped.wait(delay)


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
