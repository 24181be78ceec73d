"""Compute: the launch template and the autoscaling group of GPU nodes.

Root volumes are encrypted with the stack key; the group launches nodes as the stack's own
Auto Scaling service-linked role, which that key's policy lets use it.
Queue mode scales on the job backlog (waiting + in-flight messages) with the steps of
`infra.scaling.backlog_steps`, from zero to max and back; gang mode holds a fixed size.
"""
from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any, Optional

import pulumi
import pulumi_aws as aws

from infra import scaling
from infra.aws.efa import Interface
from infra.config import AwsImage

ROOT_VOLUME_GIB = 200
LAUNCH_HOOK_TIMEOUT_S = 1800     # preflight: drivers, fabric manager, EFA and NCCL checks
TERMINATE_HOOK_TIMEOUT_S = 600   # time to write a checkpoint before the node goes
GROUP_METRICS = ("GroupMinSize", "GroupMaxSize", "GroupDesiredCapacity", "GroupInServiceInstances",
                 "GroupPendingInstances", "GroupTerminatingInstances", "GroupTotalInstances")


@dataclass(frozen=True)
class ComputeArgs:
    prefix: str
    asg_name: str
    mode: str
    capacity: scaling.Capacity
    instance_types: tuple[str, ...]
    spot: bool
    on_demand_base: int
    image: AwsImage
    interfaces: tuple[Interface, ...]
    subnet_ids: list[pulumi.Input[str]]
    security_group_id: pulumi.Input[str]
    placement_group: Optional[pulumi.Input[str]]
    instance_profile_arn: pulumi.Input[str]
    key_arn: pulumi.Input[str]              # the stack key, which encrypts the root volumes
    autoscaling_role_arn: pulumi.Input[str] # service-linked role the group launches with; the key lets it
    node_settings: pulumi.Input[dict]       # node.json, see infra.userdata
    launch_hook: str
    terminate_hook: str
    queue_name: pulumi.Input[str]
    tags: dict[str, str]


def _user_data(node: dict) -> str:
    from infra.userdata import render_user_data  # the images area owns the cloud-init text

    return base64.b64encode(render_user_data(node).encode()).decode()


def _image(image: AwsImage) -> pulumi.Output[Any]:
    """The AMI (one lookup, by id or by name pattern): its id and its root device name, which the
    root volume mapping must name."""
    if image.id is not None:
        filters = [{"name": "image-id", "values": [image.id]}]
        return aws.ec2.get_ami_output(filters=filters, include_deprecated=True)
    filters = [{"name": "name", "values": [image.name]}, {"name": "state", "values": ["available"]},
               {"name": "architecture", "values": ["x86_64"]}]
    return aws.ec2.get_ami_output(most_recent=True, owners=list(image.owners), filters=filters)


class Compute(pulumi.ComponentResource):
    def __init__(self, name: str, args: ComputeArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpufleet:aws:Compute", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        p, tags = args.prefix, args.tags
        ami = _image(args.image)
        self.ami_id = args.image.id or ami.id
        tagged = ["instance", "volume", "network-interface"] + (["spot-instances-request"] if args.spot else [])
        self.launch_template = aws.ec2.LaunchTemplate(
            f"{p}-node", description=f"{p} GPU node", image_id=self.ami_id, update_default_version=True,
            iam_instance_profile={"arn": args.instance_profile_arn},
            metadata_options={"http_endpoint": "enabled", "http_tokens": "required",
                              "http_put_response_hop_limit": 1, "instance_metadata_tags": "disabled"},
            block_device_mappings=[{
                "device_name": ami.root_device_name,
                "ebs": {"volume_size": ROOT_VOLUME_GIB, "volume_type": "gp3", "encrypted": "true",
                        "kms_key_id": args.key_arn, "delete_on_termination": "true"}}],
            network_interfaces=[{
                "network_card_index": nic.network_card_index, "device_index": nic.device_index,
                "interface_type": nic.interface_type, "security_groups": [args.security_group_id],
                "delete_on_termination": "true",
                **({"associate_public_ip_address": "false"} if nic.primary else {})}
                for nic in args.interfaces],
            monitoring={"enabled": True},
            user_data=pulumi.Output.from_input(args.node_settings).apply(_user_data),
            tag_specifications=[{"resource_type": kind, "tags": tags} for kind in tagged],
            tags=tags, opts=child)

        cap = args.capacity
        self.group = aws.autoscaling.Group(
            f"{p}-nodes", name=args.asg_name, min_size=cap.min, max_size=cap.max, desired_capacity=cap.desired,
            vpc_zone_identifiers=args.subnet_ids, placement_group=args.placement_group,
            service_linked_role_arn=args.autoscaling_role_arn,
            mixed_instances_policy={
                "instances_distribution": {
                    "on_demand_base_capacity": args.on_demand_base,
                    "on_demand_percentage_above_base_capacity": 0 if args.spot else 100,
                    "spot_allocation_strategy": "price-capacity-optimized"},
                "launch_template": {
                    "launch_template_specification": {
                        "launch_template_id": self.launch_template.id,
                        "version": self.launch_template.latest_version.apply(str)},
                    "overrides": [{"instance_type": t} for t in args.instance_types]}},
            capacity_rebalance=args.spot,
            initial_lifecycle_hooks=[
                {"name": args.launch_hook, "lifecycle_transition": "autoscaling:EC2_INSTANCE_LAUNCHING",
                 "default_result": "ABANDON", "heartbeat_timeout": LAUNCH_HOOK_TIMEOUT_S},
                {"name": args.terminate_hook, "lifecycle_transition": "autoscaling:EC2_INSTANCE_TERMINATING",
                 "default_result": "CONTINUE", "heartbeat_timeout": TERMINATE_HOOK_TIMEOUT_S}],
            enabled_metrics=list(GROUP_METRICS), metrics_granularity="1Minute",
            instance_refresh={
                "strategy": "Rolling", "triggers": ["tag"],
                # A gang cannot run with part of its nodes: replace them all at once.
                "preferences": ({"min_healthy_percentage": 0, "skip_matching": True} if args.mode == "gang" else
                                {"min_healthy_percentage": 50, "skip_matching": True,
                                 "scale_in_protected_instances": "Wait"})},
            health_check_type="EC2", health_check_grace_period=300,
            # Nodes wait in the launch hook until preflight passes; do not block the deployment on them.
            wait_for_capacity_timeout="0",
            tags=[{"key": k, "value": v, "propagate_at_launch": True} for k, v in tags.items()],
            # The scaling policy owns the desired size in queue mode.
            opts=pulumi.ResourceOptions(parent=self, ignore_changes=["desiredCapacity"] if args.mode == "queue" else None))

        self.scaling_policy = None
        if args.mode == "queue":
            self._scale_on_backlog(args)
        self.register_outputs({"asg": self.group.name, "launch_template": self.launch_template.id})

    def _scale_on_backlog(self, args: ComputeArgs) -> None:
        child = pulumi.ResourceOptions(parent=self)
        steps = scaling.backlog_steps(args.capacity.min, args.capacity.max)
        self.scaling_policy = aws.autoscaling.Policy(
            f"{args.prefix}-backlog", autoscaling_group_name=self.group.name, policy_type="StepScaling",
            adjustment_type="ExactCapacity", metric_aggregation_type="Maximum",
            step_adjustments=[{
                "scaling_adjustment": s.capacity,
                "metric_interval_lower_bound": None if s.lower is None else str(s.lower),
                "metric_interval_upper_bound": None if s.upper is None else str(s.upper)} for s in steps],
            opts=child)

        def sqs(metric_id: str, metric: str) -> dict:
            return {"id": metric_id, "metric": {"namespace": "AWS/SQS", "metric_name": metric, "stat": "Maximum",
                                                "period": 60, "dimensions": {"QueueName": args.queue_name}}}

        # Threshold 0 with >=: always in ALARM, so Auto Scaling applies the step for the backlog every minute.
        aws.cloudwatch.MetricAlarm(
            f"{args.prefix}-backlog", alarm_description="Sets the node count from the job backlog (scaling, not paging)",
            metric_queries=[
                sqs("visible", "ApproximateNumberOfMessagesVisible"),
                sqs("in_flight", "ApproximateNumberOfMessagesNotVisible"),
                {"id": "backlog", "expression": scaling.BACKLOG_EXPRESSION, "label": "jobs waiting or running",
                 "return_data": True}],
            comparison_operator="GreaterThanOrEqualToThreshold", threshold=0, evaluation_periods=1,
            treat_missing_data="breaching", alarm_actions=[self.scaling_policy.arn], tags=args.tags, opts=child)
