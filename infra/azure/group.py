"""Resource groups: the stack's own, and the GPU nodes' (the VMs, NICs and disks the controller makes, and the
partitions' scale sets and availability sets: the one group the controller's compute rights reach)."""
from __future__ import annotations

import pulumi
from pulumi_azure_native import resources


class ResourceGroup(pulumi.ComponentResource):
    group_name: pulumi.Output[str]
    group_id: pulumi.Output[str]

    def __init__(self, name: str, group_name: str, location: str, tags: dict,
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpufleet:azure:ResourceGroup", name, None, opts)
        self.group = resources.ResourceGroup(f"{name}-rg", resource_group_name=group_name, location=location,
                                             tags=tags, opts=pulumi.ResourceOptions(parent=self))
        self.group_name = self.group.name
        self.group_id = self.group.id
        self.register_outputs({"name": self.group.name})
