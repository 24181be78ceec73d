"""Jobs on Tencent nodes, end to end with real train processes: the spot reclamation notice from the fake
metadata service (written from Tencent's documentation, tests/trainer/fake_tencent.py) stops a run at a
checkpoint on COS (moto's S3 server standing in for COS's S3-compatible endpoint) and the resumed run is the
uninterrupted one."""
from __future__ import annotations

import time

import boto3
import pytest
import torch

from tests.trainer.fake_tencent import KEY, FakeMetadata
from tests.trainer.gated import GATE, TRAIN, final_state, start_train, steps, wait_for
from trainer.clouds.tencent import SPOT
from trainer.loop.config import parse_args
from trainer.loop.stop import StopNotice
from trainer.loop.train import train

pytestmark = pytest.mark.slow
STEPS = 10
BUCKET = "gpufleet-test-data-1250000000"


@pytest.fixture
def cos(moto_endpoint, monkeypatch):
    """The checkpoint bucket on the S3-compatible stand-in; the Tencent key comes from the fake metadata."""
    monkeypatch.setenv("TENCENTCLOUD_REGION", "ap-shanghai")
    for var in ("TENCENTCLOUD_SECRET_ID", "TENCENTCLOUD_SECRET_KEY", "TENCENTCLOUD_SESSION_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    boto3.client("s3", region_name="ap-shanghai").create_bucket(
        Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": "ap-shanghai"})
    with FakeMetadata() as metadata:
        monkeypatch.setenv("TENCENTCLOUD_METADATA_ENDPOINT", metadata.endpoint)
        yield metadata


def test_a_reclamation_notice_stops_at_a_checkpoint_on_cos_and_the_resumed_run_is_the_uninterrupted_one(
        tmp_path, cos, monkeypatch):
    metadata = cos
    base_uri, uri = f"cos://{BUCKET}/base/", f"cos://{BUCKET}/runs/r1/"
    # The uninterrupted run, in this process, with no metadata variable: no watcher, no notice.
    monkeypatch.delenv("TENCENTCLOUD_METADATA_ENDPOINT")
    monkeypatch.setenv("TENCENTCLOUD_SECRET_ID", KEY.secret_id)
    monkeypatch.setenv("TENCENTCLOUD_SECRET_KEY", KEY.secret_key)
    base_args = [*TRAIN, "--steps", str(STEPS), "--checkpoint-uri", base_uri,
                 "--metrics-file", str(tmp_path / "base.jsonl")]
    assert train(parse_args(base_args), StopNotice()) == 0
    baseline = [s["loss"] for s in steps(tmp_path / "base.jsonl")]
    monkeypatch.delenv("TENCENTCLOUD_SECRET_ID")
    monkeypatch.delenv("TENCENTCLOUD_SECRET_KEY")
    monkeypatch.setenv("TENCENTCLOUD_METADATA_ENDPOINT", metadata.endpoint)  # this process reads COS as a node

    metrics, gate = tmp_path / "m.jsonl", tmp_path / "gate"
    args = ["--steps", str(STEPS), "--checkpoint-uri", uri, "--metrics-file", str(metrics)]
    env = {"TENCENTCLOUD_METADATA_ENDPOINT": metadata.endpoint}
    proc = start_train(args, {**env, GATE: f"{gate}:4"})
    wait_for(lambda: steps(metrics), what="a step before the gate")
    seen = len(metadata.gets)
    when = metadata.reclaim()
    wait_for(lambda: SPOT in metadata.gets[seen:], what="the watcher to read the reclamation time")
    time.sleep(0.2)
    gate.touch()
    log = proc.communicate(timeout=300)[0]
    assert proc.returncode == 75, log
    assert f"stop requested (spot reclamation at {when} (UTC+8))" in log
    stopped = steps(metrics)[-1]["step"]
    assert 4 <= stopped < STEPS and final_state(uri)[0] == stopped

    metadata.set(SPOT, None)  # a new node, not marked for reclamation
    proc = start_train(args, env)
    log = proc.communicate(timeout=300)[0]
    assert proc.returncode == 0, log
    records = steps(metrics)
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))  # none twice, none skipped
    assert [r["loss"] for r in records] == baseline
    step, model = final_state(uri)
    base_step, base_model = final_state(base_uri)
    assert step == base_step == STEPS and all(torch.equal(model[k], base_model[k]) for k in base_model)
    assert metadata.key_fetches >= 1  # the runs signed COS requests with the node role's key
