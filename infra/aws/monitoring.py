"""Monitoring: encrypted log group, alarms (dead letters, jobs pending, nodes that failed to power up, the
controller down, idle GPUs), dashboard, budget.

Alarms and the budget notify one KMS-encrypted SNS topic. Its subscribers are the stack's alert
recipients (`alertEmails`, `alerts`): e-mail addresses (which also get the budget mails directly),
HTTPS endpoints that confirm SNS subscriptions, and chat webhooks, reached through a small Lambda
function (`chat_forwarder.py`). The GPU widget and the idle-GPU alarm read the metrics nodes publish,
by the names and dimensions of `infra.metrics`; the controller's gauges come from Slurm's own state: the jobs' from
the bridge (`metrics.PENDING_OVER_AN_HOUR`), the nodes' from the heal daemon (`metrics.NODES_FAILED_TO_RESUME`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pulumi
import pulumi_aws as aws

from infra import metrics
from infra.aws import policies
from infra.config import Alert

LOG_RETENTION_DAYS = {"public": 30, "internal": 90, "personal": 365, "phi": 2192}
IDLE_GPU_PERCENT = 5
IDLE_GPU_PERIODS = 6          # x 5 minutes
BUDGET_ALERTS = (("ACTUAL", 80.0), ("ACTUAL", 100.0), ("FORECASTED", 100.0))
FORWARDER = Path(__file__).with_name("chat_forwarder.py")
FORWARDER_RUNTIME = "python3.12"


@dataclass(frozen=True)
class MonitoringArgs:
    prefix: str
    stack: str
    region: str
    account_id: pulumi.Input[str]
    key_arn: pulumi.Input[str]
    log_group_name: str
    chat_log_group_name: str
    metric_namespace: str
    classification: str
    queue_names: dict[str, pulumi.Input[str]]   # each team's job queue, the first team's first
    dlq_names: dict[str, pulumi.Input[str]]     # and its dead-letter queue
    node_group: str                  # the nodes' metric dimension value (metrics.ASG)
    budget_monthly_usd: float
    alerts: tuple[Alert, ...]
    tags: dict[str, str]


def dashboard_body(region: str, namespace: str, queues: dict[str, str], dlqs: dict[str, str], group: str) -> dict:
    def widget(title: str, metrics_: list, x: int, y: int, stat: str = "Maximum") -> dict:
        return {"type": "metric", "x": x, "y": y, "width": 12, "height": 6,
                "properties": {"title": title, "region": region, "metrics": metrics_, "period": 60, "stat": stat}}

    return {"widgets": [
        widget("Jobs (from Slurm, through the bridge)", [
            [namespace, metrics.JOBS_PENDING, {"label": "pending"}],
            [namespace, metrics.JOBS_RUNNING, {"label": "running"}],
            [namespace, metrics.PENDING_OVER_AN_HOUR, {"label": "pending over an hour"}]], 0, 0),
        widget("Nodes", [
            [namespace, metrics.NODES_UP, {"label": "powered up"}],
            [namespace, metrics.NODES_FAILED_TO_RESUME, {"label": "failed to power up"}]], 12, 0),
        widget("GPU utilization % (all nodes, and per node)", [
            metrics.dashboard_row(namespace, metrics.GPU_UTILIZATION, group, label="all nodes"),
            [{"expression": metrics.per_node_search(namespace, metrics.GPU_UTILIZATION, group, "Average", 300),
              "id": "pernode", "label": ""}]], 0, 6, stat="Average"),
        widget("Messages not yet taken by the bridge / dead letters, per team", [
            *(["AWS/SQS", "ApproximateNumberOfMessagesVisible", "QueueName", queue,
               {"label": f"{team}: waiting for the bridge"}] for team, queue in queues.items()),
            *(["AWS/SQS", "ApproximateNumberOfMessagesVisible", "QueueName", dlq, {"label": f"{team}: dead letters"}]
              for team, dlq in dlqs.items())], 12, 6),
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
        self._subscribe(args)
        actions = [self.topic.arn]

        def gauge(name: str, metric: str, description: str, threshold: float = 0, periods: int = 1) -> None:
            self.alarms[name] = aws.cloudwatch.MetricAlarm(
                f"{p}-{name}", alarm_description=description, namespace=args.metric_namespace, metric_name=metric,
                statistic="Maximum", period=300, evaluation_periods=periods, datapoints_to_alarm=periods,
                comparison_operator="GreaterThanThreshold", threshold=threshold,
                # no data: no bridge to tell (the controller-down alarm says so), not a job waiting
                treat_missing_data="notBreaching", alarm_actions=actions, ok_actions=actions, tags=tags, opts=child)

        # one alarm per team's dead-letter queue; the first team's keeps the name the stack had before
        self.alarms = {
            ("dead-letters" if i == 0 else f"dead-letters-{team}"): aws.cloudwatch.MetricAlarm(
                f"{p}-dead-letters" if i == 0 else f"{p}-dead-letters-{team}",
                alarm_description=f"Jobs of team {team} failed repeatedly and sit in its dead-letter queue",
                namespace="AWS/SQS", metric_name="ApproximateNumberOfMessagesVisible",
                dimensions={"QueueName": dlq}, statistic="Maximum", period=300, evaluation_periods=1,
                comparison_operator="GreaterThanThreshold", threshold=0, treat_missing_data="notBreaching",
                alarm_actions=actions, ok_actions=actions, tags=tags, opts=child)
            for i, (team, dlq) in enumerate(args.dlq_names.items())}
        self.alarms.update({
            "idle-gpus": aws.cloudwatch.MetricAlarm(
                f"{p}-idle-gpus",
                alarm_description=f"Nodes are running but their GPUs are below {IDLE_GPU_PERCENT}% busy",
                metric_queries=[
                    {"id": "gpu", "label": "mean GPU utilization of the nodes", "return_data": True,
                     "metric": metrics.alarm_metric(args.metric_namespace, metrics.GPU_UTILIZATION, args.node_group,
                                                    "Average", 300)}],
                evaluation_periods=IDLE_GPU_PERIODS, comparison_operator="LessThanThreshold",
                threshold=IDLE_GPU_PERCENT, treat_missing_data="notBreaching", alarm_actions=actions,
                ok_actions=actions, tags=tags, opts=child),
        })
        gauge("old-jobs", metrics.PENDING_OVER_AN_HOUR,
              f"A job has been pending in Slurm for over {metrics.PENDING_ALARM_S // 60} minutes (no node for it)")
        gauge("resume-failures", metrics.NODES_FAILED_TO_RESUME,
              "GPU nodes failed to power up (capacity, quota or launch errors): see the nodes' reasons in sinfo -R")
        self._actions = actions
        self._args = args

        self.dashboard = aws.cloudwatch.Dashboard(
            f"{p}-dashboard", dashboard_name=f"{p}",
            dashboard_body=pulumi.Output.all(pulumi.Output.all(**args.queue_names), pulumi.Output.all(**args.dlq_names))
            .apply(lambda v: json.dumps(dashboard_body(args.region, args.metric_namespace, v[0], v[1],
                                                       args.node_group))),
            opts=child)

        emails = [a.endpoint for a in args.alerts if a.kind == "email"]
        notifications = [
            {"comparison_operator": "GREATER_THAN", "notification_type": kind, "threshold": percent,
             "threshold_type": "PERCENTAGE", "subscriber_sns_topic_arns": actions,
             **({"subscriber_email_addresses": list(emails)} if emails else {})}
            for kind, percent in BUDGET_ALERTS]
        self.budget = aws.budgets.Budget(
            f"{p}-monthly", budget_type="COST", time_unit="MONTHLY", limit_amount=f"{args.budget_monthly_usd:.2f}",
            limit_unit="USD",
            # Counts costs tagged with this stack (activate "gpufleet-stack" as a cost allocation tag).
            cost_filters=[{"name": "TagKeyValue", "values": [f"user:gpufleet-stack${args.stack}"]}],
            notifications=notifications, tags=tags, opts=child)
        self.register_outputs({"log_group": self.log_group.name, "dashboard": self.dashboard.dashboard_name})

    def watch_controller(self, instance_id: pulumi.Input[str]) -> None:
        """The controller down: its instance fails EC2's status checks (EC2 recovers it where it can)."""
        a = self._args
        self.alarms["controller-down"] = aws.cloudwatch.MetricAlarm(
            f"{a.prefix}-controller-down",
            alarm_description="The Slurm controller fails its status checks: no job starts or powers a node up",
            namespace="AWS/EC2", metric_name="StatusCheckFailed", dimensions={"InstanceId": instance_id},
            statistic="Maximum", period=60, evaluation_periods=3, datapoints_to_alarm=3,
            comparison_operator="GreaterThanThreshold", threshold=0, treat_missing_data="breaching",
            alarm_actions=self._actions, ok_actions=self._actions, tags=a.tags,
            opts=pulumi.ResourceOptions(parent=self))

    def _subscribe(self, args: MonitoringArgs) -> None:
        """E-mail and HTTPS recipients subscribe to the topic; chat webhooks through the forwarder."""
        child = pulumi.ResourceOptions(parent=self)
        p = args.prefix
        for protocol in ("email", "https"):
            for i, endpoint in enumerate(a.endpoint for a in args.alerts if a.kind == protocol):
                aws.sns.TopicSubscription(f"{p}-alerts-{protocol}-{i}", topic=self.topic.arn, protocol=protocol,
                                          endpoint=endpoint, opts=child)
        webhooks = [a.endpoint for a in args.alerts if a.kind == "chat"]
        if webhooks:
            self._chat_forwarder(args, webhooks)

    def _chat_forwarder(self, args: MonitoringArgs, webhooks: list[str]) -> None:
        child = pulumi.ResourceOptions(parent=self)
        p, tags = args.prefix, args.tags
        log_group = aws.cloudwatch.LogGroup(
            f"{p}-chat-logs", name=args.chat_log_group_name, kms_key_id=args.key_arn,
            retention_in_days=LOG_RETENTION_DAYS[args.classification], tags=tags, opts=child)
        role = aws.iam.Role(
            f"{p}-chat", description=f"{p}: posts alerts to chat webhooks",
            assume_role_policy=json.dumps(policies.assume_role_lambda()), tags=tags, opts=child)
        policy = aws.iam.RolePolicy(
            f"{p}-chat-policy", role=role.name,
            policy=log_group.arn.apply(lambda arn: json.dumps(policies.chat_forwarder_policy(arn))), opts=child)
        function = aws.lambda_.Function(
            f"{p}-chat", name=f"{p}-chat-alerts", description="Posts the stack's alerts to chat webhooks",
            runtime=FORWARDER_RUNTIME, handler=f"{FORWARDER.stem}.handler", role=role.arn,
            code=pulumi.AssetArchive({FORWARDER.name: pulumi.StringAsset(FORWARDER.read_text())}),
            timeout=30, memory_size=128,
            # A webhook URL is a credential: a secret in the state and masked in every preview.
            environment={"variables": {"GPUFLEET_CHAT_WEBHOOKS": pulumi.Output.secret(json.dumps(webhooks))}},
            logging_config={"log_format": "Text", "log_group": log_group.name}, tags=tags,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[policy]))
        invoke = aws.lambda_.Permission(
            f"{p}-chat-invoke", action="lambda:InvokeFunction", function=function.name,
            principal="sns.amazonaws.com", source_arn=self.topic.arn, opts=child)
        aws.sns.TopicSubscription(f"{p}-alerts-chat", topic=self.topic.arn, protocol="lambda",
                                  endpoint=function.arn, opts=pulumi.ResourceOptions(parent=self, depends_on=[invoke]))
