"""Watchers that turn platform stop notices into a StopNotice."""
from __future__ import annotations

import threading

from trainer.stop import StopNotice

POLL_S = 2.0  # spot gives two minutes' warning; a few seconds of polling latency is plenty


def start_watchers(notice: StopNotice, settings: dict) -> list[threading.Thread]:
    """Start the watchers that apply to this node (settings: /etc/gpufleet/node.json, may be empty).

    AWS or unknown cloud: the IMDS watcher (spot instance-action, autoscaling lifecycle state); it
    backs off quietly where no metadata service answers. Azure: the Scheduled Events watcher.
    """
    if settings.get("cloud") == "azure":
        from trainer.azure_events import start_watcher

        return [start_watcher(notice, settings)]
    from trainer.imds import Watcher

    return [Watcher(notice, interval_s=POLL_S).start()]
