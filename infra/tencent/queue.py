"""Job queue: a team's way in. Its TDMQ CMQ queue, which the bridge receives jobs from (as the team's: the
queue a message came through is the team that sent it), its dead-letter queue (a message received MAX_RECEIVES
times without being deleted moves there) and its submit group: a CAM group whose policy (derive.submit_policy)
sends to this queue and keeps the team's records and bundles; the account's administrators add the team's people
to it. CMQ's limits shape the settings: no per-message visibility change (the queue's visibility timeout is each
job's in-flight window), messages kept at most 12 hours from their last send, no tags on queues in the provider,
and no resource policy on a queue (who may send is each identity's own policy)."""
from __future__ import annotations

import json
from dataclasses import dataclass

import pulumi
from tencentcloud_iac_pulumi import cam, tcmq

from infra.tencent import derive


@dataclass(frozen=True)
class JobQueueArgs:
    queue: str
    dlq: str
    region: str
    team: str
    group: str                                  # the submit group's name (derive.submit_group)
    policy: pulumi.Input[dict]                  # its policy (derive.submit_policy)


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
        self.group = cam.Group(f"{name}-submit", name=args.group,
                               remark=f"submits follows and cancels the jobs of team {args.team}", opts=child)
        self.policy = cam.Policy(f"{name}-submit-policy", name=args.group,
                                 document=pulumi.Output.from_input(args.policy).apply(json.dumps),
                                 description=f"gpufleet: team {args.team} submits, follows and cancels its jobs",
                                 opts=child)
        cam.GroupPolicyAttachment(f"{name}-submit-attachment", group_id=self.group.id, policy_id=self.policy.id,
                                  opts=child)
        self.url = self.queue.queue_name.apply(lambda q: derive.queue_url(args.region, q))
        self.dlq_url = self.dlq.queue_name.apply(lambda q: derive.queue_url(args.region, q))
        self.register_outputs({"queueUrl": self.url, "dlqUrl": self.dlq_url, "submitGroup": self.group.name})
