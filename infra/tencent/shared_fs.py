"""The shared file systems: CFS (general-purpose Standard, NFS) for /home on the controller and every node, and a
second one for slurmctld's state, which a replacement controller mounts to pick up every queued and running job.

Two file systems, not one with two directories: CFS has no access points, and its permission groups admit client
addresses, not directories. So /home's group admits the node subnets (root squashed) and the controller (as root:
it makes the users' directories), and the state's group admits the controller's fixed address only: no node can
mount the scheduler's state, job scripts and environments. Each is mounted at its root (``<mount ip>:/``), so no
directory has to exist before the first mount. Both mount targets sit in the controller's subnet at fixed
addresses; CFS serves the whole VPC of the region, so nodes in the other zones mount across zones.

What CFS does not offer, plainly:
- No TLS: CFS speaks NFS v3/v4.0 in the clear inside the VPC; nothing here encrypts /home or the state in transit
  (the EFS mounts of the AWS stack use TLS).
- No encryption setting: CreateCfsFileSystem (CFS API 2019-07-19) takes no key or encryption flag, though
  DescribeCfsFileSystems reports ``Encrypted`` and ``KmsKeyId``, and tencentcloud's cfs.FileSystem has no argument
  for either. These file systems are not encrypted with the stack key. Checkpoints and data belong in the
  KMS-encrypted bucket; /home holds users' scripts and job output, and the state file system the queued jobs'
  scripts and environments.
"""
from __future__ import annotations

from dataclasses import dataclass

import pulumi
from tencentcloud_iac_pulumi import cfs

from infra.tencent import derive

STORAGE_TYPE = "SD"   # general-purpose Standard (billed per GiB stored, hourly peak)
PROTOCOL = "NFS"


@dataclass(frozen=True)
class SharedFsArgs:
    prefix: str
    zone: pulumi.Input[str]               # the controller subnet's zone
    vpc_id: pulumi.Input[str]
    subnet_id: pulumi.Input[str]          # the controller's subnet
    node_cidrs: list[str]                 # the node subnets, admitted to /home
    tags: dict


class SharedFs(pulumi.ComponentResource):
    def __init__(self, name: str, args: SharedFsArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpufleet:tencent:SharedFs", name, None, opts)
        p = args.prefix
        self.home_group, self.home_rules, self.home = self._file_system(
            args, f"{p}-home", derive.HOME_FS_IP, derive.home_access_rules(args.node_cidrs),
            "/home of the controller and the nodes: node subnets root-squashed, the controller as root")
        self.state_group, self.state_rules, self.state = self._file_system(
            args, f"{p}-slurm-state", derive.STATE_FS_IP, derive.state_access_rules(),
            "slurmctld's state: the controller's address only")
        self.rules = self.home_rules + self.state_rules
        self.node_mounts = self.home.mount_ip.apply(derive.node_mounts)
        self.controller_mounts = pulumi.Output.all(self.home.mount_ip, self.state.mount_ip).apply(
            lambda v: derive.controller_mounts(*v))
        self.register_outputs({"home": self.home.id, "state": self.state.id})

    def _file_system(self, args: SharedFsArgs, name: str, mount_ip: str, rules: list[dict], description: str):
        child = pulumi.ResourceOptions(parent=self)
        group = cfs.AccessGroup(name, name=name, description=description, opts=child)
        made = [cfs.AccessRule(f"{name}-{i}", access_group_id=group.id, **rule, opts=child)
                for i, rule in enumerate(rules)]
        fs = cfs.FileSystem(
            name, name=name, availability_zone=args.zone, access_group_id=group.id, protocol=PROTOCOL,
            storage_type=STORAGE_TYPE, net_interface="VPC", vpc_id=args.vpc_id, subnet_id=args.subnet_id,
            mount_ip=mount_ip, tags=args.tags, opts=child)
        return group, made, fs
