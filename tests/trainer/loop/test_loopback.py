"""Off a cloud node the trainer contacts no metadata address: with no node.json and none of the metadata
variables, a training run opens no socket beyond loopback. The guard that checks it is tested first."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from infra.demo.imds import FakeImds
from tests.trainer.gated import ROOT
from trainer.loop.train import NODE_JSON

TRAIN = [sys.executable, "-m", "trainer", "train", "--model", "gpt-tiny", "--dataset", "synthetic", "--steps", "3",
         "--batch-size", "2", "--num-workers", "0", "--checkpoint-every", "0"]


def run(cmd, tmp_path, **env):
    refused, seen = tmp_path / "refused.log", tmp_path / "seen.log"
    base = {k: v for k, v in os.environ.items() if not k.startswith("AWS_EC2_METADATA")}
    base.update(GPUFLEET_LOOPBACK_LOG=str(refused), GPUFLEET_LOOPBACK_SEEN=str(seen), **env)
    proc = subprocess.run(cmd, cwd=ROOT, env=base, capture_output=True, text=True, timeout=300)
    lines = lambda p: p.read_text().splitlines() if p.exists() else []  # noqa: E731
    return proc, lines(refused), lines(seen)


def test_the_guard_refuses_and_records_a_connection_beyond_loopback_before_it_is_made(tmp_path):
    # 192.0.2.1 is TEST-NET-1 (documentation only); the guard raises before the connect system call.
    code = "import socket; socket.create_connection(('192.0.2.1', 9), timeout=0.1)"
    proc, refused, seen = run([sys.executable, "-c", code], tmp_path)
    assert proc.returncode != 0 and "beyond loopback" in proc.stderr
    assert [line.split(" -> ")[1] for line in refused] == ["192.0.2.1:9"] and seen == ["192.0.2.1:9"]


def test_a_training_run_off_a_node_opens_no_socket_beyond_loopback(tmp_path):
    assert not Path(NODE_JSON).exists()
    proc, refused, seen = run([*TRAIN, "--checkpoint-uri", str(tmp_path / "ck")], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert refused == [] and seen == []
    assert "IMDS" not in proc.stderr and "metadata" not in proc.stderr


def test_the_metadata_variable_points_the_watcher_at_a_fake_endpoint_on_loopback(tmp_path):
    """The control: the same run with botocore's variable set polls it, so the check above can fail."""
    with FakeImds() as imds:
        proc, refused, seen = run([*TRAIN, "--checkpoint-uri", str(tmp_path / "ck")], tmp_path,
                                  AWS_EC2_METADATA_SERVICE_ENDPOINT=imds.endpoint)
        assert proc.returncode == 0, proc.stderr
        assert refused == [] and f"127.0.0.1:{imds.port}" in seen and imds.token_requests >= 1
