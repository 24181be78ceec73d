"""Storage: a locked-down account (HTTPS/TLS1.2 only, Entra ID auth only, infrastructure encryption,
firewall admitting the stack's two subnets only, through their service endpoints) and a private blob container
for checkpoints, records and logs. The job queues live in it too (infra/azure/queue.py)."""
from __future__ import annotations

from dataclasses import dataclass

import pulumi
from pulumi_azure_native import storage

from infra.azure import derive


@dataclass(frozen=True)
class StorageArgs:
    account_name: str
    resource_group: pulumi.Input[str]
    location: str
    subnet_ids: tuple[pulumi.Input[str], ...]   # the node subnet, the controller subnet
    tags: dict
    soft_delete_days: int = 7


class Storage(pulumi.ComponentResource):
    account_id: pulumi.Output[str]
    container_id: pulumi.Output[str]

    def __init__(self, name: str, args: StorageArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpufleet:azure:Storage", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        encrypted = storage.EncryptionServiceArgs(enabled=True, key_type="Account")
        self.account = storage.StorageAccount(
            f"{name}-account",
            account_name=args.account_name,
            resource_group_name=args.resource_group,
            location=args.location,
            kind="StorageV2",
            sku=storage.SkuArgs(name="Standard_ZRS"),
            access_tier="Hot",
            enable_https_traffic_only=True,
            minimum_tls_version="TLS1_2",
            allow_blob_public_access=False,
            allow_shared_key_access=False,
            default_to_o_auth_authentication=True,
            allow_cross_tenant_replication=False,
            encryption=storage.EncryptionArgs(
                key_source="Microsoft.Storage",
                require_infrastructure_encryption=True,
                services=storage.EncryptionServicesArgs(blob=encrypted, file=encrypted,
                                                        queue=encrypted, table=encrypted),
            ),
            # Service-endpoint traffic from the stack's subnets is the only data-plane access.
            public_network_access="Enabled",
            network_rule_set=storage.NetworkRuleSetArgs(
                default_action="Deny",
                bypass="AzureServices",
                virtual_network_rules=[storage.VirtualNetworkRuleArgs(virtual_network_resource_id=subnet,
                                                                      action="Allow")
                                       for subnet in args.subnet_ids],
            ),
            tags=args.tags,
            opts=child,
        )
        retention = storage.DeleteRetentionPolicyArgs(enabled=True, days=args.soft_delete_days)
        self.blob_service = storage.BlobServiceProperties(
            f"{name}-blob-service",
            account_name=self.account.name,
            resource_group_name=args.resource_group,
            blob_services_name="default",
            delete_retention_policy=retention,
            container_delete_retention_policy=retention,
            opts=child,
        )
        self.container = storage.BlobContainer(
            f"{name}-checkpoints",
            account_name=self.account.name,
            resource_group_name=args.resource_group,
            container_name=derive.CONTAINER,
            public_access="None",
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.blob_service]),
        )
        self.account_id = self.account.id
        self.container_id = self.container.id
        self.container_url = self.account.name.apply(derive.blob_container_url)
        self.register_outputs({"accountId": self.account.id, "containerUrl": self.container_url})
