"""The Slurm controller: one small on-demand VM that runs slurmctld, the bridge and Slurm's power saving.

It boots from the stack's image with the NIC that holds the controller's static address (infra/azure/network.py)
and its own user-assigned identity. Its custom data carries the rendered slurm.conf and gres.conf, the
power-saving config (nodes.json) and controller.json; slurmctld's state lives on the shared file system's
slurm-state share, so a replacement controller (after a failure, or a `pulumi up` that changes its custom data,
which Azure cannot change on a VM) takes every queued and running job over. Private subnet, no public address,
encryption at host, OS disk Premium SSD (with the stack's disk encryption set where it has one), SSH keys only.
"""
from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Optional

import pulumi
from pulumi_azure_native import compute

from infra import slurm
from infra.azure import derive
from infra.config import StackConfig
from infra.preview.cost import AZURE_CONTROLLER_OS_DISK_GB
from infra.userdata import render_controller_user_data
from trainer.slurm.conf import render_gres_conf, render_slurm_conf

HOSTNAME = "controller"  # SlurmctldHost: slurmctld starts only on the host of that short name (the computer name)
OS_DISK_GB = AZURE_CONTROLLER_OS_DISK_GB
# slurmctld's power-saving programs on the image (ami/files): each runs `gpufleet-trainer nodes ACTION HOSTLIST`.
PROGRAMS = {"resume": "/usr/local/sbin/gpufleet-resume", "suspend": "/usr/local/sbin/gpufleet-suspend",
            "resume_fail": "/usr/local/sbin/gpufleet-resume-fail"}
CUSTOM_DATA_LIMIT = 65535  # bytes of custom data Azure takes (osProfile.customData, before base64)


@dataclass(frozen=True)
class ControllerArgs:
    prefix: str
    size: str                                 # cfg.controller.instance_type
    resource_group: pulumi.Input[str]
    location: str
    image: derive.Image
    network_interface_id: pulumi.Input[str]
    identity_id: pulumi.Input[str]
    ssh_public_key: str
    custom_data: pulumi.Input[str]            # controller_custom_data(...)
    disk_encryption_set_id: Optional[pulumi.Input[str]]
    tags: dict
    wait_for: tuple = ()                      # its rights, the shared file system, the munge secret


def controller_user_data(cfg: StackConfig, controller_addr: str, settings: dict, nodes: dict) -> str:
    """The controller's cloud-config: slurm.conf from the runtime's pure renderer (infra.slurm.cluster +
    trainer.slurm.conf), gres.conf, controller.json and nodes.json."""
    cluster = slurm.cluster(cfg, HOSTNAME, PROGRAMS, controller_addr=controller_addr)
    text = render_controller_user_data(settings, render_slurm_conf(cluster), render_gres_conf(cluster), nodes)
    size = len(text.encode())
    if size > CUSTOM_DATA_LIMIT:
        raise ValueError(f"controller custom data is {size} bytes; Azure takes at most {CUSTOM_DATA_LIMIT}")
    return text


def encode(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


class Controller(pulumi.ComponentResource):
    def __init__(self, name: str, args: ControllerArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpufleet:azure:Controller", name, None, opts)
        managed_disk = compute.ManagedDiskParametersArgs(
            storage_account_type="Premium_LRS",
            disk_encryption_set=(compute.DiskEncryptionSetParametersArgs(id=args.disk_encryption_set_id)
                                 if args.disk_encryption_set_id else None))
        self.vm = compute.VirtualMachine(
            f"{name}-vm",
            vm_name=f"{args.prefix}-controller",
            resource_group_name=args.resource_group,
            location=args.location,
            hardware_profile=compute.HardwareProfileArgs(vm_size=args.size),
            os_profile=compute.OSProfileArgs(
                computer_name=HOSTNAME,
                admin_username=derive.ADMIN_USER,
                custom_data=args.custom_data,
                linux_configuration=compute.LinuxConfigurationArgs(
                    disable_password_authentication=True,
                    ssh=compute.SshConfigurationArgs(public_keys=[compute.SshPublicKeyArgs(
                        path=f"/home/{derive.ADMIN_USER}/.ssh/authorized_keys", key_data=args.ssh_public_key)]),
                ),
            ),
            storage_profile=compute.StorageProfileArgs(
                image_reference=compute.ImageReferenceArgs(**args.image.reference),
                os_disk=compute.OSDiskArgs(create_option="FromImage", caching="ReadWrite", disk_size_gb=OS_DISK_GB,
                                           managed_disk=managed_disk, delete_option="Delete"),
            ),
            # The NIC (and with it the address the nodes know) stays when the VM goes.
            network_profile=compute.NetworkProfileArgs(network_interfaces=[compute.NetworkInterfaceReferenceArgs(
                id=args.network_interface_id, primary=True, delete_option="Detach")]),
            security_profile=compute.SecurityProfileArgs(encryption_at_host=True),
            identity=compute.VirtualMachineIdentityArgs(type="UserAssigned",
                                                        user_assigned_identities=[args.identity_id]),
            priority="Regular",
            # boot diagnostics in Azure's managed storage: the serial console for a controller that does not boot
            diagnostics_profile=compute.DiagnosticsProfileArgs(
                boot_diagnostics=compute.BootDiagnosticsArgs(enabled=True)),
            plan=compute.PlanArgs(**args.image.plan) if args.image.plan else None,
            tags=args.tags,
            # Azure cannot change a VM's custom data: a new one replaces it, after the old one let go of the NIC.
            opts=pulumi.ResourceOptions(parent=self, depends_on=list(args.wait_for), delete_before_replace=True,
                                        replace_on_changes=["osProfile.customData"]),
        )
        self.register_outputs({"vm": self.vm.id})
