"""CloudWatch log groups (encryption, retention), VPC flow logs, and alert topics that reach someone."""
from __future__ import annotations

from policies.common import UNKNOWN, number, resource_policy, stack_policy
from policies.tokens import FLOW_LOG, LOG_GROUP, SNS_SUBSCRIPTION, SNS_TOPIC, VPC


def check_log_group_encrypted(props: dict, ctx):
    if not props.get("kmsKeyId"):
        yield "log group is not encrypted with a KMS key (kmsKeyId unset)"


def check_log_group_retention(props: dict, ctx):
    days = props.get("retentionInDays")
    if days is UNKNOWN:
        return
    days = number(days)
    if not days:
        yield "log group keeps events forever (retentionInDays unset or 0)"
    elif not ctx.config["minDays"] <= days <= ctx.config["maxDays"]:
        yield f"retentionInDays {days:g} is outside {ctx.config['minDays']:g}-{ctx.config['maxDays']:g}"


def check_flow_logs(stack, ctx):
    if ctx.classification() not in ctx.config["classifications"] or not any(
            r.type.startswith("aws:") for r in stack.resources):
        return
    logs = stack.of(FLOW_LOG)
    vpcs = stack.of(VPC)
    for vpc in vpcs:
        if not stack.referrers(vpc, [FLOW_LOG], "vpcId"):
            yield f"VPC '{vpc.name}' of a {ctx.classification()} stack has no flow log", vpc.urn
    if not vpcs and not logs:
        yield f"{ctx.classification()} stack in an existing VPC declares no flow log for it", None
    for log in logs:
        if log.props.get("trafficType") not in ("ALL", UNKNOWN):
            yield f"flow log '{log.name}' records {log.props.get('trafficType')} traffic, not ALL", log.urn


def check_topic_subscribers(stack, ctx):
    for topic in stack.of(SNS_TOPIC):
        if not stack.referrers(topic, [SNS_SUBSCRIPTION], "topic"):
            yield (f"topic '{topic.name}' has no subscription: the alarms and budget alerts it gets reach "
                   f"nobody"), topic.urn


POLICIES = [
    resource_policy(
        "aws-cloudwatch-loggroup-encrypted",
        "CloudWatch log groups are encrypted with a KMS key.",
        types=[LOG_GROUP], severity="medium", frameworks=["HIPAA", "GDPR"], check=check_log_group_encrypted,
        remediation="Set kmsKeyId to the stack's KMS key; its key policy must allow logs.<region>.amazonaws.com."),
    resource_policy(
        "aws-cloudwatch-loggroup-retention",
        "CloudWatch log groups expire events after a bounded retention period.",
        types=[LOG_GROUP], severity="low", frameworks=["GDPR", "CIS"], check=check_log_group_retention,
        mandatory=False,
        config={"minDays": {"type": "integer", "minimum": 1, "default": 14,
                            "description": "Shortest allowed retention in days."},
                "maxDays": {"type": "integer", "minimum": 1, "default": 3653,
                            "description": "Longest allowed retention in days."}},
        remediation="Set retentionInDays (e.g. 30 or 90) on the log group."),
    stack_policy(
        "aws-ec2-vpc-flow-logs",
        "VPCs of stacks holding regulated data record all traffic in flow logs.",
        severity="medium", frameworks=["HIPAA", "CIS"], check=check_flow_logs,
        config={"classifications": {"type": "array", "items": {"type": "string"}, "default": ["phi"],
                                    "description": "Data classifications whose VPCs need flow logs."}},
        remediation="Add an aws.ec2.FlowLog with vpcId of the VPC, trafficType 'ALL', delivering to an encrypted "
                    "log group with retention."),
    stack_policy(
        "aws-sns-topic-alert-subscribers",
        "SNS topics that alarms and budgets notify have at least one subscriber.",
        severity="low", frameworks=["CIS"], check=check_topic_subscribers, mandatory=False,
        remediation="alerts reach nobody: set gpufleet:alertEmails (or gpufleet:alerts: e-mail, an HTTPS endpoint "
                    "or a chat webhook) so the stack subscribes them to the alert topic."),
]
