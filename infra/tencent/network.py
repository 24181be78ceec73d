"""Network: a VPC with private node subnets (one per zone, or one for a stack of gang partitions only), a small
subnet of the controller's own, and two security groups. No NAT gateway, no public IPs: the machines reach
Tencent's service endpoints (metadata, COS, TDMQ CMQ, SSM, the CVM API, Cloud Monitor, TAT) over the private network
and nothing on the internet.

Inbound, nodes take everything from other nodes of the stack (NCCL, slurmd's fan-out, job steps) and slurmd's port
from the controller; the controller takes slurmctld's port and srun's port range from the nodes. The CFS file
systems have no security group: their permission groups admit the node subnets and the controller's address only
(infra.tencent.shared_fs).
"""
from __future__ import annotations

from dataclasses import dataclass

import pulumi
from tencentcloud_iac_pulumi import security, subnet, vpc

from infra.tencent import derive


@dataclass(frozen=True)
class NetworkArgs:
    prefix: str
    zones: pulumi.Input[list]      # zones offering every partition's primary type, in placement order
    node_subnets: int              # derive.node_subnet_count
    tags: dict


class Network(pulumi.ComponentResource):
    vpc_id: pulumi.Output[str]
    subnet_ids: pulumi.Output[list]
    security_group_id: pulumi.Output[str]

    def __init__(self, name: str, args: NetworkArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpufleet:tencent:Network", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        p = args.prefix
        self.vpc = vpc.Instance(f"{p}-vpc", name=p, cidr_block=derive.VPC_CIDR, is_multicast=False,
                                tags=args.tags, opts=child)
        zones = pulumi.Output.from_input(args.zones)
        self.node_cidrs = derive.subnet_cidrs(args.node_subnets)
        self.subnets = [
            subnet.Instance(f"{p}-nodes-{i}", name=f"{p}-nodes-{i}", vpc_id=self.vpc.id, cidr_block=cidr,
                            availability_zone=zones.apply(lambda z, i=i: derive.zone_at(z, i)),
                            is_multicast=False, tags=args.tags, opts=child)
            for i, cidr in enumerate(self.node_cidrs)]
        self.controller_zone = zones.apply(lambda z: derive.zone_at(z, 0))
        self.controller_subnet = subnet.Instance(
            f"{p}-controller", name=f"{p}-controller", vpc_id=self.vpc.id, cidr_block=derive.CONTROLLER_SUBNET_CIDR,
            availability_zone=self.controller_zone, is_multicast=False, tags=args.tags, opts=child)
        self.security_group = security.Group(f"{p}-nodes", name=f"{p}-nodes",
                                             description=f"{p} GPU nodes: node-to-node and Slurm only",
                                             tags=args.tags, opts=child)
        self.controller_sg = security.Group(f"{p}-controller", name=f"{p}-controller",
                                            description=f"{p} Slurm controller: slurmctld and srun from the nodes",
                                            tags=args.tags, opts=child)
        self.rules = security.GroupRuleSet(
            f"{p}-nodes-rules", security_group_id=self.security_group.id,
            ingresses=pulumi.Output.all(self.security_group.id, self.controller_sg.id).apply(
                lambda v: derive.node_ingress_rules(*v)),
            egresses=derive.egress_rules(), opts=child)
        self.controller_rules = security.GroupRuleSet(
            f"{p}-controller-rules", security_group_id=self.controller_sg.id,
            ingresses=self.security_group.id.apply(derive.controller_ingress_rules),
            egresses=derive.egress_rules(), opts=child)
        self.vpc_id = self.vpc.id
        self.subnet_ids = pulumi.Output.all(*[s.id for s in self.subnets])
        self.subnet_zones = pulumi.Output.all(*[s.availability_zone for s in self.subnets])
        self.security_group_id = self.security_group.id
        self.register_outputs({"vpcId": self.vpc.id, "subnetIds": self.subnet_ids,
                               "controllerSubnetId": self.controller_subnet.id,
                               "securityGroupId": self.security_group.id,
                               "controllerSecurityGroupId": self.controller_sg.id})
