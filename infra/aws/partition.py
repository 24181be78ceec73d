"""A Slurm partition on EC2: the launch template its nodes start from and, for a gang partition, its cluster
placement group.

Nothing here runs a node: slurmctld's power saving does, through the controller's node provider (EC2 CreateFleet
from this template, types and purchase options from the partition, trainer.clouds.aws_nodes). The component's own
properties (instance types, node count, spot, gang) are what the policy pack judges a partition by.
Root volumes are encrypted with the stack key; the metadata service takes v2 tokens only, one hop.
"""
from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any, Optional

import pulumi
import pulumi_aws as aws

from infra.aws import efa
from infra.aws.efa import Interface
from infra.config import AwsImage, Partition
from infra.userdata import render_node_user_data

ROOT_VOLUME_GIB = 200
COMPONENT = "gpufleet:aws:Partition"


@dataclass(frozen=True)
class PartitionArgs:
    prefix: str
    partition: Partition
    image: AwsImage
    interfaces: tuple[Interface, ...]
    security_group_id: pulumi.Input[str]
    subnet_ids: list[pulumi.Input[str]]       # where its nodes launch (a gang partition: the first subnet only)
    instance_profile_arn: pulumi.Input[str]
    key_arn: pulumi.Input[str]                # the stack key, which encrypts the root volumes
    node_settings: pulumi.Input[dict]         # node.json, see infra.userdata
    tags: dict[str, str]


def image(spec: AwsImage) -> pulumi.Output[Any]:
    """The AMI (one lookup, by id or by name pattern): its id and its root device name, which the root volume
    mapping must name."""
    if spec.id is not None:
        filters = [{"name": "image-id", "values": [spec.id]}]
        return aws.ec2.get_ami_output(filters=filters, include_deprecated=True)
    filters = [{"name": "name", "values": [spec.name]}, {"name": "state", "values": ["available"]},
               {"name": "architecture", "values": ["x86_64"]}]
    return aws.ec2.get_ami_output(most_recent=True, owners=list(spec.owners), filters=filters)


def props(part: Partition, efa_interfaces: int, subnet_ids: list) -> dict:
    """What the partition is, as the component's properties (the policy pack reads them)."""
    row = part.primary
    return {"partition": part.name, "instanceTypes": list(part.instance_types), "maxNodes": part.nodes.max,
            "alwaysOn": part.nodes.min, "spot": part.spot, "onDemandBase": part.on_demand_base, "gang": part.gang,
            "gpusPerNode": row.gpus, "efaInterfaces": efa_interfaces, "subnetIds": subnet_ids}


def _user_data(node: dict) -> str:
    return base64.b64encode(render_node_user_data(node).encode()).decode()


class PartitionNodes(pulumi.ComponentResource):
    def __init__(self, name: str, args: PartitionArgs, ami: pulumi.Output[Any],
                 opts: pulumi.ResourceOptions | None = None):
        part = args.partition
        self.subnet_ids = args.subnet_ids[:1] if part.multi_node else list(args.subnet_ids)
        super().__init__(COMPONENT, name, props(part, efa.efa_count(args.interfaces), self.subnet_ids), opts)
        child = pulumi.ResourceOptions(parent=self)
        p, tags = f"{args.prefix}-{part.name}", args.tags
        self.placement_group: Optional[aws.ec2.PlacementGroup] = None
        if part.multi_node:  # a gang's nodes in one cluster placement group (and so one AZ)
            self.placement_group = aws.ec2.PlacementGroup(f"{p}-cluster", strategy="cluster", tags=tags, opts=child)
        tagged = ["instance", "volume", "network-interface"] + (["spot-instances-request"] if part.spot else [])
        self.launch_template = aws.ec2.LaunchTemplate(
            f"{p}-node", description=f"{p}: GPU nodes of Slurm partition {part.name}", image_id=args.image.id or ami.id,
            update_default_version=True,
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
        self.register_outputs({"launch_template": self.launch_template.id})
