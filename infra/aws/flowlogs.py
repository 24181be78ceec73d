"""Flow logs: every packet decision in the stack's VPC (CIS AWS 3.x, HIPAA audit) goes to a KMS-encrypted
CloudWatch log group with the stack's retention, written through a role only VPC Flow Logs can assume."""
from __future__ import annotations

import json
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from infra.aws import policies

AGGREGATION_INTERVAL_S = 60


@dataclass(frozen=True)
class FlowLogsArgs:
    prefix: str
    region: str
    account_id: pulumi.Input[str]
    vpc_id: pulumi.Input[str]
    key_arn: pulumi.Input[str]
    log_group_name: str
    retention_days: int
    tags: dict[str, str]


class FlowLogs(pulumi.ComponentResource):
    def __init__(self, name: str, args: FlowLogsArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpufleet:aws:FlowLogs", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        p = args.prefix
        self.log_group = aws.cloudwatch.LogGroup(
            f"{p}-vpc-flow-logs", name=args.log_group_name, kms_key_id=args.key_arn,
            retention_in_days=args.retention_days, tags=args.tags, opts=child)
        self.role = aws.iam.Role(
            f"{p}-vpc-flow-logs", description=f"{p}: VPC flow log delivery",
            assume_role_policy=pulumi.Output.from_input(args.account_id).apply(
                lambda acct: json.dumps(policies.assume_role_flow_logs(args.region, acct))),
            tags=args.tags, opts=child)
        delivery = aws.iam.RolePolicy(
            f"{p}-vpc-flow-logs", role=self.role.name,
            policy=self.log_group.arn.apply(lambda arn: json.dumps(policies.flow_log_delivery_policy(arn))),
            opts=child)
        # Delivery starts at creation: the role's permissions come first.
        self.flow_log = aws.ec2.FlowLog(
            f"{p}-vpc-flow-log", vpc_id=args.vpc_id, traffic_type="ALL", log_destination_type="cloud-watch-logs",
            log_destination=self.log_group.arn, iam_role_arn=self.role.arn,
            max_aggregation_interval=AGGREGATION_INTERVAL_S, tags=args.tags,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[delivery]))
        self.register_outputs({"log_group": self.log_group.name, "flow_log": self.flow_log.id})
