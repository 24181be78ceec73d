"""Identity: the nodes' user-assigned managed identity and its data-plane roles, each scoped to the
one container or queue it needs (no account keys exist: shared-key access is off)."""
from __future__ import annotations

from dataclasses import dataclass

import pulumi
from pulumi_azure_native import authorization, managedidentity

from infra.azure import derive


@dataclass(frozen=True)
class IdentityArgs:
    name: str
    resource_group: pulumi.Input[str]
    location: str
    subscription_id: pulumi.Input[str]
    container_id: pulumi.Input[str]
    queue_ids: tuple[pulumi.Input[str], ...]
    tags: dict


class Identity(pulumi.ComponentResource):
    id: pulumi.Output[str]
    client_id: pulumi.Output[str]
    principal_id: pulumi.Output[str]

    def __init__(self, name: str, args: IdentityArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpufleet:azure:Identity", name, None, opts)
        self.identity = managedidentity.UserAssignedIdentity(
            f"{name}-nodes",
            resource_name_=args.name,
            resource_group_name=args.resource_group,
            location=args.location,
            tags=args.tags,
            opts=pulumi.ResourceOptions(parent=self),
        )
        grants = [("blob", derive.STORAGE_BLOB_DATA_CONTRIBUTOR, args.container_id)]
        grants += [(f"queue-{i}", derive.STORAGE_QUEUE_DATA_CONTRIBUTOR, q) for i, q in enumerate(args.queue_ids)]
        self.role_assignments = [
            authorization.RoleAssignment(
                f"{name}-{label}",
                principal_id=self.identity.principal_id,
                principal_type="ServicePrincipal",
                role_definition_id=pulumi.Output.from_input(args.subscription_id).apply(
                    lambda sub, role=role: derive.role_definition_id(sub, role)),
                scope=scope,
                opts=pulumi.ResourceOptions(parent=self),
            )
            for label, role, scope in grants
        ]
        self.id = self.identity.id
        self.client_id = self.identity.client_id
        self.principal_id = self.identity.principal_id
        self.register_outputs({"clientId": self.client_id, "principalId": self.principal_id})
