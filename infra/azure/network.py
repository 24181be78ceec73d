"""Network: a VNet clear of the RDMA range with two private subnets, each behind its own NSG, and the controller's
network interface.

- ``nodes``: the GPU nodes and the private endpoints (registry, Key Vault, the shared file system). No outbound
  internet path at all (no default outbound access, no NAT): tokens and Scheduled Events come from the link-local
  metadata service, Blob and Queue storage through the subnet's Microsoft.Storage service endpoint, the rest
  through the private endpoints. Inbound: slurmd (6818) from the controller, anything from the other nodes (slurmd's
  fan-out, job steps, NCCL's bootstrap), SSH from the VNet; nothing else, the internet least of all.
- ``controller``: the Slurm controller alone, at a static address on a NIC of its own that outlives the VM (the
  nodes' slurmd points at it). Inbound: slurmctld (6817) and srun's ports from the nodes, SSH from the VNet.
  Its node provider calls Azure Resource Manager, which has no service endpoint: the subnet gets a NAT gateway,
  and its NSG lets out HTTPS to the AzureResourceManager service tag and Storage (the service endpoint) only,
  denying the rest of the internet. The VM itself has no public address; the NAT gateway's is outbound only.
"""
from __future__ import annotations

from dataclasses import dataclass

import pulumi
from pulumi_azure_native import network

from infra import slurm
from infra.azure import derive

SSH_PORT = 22
HTTPS_PORT = 443
DENY_PRIORITY = 4000       # the explicit denials, below every allow and above Azure's defaults (65000+)
NAT_IDLE_TIMEOUT_MIN = 4


@dataclass(frozen=True)
class NetworkArgs:
    name: str
    resource_group: pulumi.Input[str]
    location: str
    controller_size: str     # the controller's VM size (accelerated networking where the size has it)
    tags: dict


def _rule(name: str, priority: int, direction: str, access: str, protocol: str, source: str, destination: str,
          ports: str) -> network.SecurityRuleArgs:
    return network.SecurityRuleArgs(name=name, priority=priority, direction=direction, access=access,
                                    protocol=protocol, source_address_prefix=source, source_port_range="*",
                                    destination_address_prefix=destination, destination_port_range=ports)


def node_rules() -> list[network.SecurityRuleArgs]:
    nodes, ctl = derive.NODE_SUBNET_CIDR, derive.CONTROLLER_SUBNET_CIDR
    return [
        _rule("allow-slurmd-from-controller", 100, "Inbound", "Allow", "Tcp", ctl, nodes, str(slurm.SLURMD_PORT)),
        _rule("allow-nodes", 110, "Inbound", "Allow", "*", nodes, nodes, "*"),
        _rule("allow-ssh-from-vnet", 120, "Inbound", "Allow", "Tcp", "VirtualNetwork", nodes, str(SSH_PORT)),
        _rule("deny-internet-inbound", DENY_PRIORITY, "Inbound", "Deny", "*", "Internet", "*", "*"),
        _rule("deny-other-inbound", DENY_PRIORITY + 10, "Inbound", "Deny", "*", "*", "*", "*"),
    ]


def controller_rules() -> list[network.SecurityRuleArgs]:
    nodes, ctl = derive.NODE_SUBNET_CIDR, derive.CONTROLLER_SUBNET_CIDR
    low, high = slurm.SRUN_PORTS
    return [
        _rule("allow-slurmctld-from-nodes", 100, "Inbound", "Allow", "Tcp", nodes, ctl, str(slurm.SLURMCTLD_PORT)),
        _rule("allow-srun-from-nodes", 110, "Inbound", "Allow", "Tcp", nodes, ctl, f"{low}-{high}"),
        _rule("allow-ssh-from-vnet", 120, "Inbound", "Allow", "Tcp", "VirtualNetwork", ctl, str(SSH_PORT)),
        _rule("deny-internet-inbound", DENY_PRIORITY, "Inbound", "Deny", "*", "Internet", "*", "*"),
        _rule("deny-other-inbound", DENY_PRIORITY + 10, "Inbound", "Deny", "*", "*", "*", "*"),
        # the node provider's calls to Resource Manager, through the NAT gateway
        _rule("allow-resource-manager", 100, "Outbound", "Allow", "Tcp", ctl, "AzureResourceManager",
              str(HTTPS_PORT)),
        # the bridge's queue and records, through the subnet's Microsoft.Storage service endpoint
        _rule("allow-storage", 110, "Outbound", "Allow", "Tcp", ctl, "Storage", str(HTTPS_PORT)),
        _rule("deny-internet-outbound", DENY_PRIORITY, "Outbound", "Deny", "*", "*", "Internet", "*"),
    ]


class Network(pulumi.ComponentResource):
    subnet_id: pulumi.Output[str]
    controller_subnet_id: pulumi.Output[str]

    def __init__(self, name: str, args: NetworkArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpufleet:azure:Network", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        rg, location, tags = args.resource_group, args.location, args.tags
        self.nsg = network.NetworkSecurityGroup(
            f"{name}-nsg", network_security_group_name=f"{args.name}-nodes", resource_group_name=rg,
            location=location, security_rules=node_rules(), tags=tags, opts=child)
        self.controller_nsg = network.NetworkSecurityGroup(
            f"{name}-controller-nsg", network_security_group_name=f"{args.name}-controller", resource_group_name=rg,
            location=location, security_rules=controller_rules(), tags=tags, opts=child)
        self.vnet = network.VirtualNetwork(
            f"{name}-vnet",
            virtual_network_name=args.name,
            resource_group_name=rg,
            location=location,
            address_space=network.AddressSpaceArgs(address_prefixes=[derive.VNET_CIDR]),
            tags=tags,
            # Subnets are separate resources; an inline list would fight them on every update.
            opts=pulumi.ResourceOptions(parent=self, ignore_changes=["subnets"]),
        )
        storage_endpoint = [network.ServiceEndpointPropertiesFormatArgs(service="Microsoft.Storage",
                                                                        locations=[location])]
        self.subnet = network.Subnet(
            f"{name}-nodes",
            subnet_name="nodes",
            resource_group_name=rg,
            virtual_network_name=self.vnet.name,
            address_prefix=derive.NODE_SUBNET_CIDR,
            default_outbound_access=False,
            network_security_group=network.NetworkSecurityGroupArgs(id=self.nsg.id),
            service_endpoints=storage_endpoint,
            # the private endpoints here are reached by address from the VNet; their NICs take no NSG
            private_endpoint_network_policies="Disabled",
            opts=child,
        )
        self.egress_ip = network.PublicIPAddress(
            f"{name}-controller-egress", public_ip_address_name=f"{args.name}-controller-egress",
            resource_group_name=rg, location=location, sku=network.PublicIPAddressSkuArgs(name="Standard"),
            public_ip_allocation_method="Static", public_ip_address_version="IPv4", tags=tags, opts=child)
        self.nat = network.NatGateway(
            f"{name}-controller-nat", nat_gateway_name=f"{args.name}-controller", resource_group_name=rg,
            location=location, sku=network.NatGatewaySkuArgs(name="Standard"),
            idle_timeout_in_minutes=NAT_IDLE_TIMEOUT_MIN,
            public_ip_addresses=[network.SubResourceArgs(id=self.egress_ip.id)], tags=tags, opts=child)
        # Created after the node subnet: Azure updates a VNet's subnets one at a time.
        self.controller_subnet = network.Subnet(
            f"{name}-controller",
            subnet_name="controller",
            resource_group_name=rg,
            virtual_network_name=self.vnet.name,
            address_prefix=derive.CONTROLLER_SUBNET_CIDR,
            default_outbound_access=False,
            network_security_group=network.NetworkSecurityGroupArgs(id=self.controller_nsg.id),
            nat_gateway=network.SubResourceArgs(id=self.nat.id),
            service_endpoints=storage_endpoint,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.subnet]),
        )
        self.controller_nic = network.NetworkInterface(
            f"{name}-controller-nic",
            network_interface_name=f"{args.name}-controller",
            resource_group_name=rg,
            location=location,
            enable_accelerated_networking=args.controller_size in derive.ACCELERATED_NETWORKING,
            ip_configurations=[network.NetworkInterfaceIPConfigurationArgs(
                name="ipconfig1", primary=True, private_ip_allocation_method="Static",
                private_ip_address=derive.CONTROLLER_IP, private_ip_address_version="IPv4",
                subnet=network.SubnetArgs(id=self.controller_subnet.id))],
            tags=tags,
            opts=child,
        )
        self.subnet_id = self.subnet.id
        self.controller_subnet_id = self.controller_subnet.id
        self.controller_address = self.controller_nic.ip_configurations.apply(
            lambda cfgs: cfgs[0].private_ip_address)
        self.register_outputs({"subnetId": self.subnet.id, "controllerSubnetId": self.controller_subnet.id,
                               "vnetId": self.vnet.id, "controllerAddress": self.controller_address})
