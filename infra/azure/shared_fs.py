"""The shared file system: Azure Files premium NFS 4.1 shares, ``home`` for /home on the controller and every node
and ``slurm-state`` for slurmctld's state (StateSaveLocation, mounted on the controller only), which a replacement
controller mounts to take every queued and running job over.

- A FileStorage account (NFS shares need premium files), reachable only through a private endpoint in the node
  subnet (public network access disabled, the firewall denying all else) whose address the
  ``privatelink.file.core.windows.net`` zone, linked to the VNet, gives to ``<account>.file.core.windows.net``.
- Encryption in transit: the account requires secure transfer, so Azure Files accepts only NFS mounts through
  the AZNFS mount helper's TLS tunnel (stunnel, AES-GCM; "encryption in transit for NFS Azure file shares"). The
  images carry the ``aznfs`` package; the mounts' fstab type is ``aznfs``. In the regions where Microsoft still
  runs it as a preview, the subscription must be registered for the Microsoft.Storage feature
  AllowEncryptionInTransitNFS4 first.
- Encryption at rest: Azure Storage service encryption (AES-256) with Microsoft-managed keys. Azure Files can use a
  customer-managed key, but the Azure stack has no stack key to use; infrastructure (double) encryption is for
  general-purpose v2 and premium block blob accounts, not FileStorage.
- NFS has no per-client identity: who may mount is decided by the network (the private endpoint, the NSGs).
  Both shares keep root (NoRootSquash): the controller makes users' home directories and hands the state
  directory to the slurm user. A node's root could mount the state share too; it holds the munge key already,
  which lets it speak for any user to Slurm.
- Premium shares bill their provisioned size: each share is the 100 GiB minimum (the preview prices them).
"""
from __future__ import annotations

from dataclasses import dataclass

import pulumi
from pulumi_azure_native import storage

from infra.azure import derive
from infra.azure.private_link import private_endpoint
from infra.preview.cost import AZURE_FILES_SHARE_GIB

PRIVATE_DNS_ZONE = "privatelink.file.core.windows.net"
PRIVATE_LINK_GROUP = "file"          # the account's private-link sub-resource for Azure Files
SHARE_GIB = AZURE_FILES_SHARE_GIB    # the premium minimum; IOPS and throughput grow with it
SHARES = (derive.HOME_SHARE, derive.STATE_SHARE)


@dataclass(frozen=True)
class SharedFsArgs:
    account_name: str                      # derive.files_account_name
    resource_group: pulumi.Input[str]
    location: str
    subnet_id: pulumi.Input[str]           # where the private endpoint's address lives (the node subnet)
    vnet_id: pulumi.Input[str]
    tags: dict


class SharedFs(pulumi.ComponentResource):
    def __init__(self, name: str, args: SharedFsArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpufleet:azure:SharedFs", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.account = storage.StorageAccount(
            f"{name}-account",
            account_name=args.account_name,
            resource_group_name=args.resource_group,
            location=args.location,
            kind="FileStorage",
            sku=storage.SkuArgs(name="Premium_LRS"),
            enable_https_traffic_only=True,        # secure transfer required: NFS mounts must come over TLS
            minimum_tls_version="TLS1_2",
            allow_blob_public_access=False,
            allow_shared_key_access=False,
            allow_cross_tenant_replication=False,
            default_to_o_auth_authentication=True,
            encryption=storage.EncryptionArgs(
                key_source="Microsoft.Storage",
                services=storage.EncryptionServicesArgs(file=storage.EncryptionServiceArgs(enabled=True,
                                                                                           key_type="Account")),
            ),
            public_network_access="Disabled",
            network_rule_set=storage.NetworkRuleSetArgs(default_action="Deny", bypass="None"),
            tags=args.tags,
            opts=child,
        )
        self.shares = {
            share: storage.FileShare(
                f"{name}-{share}",
                account_name=self.account.name,
                resource_group_name=args.resource_group,
                share_name=share,
                enabled_protocols="NFS",
                root_squash="NoRootSquash",
                share_quota=SHARE_GIB,
                opts=child)
            for share in SHARES}
        self.endpoint = private_endpoint(
            name, endpoint_name=f"{args.account_name}-file", link_name=f"{args.account_name}-vnet",
            target_id=self.account.id, group=PRIVATE_LINK_GROUP, zone=PRIVATE_DNS_ZONE,
            resource_group=args.resource_group, location=args.location, subnet_id=args.subnet_id,
            vnet_id=args.vnet_id, tags=args.tags, opts=child)
        self.node_mounts = self.account.name.apply(derive.node_mounts)
        self.controller_mounts = self.account.name.apply(derive.controller_mounts)
        self.register_outputs({"account": self.account.name,
                               "shares": {s: share.name for s, share in self.shares.items()}})
