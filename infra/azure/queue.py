"""Job queue: the storage queue the bridge on the controller takes jobs from, and its poison queue (storage queues
have no dead-letter queue; the bridge moves a message there after too many deliveries)."""
from __future__ import annotations

from dataclasses import dataclass

import pulumi
from pulumi_azure_native import storage

from infra.azure import derive


@dataclass(frozen=True)
class JobQueueArgs:
    account_name: pulumi.Input[str]
    resource_group: pulumi.Input[str]


class JobQueue(pulumi.ComponentResource):
    queue_id: pulumi.Output[str]
    poison_queue_id: pulumi.Output[str]

    def __init__(self, name: str, args: JobQueueArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpufleet:azure:JobQueue", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.queue = storage.Queue(f"{name}-jobs", account_name=args.account_name,
                                   resource_group_name=args.resource_group,
                                   queue_name=derive.JOBS_QUEUE, opts=child)
        self.poison = storage.Queue(f"{name}-poison", account_name=args.account_name,
                                    resource_group_name=args.resource_group,
                                    queue_name=derive.POISON_QUEUE, opts=child)
        self.queue_id = self.queue.id
        self.poison_queue_id = self.poison.id
        account = pulumi.Output.from_input(args.account_name)
        self.queue_url = account.apply(derive.queue_url)
        self.poison_url = account.apply(lambda a: derive.queue_url(a, derive.POISON_QUEUE))
        self.register_outputs({"queueUrl": self.queue_url, "poisonQueueUrl": self.poison_url})
