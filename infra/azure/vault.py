"""Key Vault: the Slurm cluster's munge key, and the secrets jobs name in their env (`{"keyvault": NAME}`), over a
private path.

A standard vault with RBAC authorization (no access policies), soft delete and purge protection (a deleted
secret or vault cannot be purged before its retention ends), public network access disabled and no trusted-
services bypass: a private endpoint in the node subnet and the `privatelink.vaultcore.azure.net` zone linked to
the VNet resolve `<vault>.vault.azure.net` to a private address. The nodes' identity holds Key Vault Secrets User
(read secret values) on this vault only; people who set secrets need Key Vault Secrets Officer and the same
private path. Nodes find the vault by name in node.json (`azure.key_vault`).

The munge key authenticates every Slurm message of the cluster. The program makes its secret holding the
placeholder "unset" (tag gpufleet-munge: unset); the controller generates the key at its first boot and stores it
as a new version (trainer.clouds.azure_nodes.munge_key), so the key is never in the Pulumi state, user-data, a
preview or an output. Any update of the secret through Resource Manager would write a new version holding the
placeholder over the key, so the program never updates it: its value and tags are ignored after creation. The
controller's identity may get, list and set this secret's versions (a custom role on the secret alone); the
nodes' may read it (Key Vault Secrets User on the secret, which their vault-wide read for job secrets also
covers). Key Vault keeps secrets encrypted at rest with keys Microsoft manages in its HSMs; a standard vault has
no customer-managed key for its secrets.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Optional

import pulumi
from pulumi_azure_native import keyvault

from infra.azure import derive
from infra.azure.identity import builtin, custom_role, custom_role_id, grant
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
    resource_group_id: pulumi.Input[str]   # where the munge keeper role is defined
    stack: str
    principal_id: pulumi.Input[str]        # the nodes' identity
    controller_principal_id: pulumi.Input[str]
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
        secrets_user = builtin(args.subscription_id, SECRETS_USER)
        self.read_role = grant(f"{name}-secrets-user", args.principal_id, secrets_user, self.vault.id, child)
        self.munge = keyvault.Secret(
            f"{name}-munge",
            secret_name=derive.MUNGE_SECRET,
            vault_name=self.vault.name,
            resource_group_name=args.resource_group,
            properties=keyvault.SecretPropertiesArgs(value=derive.MUNGE_PLACEHOLDER, content_type="text/plain"),
            tags={**args.tags, derive.MUNGE_TAG: derive.MUNGE_PLACEHOLDER},
            # Created once: an update would store the placeholder as the newest version, over the controller's key.
            opts=pulumi.ResourceOptions(parent=self, ignore_changes=["properties", "tags"]),
        )
        self.munge_read_role = grant(f"{name}-munge-reader", args.principal_id, secrets_user, self.munge.id, child)
        keeper = custom_role(
            f"{name}-munge-keeper", args.subscription_id, args.stack, args.location, args.resource_group_id,
            "munge-keeper", "gpufleet: the Slurm controller stores and reads the cluster's munge key",
            data_actions=derive.MUNGE_KEEPER_DATA_ACTIONS, opts=child)
        self.munge_keep_role = grant(
            f"{name}-munge-keeper-assignment", args.controller_principal_id,
            custom_role_id(args.subscription_id, args.stack, args.location, "munge-keeper"), self.munge.id,
            pulumi.ResourceOptions(parent=self, depends_on=[keeper]))
        self.vault_name = self.vault.name
        self.munge_url = self.vault.name.apply(derive.munge_secret_url)
        self.register_outputs({"vaultName": self.vault_name, "mungeSecretId": self.munge.id,
                               "mungeSecretUrl": self.munge_url})
