"""Compute: the GPU scale set. Uniform orchestration in one placement group with one fault domain, so
every VM shares the InfiniBand fabric; SSH keys only, encryption at host, no public IP; spot when asked;
a terminate notice in Scheduled Events so a node can checkpoint before it is deleted."""
from __future__ import annotations

from dataclasses import dataclass

import pulumi
from pulumi_azure_native import compute

from infra.azure import derive

TERMINATE_NOTICE = "PT10M"  # 5-15 minutes allowed; the trainer checkpoints well within it


@dataclass(frozen=True)
class ScaleSetArgs:
    name: str
    resource_group: pulumi.Input[str]
    location: str
    size: str
    capacity: int
    spot: bool
    subnet_id: pulumi.Input[str]
    identity_id: pulumi.Input[str]
    ssh_public_key: str
    image: derive.Image
    custom_data: pulumi.Input[str]  # base64 cloud-config
    accelerated_networking: bool
    tags: dict
    autoscaled: bool  # True: the autoscale setting owns the instance count after creation
    wait_for: tuple = ()    # resources the VMs need before the first boots (role assignments)
    os_disk_gb: int = 256


class ScaleSet(pulumi.ComponentResource):
    id: pulumi.Output[str]
    vmss_name: pulumi.Output[str]

    def __init__(self, name: str, args: ScaleSetArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpufleet:azure:ScaleSet", name, None, opts)
        if args.spot:
            pricing = {"priority": "Spot", "eviction_policy": "Delete",
                       "billing_profile": compute.BillingProfileArgs(max_price=-1)}  # never evicted on price
        else:
            pricing = {"priority": "Regular"}
        profile = compute.VirtualMachineScaleSetVMProfileArgs(
            os_profile=compute.VirtualMachineScaleSetOSProfileArgs(
                computer_name_prefix=args.name[:15].rstrip("-"),
                admin_username=derive.ADMIN_USER,
                custom_data=args.custom_data,
                linux_configuration=compute.LinuxConfigurationArgs(
                    disable_password_authentication=True,
                    ssh=compute.SshConfigurationArgs(public_keys=[compute.SshPublicKeyArgs(
                        path=f"/home/{derive.ADMIN_USER}/.ssh/authorized_keys", key_data=args.ssh_public_key)]),
                ),
            ),
            storage_profile=compute.VirtualMachineScaleSetStorageProfileArgs(
                image_reference=compute.ImageReferenceArgs(**args.image.reference),
                os_disk=compute.VirtualMachineScaleSetOSDiskArgs(
                    create_option="FromImage",
                    caching="ReadWrite",
                    disk_size_gb=args.os_disk_gb,
                    managed_disk=compute.VirtualMachineScaleSetManagedDiskParametersArgs(
                        storage_account_type="Premium_LRS"),
                ),
            ),
            network_profile=compute.VirtualMachineScaleSetNetworkProfileArgs(
                network_interface_configurations=[compute.VirtualMachineScaleSetNetworkConfigurationArgs(
                    name="nic0",
                    primary=True,
                    enable_accelerated_networking=args.accelerated_networking,
                    ip_configurations=[compute.VirtualMachineScaleSetIPConfigurationArgs(
                        name="ipconfig0", primary=True,
                        subnet=compute.ApiEntityReferenceArgs(id=args.subnet_id))],
                )],
            ),
            security_profile=compute.SecurityProfileArgs(encryption_at_host=True),
            scheduled_events_profile=compute.ScheduledEventsProfileArgs(
                terminate_notification_profile=compute.TerminateNotificationProfileArgs(
                    enable=True, not_before_timeout=TERMINATE_NOTICE)),
            **pricing,
        )
        plan = compute.PlanArgs(**args.image.plan) if args.image.plan else None
        self.vmss = compute.VirtualMachineScaleSet(
            f"{name}-vmss",
            vm_scale_set_name=args.name,
            resource_group_name=args.resource_group,
            location=args.location,
            sku=compute.SkuArgs(name=args.size, tier="Standard", capacity=args.capacity),
            orchestration_mode="Uniform",
            single_placement_group=True,
            platform_fault_domain_count=1,
            overprovision=False,
            upgrade_policy=compute.UpgradePolicyArgs(mode="Manual"),
            identity=compute.VirtualMachineScaleSetIdentityArgs(
                type="UserAssigned", user_assigned_identities=[args.identity_id]),
            plan=plan,
            virtual_machine_profile=profile,
            tags=args.tags,
            opts=pulumi.ResourceOptions(parent=self, depends_on=list(args.wait_for),
                                        ignore_changes=["sku.capacity"] if args.autoscaled else None),
        )
        self.id = self.vmss.id
        self.vmss_name = self.vmss.name
        self.register_outputs({"id": self.vmss.id, "name": self.vmss.name})
