"""Job queue: a TDMQ CMQ queue the agents receive jobs from, and its dead-letter queue (a message
received MAX_RECEIVES times without being deleted moves there). CMQ's limits shape the settings: no
per-message visibility change (the queue's visibility timeout is each job's in-flight window), messages
kept at most 12 hours from their last send, and no tags on queues in the provider."""
from __future__ import annotations

from dataclasses import dataclass

import pulumi
from tencentcloud_iac_pulumi import tcmq

from infra.tencent import derive


@dataclass(frozen=True)
class JobQueueArgs:
    queue: str
    dlq: str
    region: str


class JobQueue(pulumi.ComponentResource):
    def __init__(self, name: str, args: JobQueueArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpufleet:tencent:JobQueue", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.dlq = tcmq.Queue(f"{name}-dead", queue_name=args.dlq, msg_retention_seconds=derive.QUEUE_RETENTION_S,
                              visibility_timeout=derive.QUEUE_VISIBILITY_S, max_msg_size=65536, opts=child)
        self.queue = tcmq.Queue(
            f"{name}-jobs", queue_name=args.queue, visibility_timeout=derive.QUEUE_VISIBILITY_S,
            msg_retention_seconds=derive.QUEUE_RETENTION_S, polling_wait_seconds=derive.QUEUE_POLL_S,
            max_msg_size=65536, dead_letter_queue_name=self.dlq.queue_name, policy=0,
            max_receive_count=derive.MAX_RECEIVES, opts=child)
        self.url = self.queue.queue_name.apply(lambda q: derive.queue_url(args.region, q))
        self.dlq_url = self.dlq.queue_name.apply(lambda q: derive.queue_url(args.region, q))
        self.register_outputs({"queueUrl": self.url, "dlqUrl": self.dlq_url})
