"""gpufleet infrastructure: the Pulumi program, its configuration, catalog and offline preview."""
