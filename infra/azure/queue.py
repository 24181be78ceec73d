"""Job queue: a team's way in. Its storage queue, which the bridge on the controller takes jobs from (as the team's:
the queue a message came through is the team that sent it), its poison queue (storage queues have no dead-letter
queue; the bridge moves a message there after too many deliveries), and, where the config names the team's Entra
group (`gpufleet:teams[].azureGroup`), that group's rights: send to this queue (Storage Queue Data Message Sender),
take back its poison messages (Storage Queue Data Message Processor, for `jobs retry`) and keep its records and
bundles in the container under `teams/<team>/` (the stack's blob-only custom role, held to the team's prefix by a
condition: derive.submit_blob_condition). The account's administrators decide who is in a team by the group's
members. A storage queue has no resource policy of its own: an identity holding a queue role on the whole account
could send to any team's queue."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pulumi
from pulumi_azure_native import authorization, storage

from infra.azure import derive
from infra.azure.identity import builtin


@dataclass(frozen=True)
class JobQueueArgs:
    account_name: pulumi.Input[str]
    resource_group: pulumi.Input[str]
    team: str
    queue: str                                  # derive.team_queues
    poison: str
    subscription_id: pulumi.Input[str]
    container_id: pulumi.Input[str]
    submit_role: pulumi.Input[str]              # the stack's submit-blobs custom role's definition id
    group: Optional[str] = None                 # the team's Entra group (object id), if the config names one
    after: tuple[pulumi.Resource, ...] = ()     # the custom role's definition


class JobQueue(pulumi.ComponentResource):
    queue_id: pulumi.Output[str]
    poison_queue_id: pulumi.Output[str]

    def __init__(self, name: str, args: JobQueueArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpufleet:azure:JobQueue", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.queue = storage.Queue(f"{name}-jobs", account_name=args.account_name,
                                   resource_group_name=args.resource_group, queue_name=args.queue, opts=child)
        self.poison = storage.Queue(f"{name}-poison", account_name=args.account_name,
                                    resource_group_name=args.resource_group, queue_name=args.poison, opts=child)
        self.queue_id = self.queue.id
        self.poison_queue_id = self.poison.id
        account = pulumi.Output.from_input(args.account_name)
        self.queue_url = account.apply(lambda a: derive.queue_url(a, args.queue))
        self.poison_url = account.apply(lambda a: derive.queue_url(a, args.poison))
        self.submit_roles = []
        if args.group:
            after = pulumi.ResourceOptions(parent=self, depends_on=list(args.after))

            def to_group(suffix: str, role, scope, **condition) -> authorization.RoleAssignment:
                return authorization.RoleAssignment(
                    f"{name}-submit-{suffix}", principal_id=args.group, principal_type="Group",
                    role_definition_id=role, scope=scope, opts=after, **condition)

            self.submit_roles = [
                to_group("send", builtin(args.subscription_id, derive.STORAGE_QUEUE_DATA_MESSAGE_SENDER),
                         self.queue.id),
                to_group("poison", builtin(args.subscription_id, derive.STORAGE_QUEUE_DATA_MESSAGE_PROCESSOR),
                         self.poison.id),
                to_group("blobs", args.submit_role, args.container_id,
                         condition=derive.submit_blob_condition(args.team), condition_version="2.0"),
            ]
        self.register_outputs({"queueUrl": self.queue_url, "poisonQueueUrl": self.poison_url})
