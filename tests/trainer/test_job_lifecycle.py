"""A job's life as the user follows it: `gpufleet jobs submit|status|logs|cancel|retry` (processes of their own)
around real agents and real train processes, against moto's S3 and SQS on loopback."""
from __future__ import annotations

import io
import json
import socket
import threading

import boto3
import pytest

from tests.infra.test_jobs_cli import bodies, err, gpufleet
from tests.trainer.aws import counts
from tests.trainer.gated import DIE, GATE, TRAIN, steps, wait_for
from trainer.clouds.aws import SqsJobQueue
from trainer.jobs import logs
from trainer.jobs.records import RecordStore
from trainer.loop.checkpoint import Checkpointer
from trainer.loop.storage import open_store
from trainer.node.agent import Agent
from trainer.node.emf import Emitter


@pytest.fixture
def cluster(moto_endpoint):
    """A bucket, and a job queue whose dead-letter queue is named by its redrive policy (as the stack's)."""
    boto3.client("s3").create_bucket(Bucket="ckpt", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    sqs = boto3.client("sqs")
    dlq = sqs.create_queue(QueueName="jobs-dlq")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    url = sqs.create_queue(QueueName="jobs", Attributes={
        "VisibilityTimeout": "30", "RedrivePolicy": json.dumps({"deadLetterTargetArn": arn,
                                                                 "maxReceiveCount": "3"})})["QueueUrl"]
    flags = ("--queue-url", url, "--bucket", "ckpt")
    return {"sqs": sqs, "queue": url, "dlq": dlq, "flags": flags, "records": RecordStore.of_bucket("ckpt")}


def agent(cluster, tmp_path, name="a") -> Agent:
    return Agent(SqsJobQueue(cluster["queue"]), "ckpt", {}, tmp_path / name, wait_s=0, nproc=0,
                 emitter=Emitter("gpufleet/test", io.StringIO()))


def submit(cluster, job_id, *train) -> None:
    proc = gpufleet("jobs", "submit", *cluster["flags"], "--job-id", job_id, "--", *TRAIN, *train)
    assert proc.returncode == 0, proc.stderr


def status(cluster, job_id) -> dict:
    proc = gpufleet("jobs", "status", "--bucket", "ckpt", job_id, "--format", "json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def serve_in_thread(a: Agent) -> tuple[threading.Thread, list]:
    result = []
    thread = threading.Thread(target=lambda: result.append(a.serve(once=True)), daemon=True)
    thread.start()
    return thread, result


def saved_steps(job_id) -> list[int]:
    return Checkpointer(open_store(f"s3://ckpt/jobs/{job_id}/"), keep=1).steps()


@pytest.mark.slow
def test_a_finished_job_has_its_record_progress_and_output_after_the_node_is_gone(cluster, tmp_path):
    submit(cluster, "done-1", "--steps", "4")
    assert status(cluster, "done-1")["state"] == "queued"
    assert agent(cluster, tmp_path).serve(once=True) == 0
    rec = status(cluster, "done-1")
    assert (rec["state"], len(rec["attempts"])) == ("succeeded", 1)
    (attempt,) = rec["attempts"]
    assert (attempt["n"], attempt["exit_status"], attempt["nodes"]) == (1, 0, [socket.gethostname()])
    assert attempt["end"] >= attempt["start"]
    assert (rec["progress"]["step"], rec["progress"]["total"]) == (4, 4) and rec["progress"]["loss"] > 0
    shipped = b"".join(data for _, data in logs.read(cluster["records"].store, "done-1", 1))
    local = (tmp_path / "a" / "jobs" / "done-1" / "output-1.log").read_bytes()
    assert shipped == local and b"step 4/4" in shipped  # the whole output, in order, from the bucket
    proc = gpufleet("jobs", "logs", "--bucket", "ckpt", "done-1")  # the agent and its files are not needed
    assert proc.returncode == 0 and "step 4/4" in proc.stdout, proc.stderr
    assert counts(cluster["sqs"], cluster["queue"]) == (0, 0)


@pytest.mark.slow
def test_a_cancelled_queued_job_never_runs(cluster, tmp_path):
    submit(cluster, "never", "--steps", "4")
    proc = gpufleet("jobs", "cancel", "--bucket", "ckpt", "never")
    assert (proc.returncode, proc.stdout.strip()) == (0, "job never cancelled (it was queued)"), proc.stderr
    assert agent(cluster, tmp_path).serve(once=True) == 0
    assert counts(cluster["sqs"], cluster["queue"]) == (0, 0)  # its message deleted, not run, not dead-lettered
    assert bodies(cluster["sqs"], cluster["dlq"]) == []
    rec = status(cluster, "never")
    assert (rec["state"], rec["attempts"]) == ("cancelled", [])
    assert saved_steps("never") == [] and not (tmp_path / "a" / "jobs" / "never").exists()
    again = gpufleet("jobs", "cancel", "--bucket", "ckpt", "never")
    assert (again.returncode, again.stdout.strip()) == (0, "job never has already been cancelled; nothing changed")


@pytest.mark.slow
def test_a_running_job_cancelled_stops_at_a_checkpoint_and_its_message_is_deleted(cluster, tmp_path, monkeypatch):
    gate = tmp_path / "gate"
    monkeypatch.setenv(GATE, f"{gate}:3")  # step 3 waits until the test has cancelled
    submit(cluster, "stop-me", "--steps", "50")
    thread, result = serve_in_thread(agent(cluster, tmp_path))
    wait_for(lambda: cluster["records"].get("stop-me")["state"] == "running", what="the job running")
    proc = gpufleet("jobs", "cancel", "--bucket", "ckpt", "stop-me")
    assert proc.stdout.strip() == ("job stop-me is running: its node stops it (checkpoint, exit) and marks it "
                                   "cancelled"), proc.stderr
    wait_for(lambda: (tmp_path / "a" / "jobs" / "stop-me" / "control" / "stop").exists() or not thread.is_alive(),
             what="the stop")
    gate.touch()
    thread.join(120)
    assert result == [0]
    rec = status(cluster, "stop-me")
    assert rec["state"] == "cancelled" and rec["attempts"][0]["reason"] == "cancel"
    assert rec["attempts"][0]["exit_status"] == 75  # it checkpointed and exited
    assert saved_steps("stop-me") and saved_steps("stop-me")[0] < 50
    assert counts(cluster["sqs"], cluster["queue"]) == (0, 0) and bodies(cluster["sqs"], cluster["dlq"]) == []


@pytest.mark.slow
def test_a_handed_back_job_is_queued_again_then_finished_by_another_agent(cluster, tmp_path, monkeypatch):
    gate = tmp_path / "gate"
    monkeypatch.setenv(GATE, f"{gate}:3")
    submit(cluster, "moved", "--steps", "6")
    first = agent(cluster, tmp_path, "a")
    thread, result = serve_in_thread(first)
    wait_for(lambda: cluster["records"].get("moved")["state"] == "running", what="the job running")
    metrics = tmp_path / "a" / "jobs" / "moved" / "metrics.jsonl"
    wait_for(lambda: steps(metrics), what="the first step")  # then the trainer waits at the gate
    first.stop_job()  # as the in-flight limit or failing heartbeats do: checkpoint and hand back
    gate.touch()
    thread.join(120)
    assert result == [75]
    rec = status(cluster, "moved")
    assert (rec["state"], rec["attempts"][0]["reason"]) == ("queued", "hand-back")
    monkeypatch.delenv(GATE)
    assert agent(cluster, tmp_path, "b").serve(once=True) == 0
    rec = status(cluster, "moved")
    assert rec["state"] == "succeeded" and [a["n"] for a in rec["attempts"]] == [1, 2]
    assert rec["progress"]["step"] == 6
    assert logs.attempts(cluster["records"].store, "moved") == [1, 2]  # each attempt's output kept


@pytest.mark.slow
def test_a_failed_job_past_its_retries_is_dead_lettered_then_retried_and_resumed(cluster, tmp_path, monkeypatch):
    monkeypatch.setenv(DIE, "0:4:3")  # rank 0 exits 3 at its 4th forward call
    submit(cluster, "flaky", "--steps", "6", "--checkpoint-every", "2")
    assert agent(cluster, tmp_path).serve(once=True) == 1
    rec = status(cluster, "flaky")
    assert (rec["state"], rec["reason"], rec["attempts"][0]["exit_status"]) == ("failed", "failure", 3)
    (copy,) = cluster["sqs"].receive_message(QueueUrl=cluster["dlq"], VisibilityTimeout=0)["Messages"]  # stays visible
    assert json.loads(copy["Body"])["job_id"] == "flaky"
    monkeypatch.delenv(DIE)
    proc = gpufleet("jobs", "retry", *cluster["flags"], "flaky")  # the queue's redrive policy names its DLQ
    assert proc.stdout.strip() == "job flaky queued again after 1 attempt(s); its dead-letter message removed", \
        proc.stderr
    assert bodies(cluster["sqs"], cluster["dlq"]) == []
    assert agent(cluster, tmp_path, "b").serve(once=True) == 0
    rec = status(cluster, "flaky")
    assert rec["state"] == "succeeded" and len(rec["attempts"]) == 2
    assert b"resum" in b"".join(d for _, d in logs.read(cluster["records"].store, "flaky", 2)).lower()


def test_jobs_status_of_an_unknown_job_is_one_line(cluster):
    proc = gpufleet("jobs", "status", "--bucket", "ckpt", "nope")
    assert proc.returncode == 2 and err(proc).startswith("error: job 'nope': no such job"), proc.stderr


@pytest.mark.slow
def test_a_job_past_its_timeout_is_stopped_at_a_checkpoint_and_failed_with_reason_timeout(cluster, tmp_path):
    proc = gpufleet("jobs", "submit", *cluster["flags"], "--job-id", "slow", "--timeout", "4", "--",
                    *TRAIN, "--steps", "100000")
    assert proc.returncode == 0, proc.stderr
    assert agent(cluster, tmp_path).serve(once=True) == 1
    rec = status(cluster, "slow")
    assert (rec["state"], rec["reason"], rec["attempts"][0]["reason"]) == ("failed", "timeout", "timeout")
    assert saved_steps("slow")  # stopped with a checkpoint
    assert [b["job_id"] for b in bodies(cluster["sqs"], cluster["dlq"])] == ["slow"]
