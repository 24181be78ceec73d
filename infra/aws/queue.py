"""Queue: a team's way in. Its SQS job queue and dead-letter queue (KMS-encrypted, TLS-only) and its submit role:
the queue takes messages from that role alone (policies.queue_policy), so the queue a message came through is the
team that sent it, which the bridge makes the job's Slurm account (trainer.slurm.bridge)."""
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
    team: str
    name: str                        # "jobs" (the first team's, as before teams had queues), "jobs-<team>"
    region: str
    account_id: pulumi.Input[str]
    bucket_arn: pulumi.Input[str]
    key_arn: pulumi.Input[str]
    tags: dict[str, str]


class JobQueue(pulumi.ComponentResource):
    def __init__(self, name: str, args: QueueArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpufleet:aws:Queue", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        p, q = args.prefix, f"{args.prefix}-{args.name}"
        encryption = {"kms_master_key_id": args.key_arn, "kms_data_key_reuse_period_seconds": 300}
        self.dlq = aws.sqs.Queue(f"{q}-dlq", message_retention_seconds=RETENTION_S,
                                 tags=args.tags, opts=child, **encryption)
        self.queue = aws.sqs.Queue(
            q, visibility_timeout_seconds=VISIBILITY_TIMEOUT_S, message_retention_seconds=RETENTION_S,
            receive_wait_time_seconds=20,
            redrive_policy=self.dlq.arn.apply(
                lambda arn: json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": MAX_RECEIVES})),
            tags=args.tags, opts=child, **encryption)
        aws.sqs.RedriveAllowPolicy(
            f"{q}-dlq-redrive-allow", queue_url=self.dlq.url,
            redrive_allow_policy=self.queue.arn.apply(
                lambda arn: json.dumps({"redrivePermission": "byQueue", "sourceQueueArns": [arn]})),
            opts=child)
        self.submit_role = aws.iam.Role(
            f"{p}-submit-{args.team}", description=f"{p}: team {args.team} submits, follows and cancels its jobs",
            assume_role_policy=pulumi.Output.from_input(args.account_id).apply(
                lambda acct: json.dumps(policies.assume_role_account(acct, args.region))),
            tags=args.tags, opts=child)
        aws.iam.RolePolicy(
            f"{p}-submit-{args.team}-policy", role=self.submit_role.name,
            policy=pulumi.Output.all(args.bucket_arn, args.key_arn, self.queue.arn, self.dlq.arn).apply(
                lambda v: json.dumps(policies.submit_policy(*v, region=args.region, team=args.team))),
            opts=child)
        aws.sqs.QueuePolicy(f"{q}-policy", queue_url=self.queue.url,
                            policy=pulumi.Output.all(self.queue.arn, self.submit_role.arn).apply(
                                lambda v: json.dumps(policies.queue_policy(*v))),
                            opts=child)
        aws.sqs.QueuePolicy(f"{q}-dlq-policy", queue_url=self.dlq.url,
                            policy=self.dlq.arn.apply(lambda arn: json.dumps(policies.queue_policy(arn))),
                            opts=child)
        self.register_outputs({"url": self.queue.url, "dlq_url": self.dlq.url, "submit_role": self.submit_role.arn})
