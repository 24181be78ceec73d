"""Identity: the user-assigned managed identities of the GPU nodes and of the Slurm controller, and their roles,
each scoped to the one resource it is needed on (no account keys exist: shared-key access is off).

- nodes: write checkpoints, records and logs in the blob container. Their registry pull and Key Vault reads are
  granted where those resources are made (infra/azure/registry.py, vault.py). Nodes take no job from the queue:
  the bridge on the controller does. Jobs hold none of it (the metadata service answers only root on a node).
- each team's jobs (``<name>-team-<team>``, on every node; its jobs get its tokens from the node's credentials
  daemon): a custom role of blob data actions on the container, held by an ABAC condition to reads under
  ``teams/<team>/{jobs,code,data}/`` and writes under ``teams/<team>/jobs/``; AcrPull (registry.py).
- controller (the bridge, slurmctld's power saving): the teams' job queues and poison queues, the blob container
  (the jobs' records); in the nodes' resource group, a custom role that creates, reads and deletes VMs, NICs and
  OS disks and puts VMs into the partitions' scale sets and availability sets; on the node subnet, a custom role
  to join NICs to it; on the node identity and each team's, Managed Identity Operator (assign them to the VMs it
  creates); on a gallery image, Reader. Its Key Vault right (the munge key) is granted on the secret
  (infra/azure/vault.py). The controller can touch nothing else: not itself, the shared file system, the vault
  or the registry.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pulumi
from pulumi_azure_native import authorization, managedidentity

from infra.azure import derive


@dataclass(frozen=True)
class IdentityArgs:
    name: str                                   # base name: <name>-nodes, <name>-controller
    stack: str
    resource_group: pulumi.Input[str]
    resource_group_id: pulumi.Input[str]        # the stack's group (the node subnet's): the subnet role's scope
    location: str
    subscription_id: pulumi.Input[str]
    container_id: pulumi.Input[str]
    queue_ids: tuple[pulumi.Input[str], ...]    # the job queue and its poison queue
    nodes_group_id: pulumi.Input[str]           # the nodes' resource group
    node_subnet_id: pulumi.Input[str]
    image_definition_id: Optional[str]          # a gallery image the nodes boot from (derive.gallery_image_definition)
    tags: dict
    teams: tuple[str, ...] = ()                 # each gets its jobs' identity


def custom_role(resource_name: str, subscription_id: pulumi.Input[str], stack: str, location: str,
                scope: pulumi.Input[str], purpose: str, description: str, actions: tuple[str, ...] = (),
                data_actions: tuple[str, ...] = (), opts: Optional[pulumi.ResourceOptions] = None
                ) -> authorization.RoleDefinition:
    """A custom role definition assignable at ``scope`` (a resource group) and below: its GUID and name fixed by
    subscription, stack, region and purpose."""
    sub = pulumi.Output.from_input(subscription_id)
    return authorization.RoleDefinition(
        resource_name,
        role_definition_id=sub.apply(lambda s: derive.custom_role_guid(s, stack, location, purpose)),
        role_name=sub.apply(lambda s: derive.custom_role_name(s, stack, location, purpose)),
        role_type="CustomRole",
        description=description,
        scope=scope,
        assignable_scopes=[scope],
        permissions=[authorization.PermissionArgs(actions=list(actions), not_actions=[],
                                                  data_actions=list(data_actions), not_data_actions=[])],
        opts=opts,
    )


def custom_role_id(subscription_id: pulumi.Input[str], stack: str, location: str, purpose: str
                   ) -> pulumi.Output[str]:
    """The role definition id a role assignment names for a custom role of ``purpose``."""
    return pulumi.Output.from_input(subscription_id).apply(
        lambda s: derive.role_definition_id(s, derive.custom_role_guid(s, stack, location, purpose)))


def grant(name: str, principal_id: pulumi.Input[str], role: pulumi.Input[str], scope: pulumi.Input[str],
          opts: pulumi.ResourceOptions) -> authorization.RoleAssignment:
    """A role assignment to a managed identity (principalType ServicePrincipal: ARM does not wait for the
    principal to replicate)."""
    return authorization.RoleAssignment(name, principal_id=principal_id, principal_type="ServicePrincipal",
                                        role_definition_id=role, scope=scope, opts=opts)


def builtin(subscription_id: pulumi.Input[str], role_guid: str) -> pulumi.Output[str]:
    """The role definition id of a built-in role."""
    return pulumi.Output.from_input(subscription_id).apply(lambda s: derive.role_definition_id(s, role_guid))


class Identity(pulumi.ComponentResource):
    id: pulumi.Output[str]
    client_id: pulumi.Output[str]
    principal_id: pulumi.Output[str]

    def __init__(self, name: str, args: IdentityArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpufleet:azure:Identity", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.identity = managedidentity.UserAssignedIdentity(
            f"{name}-nodes", resource_name_=f"{args.name}-nodes", resource_group_name=args.resource_group,
            location=args.location, tags=args.tags, opts=child)
        self.controller = managedidentity.UserAssignedIdentity(
            f"{name}-controller", resource_name_=f"{args.name}-controller", resource_group_name=args.resource_group,
            location=args.location, tags=args.tags, opts=child)
        nodes, ctl = self.identity.principal_id, self.controller.principal_id
        sub, stack, location = args.subscription_id, args.stack, args.location
        blob, queue = (builtin(sub, derive.STORAGE_BLOB_DATA_CONTRIBUTOR),
                       builtin(sub, derive.STORAGE_QUEUE_DATA_CONTRIBUTOR))
        # what the nodes' identity holds here
        self.role_assignments = [grant(f"{name}-blob", nodes, blob, args.container_id, child)]

        launcher = custom_role(
            f"{name}-node-launcher", sub, stack, location, args.nodes_group_id, "node-launcher",
            "gpufleet: the Slurm controller creates and deletes the GPU nodes' VMs, NICs and disks in the nodes' "
            "resource group", actions=derive.NODE_LAUNCH_ACTIONS, opts=child)
        joiner = custom_role(
            f"{name}-subnet-joiner", sub, stack, location, args.resource_group_id, "subnet-joiner",
            "gpufleet: the Slurm controller puts the GPU nodes' NICs into the node subnet",
            actions=derive.SUBNET_JOIN_ACTIONS, opts=child)
        after = lambda role: pulumi.ResourceOptions(parent=self, depends_on=[role])  # noqa: E731
        self.controller_roles = [
            grant(f"{name}-controller-blob", ctl, blob, args.container_id, child),
            *(grant(f"{name}-controller-queue-{i}", ctl, queue, q, child) for i, q in enumerate(args.queue_ids)),
            grant(f"{name}-controller-launch", ctl, custom_role_id(sub, stack, location, "node-launcher"), args.nodes_group_id,
                  after(launcher)),
            grant(f"{name}-controller-subnet", ctl, custom_role_id(sub, stack, location, "subnet-joiner"), args.node_subnet_id,
                  after(joiner)),
            grant(f"{name}-controller-assign-identity", ctl, builtin(sub, derive.MANAGED_IDENTITY_OPERATOR),
                  self.identity.id, child),
        ]
        # Each team's jobs' identity: every node holds it (so a team's job may run anywhere), only the team's jobs
        # get its tokens (trainer.node.jobcreds); its blob role is held to the team's prefix by a condition.
        job_blobs = custom_role(
            f"{name}-job-blobs", sub, stack, location, args.resource_group_id, "job-blobs",
            "gpufleet: a team's jobs keep their records, checkpoints and logs and read the team's code and data "
            "(held to the team's prefix by each assignment's condition)", data_actions=derive.JOB_BLOB_DATA_ACTIONS,
            opts=child)
        self.teams: dict[str, managedidentity.UserAssignedIdentity] = {}
        for team in args.teams:
            ident = self.teams[team] = managedidentity.UserAssignedIdentity(
                f"{name}-team-{team}", resource_name_=derive.team_identity_name(args.name, team),
                resource_group_name=args.resource_group, location=args.location, tags=args.tags, opts=child)
            authorization.RoleAssignment(
                f"{name}-team-{team}-blobs", principal_id=ident.principal_id, principal_type="ServicePrincipal",
                role_definition_id=custom_role_id(sub, stack, location, "job-blobs"), scope=args.container_id,
                condition=derive.job_blob_condition(team), condition_version="2.0", opts=after(job_blobs))
            self.controller_roles.append(grant(f"{name}-controller-assign-{team}", ctl,
                                               builtin(sub, derive.MANAGED_IDENTITY_OPERATOR), ident.id, child))
        if args.image_definition_id:
            self.controller_roles.append(grant(f"{name}-controller-image", ctl, builtin(sub, derive.READER),
                                               args.image_definition_id, child))
        self.id = self.identity.id
        self.client_id = self.identity.client_id
        self.principal_id = self.identity.principal_id
        self.controller_id = self.controller.id
        self.controller_client_id = self.controller.client_id
        self.controller_principal_id = self.controller.principal_id
        self.register_outputs({"clientId": self.client_id, "principalId": self.principal_id,
                               "controllerClientId": self.controller_client_id,
                               "controllerPrincipalId": self.controller_principal_id})
