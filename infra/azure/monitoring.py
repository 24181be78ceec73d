"""Monitoring: the autoscale setting that sizes the scale set from the job queue's
ApproximateMessageCount, down to zero, and sends scale events to the alert recipients (e-mail
addresses, and HTTPS endpoints as autoscale webhooks)."""
from __future__ import annotations

from dataclasses import dataclass

import pulumi
from pulumi_azure_native import monitor

from infra.config import Alert


@dataclass(frozen=True)
class AutoscaleArgs:
    name: str
    resource_group: pulumi.Input[str]
    location: str
    scale_set_id: pulumi.Input[str]
    capacity: dict          # derive.capacity
    rules: list             # derive.queue_rules
    alerts: tuple[Alert, ...]
    tags: dict


class Autoscale(pulumi.ComponentResource):
    def __init__(self, name: str, args: AutoscaleArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpufleet:azure:Autoscale", name, None, opts)
        notifications = None
        emails = [a.endpoint for a in args.alerts if a.kind == "email"]
        hooks = [a.endpoint for a in args.alerts if a.kind == "https"]
        if emails or hooks:
            notifications = [monitor.AutoscaleNotificationArgs(
                operation="Scale", email=monitor.EmailNotificationArgs(custom_emails=emails) if emails else None,
                webhooks=[monitor.WebhookNotificationArgs(service_uri=u) for u in hooks] or None)]
        self.setting = monitor.AutoscaleSetting(
            f"{name}-setting",
            autoscale_setting_name=args.name,
            resource_group_name=args.resource_group,
            location=args.location,
            target_resource_uri=args.scale_set_id,
            enabled=True,
            profiles=[monitor.AutoscaleProfileArgs(name="queue-backlog", capacity=args.capacity, rules=args.rules)],
            notifications=notifications,
            tags=args.tags,
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.register_outputs({"id": self.setting.id})
