"""Network: private subnets only, VPC endpoints instead of a NAT, the security groups of the nodes, the
controller and the shared file system, and the controller's network interface (its fixed private address,
which nodes reach slurmctld at and which a replacement controller keeps).

Slurm's traffic is held to its ports: nodes reach slurmctld (6817) and the ports ``srun`` listens on
(``infra.slurm.SRUN_PORTS``) on the controller; the controller reaches slurmd (6818) on the nodes; nodes of a
partition whose nodes talk to each other (a gang partition, EFA) allow all traffic among themselves. The shared
file system (NFS, 2049) takes the nodes and the controller only.

No NAT gateway: nodes boot from a baked image and talk only to AWS APIs, so an S3 gateway endpoint
(free; checkpoint traffic stays off metered paths) and interface endpoints for the services the
node uses give them everything without any route to the internet; for personal or PHI data that
removes the exfiltration path a NAT would open. Every endpoint has a policy (`infra.aws.policies`):
only this account's principals on this account's resources, and through the S3 gateway only the
stack's bucket, so job code cannot copy data to a foreign account. With an existing VPC
(`gpufleet:network`) the VPC's own routing is used and node egress is HTTPS only.
"""
from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass
from typing import Optional

import pulumi
import pulumi_aws as aws

from infra import slurm
from infra.aws import policies
from infra.config import Network as ExistingNetwork

VPC_CIDR = "10.42.0.0/16"
SUBNET_PREFIX = 19
QUEUE_MODE_SUBNETS = 3   # spread spot capacity over three AZs
# sts: the nodes' credentials daemon assumes the job role with the node role's credentials, which work only
# through the VPC's endpoints (infra.aws.policies.stay_on_instance).
INTERFACE_ENDPOINTS = ("sqs", "ssm", "ssmmessages", "ec2messages", "logs", "monitoring", "ec2", "secretsmanager",
                       "ecr.api", "ecr.dkr", "sts")
HTTPS = 443
NFS = 2049


@dataclass(frozen=True)
class NetworkArgs:
    prefix: str
    region: str
    single_subnet: bool        # an EFA gang lives in one subnet (one AZ); queue mode spreads over AZs
    node_to_node: bool         # all traffic between nodes (NCCL over EFA, rendezvous)
    existing: Optional[ExistingNetwork]
    account_id: pulumi.Input[str]
    bucket_arns: tuple[pulumi.Input[str], ...]  # the buckets nodes use, the only ones the S3 endpoint reaches
    aws_owned_reads: tuple[str, ...]  # AWS-owned buckets nodes read through the S3 endpoint (ECR layers)
    tags: dict[str, str]


def subnet_cidrs(vpc_cidr: str, count: int, prefix: int = SUBNET_PREFIX) -> list[str]:
    return [str(net) for net, _ in zip(ipaddress.ip_network(vpc_cidr).subnets(new_prefix=prefix), range(count))]


class Network(pulumi.ComponentResource):
    def __init__(self, name: str, args: NetworkArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpufleet:aws:Network", name, None, opts)
        self._args = args
        p = args.prefix
        child = pulumi.ResourceOptions(parent=self)
        if args.existing is not None:
            self.vpc_id: pulumi.Input[str] = args.existing.vpc_id
            given = list(args.existing.subnet_ids)
            self.subnet_ids: list[pulumi.Input[str]] = given[:1] if args.single_subnet else given
            self._security_groups()
            for who, sg in (("nodes", self.node_sg), ("controller", self.controller_sg)):
                aws.vpc.SecurityGroupEgressRule(
                    f"{p}-{who}-egress-https", security_group_id=sg.id, ip_protocol="tcp",
                    from_port=HTTPS, to_port=HTTPS, cidr_ipv4="0.0.0.0/0",
                    description="HTTPS to AWS APIs through the VPC's own routing", tags=args.tags, opts=child)
        else:
            self._new_vpc()
        self._slurm_rules()
        if args.node_to_node:
            aws.vpc.SecurityGroupIngressRule(
                f"{p}-nodes-ingress-self", security_group_id=self.node_sg.id, ip_protocol="-1",
                referenced_security_group_id=self.node_sg.id, description="all traffic from the other nodes (EFA, NCCL)",
                tags=args.tags, opts=child)
            aws.vpc.SecurityGroupEgressRule(
                f"{p}-nodes-egress-self", security_group_id=self.node_sg.id, ip_protocol="-1",
                referenced_security_group_id=self.node_sg.id, description="all traffic to the other nodes (EFA, NCCL)",
                tags=args.tags, opts=child)
        # The controller's address: an interface of its own that outlives the instance, so nodes (whose
        # slurmd is pointed at it) and a replacement controller agree on it.
        self.controller_eni = aws.ec2.NetworkInterface(
            f"{p}-controller", subnet_id=self.subnet_ids[0], security_groups=[self.controller_sg.id],
            description=f"{p} Slurm controller", tags={**args.tags, "Name": f"{p}-controller"}, opts=child)
        self.register_outputs({"vpc_id": self.vpc_id, "subnet_ids": self.subnet_ids, "node_sg": self.node_sg.id,
                               "controller_sg": self.controller_sg.id, "shared_fs_sg": self.shared_fs_sg.id})

    def _security_groups(self) -> None:
        # Rules are separate resources; no inline rules, so no SSH and nothing else by default.
        def group(suffix: str, what: str) -> aws.ec2.SecurityGroup:
            return aws.ec2.SecurityGroup(
                f"{self._args.prefix}-{suffix}", vpc_id=self.vpc_id, description=f"gpufleet {what}",
                revoke_rules_on_delete=True, tags=self._args.tags, opts=pulumi.ResourceOptions(parent=self))

        self.node_sg = group("nodes", "GPU nodes")
        self.controller_sg = group("controller", "Slurm controller")
        self.shared_fs_sg = group("shared-fs", "shared file system (NFS)")

    def _rule(self, name: str, direction: str, sg, peer, port: int | tuple[int, int], what: str) -> None:
        low, high = port if isinstance(port, tuple) else (port, port)
        kind = aws.vpc.SecurityGroupIngressRule if direction == "ingress" else aws.vpc.SecurityGroupEgressRule
        kind(f"{self._args.prefix}-{name}", security_group_id=sg.id, ip_protocol="tcp", from_port=low, to_port=high,
             referenced_security_group_id=peer.id, description=what, tags=self._args.tags,
             opts=pulumi.ResourceOptions(parent=self))

    def _slurm_rules(self) -> None:
        """Slurm between the controller and the nodes, NFS from both to the shared file system."""
        nodes, ctl, fs = self.node_sg, self.controller_sg, self.shared_fs_sg
        ctld, slurmd, srun = slurm.SLURMCTLD_PORT, slurm.SLURMD_PORT, slurm.SRUN_PORTS
        self._rule("controller-ingress-slurmctld", "ingress", ctl, nodes, ctld, "slurmctld from the nodes")
        self._rule("nodes-egress-slurmctld", "egress", nodes, ctl, ctld, "slurmctld on the controller")
        self._rule("controller-ingress-srun", "ingress", ctl, nodes, srun, "steps of srun run on the controller")
        self._rule("nodes-egress-srun", "egress", nodes, ctl, srun, "srun on the controller")
        self._rule("nodes-ingress-slurmd", "ingress", nodes, ctl, slurmd, "slurmd from the controller")
        self._rule("controller-egress-slurmd", "egress", ctl, nodes, slurmd, "slurmd on the nodes")
        for who, sg in (("nodes", nodes), ("controller", ctl)):
            self._rule(f"shared-fs-ingress-{who}", "ingress", fs, sg, NFS, f"NFS from the {who}")
            self._rule(f"{who}-egress-shared-fs", "egress", sg, fs, NFS, "NFS to the shared file system")

    def _new_vpc(self) -> None:
        a, p = self._args, self._args.prefix
        child = pulumi.ResourceOptions(parent=self)
        vpc = aws.ec2.Vpc(f"{p}-vpc", cidr_block=VPC_CIDR, enable_dns_support=True, enable_dns_hostnames=True,
                          tags={**a.tags, "Name": f"{p}-vpc"}, opts=child)
        self.vpc_id = vpc.id
        # The VPC's default security group keeps no rules (nothing may use it).
        aws.ec2.DefaultSecurityGroup(f"{p}-default-sg", vpc_id=vpc.id, tags=a.tags, opts=child)
        zones = aws.get_availability_zones_output(state="available")
        route_table = aws.ec2.RouteTable(f"{p}-private", vpc_id=vpc.id, tags={**a.tags, "Name": f"{p}-private"},
                                         opts=child)
        subnets = []
        for i, cidr in enumerate(subnet_cidrs(VPC_CIDR, 1 if a.single_subnet else QUEUE_MODE_SUBNETS)):
            subnet = aws.ec2.Subnet(
                f"{p}-private-{i}", vpc_id=vpc.id, cidr_block=cidr, map_public_ip_on_launch=False,
                availability_zone=zones.names.apply(lambda names, i=i: names[i % len(names)]),
                tags={**a.tags, "Name": f"{p}-private-{i}"}, opts=child)
            aws.ec2.RouteTableAssociation(f"{p}-private-{i}", subnet_id=subnet.id, route_table_id=route_table.id,
                                          opts=child)
            subnets.append(subnet)
        self.subnet_ids = [s.id for s in subnets]
        self._security_groups()
        endpoint_sg = aws.ec2.SecurityGroup(
            f"{p}-endpoints", vpc_id=vpc.id, description="gpufleet VPC interface endpoints",
            revoke_rules_on_delete=True, tags=a.tags, opts=child)
        for who, sg in (("nodes", self.node_sg), ("controller", self.controller_sg)):
            self._rule(f"endpoints-ingress-{who}", "ingress", endpoint_sg, sg, HTTPS, f"HTTPS from the {who}")
            self._rule(f"{who}-egress-endpoints", "egress", sg, endpoint_sg, HTTPS, "HTTPS to the interface endpoints")
        s3 = aws.ec2.VpcEndpoint(
            f"{p}-s3", vpc_id=vpc.id, service_name=f"com.amazonaws.{a.region}.s3", vpc_endpoint_type="Gateway",
            route_table_ids=[route_table.id],
            policy=pulumi.Output.all(a.account_id, *a.bucket_arns).apply(
                lambda v: json.dumps(policies.s3_endpoint_policy(v[0], list(v[1:]), list(a.aws_owned_reads)))),
            tags=a.tags, opts=child)
        for who, sg in (("nodes", self.node_sg), ("controller", self.controller_sg)):
            aws.vpc.SecurityGroupEgressRule(
                f"{p}-{who}-egress-s3", security_group_id=sg.id, ip_protocol="tcp",
                from_port=HTTPS, to_port=HTTPS, prefix_list_id=s3.prefix_list_id,
                description="HTTPS to S3 through the gateway endpoint", tags=a.tags, opts=child)
        interface_policy = pulumi.Output.from_input(a.account_id).apply(
            lambda acct: json.dumps(policies.interface_endpoint_policy(acct)))
        for service in INTERFACE_ENDPOINTS:
            aws.ec2.VpcEndpoint(
                f"{p}-{service}", vpc_id=vpc.id, service_name=f"com.amazonaws.{a.region}.{service}",
                vpc_endpoint_type="Interface", private_dns_enabled=True, subnet_ids=self.subnet_ids,
                security_group_ids=[endpoint_sg.id], policy=interface_policy, tags=a.tags, opts=child)
