"""Azure stack: ND-series scale set on InfiniBand, locked-down storage, queue-driven autoscale."""
