"""A node's notice watcher (`python -m trainer nodes watch NAME`) against a fake metadata endpoint on loopback:
it keeps watching until a spot notice comes, then drains the node and requeues its jobs (on_notice); it runs
the node's health check when it starts and every interval. The health check drains a node whose hardware is
not what its Slurm definition says (Slurm's side is monkeypatched here; the box's tests run the real one)."""
from __future__ import annotations

import threading
import time

import pytest

from infra.demo.imds import FakeImds
from tests.trainer.node.test_preflight import FakeProbe
from trainer.slurm import nodes


@pytest.fixture
def imds(monkeypatch):
    """This node's metadata endpoint, a fake on loopback."""
    with FakeImds() as fake:
        monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", fake.endpoint)
        monkeypatch.delenv("AWS_EC2_METADATA_DISABLED", raising=False)
        yield fake


def test_a_spot_notice_reaches_on_notice(monkeypatch, imds):
    calls = []
    monkeypatch.setattr(nodes, "on_notice", lambda name, reason: calls.append((name, reason, time.monotonic())))
    threading.Timer(1.0, imds.spot_interruption).start()
    started = time.monotonic()
    assert nodes.watch("gpu-1", {"cloud": "aws", "health_every_s": 0}, poll_s=0.1) == 0
    (name, reason, at), = calls
    assert name == "gpu-1" and "spot" in reason
    assert at - started >= 1.0  # it watched until the notice came


def test_the_expected_hardware_is_the_nodes_slurm_definition():
    fields = {"Gres": "gpu:8(S:0-1)", "AvailableFeatures": "p5.48xlarge,spot,efa,nvswitch"}
    assert nodes.expected_hardware(fields) == {"gpus": 8, "efa": 1, "nvswitch": True}
    assert nodes.expected_hardware({"Gres": "(null)", "AvailableFeatures": "g6.xlarge"}) == \
        {"gpus": 0, "efa": 0, "nvswitch": False}


def test_a_node_failing_its_health_check_is_drained_and_its_jobs_requeued(monkeypatch):
    calls = []
    monkeypatch.setattr(nodes.client, "node_fields", lambda name: {"Gres": "gpu:8", "AvailableFeatures": "efa"})
    monkeypatch.setattr(nodes.client, "update_node", lambda name, **f: calls.append(("update", name, f)))
    monkeypatch.setattr(nodes.client, "jobs_on", lambda name: ["41", "42_3"])
    monkeypatch.setattr(nodes.client, "requeue", lambda job: calls.append(("requeue", job)))
    assert nodes.health("gpu-3", FakeProbe(gpus=8, efa=32)) == 0
    assert calls == []  # healthy: nothing done
    assert nodes.health("gpu-3", FakeProbe(gpus=7, efa=32, plugin=None)) == 0
    (_, name, fields), *requeued = calls
    assert name == "gpu-3" and fields["state"] == "DRAIN"
    assert fields["reason"] == ("preflight: gpus: 7 found, 8 expected; nccl-net-plugin: no libnccl-net*.so on "
                                "LD_LIBRARY_PATH or the usual library dirs")
    assert requeued == [("requeue", "41"), ("requeue", "42_3")]


def test_the_watcher_checks_the_node_when_it_starts_and_again_every_interval(monkeypatch, imds):
    checks = []
    monkeypatch.setattr(nodes, "on_notice", lambda name, reason: [])

    def health(name):
        checks.append((name, time.monotonic()))
        if len(checks) == 2:
            raise RuntimeError("slurmctld: no answer")  # told, and the watcher goes on
        return 0
    monkeypatch.setattr(nodes, "health", health)
    threading.Timer(1.2, imds.spot_interruption).start()
    started = time.monotonic()
    assert nodes.watch("gpu-2", {"cloud": "aws", "health_every_s": 0.5}, poll_s=0.1) == 0
    assert [name for name, _ in checks] == ["gpu-2"] * len(checks) and len(checks) >= 3
    assert checks[0][1] - started < 0.5  # at once, when the node starts
