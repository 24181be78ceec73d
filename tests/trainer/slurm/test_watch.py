"""A node's notice watcher (`python -m trainer nodes watch NAME`) against a fake metadata endpoint on loopback:
it keeps watching until a spot notice comes, then drains the node and requeues its jobs (on_notice)."""
from __future__ import annotations

import threading
import time

from infra.demo.imds import FakeImds
from trainer.slurm import nodes


def test_a_spot_notice_reaches_on_notice(monkeypatch):
    calls = []
    monkeypatch.setattr(nodes, "on_notice", lambda name, reason: calls.append((name, reason, time.monotonic())))
    with FakeImds() as imds:
        monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds.endpoint)
        monkeypatch.delenv("AWS_EC2_METADATA_DISABLED", raising=False)
        timer = threading.Timer(1.0, imds.spot_interruption)
        started = time.monotonic()
        timer.start()
        assert nodes.watch("gpu-1", {"cloud": "aws"}, poll_s=0.1) == 0
    (name, reason, at), = calls
    assert name == "gpu-1" and "spot" in reason
    assert at - started >= 1.0  # it watched until the notice came
