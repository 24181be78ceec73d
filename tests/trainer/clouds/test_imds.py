"""IMDSv2 client and spot interruption watcher against the fake IMDS on loopback (real HTTP)."""
from __future__ import annotations

import json
import socket

import pytest

from infra.demo.imds import FakeImds
from trainer.clouds.aws import REBALANCE, Imds, ImdsUnavailable, Watcher, interruption
from trainer.loop.stop import StopNotice


@pytest.fixture
def imds(monkeypatch):
    with FakeImds() as fake:
        monkeypatch.delenv("AWS_EC2_METADATA_DISABLED")
        monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", fake.endpoint)
        yield fake


def closed_port_endpoint() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/"


def test_reads_items_with_one_cached_token(imds):
    client = Imds()
    assert client.endpoint == imds.endpoint
    assert client.instance_id() == "i-0123456789abcdef0"
    assert client.instance_type() == "g5.xlarge"
    assert client.region() == "eu-west-1"
    assert client.get("meta-data/spot/instance-action") is None  # 404: no interruption
    assert imds.token_requests == 1


def test_revoked_token_is_renewed_once(imds):
    client = Imds()
    assert client.private_ip() == "10.0.0.10"
    imds.revoke_tokens()
    assert client.private_ip() == "10.0.0.10"
    assert imds.token_requests == 2 and imds.rejected == 1


def test_token_renewed_before_its_ttl_ends(imds, monkeypatch):
    client = Imds(token_ttl_s=10)
    client.instance_id()
    clock = [1000.0]
    monkeypatch.setattr("trainer.clouds.aws.time.monotonic", lambda: clock[0])
    client._token_expires = clock[0] + 4  # less than the renewal margin (ttl/2) left
    client.instance_id()
    assert imds.token_requests == 2


def test_off_ec2_fails_fast(monkeypatch):
    monkeypatch.delenv("AWS_EC2_METADATA_DISABLED")
    monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", closed_port_endpoint())
    client = Imds()
    assert not client.available()
    with pytest.raises(ImdsUnavailable, match="no instance metadata service"):
        client.instance_id()


def test_disabled_by_botocore_variable(imds, monkeypatch):
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    assert not Imds().available()
    assert imds.token_requests == 0


@pytest.mark.parametrize("spot, expected", [
    (None, None),
    ("", None),
    ('{"action": "terminate", "time": "2026-11-30T05:00:00Z"}', "spot terminate at 2026-11-30T05:00:00Z"),
    ('{"action": "stop", "time": "T"}', "spot stop at T"),
    ("not json", "spot interruption"),
])
def test_interruption(spot, expected):
    assert interruption(spot) == expected


def test_watcher_sets_notice_on_spot_action(imds):
    notice = StopNotice()
    watcher = Watcher(notice, interval_s=0.05)
    thread = watcher.start()
    imds.spot_interruption()
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert notice.is_set() and notice.reason.startswith("spot terminate at ")
    assert imds.token_requests == 1  # one token for the whole watch


def test_a_rebalance_recommendation_is_logged_not_a_notice(imds, caplog):
    notice = StopNotice()
    watcher = Watcher(notice, interval_s=0.05)
    imds.set(REBALANCE, json.dumps({"noticeTime": "2026-11-30T05:00:00Z"}))
    assert watcher.poll() is None and not notice.is_set()
    assert "rebalance recommendation" in caplog.text


def test_watcher_backs_off_quietly_off_ec2(monkeypatch):
    monkeypatch.delenv("AWS_EC2_METADATA_DISABLED")
    monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", closed_port_endpoint())
    notice = StopNotice()
    watcher = Watcher(notice, interval_s=0.01, max_backoff_s=0.08)
    delays = []
    monkeypatch.setattr(watcher.stopped, "wait", lambda d: delays.append(d) or len(delays) >= 5)
    monkeypatch.setattr(watcher.stopped, "is_set", lambda: len(delays) >= 5)
    watcher.run()
    assert delays == [0.02, 0.04, 0.08, 0.08, 0.08]
    assert not notice.is_set()
