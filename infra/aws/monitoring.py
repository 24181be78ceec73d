"""Monitoring: encrypted log group, alarms (dead letters, old jobs, idle GPUs), dashboard, budget.

Alarms and the budget notify one KMS-encrypted SNS topic; `alertEmails` subscribe to it and get the
budget mails directly. The idle-GPU alarm reads `GPUUtilization` (percent, dimension
AutoScalingGroupName) that nodes publish to the `gpufleet/<stack>` namespace.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from infra.aws import policies

LOG_RETENTION_DAYS = {"public": 30, "internal": 90, "personal": 365, "phi": 2192}
OLDEST_JOB_ALARM_S = 3600
IDLE_GPU_PERCENT = 5
IDLE_GPU_PERIODS = 6          # x 5 minutes
GPU_METRIC = "GPUUtilization"
BUDGET_ALERTS = (("ACTUAL", 80.0), ("ACTUAL", 100.0), ("FORECASTED", 100.0))


@dataclass(frozen=True)
class MonitoringArgs:
    prefix: str
    stack: str
    region: str
    account_id: pulumi.Input[str]
    key_arn: pulumi.Input[str]
    log_group_name: str
    metric_namespace: str
    classification: str
    queue_name: pulumi.Input[str]
    dlq_name: pulumi.Input[str]
    asg_name: str
    budget_monthly_usd: float
    alert_emails: tuple[str, ...]
    tags: dict[str, str]


def dashboard_body(region: str, namespace: str, queue: str, dlq: str, asg: str) -> dict:
    def widget(title: str, metrics: list, x: int, y: int) -> dict:
        return {"type": "metric", "x": x, "y": y, "width": 12, "height": 6,
                "properties": {"title": title, "region": region, "metrics": metrics, "period": 60, "stat": "Maximum"}}

    return {"widgets": [
        widget("Jobs waiting / running", [
            ["AWS/SQS", "ApproximateNumberOfMessagesVisible", "QueueName", queue, {"label": "waiting"}],
            ["AWS/SQS", "ApproximateNumberOfMessagesNotVisible", "QueueName", queue, {"label": "running"}]], 0, 0),
        widget("Nodes", [
            ["AWS/AutoScaling", "GroupInServiceInstances", "AutoScalingGroupName", asg, {"label": "in service"}],
            ["AWS/AutoScaling", "GroupDesiredCapacity", "AutoScalingGroupName", asg, {"label": "desired"}]], 12, 0),
        widget("GPU utilization %", [[namespace, GPU_METRIC, "AutoScalingGroupName", asg]], 0, 6),
        widget("Oldest job age (s) / dead letters", [
            ["AWS/SQS", "ApproximateAgeOfOldestMessage", "QueueName", queue],
            ["AWS/SQS", "ApproximateNumberOfMessagesVisible", "QueueName", dlq, {"label": "dead letters"}]], 12, 6),
    ]}


class Monitoring(pulumi.ComponentResource):
    def __init__(self, name: str, args: MonitoringArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpufleet:aws:Monitoring", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        p, tags = args.prefix, args.tags
        self.log_group = aws.cloudwatch.LogGroup(
            f"{p}-logs", name=args.log_group_name, kms_key_id=args.key_arn,
            retention_in_days=LOG_RETENTION_DAYS[args.classification], tags=tags, opts=child)

        self.topic = aws.sns.Topic(f"{p}-alerts", kms_master_key_id=args.key_arn, tags=tags, opts=child)
        aws.sns.TopicPolicy(
            f"{p}-alerts-policy", arn=self.topic.arn,
            policy=pulumi.Output.all(self.topic.arn, args.account_id).apply(
                lambda v: json.dumps(policies.topic_policy(*v))),
            opts=child)
        for i, email in enumerate(args.alert_emails):
            aws.sns.TopicSubscription(f"{p}-alerts-email-{i}", topic=self.topic.arn, protocol="email",
                                      endpoint=email, opts=child)
        actions = [self.topic.arn]

        self.alarms = {
            "dead-letters": aws.cloudwatch.MetricAlarm(
                f"{p}-dead-letters", alarm_description="Jobs failed repeatedly and sit in the dead-letter queue",
                namespace="AWS/SQS", metric_name="ApproximateNumberOfMessagesVisible",
                dimensions={"QueueName": args.dlq_name}, statistic="Maximum", period=300, evaluation_periods=1,
                comparison_operator="GreaterThanThreshold", threshold=0, treat_missing_data="notBreaching",
                alarm_actions=actions, ok_actions=actions, tags=tags, opts=child),
            "old-jobs": aws.cloudwatch.MetricAlarm(
                f"{p}-old-jobs", alarm_description=f"A job has waited over {OLDEST_JOB_ALARM_S} s for a node",
                namespace="AWS/SQS", metric_name="ApproximateAgeOfOldestMessage",
                dimensions={"QueueName": args.queue_name}, statistic="Maximum", period=300, evaluation_periods=1,
                comparison_operator="GreaterThanThreshold", threshold=OLDEST_JOB_ALARM_S,
                treat_missing_data="notBreaching", alarm_actions=actions, ok_actions=actions, tags=tags, opts=child),
            "idle-gpus": aws.cloudwatch.MetricAlarm(
                f"{p}-idle-gpus",
                alarm_description=f"Nodes are running but their GPUs are below {IDLE_GPU_PERCENT}% busy",
                metric_queries=[
                    {"id": "nodes", "metric": {"namespace": "AWS/AutoScaling", "metric_name": "GroupInServiceInstances",
                                               "dimensions": {"AutoScalingGroupName": args.asg_name},
                                               "stat": "Minimum", "period": 300}},
                    {"id": "gpu", "metric": {"namespace": args.metric_namespace, "metric_name": GPU_METRIC,
                                             "dimensions": {"AutoScalingGroupName": args.asg_name},
                                             "stat": "Average", "period": 300}},
                    {"id": "idle", "label": "nodes running with idle GPUs", "return_data": True,
                     "expression": f"IF(FILL(nodes, 0) > 0 AND FILL(gpu, 0) < {IDLE_GPU_PERCENT}, 1, 0)"},
                ],
                evaluation_periods=IDLE_GPU_PERIODS, comparison_operator="GreaterThanOrEqualToThreshold",
                threshold=1, treat_missing_data="notBreaching", alarm_actions=actions, ok_actions=actions,
                tags=tags, opts=child),
        }

        self.dashboard = aws.cloudwatch.Dashboard(
            f"{p}-dashboard", dashboard_name=f"{p}",
            dashboard_body=pulumi.Output.all(args.queue_name, args.dlq_name).apply(
                lambda v: json.dumps(dashboard_body(args.region, args.metric_namespace, v[0], v[1], args.asg_name))),
            opts=child)

        notifications = [
            {"comparison_operator": "GREATER_THAN", "notification_type": kind, "threshold": percent,
             "threshold_type": "PERCENTAGE", "subscriber_sns_topic_arns": actions,
             **({"subscriber_email_addresses": list(args.alert_emails)} if args.alert_emails else {})}
            for kind, percent in BUDGET_ALERTS]
        self.budget = aws.budgets.Budget(
            f"{p}-monthly", budget_type="COST", time_unit="MONTHLY", limit_amount=f"{args.budget_monthly_usd:.2f}",
            limit_unit="USD",
            # Counts costs tagged with this stack (activate "gpufleet-stack" as a cost allocation tag).
            cost_filters=[{"name": "TagKeyValue", "values": [f"user:gpufleet-stack${args.stack}"]}],
            notifications=notifications, tags=tags, opts=child)
        self.register_outputs({"log_group": self.log_group.name, "dashboard": self.dashboard.dashboard_name})
