"""A Slurm partition on CVM: the launch template its nodes start from.

Nothing here runs a node: slurmctld's power saving does, through the controller's node provider
(trainer.clouds.tencent_nodes: RunInstances from this template, one call per node name, with the instance type,
zone, subnet, payment mode and tags of that node). The template carries what every node of the partition shares:
the image, the node role, the node security group, no public IP and no internet bandwidth, the Cloud Monitor and
TAT agents, the image's own login (no key, no password) and the user-data that writes node.json. The component's own
properties (instance types, node counts, spot, gang) are what the policy pack judges a partition by.

Payment: the template says pay-as-you-go (POSTPAID_BY_HOUR); the provider asks for spot per node (SPOTPAID,
one-time, bid at most nodes.json's spot_max_price) beyond the partition's on-demand base. A template that named spot
market options would clash with the on-demand nodes' requests, whose parameters override the template's.

Disks: the system disk only (no data disk). Neither tencentcloud's cvm.LaunchTemplate (system_disk: type and size)
nor CreateLaunchTemplate can encrypt it; CVM's RunInstances takes SystemDisk.Encrypt and KmsKeyId (marked beta in
Tencent's API models), so the node provider could encrypt it per launch. Checkpoints and data live in the
KMS-encrypted bucket.

No placement set: Tencent's placement sets (disaster-recover groups, HOST/SW/RACK) spread their instances apart,
which is the opposite of what a gang's NCCL wants and caps how many nodes a set may hold; single-node queue jobs gain
nothing from it. A multi-node gang partition launches into one subnet (one zone) instead, and each resume batch into
one type and zone (the provider's all-or-nothing gang launch).

Every field of a launch template is fixed at creation (the provider has no update): a change makes a new template,
whose id is in the controller's nodes.json, so the controller is replaced too; its Slurm state is on CFS.
"""
from __future__ import annotations

import base64
from dataclasses import dataclass

import pulumi
from tencentcloud_iac_pulumi import cvm

from infra.config import Partition
from infra.tencent import derive
from infra.userdata import render_node_user_data

COMPONENT = "gpufleet:tencent:Partition"


@dataclass(frozen=True)
class PartitionArgs:
    prefix: str
    partition: Partition
    image_id: pulumi.Input[str]
    vpc_id: pulumi.Input[str]
    subnet_ids: pulumi.Input[list]           # where its nodes launch (derive.partition_subnets)
    zones: pulumi.Input[list]                # the zone of each of those subnets
    security_group_id: pulumi.Input[str]
    role_name: pulumi.Input[str]             # the nodes' CAM role
    node_settings: pulumi.Input[dict]        # node.json, see infra.userdata
    tags: dict


def props(part: Partition, subnet_ids) -> dict:
    """What the partition is, as the component's properties (the policy pack reads them)."""
    return {"partition": part.name, "instanceTypes": list(part.instance_types), "maxNodes": part.nodes.max,
            "alwaysOn": part.nodes.min, "spot": part.spot, "onDemandBase": part.on_demand_base, "gang": part.gang,
            "gpusPerNode": part.primary.gpus, "subnetIds": subnet_ids}


def user_data(node: dict) -> str:
    return base64.b64encode(render_node_user_data(node).encode()).decode()


class PartitionNodes(pulumi.ComponentResource):
    def __init__(self, name: str, args: PartitionArgs, opts: pulumi.ResourceOptions | None = None):
        part = args.partition
        super().__init__(COMPONENT, name, props(part, args.subnet_ids), opts)
        child = pulumi.ResourceOptions(parent=self)
        p, tags = f"{args.prefix}-{part.name}", args.tags
        first = pulumi.Output.all(args.subnet_ids, args.zones).apply(lambda v: (v[0][0], v[1][0]))
        self.launch_template = cvm.LaunchTemplate(
            f"{p}-node", launch_template_name=f"{p}-node",
            launch_template_version_description=f"{p}: GPU nodes of Slurm partition {part.name}",
            placement={"zone": first.apply(lambda f: f[1]), "project_id": 0},
            image_id=args.image_id, instance_type=part.instance_types[0], instance_name=f"{p}-node",
            instance_charge_type=derive.ON_DEMAND, cam_role_name=args.role_name,
            system_disk={"disk_type": derive.SYSTEM_DISK_TYPE, "disk_size": derive.NODE_SYSTEM_DISK_GB},
            virtual_private_cloud={"vpc_id": args.vpc_id, "subnet_id": first.apply(lambda f: f[0])},
            security_group_ids=[args.security_group_id],
            internet_accessible={"public_ip_assigned": False, "internet_max_bandwidth_out": 0},
            login_settings={"keep_image_login": "TRUE"},
            enhanced_service={"monitor_service": {"enabled": True}, "security_service": {"enabled": True},
                              "automation_service": {"enabled": True}},
            user_data=pulumi.Output.from_input(args.node_settings).apply(user_data),
            tag_specifications=[{"resource_type": "instance",
                                 "tags": [{"key": k, "value": v} for k, v in tags.items()]}],
            tags=tags, opts=child)
        self.register_outputs({"launch_template": self.launch_template.id})
