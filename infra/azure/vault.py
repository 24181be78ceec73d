"""Key Vault: the secrets jobs name in their env (`{"keyvault": NAME}`), read by the nodes' identity only, over a
private path.

A standard vault with RBAC authorization (no access policies), soft delete and purge protection (a deleted
secret or vault cannot be purged before its retention ends), public network access disabled and no trusted-
services bypass: a private endpoint in the node subnet and the `privatelink.vaultcore.azure.net` zone linked to
the VNet resolve `<vault>.vault.azure.net` to a private address. The nodes' identity holds Key Vault Secrets User
(read secret values) on this vault only; people who set secrets need Key Vault Secrets Officer and the same
private path. Nodes find the vault by name in node.json (`azure.key_vault`).
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Optional

import pulumi
from pulumi_azure_native import authorization, keyvault

from infra.azure import derive
from infra.azure.private_link import private_endpoint

SECRETS_USER = "4633458b-17de-408a-b874-0445c86b69e6"  # built-in role: Key Vault Secrets User (read values)
PRIVATE_DNS_ZONE = "privatelink.vaultcore.azure.net"
PRIVATE_LINK_GROUP = "vault"                           # the vault's private-link sub-resource
RETENTION_DAYS = 90                                    # soft-delete retention (7-90; the default)


def vault_name(stack: str, region: str) -> str:
    """3-24 letters, digits and hyphens, starting with a letter: globally unique enough, stable per stack and
    region."""
    digest = hashlib.sha256(f"gpufleet/{stack}/{region}/vault".encode()).hexdigest()[:8]
    stem = re.sub(r"[^a-z0-9]", "", stack.lower())[:12]
    return f"gf{stem}-{digest}" if stem else f"gf-{digest}"


@dataclass(frozen=True)
class VaultArgs:
    name: str                              # the vault's own name (vault_name)
    resource_group: pulumi.Input[str]
    location: str
    tenant_id: pulumi.Input[str]
    subnet_id: pulumi.Input[str]           # where the private endpoint's address lives (the node subnet)
    vnet_id: pulumi.Input[str]             # the VNet the private DNS zone resolves for
    subscription_id: pulumi.Input[str]
    principal_id: pulumi.Input[str]        # the nodes' identity
    tags: dict


class Vault(pulumi.ComponentResource):
    vault_name: pulumi.Output[str]

    def __init__(self, name: str, args: VaultArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("gpufleet:azure:Vault", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.vault = keyvault.Vault(
            f"{name}-vault",
            vault_name=args.name,
            resource_group_name=args.resource_group,
            location=args.location,
            properties=keyvault.VaultPropertiesArgs(
                tenant_id=args.tenant_id,
                sku=keyvault.SkuArgs(family="A", name=keyvault.SkuName.STANDARD),
                enable_rbac_authorization=True,
                enable_soft_delete=True,
                soft_delete_retention_in_days=RETENTION_DAYS,
                enable_purge_protection=True,
                public_network_access="Disabled",
                network_acls=keyvault.NetworkRuleSetArgs(default_action="Deny", bypass="None"),
                enabled_for_deployment=False,
                enabled_for_disk_encryption=False,
                enabled_for_template_deployment=False,
            ),
            tags=args.tags,
            opts=child,
        )
        self.endpoint = private_endpoint(
            name, endpoint_name=f"{args.name}-vault", link_name=f"{args.name}-vnet", target_id=self.vault.id,
            group=PRIVATE_LINK_GROUP, zone=PRIVATE_DNS_ZONE, resource_group=args.resource_group,
            location=args.location, subnet_id=args.subnet_id, vnet_id=args.vnet_id, tags=args.tags, opts=child)
        self.read_role = authorization.RoleAssignment(
            f"{name}-secrets-user",
            principal_id=args.principal_id,
            principal_type="ServicePrincipal",
            role_definition_id=pulumi.Output.from_input(args.subscription_id).apply(
                lambda sub: derive.role_definition_id(sub, SECRETS_USER)),
            scope=self.vault.id,
            opts=child,
        )
        self.vault_name = self.vault.name
        self.register_outputs({"vaultName": self.vault_name})
