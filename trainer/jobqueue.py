"""The job queue the agent pulls from: SQS here, Azure Storage queues in ``trainer.azure_queue``."""
from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from urllib.parse import urlparse

from trainer.errors import UsageError

# SQS caps a message's total time in flight at 12 hours from the receive that handed it out.
MAX_IN_FLIGHT_S = 12 * 3600


@dataclass(frozen=True)
class Message:
    id: str
    body: str
    receipt: str
    receive_count: int
    received_at: float = field(default_factory=time.time)  # wall clock of the receive (for the 12-hour cap)


class JobQueue:
    """At-least-once delivery: a received message stays hidden until deleted or its visibility ends."""

    max_in_flight_s: float = MAX_IN_FLIGHT_S

    def receive(self, wait_s: int) -> Message | None:
        raise NotImplementedError

    def extend(self, msg: Message, visibility_s: int) -> None:
        raise NotImplementedError

    def release(self, msg: Message) -> None:
        """Make the message visible again at once (visibility 0)."""
        self.extend(msg, 0)

    def delete(self, msg: Message) -> None:
        raise NotImplementedError

    def send(self, body: str) -> str:
        raise NotImplementedError


def sqs_region(url: str) -> str | None:
    """The region in an SQS URL (https://sqs.<region>.amazonaws.com/...), or None for an emulator URL."""
    m = re.match(r"(?:sqs\.)?([a-z]{2}(?:-[a-z]+)+-\d)\.(?:queue\.)?amazonaws\.com(?:\.cn)?$",
                 urlparse(url).hostname or "")
    return m.group(1) if m else None


class SqsJobQueue(JobQueue):
    def __init__(self, url: str, region: str | None = None):
        import boto3

        self.url = url
        self.client = boto3.client("sqs", region_name=region or sqs_region(url))

    def receive(self, wait_s: int) -> Message | None:
        resp = self.client.receive_message(
            QueueUrl=self.url, MaxNumberOfMessages=1, WaitTimeSeconds=wait_s,
            MessageSystemAttributeNames=["ApproximateReceiveCount"])
        for m in resp.get("Messages", []):
            return Message(m["MessageId"], m["Body"], m["ReceiptHandle"],
                           int(m.get("Attributes", {}).get("ApproximateReceiveCount", 1)))
        return None

    def extend(self, msg: Message, visibility_s: int) -> None:
        self.client.change_message_visibility(
            QueueUrl=self.url, ReceiptHandle=msg.receipt, VisibilityTimeout=int(visibility_s))

    def delete(self, msg: Message) -> None:
        self.client.delete_message(QueueUrl=self.url, ReceiptHandle=msg.receipt)

    def send(self, body: str) -> str:
        return self.client.send_message(QueueUrl=self.url, MessageBody=body)["MessageId"]


def open_queue(url: str, region: str | None = None) -> JobQueue:
    """SQS for SQS URLs; an Azure Storage queue for https://<account>.queue.core.windows.net/<queue>."""
    host = urlparse(url).hostname or ""
    if host.endswith(".queue.core.windows.net"):
        from trainer.azure_queue import AzureJobQueue

        return AzureJobQueue(url)
    if not url.startswith(("http://", "https://")):
        raise UsageError(f"--queue-url: {url!r} is not a queue URL (an SQS or Azure Storage queue https URL)")
    return SqsJobQueue(url, region)


JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


@dataclass(frozen=True)
class Job:
    job_id: str
    args: list[str]


def check_job_id(job_id: object, where: str = "job_id") -> str:
    if not isinstance(job_id, str) or not JOB_ID.match(job_id):
        raise UsageError(f"{where}: {job_id!r} is not allowed; expected 1-128 letters, digits, '.', '_' or '-', "
                     "starting with a letter or digit")
    return job_id


def parse_job(body: str) -> Job:
    """A job message {"job_id": str, "args": [train flags]}, its flags checked by train's own parser."""
    try:
        raw = json.loads(body)
    except ValueError as exc:
        raise UsageError(f"job message: not JSON ({exc})") from None
    if not isinstance(raw, dict) or set(raw) != {"job_id", "args"}:
        keys = sorted(raw) if isinstance(raw, dict) else type(raw).__name__
        raise UsageError(f"job message: expected exactly the keys job_id and args, got {keys}")
    job_id = check_job_id(raw["job_id"])
    args = raw["args"]
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise UsageError(f"job {job_id}: args must be a list of strings, got {args!r}")
    from trainer.config import parse_args

    try:
        parse_args(args)
    except UsageError as exc:
        raise UsageError(f"job {job_id}: {exc}") from None
    return Job(job_id, args)
