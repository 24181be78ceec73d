"""`python -m trainer submit`: one job or a sweep grid, all checked by train's parser before any is sent."""
from __future__ import annotations

import json
import subprocess
import sys

import boto3
import pytest

from tests.trainer.gated import ROOT
from trainer.errors import UsageError
from trainer.jobs.queue import Job, parse_job
from trainer.jobs.submit import expand, parse_sweep


def test_parse_sweep():
    assert parse_sweep("lr=1e-3,3e-4") == ("lr", ["1e-3", "3e-4"])
    assert parse_sweep("--batch_size=8,16") == ("batch-size", ["8", "16"])
    with pytest.raises(UsageError, match=r"--sweep: 'learning=1' is not allowed; expected KEY=V1,V2,\.\.\. with KEY a train flag"):
        parse_sweep("learning=1")
    with pytest.raises(UsageError, match="expected distinct, non-empty values"):
        parse_sweep("lr=1,,2")


def test_grid_ids_derive_from_values():
    jobs = expand("exp", ["--steps", "100"], [("lr", ["1e-3", "3e-4"]), ("batch-size", ["8", "16"])])
    assert [j.job_id for j in jobs] == ["exp.lr-1e-3.batch-size-8", "exp.lr-1e-3.batch-size-16",
                                        "exp.lr-3e-4.batch-size-8", "exp.lr-3e-4.batch-size-16"]
    assert jobs[1] == Job("exp.lr-1e-3.batch-size-16", ["--steps", "100", "--lr", "1e-3", "--batch-size", "16"])
    assert expand("one", ["--steps", "5"], []) == [Job("one", ["--steps", "5"])]


def test_any_invalid_combination_refuses_the_whole_grid():
    with pytest.raises(UsageError, match=r"job exp.batch-size-0: --batch-size: '0' is not allowed"):
        expand("exp", [], [("batch-size", ["8", "0"])])
    with pytest.raises(UsageError, match="--checkpoint-uri: one location cannot be shared by the jobs of a sweep"):
        expand("exp", ["--checkpoint-uri", "s3://b/x"], [("lr", ["1", "2"])])
    with pytest.raises(UsageError, match="two combinations give the same job id"):
        expand("exp", [], [("model", ["a:b", "a/b"])])


@pytest.fixture
def queue(moto_endpoint):
    sqs = boto3.client("sqs")
    return sqs, sqs.create_queue(QueueName="jobs")["QueueUrl"]


def submit(*argv):
    return subprocess.run([sys.executable, "-m", "trainer", "submit", *argv], cwd=ROOT, capture_output=True, text=True)


def received(sqs, url) -> list[dict]:
    out = []
    while msgs := sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", []):
        out += [json.loads(m["Body"]) for m in msgs]
    return out


def test_submit_sends_the_grid(queue):
    sqs, url = queue
    proc = submit("--queue-url", url, "--job-id", "sweep1", "--sweep", "lr=1e-3,3e-4", "--sweep", "seed=1,2",
                  "--", "--steps", "50", "--model", "gpt-tiny")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("queued sweep1.") == 4
    bodies = received(sqs, url)
    assert sorted(b["job_id"] for b in bodies) == ["sweep1.lr-1e-3.seed-1", "sweep1.lr-1e-3.seed-2",
                                                    "sweep1.lr-3e-4.seed-1", "sweep1.lr-3e-4.seed-2"]
    for b in bodies:
        assert parse_job(json.dumps(b)).args[:4] == ["--steps", "50", "--model", "gpt-tiny"]  # what the agent accepts


@pytest.mark.parametrize("argv, message", [
    (["--job-id", "j", "--", "--steps", "0"], "error: job j: --steps: '0' is not allowed; expected an integer >= 1"),
    (["--sweep", "precision=fp32,fp8", "--", "--steps", "5"], "--precision: 'fp8' is not allowed"),
    (["--job-id", "has space"], "--job-id: 'has space' is not allowed"),
    (["--job-id", "j", "--", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
])
def test_invalid_input_sends_nothing(queue, argv, message):
    sqs, url = queue
    proc = submit("--queue-url", url, *argv)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and message in proc.stderr
    assert received(sqs, url) == []
