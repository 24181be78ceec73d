"""Jobs on Tencent nodes, end to end with real train processes: the spot reclamation notice from the fake
metadata service (written from Tencent's documentation, tests/trainer/fake_tencent.py) stops a run at a
checkpoint on COS (moto's S3 server standing in for COS's S3-compatible endpoint) and the resumed run is the
uninterrupted one; the agent hands a reclaimed job back through the fake TDMQ CMQ and dead-letters a job
that keeps failing."""
from __future__ import annotations

import io
import json
import threading
import time

import boto3
import pytest
import torch

from tests.trainer.fake_tencent import KEY, FakeCmq, FakeMetadata
from tests.trainer.gated import GATE, TRAIN, final_state, start_train, steps, wait_for
from trainer.clouds.tencent import SPOT, CmqJobQueue
from trainer.clouds.tencent_api import StaticCredentials
from trainer.loop.config import parse_args
from trainer.loop.stop import StopNotice
from trainer.loop.train import train
from trainer.node.agent import Agent
from trainer.node.emf import Emitter
from trainer.node.platform import Platform

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


class Reclaimable(Platform):
    """The node platform as the agent reads it after a reclamation: going away, let go."""

    name = "tencent"

    def __init__(self, metadata: FakeMetadata):
        self.metadata, self.released = metadata, 0

    def going_away(self):
        return "spot reclamation" if SPOT in self.metadata.items else None

    def let_go(self):
        self.released += 1


def agent(cmq, tmp_path, name, **kw) -> Agent:
    q = CmqJobQueue(cmq.url("jobs"), credentials_provider=StaticCredentials(KEY))
    return Agent(q, f"cos://{BUCKET}", {"cloud": "tencent"}, tmp_path / name, wait_s=kw.pop("wait_s", 0), nproc=0,
                 emitter=kw.pop("emitter", Emitter("gpufleet/test", io.StringIO())), **kw)


def send(cmq, job_id, args) -> None:
    CmqJobQueue(cmq.url("jobs"), credentials_provider=StaticCredentials(KEY)).send(
        json.dumps({"job_id": job_id, "args": args}))


def test_a_reclaimed_job_is_handed_back_through_cmq_and_finished_by_another_agent(tmp_path, cos, monkeypatch):
    metadata = cos
    with FakeCmq() as cmq:
        cmq.create("jobs-dead")
        cmq.create("jobs", visibility_s=600, dead_letter="jobs-dead", max_receives=3)
        gate = tmp_path / "gate"
        monkeypatch.setenv(GATE, f"{gate}:3")
        send(cmq, "bert-1", [*TRAIN, "--steps", str(STEPS)])
        out = io.StringIO()
        platform = Reclaimable(metadata)
        first = agent(cmq, tmp_path, "a", platform=platform, emitter=Emitter("gpufleet/test", out))
        result = []
        thread = threading.Thread(target=lambda: result.append(first.serve(once=True)))
        thread.start()
        metrics_a = tmp_path / "a" / "jobs" / "bert-1" / "metrics.jsonl"
        wait_for(lambda: steps(metrics_a), what="the job's first step")
        seen = len(metadata.gets)
        metadata.reclaim()
        wait_for(lambda: SPOT in metadata.gets[seen:], what="the job's watcher to read the reclamation")
        time.sleep(0.2)
        gate.touch()
        thread.join(timeout=300)
        assert result == [75] and platform.released == 1
        assert cmq.counts("jobs") == (1, 0)  # handed back at once as a new copy, the received one deleted
        assert {"Preemptions": 1.0, "StepsLost": 0.0}.items() <= json.loads(out.getvalue().splitlines()[-1]).items()

        monkeypatch.delenv("TENCENTCLOUD_METADATA_ENDPOINT")  # the second agent's node is not reclaimed
        monkeypatch.setenv("TENCENTCLOUD_SECRET_ID", KEY.secret_id)
        monkeypatch.setenv("TENCENTCLOUD_SECRET_KEY", KEY.secret_key)
        monkeypatch.setenv("TENCENTCLOUD_SESSION_TOKEN", KEY.token)
        second = agent(cmq, tmp_path, "b", platform=Platform())
        assert second.serve(once=True) == 0
        assert cmq.counts("jobs") == (0, 0) and cmq.bodies("jobs-dead") == []
        done = [r["step"] for r in steps(metrics_a) + steps(tmp_path / "b" / "jobs" / "bert-1" / "metrics.jsonl")]
        assert done == list(range(1, STEPS + 1))
        assert final_state(f"cos://{BUCKET}/jobs/bert-1/")[0] == STEPS


def test_a_job_out_of_retries_goes_to_the_dead_letter_queue_without_waiting_for_visibility(
        tmp_path, cos, caplog):
    with FakeCmq() as cmq:
        cmq.create("jobs-dead")
        cmq.create("jobs", visibility_s=3600, dead_letter="jobs-dead", max_receives=3)
        CmqJobQueue(cmq.url("jobs"), credentials_provider=StaticCredentials(KEY)).send(json.dumps({
            "spec": 1, "job_id": "broken", "kind": "trainer", "retries": {"on_error": 2},
            "args": [*TRAIN, "--steps", "2", "--model", "no_such_module:factory"]}))
        a = agent(cmq, tmp_path, "a", platform=Platform())
        for n in (1, 2, 3):
            assert a.serve(once=True) == 1
            assert f"job broken: failed with exit status 2 (attempt {n})" in caplog.text
        assert "moved to the dead-letter queue: 3 failure(s), retries.on_error is 2" in caplog.text
        assert a.serve(once=True) == 0  # nothing left: the third failure dead-lettered it
        (dead,) = cmq.bodies("jobs-dead")
        assert json.loads(dead)["job_id"] == "broken" and cmq.counts("jobs") == (0, 0)
