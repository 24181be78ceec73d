"""Compute: the launch configuration (as_.ScalingConfig) and the scaling group of GPU nodes, with a
launch lifecycle hook (nodes pass preflight first) and a terminate hook (time to checkpoint).

Nodes get no public IP and no login key or password (keep_image_login: the baked image allows key-less
access only through TencentCloud Automation Tools); the Cloud Monitor agent reports CPU, memory and GPU
metrics. Spot (`SPOTPAID`, one-time) bids at most the dearest listed type's pay-as-you-go price. Neither
the AS API nor the provider can encrypt a launch configuration's system or data disks: the
configuration attaches no data disk, and checkpoints and datasets live in the KMS-encrypted bucket.
Queue mode: min 0, the scaler owns the desired size. Gang mode: a fixed size in one zone (Tencent's
placement groups spread nodes apart, the opposite of what NCCL wants, so none is used).
"""
from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import pulumi
from tencentcloud_iac_pulumi import as_

from infra import scaling
from infra.tencent import derive

GANG_TERMINATION = "OLDEST_INSTANCE"
QUEUE_TERMINATION = "NEWEST_INSTANCE"


@dataclass(frozen=True)
class ComputeArgs:
    prefix: str
    names: derive.Names
    mode: str
    capacity: scaling.Capacity
    instance_types: tuple[str, ...]
    spot: bool
    image_id: pulumi.Input[str]
    vpc_id: pulumi.Input[str]
    subnet_ids: pulumi.Input[list]
    security_group_id: pulumi.Input[str]
    role_name: pulumi.Input[str]
    node_settings: pulumi.Input[dict]       # node.json, see infra.userdata
    tags: dict


def _user_data(node: dict) -> str:
    from infra.userdata import render_user_data  # the images area owns the cloud-init text

    return base64.b64encode(render_user_data(node).encode()).decode()


def pricing(spot: bool, instance_types: tuple[str, ...]) -> dict[str, Any]:
    if not spot:
        return {"instance_charge_type": "POSTPAID_BY_HOUR"}
    return {"instance_charge_type": "SPOTPAID", "spot_instance_type": "one-time",
            "spot_max_price": derive.spot_max_price(instance_types)}


class Compute(pulumi.ComponentResource):
    def __init__(self, name: str, args: ComputeArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpufleet:tencent:Compute", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        p, n = args.prefix, args.names
        self.config = as_.ScalingConfig(
            f"{p}-node", configuration_name=n.config, instance_types=list(args.instance_types),
            image_id=args.image_id, system_disk_type=derive.SYSTEM_DISK_TYPE, system_disk_size=derive.SYSTEM_DISK_GB,
            disk_type_policy="ORIGINAL", security_group_ids=[args.security_group_id], cam_role_name=args.role_name,
            public_ip_assigned=False, internet_max_bandwidth_out=0, keep_image_login=True,
            enhanced_monitor_service=True, enhanced_security_service=True, enhanced_automation_tools_service=True,
            user_data=pulumi.Output.from_input(args.node_settings).apply(_user_data),
            instance_name_settings={"instance_name": f"{p}-node", "instance_name_style": "UNIQUE"},
            instance_tags=args.tags, tags=args.tags, **pricing(args.spot, args.instance_types), opts=child)
        cap, queue_mode = args.capacity, args.mode == "queue"
        self.group = as_.ScalingGroup(
            f"{p}-nodes", scaling_group_name=n.group, configuration_id=self.config.id, min_size=cap.min,
            max_size=cap.max, desired_capacity=cap.desired, vpc_id=args.vpc_id, subnet_ids=args.subnet_ids,
            multi_zone_subnet_policy="EQUALITY" if queue_mode else "PRIORITY",
            retry_policy="INCREMENTAL_INTERVALS", health_check_type="CVM", replace_monitor_unhealthy=False,
            scaling_mode="CLASSIC_SCALING",
            termination_policies=QUEUE_TERMINATION if queue_mode else GANG_TERMINATION, tags=args.tags,
            # The scaler owns the desired size in queue mode.
            opts=pulumi.ResourceOptions(parent=self, ignore_changes=["desiredCapacity"] if queue_mode else None))
        self.hooks = [
            as_.LifecycleHook(f"{p}-preflight", scaling_group_id=self.group.id, lifecycle_hook_name=n.launch_hook,
                              lifecycle_transition="INSTANCE_LAUNCHING", default_result="ABANDON",
                              heartbeat_timeout=derive.LAUNCH_HOOK_TIMEOUT_S, lifecycle_transition_type="NORMAL",
                              opts=child),
            as_.LifecycleHook(f"{p}-checkpoint", scaling_group_id=self.group.id, lifecycle_hook_name=n.terminate_hook,
                              lifecycle_transition="INSTANCE_TERMINATING", default_result="CONTINUE",
                              heartbeat_timeout=derive.TERMINATE_HOOK_TIMEOUT_S, lifecycle_transition_type="NORMAL",
                              opts=child),
        ]
        self.register_outputs({"group": self.group.id, "config": self.config.id})
