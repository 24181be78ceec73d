"""Registry: the container registry the nodes pull job images from, reachable only over a private path.

Nodes have no outbound internet access, so images come from the stack's registry through a private
endpoint in the node subnet; `privatelink.azurecr.io`, linked to the VNet, resolves the login server
and its regional data endpoint to the endpoint's addresses. Private endpoints need the Premium tier,
which also allows turning public network access off: the registry then answers nothing from the
internet (pushes come from inside the VNet or a network peered with it). No admin user, no anonymous
pull, no export; the nodes' identity holds AcrPull on this registry only (Entra ID tokens, no keys).
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Optional

import pulumi
from pulumi_azure_native import authorization, containerregistry

from infra.azure import derive
from infra.azure.private_link import private_endpoint

ACR_PULL = "7f951dda-4ed3-4680-a7ca-43fe172d538d"     # built-in role: pull images
PRIVATE_DNS_ZONE = "privatelink.azurecr.io"
PRIVATE_LINK_GROUP = "registry"                       # the registry's private-link sub-resource
SKU = "Premium"                                       # the tier that has private endpoints
UNTAGGED_RETENTION_DAYS = 7


def registry_name(stack: str, region: str) -> str:
    """5-50 letters and digits, globally unique enough, stable per stack and region."""
    digest = hashlib.sha256(f"gpufleet/{stack}/{region}/registry".encode()).hexdigest()[:8]
    stem = re.sub(r"[^a-z0-9]", "", stack.lower())[:30]
    return f"gpufleet{stem}{digest}"


def login_server(name: str) -> str:
    """What `docker pull` names: `<registry>.azurecr.io/<image>`."""
    return f"{name.lower()}.azurecr.io"


@dataclass(frozen=True)
class RegistryArgs:
    name: str                              # the registry's own name (registry_name)
    resource_group: pulumi.Input[str]
    location: str
    subnet_id: pulumi.Input[str]           # where the private endpoint's address lives (the node subnet)
    vnet_id: pulumi.Input[str]             # the VNet the private DNS zone resolves for
    subscription_id: pulumi.Input[str]
    principal_id: pulumi.Input[str]        # the nodes' identity
    tags: dict
    job_principal_ids: Optional[dict] = None  # team -> its jobs' identity (a job's task logs in to pull its image)


class Registry(pulumi.ComponentResource):
    login_server: pulumi.Output[str]

    def __init__(self, name: str, args: RegistryArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("gpufleet:azure:Registry", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.registry = containerregistry.Registry(
            f"{name}-registry",
            registry_name=args.name,
            resource_group_name=args.resource_group,
            location=args.location,
            sku=containerregistry.SkuArgs(name=SKU),
            admin_user_enabled=False,
            anonymous_pull_enabled=False,
            public_network_access="Disabled",
            network_rule_bypass_options="None",
            policies=containerregistry.PoliciesArgs(
                export_policy=containerregistry.ExportPolicyArgs(status="disabled"),
                retention_policy=containerregistry.RetentionPolicyArgs(status="enabled",
                                                                       days=UNTAGGED_RETENTION_DAYS),
            ),
            tags=args.tags,
            opts=child,
        )
        self.endpoint = private_endpoint(
            name, endpoint_name=f"{args.name}-registry", link_name=f"{args.name}-vnet", target_id=self.registry.id,
            group=PRIVATE_LINK_GROUP, zone=PRIVATE_DNS_ZONE, resource_group=args.resource_group, location=args.location,
            subnet_id=args.subnet_id, vnet_id=args.vnet_id, tags=args.tags, opts=child)
        self.pull_role = authorization.RoleAssignment(
            f"{name}-acr-pull",
            principal_id=args.principal_id,
            principal_type="ServicePrincipal",
            role_definition_id=pulumi.Output.from_input(args.subscription_id).apply(
                lambda sub: derive.role_definition_id(sub, ACR_PULL)),
            scope=self.registry.id,
            opts=child,
        )
        self.job_pull_roles = [authorization.RoleAssignment(
            f"{name}-acr-pull-{team}", principal_id=principal, principal_type="ServicePrincipal",
            role_definition_id=pulumi.Output.from_input(args.subscription_id).apply(
                lambda sub: derive.role_definition_id(sub, ACR_PULL)),
            scope=self.registry.id, opts=child) for team, principal in (args.job_principal_ids or {}).items()]
        self.login_server = self.registry.login_server
        self.register_outputs({"loginServer": self.login_server})
