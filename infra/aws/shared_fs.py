"""The shared file system: EFS for /home on the controller and every node, and for slurmctld's state.

Encrypted at rest with the stack key and in transit (the file system policy refuses any connection without
TLS; amazon-efs-utils mounts with ``tls,iam``), reachable only through mount targets in the stack's subnets whose
security group takes NFS from the nodes and the controller. Two access points: ``/home`` (users' scripts, their
``#SBATCH -o`` files, submitit's folders) and ``/slurm/state`` (StateSaveLocation, entered as the slurm user),
which a replacement controller mounts to pick up every queued and running job. Nodes may mount /home only and
never as root; the controller may mount both, as root on /home (it makes the users' directories).
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from infra.aws import policies
from infra.slurm import SLURM_GID, SLURM_UID, STATE_DIR

HOME = "/home"
STATE_PATH = "/slurm/state"
MOUNT_OPTIONS = "_netdev,noresvport,tls,iam"  # amazon-efs-utils' fstab options: TLS and IAM authorization


@dataclass(frozen=True)
class SharedFsArgs:
    prefix: str
    key_arn: pulumi.Input[str]
    subnet_ids: list[pulumi.Input[str]]
    security_group_id: pulumi.Input[str]
    node_role_arn: pulumi.Input[str]
    controller_role_arn: pulumi.Input[str]
    tags: dict[str, str]


def mount(fs_id: str, access_point_id: str, target: str) -> dict:
    """One entry of node.json's / controller.json's ``mounts``: an access point through amazon-efs-utils."""
    return {"source": f"{fs_id}:/", "target": target, "type": "efs",
            "options": f"{MOUNT_OPTIONS},accesspoint={access_point_id}"}


class SharedFs(pulumi.ComponentResource):
    def __init__(self, name: str, args: SharedFsArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpufleet:aws:SharedFs", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        p, tags = args.prefix, args.tags
        self.fs = aws.efs.FileSystem(
            f"{p}-shared", encrypted=True, kms_key_id=args.key_arn, performance_mode="generalPurpose",
            throughput_mode="elastic", lifecycle_policies=[{"transition_to_ia": "AFTER_30_DAYS"}],
            tags={**tags, "Name": f"{p}-shared"}, opts=child)
        aws.efs.BackupPolicy(f"{p}-shared-backup", file_system_id=self.fs.id, backup_policy={"status": "ENABLED"},
                             opts=child)
        self.mount_targets = [
            aws.efs.MountTarget(f"{p}-shared-{i}", file_system_id=self.fs.id, subnet_id=subnet,
                                security_groups=[args.security_group_id], opts=child)
            for i, subnet in enumerate(args.subnet_ids)]
        self.home = aws.efs.AccessPoint(
            f"{p}-home", file_system_id=self.fs.id,
            root_directory={"path": HOME, "creation_info": {"owner_uid": 0, "owner_gid": 0, "permissions": "0755"}},
            tags={**tags, "Name": f"{p}-home"}, opts=child)
        self.state = aws.efs.AccessPoint(
            f"{p}-slurm-state", file_system_id=self.fs.id,
            posix_user={"uid": SLURM_UID, "gid": SLURM_GID},
            root_directory={"path": STATE_PATH, "creation_info": {"owner_uid": SLURM_UID, "owner_gid": SLURM_GID,
                                                                  "permissions": "0700"}},
            tags={**tags, "Name": f"{p}-slurm-state"}, opts=child)
        aws.efs.FileSystemPolicy(
            f"{p}-shared-policy", file_system_id=self.fs.id,
            policy=pulumi.Output.all(self.fs.arn, self.home.arn, self.state.arn, args.node_role_arn,
                                     args.controller_role_arn).apply(
                lambda v: json.dumps(policies.shared_fs_policy(*v))),
            opts=child)
        self.node_mounts = pulumi.Output.all(self.fs.id, self.home.id).apply(
            lambda v: [mount(v[0], v[1], HOME)])
        self.controller_mounts = pulumi.Output.all(self.fs.id, self.home.id, self.state.id).apply(
            lambda v: [mount(v[0], v[1], HOME), mount(v[0], v[2], STATE_DIR)])
        self.register_outputs({"file_system": self.fs.id})
