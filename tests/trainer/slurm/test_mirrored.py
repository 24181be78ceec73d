"""A job submitted with sbatch directly is mirrored as a record of kind sbatch: `retry` cannot requeue it through
the queue, and says so in one line (nothing sent)."""
from __future__ import annotations

import time

import boto3
import pytest

from trainer.errors import UsageError
from trainer.jobs import commands
from trainer.jobs.records import RecordStore, new_record


def test_retry_of_a_mirrored_sbatch_job_is_one_line_and_sends_nothing(moto_endpoint):
    boto3.client("s3").create_bucket(Bucket="mirror", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    sqs = boto3.client("sqs")
    url = sqs.create_queue(QueueName="mirror")["QueueUrl"]
    spec = {"job_id": "slurm-7", "kind": "sbatch", "name": "wrap", "user": "alice", "partition": "gpu"}
    RecordStore.of_bucket("mirror", None).update("slurm-7", lambda r: r, missing=lambda: {
        **new_record(spec, time.time()), "state": "failed"})
    with pytest.raises(UsageError) as told:
        commands.retry(commands.Target("mirror", url), "slurm-7")
    assert str(told.value) == ("retry: job slurm-7 was submitted with sbatch on the controller, not through the "
                               "queue; submit its script again with sbatch")
    assert "Messages" not in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0)
