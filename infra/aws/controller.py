"""The Slurm controller: one small on-demand instance that runs slurmctld, the bridge and power saving.

It boots from the stack's image with the network interface that holds the controller's address (infra.aws.network)
and the controller role, whose policy (`policies.controller_policy`) is attached here because it names the
partitions' launch templates. Its user-data carries the rendered slurm.conf and gres.conf, the power-saving config
(nodes.json) and controller.json; slurmctld's state lives on the shared file system, so a replacement controller
(after a failure, or a `pulumi up` that changes its user-data) takes every queued and running job over. Private
subnet, no public address, metadata service v2 only, root volume encrypted with the stack key, shell access through
SSM Session Manager.
"""
from __future__ import annotations

import base64
import json
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from infra.aws import policies

ROOT_VOLUME_GIB = 50
HOSTNAME = "controller"  # SlurmctldHost: slurmctld starts only on the host of that short name


@dataclass(frozen=True)
class ControllerArgs:
    prefix: str
    instance_type: str
    image_id: pulumi.Input[str]
    root_device_name: pulumi.Input[str]
    network_interface_id: pulumi.Input[str]
    role_name: pulumi.Input[str]
    instance_profile_name: pulumi.Input[str]
    policy: pulumi.Input[dict]               # policies.controller_policy(...)
    key_arn: pulumi.Input[str]
    user_data: pulumi.Input[str]             # infra.userdata.render_controller_user_data(...)
    tags: dict[str, str]


class Controller(pulumi.ComponentResource):
    def __init__(self, name: str, args: ControllerArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpufleet:aws:Controller", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        p = args.prefix
        policy = aws.iam.RolePolicy(
            f"{p}-controller-policy", role=args.role_name,
            policy=pulumi.Output.from_input(args.policy).apply(json.dumps), opts=child)
        self.instance = aws.ec2.Instance(
            f"{p}-controller", ami=args.image_id, instance_type=args.instance_type,
            iam_instance_profile=args.instance_profile_name,
            network_interfaces=[{"network_interface_id": args.network_interface_id, "device_index": 0}],
            metadata_options={"http_endpoint": "enabled", "http_tokens": "required",
                              "http_put_response_hop_limit": 1, "instance_metadata_tags": "disabled"},
            root_block_device={"volume_size": ROOT_VOLUME_GIB, "volume_type": "gp3", "encrypted": True,
                               "kms_key_id": args.key_arn, "delete_on_termination": True,
                               "tags": args.tags},
            user_data_base64=pulumi.Output.from_input(args.user_data).apply(
                lambda text: base64.b64encode(text.encode()).decode()),
            user_data_replace_on_change=True, monitoring=True,
            maintenance_options={"auto_recovery": "default"},
            tags={**args.tags, "Name": f"{p}-controller"},
            # The address is the interface's: the old instance lets go of it before the new one takes it.
            opts=pulumi.ResourceOptions(parent=self, depends_on=[policy], delete_before_replace=True))
        self.register_outputs({"instance": self.instance.id})


def policy_args(region: str, account_id: str, subnet_ids: list[str], security_group_ids: list[str],
                image_id: str, placement_groups: list[str]) -> dict:
    """The ARNs of the launch's own resources, for `policies.controller_policy`."""
    part = policies.partition(region)
    ec2 = f"arn:{part}:ec2:{region}:{account_id}"
    return {"subnet_arns": [f"{ec2}:subnet/{s}" for s in subnet_ids],
            "security_group_arns": [f"{ec2}:security-group/{g}" for g in security_group_ids],
            "image_arns": [f"arn:{part}:ec2:{region}::image/{image_id}"],
            "placement_group_arns": [f"{ec2}:placement-group/{g}" for g in placement_groups]}
