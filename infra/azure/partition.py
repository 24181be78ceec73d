"""A Slurm partition on Azure: the group its GPU nodes' VMs join when slurmctld powers them up.

Nothing here runs a node: the controller's node provider (trainer.clouds.azure_nodes) creates one VM per Slurm node
from nodes.json, in the nodes' resource group, and deletes it when Slurm powers the node down. Where a VM goes:
- a queue partition (and a one-node gang): a Flexible orchestration scale set with one fault domain, so spot and
  on-demand VMs mix in it. The set has no VM profile and no capacity of its own (the provider sends whole VM
  bodies) and no autoscale: Slurm's power saving sizes the partition.
- a multi-node gang partition: an availability set (one fault domain, one update domain, managed disks: Aligned).
  Azure's Flexible scale sets have no InfiniBand; VMs of one availability set share one InfiniBand fabric, as a
  Uniform set in one placement group would. Spot VMs are not allowed in availability sets
  (LowPriVMNotSupportedInAvailabilitySet), so such a partition runs on demand (the stack config says so).

The component's properties say what the partition is; the policy pack judges partitions by them.
"""
from __future__ import annotations

from dataclasses import dataclass

import pulumi
from pulumi_azure_native import compute

from infra.azure import derive
from infra.config import Partition

COMPONENT = "gpufleet:azure:Partition"
FAULT_DOMAINS = 1


@dataclass(frozen=True)
class PartitionArgs:
    prefix: str                            # derive.base_name
    partition: Partition
    resource_group: pulumi.Input[str]      # the nodes' group (derive.nodes_group_name)
    location: str
    tags: dict


def props(part: Partition) -> dict:
    """What the partition is, as the component's properties (the policy pack reads them)."""
    row = part.primary
    return {"partition": part.name, "vmSize": row.name, "instanceTypes": list(part.instance_types),
            "maxNodes": part.nodes.max, "alwaysOn": part.nodes.min, "spot": part.spot,
            "onDemandBase": part.on_demand_base, "gang": part.gang, "gpusPerNode": row.gpus,
            "infiniband": row.infiniband_gbps > 0, "placement": derive.placement(part)}


class PartitionNodes(pulumi.ComponentResource):
    group_id: pulumi.Output[str]

    def __init__(self, name: str, args: PartitionArgs, opts: pulumi.ResourceOptions | None = None):
        part = args.partition
        super().__init__(COMPONENT, name, props(part), opts)
        child = pulumi.ResourceOptions(parent=self)
        group_name = f"{args.prefix}-{part.name}"
        if derive.placement(part) == "availability_set":
            self.availability_set = compute.AvailabilitySet(
                f"{name}-avset", availability_set_name=group_name, resource_group_name=args.resource_group,
                location=args.location, platform_fault_domain_count=FAULT_DOMAINS, platform_update_domain_count=1,
                sku=compute.SkuArgs(name="Aligned"), tags=args.tags, opts=child)
            self.group_id = self.availability_set.id
        else:
            self.scale_set = compute.VirtualMachineScaleSet(
                f"{name}-vmss", vm_scale_set_name=group_name, resource_group_name=args.resource_group,
                location=args.location, orchestration_mode="Flexible", platform_fault_domain_count=FAULT_DOMAINS,
                single_placement_group=False, tags=args.tags, opts=child)
            self.group_id = self.scale_set.id
        self.register_outputs({"group": self.group_id})
