"""DNS firewall: the stack's VPC resolves only the names its nodes and controller need, and logs every query.

Nodes reach AWS through the VPC's endpoints (infra.aws.network) and nothing else, so the only names they need are
the region's AWS service names (`*.<region>.amazonaws.com`: the endpoints' private DNS, the S3 gateway's bucket
names, ECR's registry and pull-through repositories, EFS) and the VPC's own instance names (`*.ec2.internal` in
us-east-1, `*.<region>.compute.internal` elsewhere). A Route 53 Resolver DNS Firewall rule group allows those
and answers every other query NXDOMAIN, which closes DNS as a way to carry data out (a job resolving
`<data>.attacker.example`). Every query, allowed or blocked, goes to a log group of the stack encrypted with the
stack key.

Made only for a VPC the stack creates: an association filters the DNS of every workload of the VPC, so an
existing VPC (`gpufleet:network`) is its owner's to firewall, as its routing and endpoints are.
"""
from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from infra.aws.registry import dns_suffix

ALLOW_PRIORITY, BLOCK_PRIORITY = 100, 200   # within the rule group: allow first, then block the rest
ASSOCIATION_PRIORITY = 101                  # the lowest (first-evaluated) a customer association may take


def internal_domain(region: str) -> str:
    """The VPC's own DNS names of instances: `ip-10-0-0-1.ec2.internal` in us-east-1, else
    `ip-10-0-0-1.<region>.compute.internal`."""
    return "ec2.internal" if region == "us-east-1" else f"{region}.compute.internal"


def allowed_domains(region: str) -> list[str]:
    """The names the stack's instances may resolve: the region's AWS service names and the VPC's internal names."""
    return [f"*.{region}.{dns_suffix(region)}", f"*.{internal_domain(region)}"]


@dataclass(frozen=True)
class DnsFirewallArgs:
    prefix: str
    region: str
    vpc_id: pulumi.Input[str]
    key_arn: pulumi.Input[str]
    log_group_name: str
    retention_days: int
    tags: dict[str, str]


class DnsFirewall(pulumi.ComponentResource):
    def __init__(self, name: str, args: DnsFirewallArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpufleet:aws:DnsFirewall", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        p, tags = args.prefix, args.tags
        allowed = aws.route53.ResolverFirewallDomainList(
            f"{p}-dns-allowed", name=f"{p}-dns-allowed", domains=allowed_domains(args.region), tags=tags, opts=child)
        everything = aws.route53.ResolverFirewallDomainList(
            f"{p}-dns-everything", name=f"{p}-dns-everything", domains=["*"], tags=tags, opts=child)
        group = aws.route53.ResolverFirewallRuleGroup(f"{p}-dns", name=f"{p}-dns", tags=tags, opts=child)
        aws.route53.ResolverFirewallRule(
            f"{p}-dns-allow-aws", name="allow-aws-and-vpc-names", action="ALLOW", priority=ALLOW_PRIORITY,
            firewall_domain_list_id=allowed.id, firewall_rule_group_id=group.id, opts=child)
        aws.route53.ResolverFirewallRule(
            f"{p}-dns-block-rest", name="block-everything-else", action="BLOCK", block_response="NXDOMAIN",
            priority=BLOCK_PRIORITY, firewall_domain_list_id=everything.id, firewall_rule_group_id=group.id,
            opts=child)
        self.association = aws.route53.ResolverFirewallRuleGroupAssociation(
            f"{p}-dns", name=f"{p}-dns", firewall_rule_group_id=group.id, vpc_id=args.vpc_id,
            priority=ASSOCIATION_PRIORITY, tags=tags, opts=child)

        self.log_group = aws.cloudwatch.LogGroup(
            f"{p}-dns-queries", name=args.log_group_name, kms_key_id=args.key_arn,
            retention_in_days=args.retention_days, tags=tags, opts=child)
        query_log = aws.route53.ResolverQueryLogConfig(
            f"{p}-dns-queries", name=f"{p}-dns-queries", destination_arn=self.log_group.arn, tags=tags, opts=child)
        aws.route53.ResolverQueryLogConfigAssociation(
            f"{p}-dns-queries", resolver_query_log_config_id=query_log.id, resource_id=args.vpc_id, opts=child)
        self.register_outputs({"rule_group": group.id, "log_group": self.log_group.name})
