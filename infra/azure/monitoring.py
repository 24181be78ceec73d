"""Monitoring: the stack's action group (the alert recipients: e-mail addresses, and HTTPS endpoints as webhooks
that receive Azure Monitor's common alert schema) and the alert on the Slurm controller being down.

The controller down: the VM's platform metric VmAvailabilityMetric (1 available, 0 not) averages below 1 over five
minutes; Azure keeps measuring it whatever runs in the VM. Scale events went with the scale set: Slurm's power
saving now sizes the partitions.

Not here, and why: the bridge's gauges (jobs pending over an hour, nodes that failed to power up; infra.metrics
PENDING_OVER_AN_HOUR, NODES_FAILED_TO_RESUME) have no path to Azure Monitor in this repository: nothing on the
controller publishes them (on AWS their alarms wait for the same publisher). Azure Monitor takes custom metrics
on a resource (POST https://<region>.monitoring.azure.com/<controller VM id>/metrics, with a token of an identity
holding Monitoring Metrics Publisher on the VM); once the bridge publishes there, two metric alerts on the VM
(namespace gpufleet/<stack>, skipMetricValidation for a metric not yet seen) complete the set.
"""
from __future__ import annotations

from dataclasses import dataclass

import pulumi
from pulumi_azure_native import monitor

from infra.config import Alert

AVAILABILITY_METRIC = "VmAvailabilityMetric"
VM_NAMESPACE = "Microsoft.Compute/virtualMachines"
SINGLE_RESOURCE = "Microsoft.Azure.Monitor.SingleResourceMultipleMetricCriteria"
CONTROLLER_DOWN_SEVERITY = 1   # 0 critical .. 4 verbose: no job starts and no node powers up while it lasts
SHORT_NAME_MAX = 12


@dataclass(frozen=True)
class MonitoringArgs:
    name: str
    stack: str
    resource_group: pulumi.Input[str]
    alerts: tuple[Alert, ...]
    tags: dict


def receivers(alerts: tuple[Alert, ...]) -> dict:
    """The action group's e-mail and webhook receivers, in the order the config lists the recipients."""
    emails = [a.endpoint for a in alerts if a.kind == "email"]
    hooks = [a.endpoint for a in alerts if a.kind == "https"]
    return {
        "email_receivers": [monitor.MicrosoftCommonEmailReceiverArgs(name=f"email-{i}", email_address=e,
                                                                     use_common_alert_schema=True)
                            for i, e in enumerate(emails)],
        "webhook_receivers": [monitor.WebhookReceiverArgs(name=f"webhook-{i}", service_uri=u,
                                                          use_common_alert_schema=True)
                              for i, u in enumerate(hooks)],
    }


class Monitoring(pulumi.ComponentResource):
    def __init__(self, name: str, args: MonitoringArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpufleet:azure:Monitoring", name, None, opts)
        self._name, self._args = name, args
        self.action_group = monitor.ActionGroup(
            f"{name}-alerts", action_group_name=f"{args.name}-alerts", resource_group_name=args.resource_group,
            location="Global", group_short_name=f"gf-{args.stack}"[:SHORT_NAME_MAX], enabled=True,
            **receivers(args.alerts), tags=args.tags, opts=pulumi.ResourceOptions(parent=self))
        self.alerts: dict[str, monitor.MetricAlert] = {}
        self.register_outputs({"actionGroup": self.action_group.id})

    def watch_controller(self, vm_id: pulumi.Input[str]) -> None:
        """The controller down: its VM unavailable for five minutes."""
        a = self._args
        self.alerts["controller-down"] = monitor.MetricAlert(
            f"{self._name}-controller-down",
            rule_name=f"{a.name}-controller-down",
            resource_group_name=a.resource_group,
            location="global",
            description="The Slurm controller VM is unavailable: no job starts and no GPU node powers up",
            severity=CONTROLLER_DOWN_SEVERITY,
            enabled=True,
            scopes=[vm_id],
            evaluation_frequency="PT1M",
            window_size="PT5M",
            criteria=monitor.MetricAlertSingleResourceMultipleMetricCriteriaArgs(
                odata_type=SINGLE_RESOURCE,
                all_of=[monitor.MetricCriteriaArgs(
                    criterion_type="StaticThresholdCriterion", name="vm-availability",
                    metric_namespace=VM_NAMESPACE, metric_name=AVAILABILITY_METRIC, operator="LessThan",
                    threshold=1, time_aggregation="Average")]),
            auto_mitigate=True,
            actions=[monitor.MetricAlertActionArgs(action_group_id=self.action_group.id)],
            tags=a.tags,
            opts=pulumi.ResourceOptions(parent=self))
