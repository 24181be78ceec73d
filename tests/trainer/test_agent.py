"""The job agent against SQS, S3 and autoscaling in moto server, the fake IMDS, and real train processes."""
from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
import time

import boto3
import pytest

from tests.trainer.aws import LifecycleStubbed, counts, make_group, send
from infra.demo.imds import FakeImds
from tests.trainer.gated import GATE, ROOT, TRAIN, final_state, steps, wait_for
from trainer.node.agent import (CAP_MARGIN_S, Agent, command, default_checkpoint_uri, job_args, outcome,
                                visibility_extension)
from trainer.node.runner import children
from trainer.node import emf
from trainer.node.emf import Emitter
from trainer.clouds.aws import LIFECYCLE, NodePlatform, SqsJobQueue
from trainer.jobs.spec import Job

STEPS = 8


@pytest.fixture
def aws(moto_endpoint):
    """A job queue whose messages go to a dead-letter queue after 2 receives, and a checkpoint bucket."""
    sqs = boto3.client("sqs")
    dlq = sqs.create_queue(QueueName="jobs-dlq")["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    url = sqs.create_queue(QueueName="jobs", Attributes={
        "VisibilityTimeout": "30",
        "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": "2"})})["QueueUrl"]
    boto3.client("s3").create_bucket(Bucket="ckpt", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    return sqs, url, dlq


def agent(url, tmp_path, name, **kw) -> Agent:
    kw.setdefault("emitter", Emitter("gpufleet/test", io.StringIO()))
    return Agent(kw.pop("queue", None) or SqsJobQueue(url), "ckpt", kw.pop("node", {}), tmp_path / name,
                 wait_s=kw.pop("wait_s", 0), nproc=0, **kw)


def test_an_aws_node_publishes_gpu_utilisation_for_its_group_and_itself_while_idle(aws, tmp_path, monkeypatch,
                                                                                   capsys):
    """With no job at all the agent still measures its GPUs, under the group's and the node's dimensions."""
    _, url, _ = aws
    monkeypatch.setattr(emf, "gpu_utilisation", lambda: 0.0)
    node = {"cloud": "aws", "asg_name": "gpufleet-test-nodes", "metric_namespace": "gpufleet/test",
            "region": "eu-west-1"}
    with FakeImds(instance_id="i-0feedface0000001") as imds:
        monkeypatch.delenv("AWS_EC2_METADATA_DISABLED")
        monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds.endpoint)
        idle = Agent(SqsJobQueue(url), "ckpt", node, tmp_path / "a", wait_s=0, nproc=0,
                     platform=NodePlatform(node, autoscaling=LifecycleStubbed()))
        assert idle.serve(once=True) == 0
    (doc,) = [json.loads(ln) for ln in capsys.readouterr().out.splitlines() if '"_aws"' in ln]
    assert doc["GPUUtilization"] == 0.0 and doc["_aws"]["CloudWatchMetrics"][0]["Namespace"] == "gpufleet/test"
    assert doc["_aws"]["CloudWatchMetrics"][0]["Dimensions"] == [["AutoScalingGroupName"],
                                                                 ["AutoScalingGroupName", "InstanceId"]]
    assert (doc["AutoScalingGroupName"], doc["InstanceId"]) == ("gpufleet-test-nodes", "i-0feedface0000001")


def test_job_args_defaults():
    args, uri, metrics = job_args(Job("j1", args=("--steps", "5")), "ckpt", "/w/m.jsonl")
    assert args == ["--steps", "5", "--checkpoint-uri", "s3://ckpt/jobs/j1/", "--metrics-file", "/w/m.jsonl"]
    assert (uri, metrics) == ("s3://ckpt/jobs/j1/", "/w/m.jsonl")
    own = ["--checkpoint-uri", "s3://mine/x/", "--metrics-file", "/m.jsonl"]
    assert job_args(Job("j1", args=tuple(own)), "ckpt", "/w/m.jsonl") == (own, "s3://mine/x/", "/m.jsonl")
    assert default_checkpoint_uri("https://acct.blob.core.windows.net/ckpt/", "j2") == \
        "https://acct.blob.core.windows.net/ckpt/jobs/j2/"


def test_command_uses_torchrun_over_gpus_and_one_process_without():
    assert command(["--steps", "1"], 0)[1:] == ["-m", "trainer", "train", "--steps", "1"]
    assert command(["--steps", "1"], 8)[1:] == ["-m", "trainer.node.launch", "--standalone", "--nproc-per-node", "8",
                                                "-m", "trainer", "train", "--steps", "1"]


def test_visibility_extension_respects_the_in_flight_limit():
    cap = 12 * 3600
    assert visibility_extension(1000.0, 1000.0, 600, cap) == 600
    assert visibility_extension(1000.0 + cap - CAP_MARGIN_S - 100, 1000.0, 600, cap) == 100
    assert visibility_extension(1000.0 + cap, 1000.0, 600, cap) == 0


def test_invalid_jobs_are_logged_and_dead_lettered_at_once(aws, tmp_path, caplog):
    sqs, url, dlq = aws
    sqs.send_message(QueueUrl=url, MessageBody=json.dumps({"job_id": "bad", "args": ["--steps", "0"]}))
    a = agent(url, tmp_path, "a")
    assert a.serve(once=True) == 1
    assert "invalid job, moved to the dead-letter queue: job bad: --steps: '0' is not allowed" in caplog.text
    assert counts(sqs, url) == (0, 0)  # not left to redelivery
    (moved,) = sqs.receive_message(QueueUrl=dlq)["Messages"]
    assert json.loads(moved["Body"])["job_id"] == "bad"


def protected(instance_id) -> bool:
    got = boto3.client("autoscaling").describe_auto_scaling_instances(InstanceIds=[instance_id])
    return got["AutoScalingInstances"][0]["ProtectedFromScaleIn"]


@pytest.mark.slow
def test_preempted_job_is_handed_back_and_finished_by_another_agent(aws, tmp_path, monkeypatch):
    sqs, url, _ = aws
    (instance_id,) = make_group("gpu")
    node = {"asg_name": "gpu", "terminate_hook": "drain", "region": "eu-west-1"}
    gate = tmp_path / "gate"
    monkeypatch.setenv(GATE, f"{gate}:3")
    send(sqs, url, "resnet-1", [*TRAIN, "--steps", str(STEPS)])
    out = io.StringIO()
    with FakeImds(instance_id=instance_id) as imds:
        monkeypatch.delenv("AWS_EC2_METADATA_DISABLED")
        monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds.endpoint)
        autoscaling = LifecycleStubbed()
        autoscaling.expect_complete("gpu", "drain", instance_id, "CONTINUE")
        first = agent(url, tmp_path, "a", node=node, platform=NodePlatform(node, autoscaling=autoscaling),
                      emitter=Emitter("gpufleet/test", out))
        result = []
        thread = threading.Thread(target=lambda: result.append(first.serve(once=True)))
        thread.start()
        metrics_a = tmp_path / "a" / "jobs" / "resnet-1" / "metrics.jsonl"
        wait_for(lambda: steps(metrics_a), what="the job's first step")
        assert protected(instance_id)
        imds.set(LIFECYCLE, "Terminated")  # the group scales this instance in
        seen = len(imds.gets)
        wait_for(lambda: LIFECYCLE in imds.gets[seen:], what="the job's watcher to read the lifecycle state")
        time.sleep(0.2)
        gate.touch()
        thread.join(timeout=300)
        assert result == [75]
        autoscaling.stub.assert_no_pending_responses()  # terminate hook completed with CONTINUE
    assert counts(sqs, url)[0] == 1  # handed back at once, not after the visibility timeout
    lines = [json.loads(ln) for ln in out.getvalue().splitlines()]
    assert {"Preemptions": 1.0, "StepsLost": 0.0}.items() <= lines[-1].items()

    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # the second agent runs off EC2
    second = agent(url, tmp_path, "b")
    assert second.serve(once=True) == 0
    assert counts(sqs, url) == (0, 0)  # done: the message is deleted
    metrics_b = tmp_path / "b" / "jobs" / "resnet-1" / "metrics.jsonl"
    done = [r["step"] for r in steps(metrics_a) + steps(metrics_b)]
    assert done == list(range(1, STEPS + 1))  # no step done twice, none skipped
    assert final_state("s3://ckpt/jobs/resnet-1/")[0] == STEPS


@pytest.mark.slow
def test_sigkilled_agent_job_is_redelivered_after_the_visibility_timeout(aws, tmp_path, monkeypatch):
    sqs, url, _ = aws
    gate = tmp_path / "gate"
    send(sqs, url, "j-kill", [*TRAIN, "--steps", str(STEPS)])
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainer", "agent", "--queue-url", url, "--bucket", "ckpt", "--once",
         "--visibility", "2", "--wait", "0", "--work-dir", str(tmp_path / "a"),
         "--node-json", str(tmp_path / "absent.json")],
        cwd=ROOT, env={**os.environ, GATE: f"{gate}:3"}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    metrics_a = tmp_path / "a" / "jobs" / "j-kill" / "metrics.jsonl"
    wait_for(lambda: steps(metrics_a), what="the job's first step")
    (train_pid,) = children(proc.pid)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    gate.touch()  # the orphaned job got SIGTERM when its agent died: it checkpoints and exits
    wait_for(lambda: not os.path.exists(f"/proc/{train_pid}") or
             open(f"/proc/{train_pid}/stat").read().split()[2] == "Z", what="the orphaned job to stop")
    stopped_at = steps(metrics_a)[-1]["step"]
    assert final_state("s3://ckpt/jobs/j-kill/")[0] == stopped_at

    second = agent(url, tmp_path, "b", wait_s=10)
    assert second.serve(once=True) == 0  # the message came back once its visibility ran out
    assert counts(sqs, url) == (0, 0)
    done = [r["step"] for r in steps(metrics_a) + steps(tmp_path / "b" / "jobs" / "j-kill" / "metrics.jsonl")]
    assert done == list(range(1, STEPS + 1))


@pytest.mark.slow
def test_message_near_the_in_flight_limit_is_checkpointed_and_handed_back(aws, tmp_path, caplog):
    sqs, url, _ = aws
    send(sqs, url, "long", [*TRAIN, "--steps", "1000000"])
    queue = SqsJobQueue(url)
    a = Agent(queue, "ckpt", {}, tmp_path / "a", visibility_s=3, wait_s=0, nproc=0,
              emitter=Emitter("gpufleet/test", io.StringIO()))
    result = []
    thread = threading.Thread(target=lambda: result.append(a.serve(once=True)))
    thread.start()
    metrics = tmp_path / "a" / "jobs" / "long" / "metrics.jsonl"
    wait_for(lambda: steps(metrics), what="the job's first step")
    queue.max_in_flight_s = CAP_MARGIN_S  # SQS allows 12 hours from the receive; pretend they are up
    thread.join(timeout=300)
    assert result == [75]
    assert "nears the queue's in-flight limit: checkpointing and handing it back" in caplog.text
    assert counts(sqs, url) == (1, 0)  # visible again at once: the next receive gets a fresh 12 hours
    assert final_state("s3://ckpt/jobs/long/")[0] == steps(metrics)[-1]["step"]


def test_a_requested_stop_before_train_handles_signals_counts_as_preempted():
    assert outcome(-signal.SIGTERM, stop_requested=True) == 75
    assert outcome(143, stop_requested=True) == 75  # through torchrun (trainer.node.launch)
    assert outcome(-signal.SIGTERM, stop_requested=False) == -signal.SIGTERM
    assert outcome(75, stop_requested=False) == 75 and outcome(1, stop_requested=True) == 1


@pytest.mark.slow
def test_a_failed_job_without_retries_is_dead_lettered_after_one_run(aws, tmp_path, caplog):
    sqs, url, dlq = aws
    send(sqs, url, "broken", [*TRAIN, "--steps", "2", "--model", "no_such_module:factory"])
    a = agent(url, tmp_path, "a", visibility_s=1, wait_s=5)
    assert a.serve(once=True) == 1
    assert "job broken: failed with exit status 2 (attempt 1); moved to the dead-letter queue" in caplog.text
    assert counts(sqs, url) == (0, 0)
    assert a.serve(once=True) == 0  # nothing redelivered
    (dead,) = sqs.receive_message(QueueUrl=dlq)["Messages"]
    assert json.loads(dead["Body"])["job_id"] == "broken"


@pytest.mark.parametrize("argv, message", [
    (["--node-json", "/nonexistent/node.json"], "--node-json: /nonexistent/node.json does not exist"),
    (["--queue-url", "http://q", "--bucket", "b", "--visibility", "0"], "--visibility: 0 is not allowed"),
    (["--queue-url", "sqs-name", "--bucket", "b"], "--queue-url: 'sqs-name' is not a queue URL"),
    (["--node-json", "{gang}"], "mode 'gang' needs asg_name and node_count (an integer >= 1)"),
])
def test_cli_bad_input_is_one_line(argv, message, tmp_path):
    gang = tmp_path / "node.json"
    gang.write_text(json.dumps({"mode": "gang", "queue_url": "http://q", "bucket": "b"}))
    argv = [a.format(gang=gang) for a in argv]
    proc = subprocess.run([sys.executable, "-m", "trainer", "agent", *argv], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and message in proc.stderr
