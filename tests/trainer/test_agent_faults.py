"""The job agent never loses or duplicates work: repeated preemptions, failing heartbeats and failing deletes
(through a fault proxy in front of moto server), jobs over the command-line limit; real train processes."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading

import boto3
import pytest

from tests.trainer.aws import LifecycleStubbed, counts, make_group, send
from infra.demo.imds import FakeImds
from tests.trainer.fault_proxy import Fault, FaultProxy
from tests.trainer.gated import GATE, ROOT, TRAIN, final_state, steps, wait_for
from trainer.clouds.aws import NodePlatform, SqsJobQueue
from trainer.jobs.spec import MAX_ARGS_BYTES, parse_job, with_attempt
from trainer.node.agent import Agent
from tests.trainer.test_agent import agent, aws  # noqa: F401 (aws: a fixture)

STEPS = 8


def in_thread(a: Agent) -> tuple[threading.Thread, list]:
    result: list = []
    thread = threading.Thread(target=lambda: result.append(a.serve(once=True)))
    thread.start()
    return thread, result


def preempt(a: Agent, gate) -> None:
    """What the agent's SIGTERM handler does, without signalling the test process."""
    a.stopping = "SIGTERM"
    a.stop_job()
    gate.touch()


def peek(sqs, url) -> dict:
    """The one visible message's body, made visible again at once."""
    (m,) = sqs.receive_message(QueueUrl=url, VisibilityTimeout=0)["Messages"]
    return json.loads(m["Body"])


def test_with_attempt_adds_one_entry_and_keeps_every_other_key():
    body = json.dumps({"spec": 1, "job_id": "j", "kind": "image", "image": "team/train:1", "command": ["run"],
                       "retries": {"on_error": 1}})
    once = with_attempt(body, {"outcome": "preempted", "step": 3})
    twice = json.loads(with_attempt(once, {"outcome": "handed back", "step": 5}))
    assert twice == {**json.loads(body), "attempts": [
        {"n": 1, "outcome": "preempted", "step": 3}, {"n": 2, "outcome": "handed back", "step": 5}]}
    job = parse_job(json.dumps(twice))
    assert job.attempts[1]["n"] == 2 and job.to_dict()["attempts"] == twice["attempts"]  # the message keeps it
    legacy = json.loads(with_attempt(json.dumps({"job_id": "j", "args": ["--steps", "1"]}), {"outcome": "failed"}))
    assert parse_job(json.dumps(legacy)).attempts == ({"n": 1, "outcome": "failed"},)


@pytest.mark.slow
def test_a_job_preempted_three_times_is_not_dead_lettered_and_finishes_once(aws, tmp_path, monkeypatch):
    sqs, url, dlq = aws
    total = 20  # each run does about four steps before its stop lands
    send(sqs, url, "often", [*TRAIN, "--steps", str(total)])
    files = []
    for i in range(3):
        gate = tmp_path / f"gate{i}"
        monkeypatch.setenv(GATE, f"{gate}:3")  # each run pauses at its third step until preempted
        a = agent(url, tmp_path, f"a{i}")
        thread, result = in_thread(a)
        files.append(tmp_path / f"a{i}" / "jobs" / "often" / "metrics.jsonl")
        wait_for(lambda: steps(files[-1]), what=f"run {i}'s first step")
        preempt(a, gate)
        thread.join(timeout=300)
        assert result == [75]
        assert counts(sqs, url) == (1, 0)  # a fresh message, visible at once
    body = peek(sqs, url)
    assert [(a["n"], a["outcome"]) for a in body["attempts"]] == [(1, "preempted"), (2, "preempted"),
                                                                  (3, "preempted")]
    assert [a["step"] for a in body["attempts"]] == [steps(f)[-1]["step"] for f in files]
    monkeypatch.delenv(GATE)
    last = agent(url, tmp_path, "b", wait_s=2)
    assert last.serve(once=True) == 0
    assert counts(sqs, url) == (0, 0) and "Messages" not in sqs.receive_message(QueueUrl=dlq)
    files.append(tmp_path / "b" / "jobs" / "often" / "metrics.jsonl")
    assert [r["step"] for f in files for r in steps(f)] == list(range(1, total + 1))  # each step once
    assert final_state("s3://ckpt/jobs/often/")[0] == total


@pytest.mark.slow
def test_failing_heartbeats_stop_the_job_at_a_checkpoint_before_the_message_lapses(aws, tmp_path, monkeypatch,
                                                                                    caplog):
    sqs, url, _ = aws
    send(sqs, url, "beats", [*TRAIN, "--steps", "1000000"])
    with FaultProxy(os.environ["AWS_ENDPOINT_URL"]) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        a = agent(url, tmp_path, "a", queue=SqsJobQueue(url), visibility_s=6)
        thread, result = in_thread(a)
        metrics = tmp_path / "a" / "jobs" / "beats" / "metrics.jsonl"
        wait_for(lambda: steps(metrics), what="the job's first step")
        beats = proxy.add(Fault("error", target="ChangeMessageVisibility", status=400))
        thread.join(timeout=300)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.upstream_url)
    assert result == [75] and beats.hits >= 1
    assert "heartbeats failing" in caplog.text and "stopping the job at a checkpoint" in caplog.text
    stopped = steps(metrics)[-1]["step"]
    assert final_state("s3://ckpt/jobs/beats/")[0] == stopped
    assert counts(sqs, url) == (1, 0)
    assert peek(sqs, url)["attempts"][0]["outcome"] == "handed back"


@pytest.mark.slow
def test_a_copy_left_by_a_failed_delete_is_dropped_as_superseded(aws, tmp_path, monkeypatch, caplog):
    sqs, url, _ = aws
    caplog.set_level(logging.INFO, logger="gpufleet.agent")
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"VisibilityTimeout": "2"})
    send(sqs, url, "dup", [*TRAIN, "--steps", str(STEPS)])
    gate = tmp_path / "gate"
    monkeypatch.setenv(GATE, f"{gate}:3")
    with FaultProxy(os.environ["AWS_ENDPOINT_URL"]) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        a = agent(url, tmp_path, "a", queue=SqsJobQueue(url), visibility_s=6)
        thread, result = in_thread(a)
        first = tmp_path / "a" / "jobs" / "dup" / "metrics.jsonl"
        wait_for(lambda: steps(first), what="the job's first step")
        deletes = proxy.add(Fault("error", target="DeleteMessage", status=400))
        preempt(a, gate)
        thread.join(timeout=300)
    assert result == [75] and deletes.hits == 1
    assert "deleting it after the hand-back failed" in caplog.text
    monkeypatch.delenv(GATE)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.upstream_url)
    b = agent(url, tmp_path, "b", wait_s=5)
    while sum(counts(sqs, url)):  # the fresh message and the old copy, in either order
        assert b.serve(once=True) == 0
    assert "is a copy a hand-back superseded; deleted" in caplog.text
    done = [r["step"] for r in steps(first) + steps(tmp_path / "b" / "jobs" / "dup" / "metrics.jsonl")]
    assert done == list(range(1, STEPS + 1))


def test_a_job_over_the_command_line_limit_is_refused_at_submit_in_one_line(aws):
    _, url, _ = aws
    proc = subprocess.run([sys.executable, "-m", "trainer", "submit", "--queue-url", url, "--job-id", "big", "--",
                           "--model", "m" * (MAX_ARGS_BYTES + 1)], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "job big: its args are" in proc.stderr and "a command line can safely carry" in proc.stderr


def test_a_job_over_the_command_line_limit_is_dead_lettered_in_one_line_and_protection_released(
        aws, tmp_path, monkeypatch, caplog):
    sqs, url, dlq = aws
    (instance_id,) = make_group("gpu")
    node = {"asg_name": "gpu", "terminate_hook": "drain", "region": "eu-west-1"}
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"VisibilityTimeout": "0"})
    send(sqs, url, "big", ["--model", "m" * 200_000])  # sent around submit's check
    with FakeImds(instance_id=instance_id) as imds:
        monkeypatch.delenv("AWS_EC2_METADATA_DISABLED")
        monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds.endpoint)
        a = agent(url, tmp_path, "a", node=node, platform=NodePlatform(node, autoscaling=LifecycleStubbed()))
        with caplog.at_level(logging.ERROR, logger="gpufleet.agent"):
            assert a.serve(once=True) == 1
        assert a.serve(once=True) == 0  # moved to the dead-letter queue at once
    errors = [r.getMessage() for r in caplog.records if r.name == "gpufleet.agent" and r.levelno >= logging.ERROR]
    assert len(errors) == 1 and not any("\n" in e for e in errors)
    assert "invalid job, moved to the dead-letter queue: job big: its args are" in caplog.text
    assert json.loads(sqs.receive_message(QueueUrl=dlq)["Messages"][0]["Body"])["job_id"] == "big"
    got = boto3.client("autoscaling").describe_auto_scaling_instances(InstanceIds=[instance_id])
    assert got["AutoScalingInstances"][0]["ProtectedFromScaleIn"] is False


def test_a_command_the_os_refuses_is_a_failed_job_not_a_crash(aws, tmp_path, monkeypatch, caplog):
    sqs, url, _ = aws
    send(sqs, url, "e2big", ["--steps", "1"])
    # one argument over MAX_ARG_STRLEN, as a node whose own environment is huge would make: Popen raises E2BIG
    monkeypatch.setattr("trainer.node.agent.command", lambda args, nproc: [sys.executable, "-c", "pass", "x" * 200_000])
    a = agent(url, tmp_path, "a")
    with caplog.at_level(logging.ERROR, logger="gpufleet.agent"):
        assert a.serve(once=True) == 1
    assert "job e2big: cannot start: [Errno 7] Argument list too long" in caplog.text


def test_no_exception_escapes_handling_and_protection_is_released(aws, tmp_path, monkeypatch, caplog):
    sqs, url, _ = aws
    (instance_id,) = make_group("gpu")
    node = {"asg_name": "gpu", "region": "eu-west-1"}
    send(sqs, url, "j", ["--steps", "1"])
    with FakeImds(instance_id=instance_id) as imds:
        monkeypatch.delenv("AWS_EC2_METADATA_DISABLED")
        monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds.endpoint)
        a = agent(url, tmp_path, "a", node=node, platform=NodePlatform(node, autoscaling=LifecycleStubbed()))

        def launch(job, attempt):
            assert boto3.client("autoscaling").describe_auto_scaling_instances(
                InstanceIds=[instance_id])["AutoScalingInstances"][0]["ProtectedFromScaleIn"]
            raise MemoryError("the node ran out of memory")

        monkeypatch.setattr(a, "launch", launch)
        assert a.serve(once=True) == 1
    assert "the agent could not handle it (MemoryError: the node ran out of memory); left for redelivery" \
        in caplog.text
    got = boto3.client("autoscaling").describe_auto_scaling_instances(InstanceIds=[instance_id])
    assert got["AutoScalingInstances"][0]["ProtectedFromScaleIn"] is False



def send_job(sqs, url, job_id, args, **fields) -> None:
    sqs.send_message(QueueUrl=url, MessageBody=json.dumps({"spec": 1, "job_id": job_id, "kind": "trainer",
                                                           "args": args, **fields}))


BROKEN = [*TRAIN, "--steps", "2", "--model", "no_such_module:factory"]  # exits 2 before its first step


def counting(a: Agent) -> list:
    """The attempts the agent launches (their GPUFLEET_ATTEMPT numbers)."""
    launched, launch = [], a.launch
    a.launch = lambda job, attempt: launched.append(attempt) or launch(job, attempt)
    return launched


def dead(sqs, dlq) -> list[dict]:
    return [json.loads(m["Body"]) for m in sqs.receive_message(QueueUrl=dlq, MaxNumberOfMessages=10,
                                                               MessageAttributeNames=["All"]).get("Messages", [])]


def test_retries_on_error_0_dead_letters_after_one_run(aws, tmp_path, caplog):
    sqs, url, dlq = aws
    send_job(sqs, url, "once", BROKEN)
    a = agent(url, tmp_path, "a")
    launched = counting(a)
    assert a.serve(once=True) == 1
    assert a.serve(once=True) == 0  # nothing redelivered
    assert launched == [1] and counts(sqs, url) == (0, 0)
    assert [d["job_id"] for d in dead(sqs, dlq)] == ["once"]
    assert "moved to the dead-letter queue: 1 failure(s), retries.on_error is 0" in caplog.text


def test_retries_on_error_1_runs_twice_then_dead_letters_with_the_history(aws, tmp_path):
    sqs, url, dlq = aws
    send_job(sqs, url, "twice", BROKEN, retries={"on_error": 1})
    a = agent(url, tmp_path, "a")
    launched = counting(a)
    assert a.serve(once=True) == 1
    assert counts(sqs, url) == (1, 0)  # queued again as a fresh message
    assert a.serve(once=True) == 1
    assert a.serve(once=True) == 0
    assert launched == [1, 2] and counts(sqs, url) == (0, 0)
    (moved,) = dead(sqs, dlq)
    assert [(x["n"], x["outcome"], x["exit_status"]) for x in moved["attempts"]] == [(1, "failed", 2)]


def test_an_exit_status_in_on_exit_codes_always_retries_and_never_counts(aws, tmp_path):
    sqs, url, dlq = aws
    send_job(sqs, url, "flaky", BROKEN, retries={"on_error": 0, "on_exit_codes": [2]})
    a = agent(url, tmp_path, "a")
    for _ in range(3):  # more than maxReceiveCount (2) and on_error (0)
        assert a.serve(once=True) == 1
    body = peek(sqs, url)
    assert [x["exit_status"] for x in body["attempts"]] == [2, 2, 2] and not dead(sqs, dlq)


@pytest.mark.slow
def test_a_job_stopped_at_its_timeout_is_a_failure_that_counts(aws, tmp_path, caplog):
    sqs, url, dlq = aws
    send_job(sqs, url, "slow", [*TRAIN, "--steps", "1000000"], timeout=3, retries={"on_error": 1})
    a = agent(url, tmp_path, "a")
    assert a.serve(once=True) == 1
    assert "job slow: stopped at its timeout of 3 s" in caplog.text
    assert [x["outcome"] for x in peek(sqs, url)["attempts"]] == ["timeout"]
    assert a.serve(once=True) == 1
    assert [x["outcome"] for x in dead(sqs, dlq)[0]["attempts"]] == ["timeout"]
    assert counts(sqs, url) == (0, 0)
