"""Network: a VPC with one private subnet per zone and the nodes' security group. No NAT gateway, no
public IPs: nodes reach Tencent's service endpoints (metadata, COS, TDMQ CMQ, Cloud Monitor, TAT) over
the private network and nothing on the internet. Inbound, only the group's own nodes (NCCL)."""
from __future__ import annotations

from dataclasses import dataclass

import pulumi
from tencentcloud_iac_pulumi import security, subnet, vpc

from infra.tencent import derive


@dataclass(frozen=True)
class NetworkArgs:
    prefix: str
    zones: pulumi.Input[list]      # zones offering the primary type, in placement order
    single_zone: bool              # gang mode: one subnet in one zone
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
        count = 1 if args.single_zone else derive.QUEUE_ZONES
        self.subnets = [
            subnet.Instance(f"{p}-nodes-{i}", name=f"{p}-nodes-{i}", vpc_id=self.vpc.id, cidr_block=cidr,
                            availability_zone=zones.apply(lambda z, i=i: derive.zone_at(z, i)),
                            is_multicast=False, tags=args.tags, opts=child)
            for i, cidr in enumerate(derive.subnet_cidrs(count))]
        self.security_group = security.Group(f"{p}-nodes", name=f"{p}-nodes",
                                             description=f"{p} GPU nodes: node-to-node only", tags=args.tags,
                                             opts=child)
        self.rules = security.GroupRuleSet(
            f"{p}-nodes-rules", security_group_id=self.security_group.id,
            ingresses=self.security_group.id.apply(derive.ingress_rules), egresses=derive.egress_rules(),
            opts=child)
        self.vpc_id = self.vpc.id
        self.subnet_ids = pulumi.Output.all(*[s.id for s in self.subnets])
        self.security_group_id = self.security_group.id
        self.register_outputs({"vpcId": self.vpc.id, "subnetIds": self.subnet_ids,
                               "securityGroupId": self.security_group.id})
