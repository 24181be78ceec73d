"""The metrics nodes publish: names, units and dimensions.

The one source for the emitter (trainer.node.emf) and for the stack's dashboards and alarms (infra.metrics
imports this module; the trainer never imports infra). Pure: no cloud SDK, no torch.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Optional

ASG = "AutoScalingGroupName"     # the group name from node.json
INSTANCE = "InstanceId"          # this node, from the instance metadata
# Every metric is published twice: one series for the whole group (what alarms read) and one per node.
DIMENSION_SETS = ((ASG,), (ASG, INSTANCE))

GPU_UTILIZATION = "GPUUtilization"
THROUGHPUT = "Throughput"
STEP_TIME = "StepTime"
DATA_WAIT_SHARE = "DataWaitShare"
STEPS = "Steps"
CHECKPOINT_SECONDS = "CheckpointSeconds"
PREEMPTIONS = "Preemptions"
STEPS_LOST = "StepsLost"
TOKENS_PER_S = "TokensPerSecond"
TOKENS_PER_S_PER_GPU = "TokensPerSecondPerGPU"
MFU = "MFU"
PEAK_GPU_MEMORY = "PeakGPUMemory"
# The controller's gauges (the bridge, from Slurm's own state), published without dimensions.
PENDING_ALARM_S = 3600  # a job pending longer than this counts in PENDING_OVER_AN_HOUR
JOBS_PENDING = "JobsPending"
JOBS_RUNNING = "JobsRunning"
PENDING_OVER_AN_HOUR = "JobsPendingOverAnHour"
NODES_UP = "NodesUp"
NODES_FAILED_TO_RESUME = "NodesFailedToResume"
UNITS = {
    GPU_UTILIZATION: "Percent", THROUGHPUT: "Count/Second", STEP_TIME: "Seconds", DATA_WAIT_SHARE: "Percent",
    STEPS: "Count", CHECKPOINT_SECONDS: "Seconds", PREEMPTIONS: "Count", STEPS_LOST: "Count",
    TOKENS_PER_S: "Count/Second", TOKENS_PER_S_PER_GPU: "Count/Second", MFU: "Percent", PEAK_GPU_MEMORY: "Megabytes",
    JOBS_PENDING: "Count", JOBS_RUNNING: "Count", PENDING_OVER_AN_HOUR: "Count", NODES_UP: "Count",
    NODES_FAILED_TO_RESUME: "Count",
}


def namespace(stack: str) -> str:
    """The CloudWatch namespace of a stack's node metrics (the only one the node role may publish to)."""
    return f"gpufleet/{stack}"


def dimensions(group: Optional[str], instance: Optional[str]) -> dict[str, str]:
    """The dimension values of this node's metrics; a value it cannot tell is left out."""
    return {name: value for name, value in ((ASG, group), (INSTANCE, instance)) if value}


def dimension_sets(values: Mapping[str, str]) -> list[list[str]]:
    """The dimension sets a record with these values carries: each of DIMENSION_SETS it has every value
    for ([[]], no dimensions, off any group)."""
    sets = [list(s) for s in DIMENSION_SETS if all(name in values for name in s)]
    return sets or [[]]
