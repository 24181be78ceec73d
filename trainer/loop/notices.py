"""Watchers that turn platform stop notices into a StopNotice."""
from __future__ import annotations

import threading

from trainer.clouds import adapter, node_cloud
from trainer.loop.stop import StopNotice

POLL_S = 2.0  # spot gives two minutes' warning; a few seconds of polling latency is plenty


def start_watchers(notice: StopNotice, settings: dict) -> list[threading.Thread]:
    """Start the watchers that apply to this node (settings: /etc/gpufleet/node.json, may be empty).

    Only a cloud node (node.json names its cloud) or an explicit metadata endpoint variable starts one
    (trainer.clouds.node_cloud): off a cloud no metadata address is contacted. AWS: the IMDS watcher (spot
    instance-action, autoscaling lifecycle state); Azure: the Scheduled Events watcher.
    """
    cloud = node_cloud(settings)
    if cloud is None:
        return []
    return [adapter(cloud).start_watcher(notice, settings, interval_s=POLL_S)]
