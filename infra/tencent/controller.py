"""The Slurm controller: one small pay-as-you-go CVM that runs slurmctld, the bridge and power saving.

Its address is fixed: the instance's own private IP, ``derive.CONTROLLER_IP``, in a subnet of its own where no node
is ever launched. A replacement (after a failure, or a ``pulumi up`` that changes its user-data or a partition's
launch template) is made only after the old instance is gone (delete before replace), and takes the same address,
so the nodes' slurmd and node.json (``--conf-server``) keep finding it. A second network interface would keep an
address too, but Tencent's primary interface cannot be detached, so the controller would have to move slurmctld
onto a secondary interface the image must configure; the primary address in a dedicated subnet needs nothing of
the image.

Private subnet, no public IP and no internet bandwidth, the controller security group, its own CAM role (its policy,
``derive.controller_policy``, is made here and attached before the instance boots), the image's own login (no key,
no password; shell access through TencentCloud Automation Tools). Its user-data carries controller.json, the
rendered slurm.conf and gres.conf, and the power-saving config (nodes.json); slurmctld's state is on the state file
system (infra.tencent.shared_fs), so a replacement controller takes every queued and running job over.

The system disk is not encrypted with the stack key: tencentcloud-iac-pulumi 0.2 (the newest on PyPI) has no
system-disk encryption argument on instance.Instance (the Terraform provider added ``system_disk_encrypt`` and
``system_disk_kms_key_id`` in 2026; RunInstances' SystemDisk.Encrypt is marked beta). The controller's secrets are
not kept there by the stack: the munge key is read from SSM at boot, the Slurm state is on CFS.
"""
from __future__ import annotations

import base64
import json
from dataclasses import dataclass

import pulumi
from tencentcloud_iac_pulumi import cam, instance

from infra.tencent import derive


@dataclass(frozen=True)
class ControllerArgs:
    prefix: str
    policy_name: str
    instance_type: str
    image_id: pulumi.Input[str]
    zone: pulumi.Input[str]
    vpc_id: pulumi.Input[str]
    subnet_id: pulumi.Input[str]              # the controller's own subnet
    security_group_id: pulumi.Input[str]
    role_id: pulumi.Input[str]
    role_name: pulumi.Input[str]
    policy: pulumi.Input[dict]                # derive.controller_policy(...)
    user_data: pulumi.Input[str]              # infra.userdata.render_controller_user_data(...)
    ready: list                               # what must exist before it boots (munge secret, file systems' rules)
    tags: dict


class Controller(pulumi.ComponentResource):
    def __init__(self, name: str, args: ControllerArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpufleet:tencent:Controller", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        p = args.prefix
        self.policy = cam.Policy(
            f"{p}-controller-policy", name=args.policy_name,
            document=pulumi.Output.from_input(args.policy).apply(json.dumps),
            description="gpufleet Slurm controller: launch and end this stack's nodes, munge key, queue, records",
            opts=child)
        attachment = cam.RolePolicyAttachment(f"{p}-controller-policy-attachment", role_id=args.role_id,
                                              policy_id=self.policy.id, opts=child)
        self.instance = instance.Instance(
            f"{p}-controller", instance_name=f"{p}-controller", hostname=derive.CONTROLLER_HOSTNAME,
            availability_zone=args.zone, image_id=args.image_id, instance_type=args.instance_type,
            instance_charge_type=derive.ON_DEMAND, vpc_id=args.vpc_id, subnet_id=args.subnet_id,
            private_ip=derive.CONTROLLER_IP, orderly_security_groups=[args.security_group_id],
            allocate_public_ip=False, internet_max_bandwidth_out=0, cam_role_name=args.role_name,
            system_disk_type=derive.SYSTEM_DISK_TYPE, system_disk_size=derive.CONTROLLER_SYSTEM_DISK_GB,
            keep_image_login=True, disable_monitor_service=False, disable_automation_service=False,
            disable_security_service=False,
            user_data=pulumi.Output.from_input(args.user_data).apply(
                lambda text: base64.b64encode(text.encode()).decode()),
            user_data_replace_on_change=True, tags=args.tags,
            # The address is the instance's: the old one lets go of it before the new one takes it.
            opts=pulumi.ResourceOptions(parent=self, depends_on=[attachment, *args.ready],
                                        delete_before_replace=True))
        self.register_outputs({"instance": self.instance.id, "address": self.instance.private_ip})
