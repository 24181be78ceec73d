"""Monitoring: a CLS log set and topic for the machines' logs, a CAM group whose members get the alarms, a Cloud
Monitor notification template to that group, alarm policies and a monthly budget in CNY with reminders at 80 %,
100 % and 100 % forecast.

Alarms: GPUs idle while nodes run, CPU and memory busy (rules on the stack's machines, bound by the stack tag,
which every node carries from the node provider's tags and the controller from its own; Slurm powers nodes down
when idle, so the idle-GPU rule speaks only while nodes run), dead letters (the dead-letter queue, bound by its id
and name, QCE/CMQ dimensions), and the controller down (Cloud Monitor's CVM event "ping unreachable", bound to the
controller instance: no job starts and no node powers up while it lasts).

Not here: alarms on jobs pending over an hour and on nodes that failed to power up. Those are gauges the bridge is
to compute from Slurm's state (metrics.PENDING_OVER_AN_HOUR, NODES_FAILED_TO_RESUME); on AWS they are CloudWatch
metrics. Nothing in this repository publishes them to Tencent Cloud Monitor (that takes its custom-metrics API,
PutMonitorData, which CAM cannot hold to a namespace), so an alarm on them would watch nothing. Slurm itself keeps
the failed nodes DOWN with their reason (``sinfo -R``).
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import pulumi
from tencentcloud_iac_pulumi import billing, cam, cls, monitor

from infra.tencent import derive

# Cloud Monitor's policy type for CMQ queues (metrics in QCE/CMQ). The provider takes any string and no
# document within reach lists the policy types: the first `pulumi up` proves it.
DLQ_ALARM_NAMESPACE = "cmq_queue"
ALL_DAY = {"start_time": 0, "end_time": 86399, "weekdays": [1, 2, 3, 4, 5, 6, 7]}


@dataclass(frozen=True)
class MonitoringArgs:
    names: derive.Names
    stack: str
    classification: str
    budget_monthly_cny: float
    dlqs: list[tuple[pulumi.Input[str], pulumi.Input[str]]]   # each team's dead-letter queue: (id, name)
    tags: dict


class Monitoring(pulumi.ComponentResource):
    topic_id: pulumi.Output[str]

    def __init__(self, name: str, args: MonitoringArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpufleet:tencent:Monitoring", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        n, tags = args.names, args.tags
        p = n.prefix
        self.logset = cls.Logset(f"{p}-logs", logset_name=n.logset, tags=tags, opts=child)
        self.topic = cls.Topic(f"{p}-node-logs", logset_id=self.logset.id, topic_name="nodes",
                               period=derive.LOG_RETENTION_DAYS[args.classification], storage_type="hot",
                               auto_split=True, is_web_tracking=False, tags=tags, opts=child)
        self.group = cam.Group(f"{p}-alerts", name=f"{p}-alerts", remark="receives the stack's alarms", opts=child)
        self.notice = monitor.AlarmNotice(
            f"{p}-alerts", name=f"{p}-alerts", notice_type="ALL", notice_language="en-US",
            user_notices=[{"receiver_type": "GROUP", "group_ids": [self.group.id.apply(int)],
                           "notice_ways": ["EMAIL", "SMS"], **ALL_DAY}],
            opts=child)
        stack_tag = [{"key": "gpufleet-stack", "value": args.stack}]
        self.alarms = {
            label: monitor.AlarmPolicy(
                f"{p}-{label}", policy_name=f"{p}-{label}", monitor_type="MT_QCE", namespace="cvm_device",
                project_id=0, enable=1, conditions={"is_union_rule": 0, "rules": [rule]},
                notice_ids=[self.notice.id], policy_tags=stack_tag, remark=_REMARKS[label], opts=child)
            for label, rule in derive.node_alarm_rules().items()}
        self.alarms["dead-letters"] = monitor.AlarmPolicy(
            f"{p}-dead-letters", policy_name=f"{p}-dead-letters", monitor_type="MT_QCE",
            namespace=DLQ_ALARM_NAMESPACE, project_id=0, enable=1,
            conditions={"is_union_rule": 0, "rules": [derive.dead_letter_rule()]}, notice_ids=[self.notice.id],
            remark=_REMARKS["dead-letters"], opts=child)
        monitor.PolicyBindingObject(
            f"{p}-dead-letters-queue", policy_id=self.alarms["dead-letters"].id,
            dimensions=[{"dimensions_json": pulumi.Output.all(dlq_id, dlq_name).apply(
                lambda v: json.dumps({"queueId": v[0], "queueName": v[1]}, sort_keys=True))}
                for dlq_id, dlq_name in args.dlqs],
            opts=child)
        first, last = derive.BUDGET_PERIOD
        self.budget = billing.Budget(
            f"{p}-monthly", budget_name=f"{p}-monthly", bill_type="BILL", fee_type="COST", plan_type="FIX",
            cycle_type="MONTH", period_begin=first, period_end=last,
            budget_quota=f"{args.budget_monthly_cny:.2f}",
            dimensions_range={"tags": [{"tag_key": "gpufleet-stack", "tag_values": [args.stack]}]},
            warn_jsons=[{"warn_type": kind, "cal_type": "PERCENTAGE", "threshold_value": str(percent)}
                        for kind, percent in derive.BUDGET_ALERTS],
            budget_note="gpufleet stack budget (costs tagged gpufleet-stack)", opts=child)
        self.topic_id = self.topic.id
        self._prefix = p
        self.register_outputs({"logTopic": self.topic.id, "alertGroup": self.group.name})

    def watch_controller(self, instance_id: pulumi.Input[str]) -> None:
        """The controller down: Cloud Monitor's "ping unreachable" event of its instance."""
        child = pulumi.ResourceOptions(parent=self)
        p = self._prefix
        self.alarms["controller-down"] = monitor.AlarmPolicy(
            f"{p}-controller-down", policy_name=f"{p}-controller-down", monitor_type="MT_QCE",
            namespace="cvm_device", project_id=0, enable=1, event_conditions=[derive.controller_down_event()],
            notice_ids=[self.notice.id], remark=_REMARKS["controller-down"], opts=child)
        monitor.PolicyBindingObject(
            f"{p}-controller-down-instance", policy_id=self.alarms["controller-down"].id,
            dimensions=[{"dimensions_json": pulumi.Output.from_input(instance_id).apply(
                lambda i: json.dumps({"unInstanceId": i}))}],
            opts=child)


# Cloud Monitor takes remarks of at most 100 letters, digits, '_' and '-' (CreateAlarmPolicy's Remark): no spaces.
_REMARKS = {
    "idle-gpus": f"nodes-run-but-their-GPUs-are-below-{derive.IDLE_GPU_PERCENT}-percent-busy",
    "busy-cpu": f"a-machine-CPU-is-above-{derive.BUSY_PERCENT}-percent",
    "busy-memory": f"a-machine-memory-is-above-{derive.BUSY_PERCENT}-percent",
    "dead-letters": "jobs-failed-repeatedly-and-sit-in-the-dead-letter-queue",
    "controller-down": "the-Slurm-controller-does-not-answer-ping-no-job-starts-no-node-powers-up",
}
