"""Queue: the SQS job queue and its dead-letter queue, KMS-encrypted, TLS-only."""
from __future__ import annotations

import json
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from infra.aws import policies

# A job message stays invisible while its node works on it; the agent extends the visibility while
# the job runs, so this only bounds how long a crashed node holds a job.
VISIBILITY_TIMEOUT_S = 900
MAX_RECEIVES = 3
RETENTION_S = 14 * 24 * 3600


@dataclass(frozen=True)
class QueueArgs:
    prefix: str
    key_arn: pulumi.Input[str]
    tags: dict[str, str]


class JobQueue(pulumi.ComponentResource):
    def __init__(self, name: str, args: QueueArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpufleet:aws:Queue", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        p = args.prefix
        encryption = {"kms_master_key_id": args.key_arn, "kms_data_key_reuse_period_seconds": 300}
        self.dlq = aws.sqs.Queue(f"{p}-jobs-dlq", message_retention_seconds=RETENTION_S,
                                 tags=args.tags, opts=child, **encryption)
        self.queue = aws.sqs.Queue(
            f"{p}-jobs", visibility_timeout_seconds=VISIBILITY_TIMEOUT_S, message_retention_seconds=RETENTION_S,
            receive_wait_time_seconds=20,
            redrive_policy=self.dlq.arn.apply(
                lambda arn: json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": MAX_RECEIVES})),
            tags=args.tags, opts=child, **encryption)
        aws.sqs.RedriveAllowPolicy(
            f"{p}-jobs-dlq-redrive-allow", queue_url=self.dlq.url,
            redrive_allow_policy=self.queue.arn.apply(
                lambda arn: json.dumps({"redrivePermission": "byQueue", "sourceQueueArns": [arn]})),
            opts=child)
        for queue, suffix in ((self.queue, "jobs"), (self.dlq, "jobs-dlq")):
            aws.sqs.QueuePolicy(f"{p}-{suffix}-policy", queue_url=queue.url,
                                policy=queue.arn.apply(lambda arn: json.dumps(policies.queue_policy(arn))),
                                opts=child)
        self.register_outputs({"url": self.queue.url, "dlq_url": self.dlq.url})
