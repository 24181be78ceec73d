"""Network: a VNet clear of the RDMA range and one private node subnet: an NSG that denies internet
inbound, no default outbound internet access, and a Microsoft.Storage service endpoint (the storage
firewall admits this subnet only). Nodes need nothing else: tokens and Scheduled Events come from the
link-local metadata service, images carry the software, job containers come from the registry's private
endpoint in this subnet (infra/azure/registry.py)."""
from __future__ import annotations

from dataclasses import dataclass

import pulumi
from pulumi_azure_native import network

from infra.azure import derive


@dataclass(frozen=True)
class NetworkArgs:
    name: str
    resource_group: pulumi.Input[str]
    location: str
    tags: dict


class Network(pulumi.ComponentResource):
    subnet_id: pulumi.Output[str]

    def __init__(self, name: str, args: NetworkArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpufleet:azure:Network", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.nsg = network.NetworkSecurityGroup(
            f"{name}-nsg",
            network_security_group_name=f"{args.name}-nodes",
            resource_group_name=args.resource_group,
            location=args.location,
            # Azure's defaults already allow VNet traffic (NCCL bootstrap) and deny the rest; the
            # explicit rule states the intent and wins over any later, lower-priority allow.
            security_rules=[network.SecurityRuleArgs(
                name="deny-internet-inbound",
                priority=4000,
                direction="Inbound",
                access="Deny",
                protocol="*",
                source_address_prefix="Internet",
                source_port_range="*",
                destination_address_prefix="*",
                destination_port_range="*",
            )],
            tags=args.tags,
            opts=child,
        )
        self.vnet = network.VirtualNetwork(
            f"{name}-vnet",
            virtual_network_name=args.name,
            resource_group_name=args.resource_group,
            location=args.location,
            address_space=network.AddressSpaceArgs(address_prefixes=[derive.VNET_CIDR]),
            tags=args.tags,
            # Subnets are separate resources; an inline list would fight them on every update.
            opts=pulumi.ResourceOptions(parent=self, ignore_changes=["subnets"]),
        )
        self.subnet = network.Subnet(
            f"{name}-nodes",
            subnet_name="nodes",
            resource_group_name=args.resource_group,
            virtual_network_name=self.vnet.name,
            address_prefix=derive.SUBNET_CIDR,
            default_outbound_access=False,
            network_security_group=network.NetworkSecurityGroupArgs(id=self.nsg.id),
            service_endpoints=[network.ServiceEndpointPropertiesFormatArgs(
                service="Microsoft.Storage", locations=[args.location])],
            opts=child,
        )
        self.subnet_id = self.subnet.id
        self.register_outputs({"subnetId": self.subnet.id, "vnetId": self.vnet.id})
