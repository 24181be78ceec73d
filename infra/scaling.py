"""Scaling math for the node group: capacity bounds per mode and the queue-backlog steps.

Queue mode runs one job per node. The backlog is every job not yet finished: messages waiting
(ApproximateNumberOfMessagesVisible) plus messages being worked on (ApproximateNumberOfMessagesNotVisible,
the in-flight jobs). The wanted capacity is ceil(backlog / jobs_per_node), clamped to [min, max];
an empty queue with nothing in flight wants `min`, which is zero for a scale-to-zero stack.
On AWS the rule runs as one step-scaling policy with ExactCapacity adjustments driven by an alarm
on the backlog (threshold 0, so the alarm is always in ALARM and Auto Scaling re-applies the policy
every minute). Auto Scaling allows at most 20 step adjustments per policy; above that the steps
round capacity up to the next step, so no waiting job is left without a node.
Gang mode holds a fixed size: one multi-node job needs all its nodes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

JOBS_PER_NODE = 1
MAX_STEP_ADJUSTMENTS = 20
# CloudWatch metric-math ids: "visible" and "in_flight" are the two SQS queue metrics.
BACKLOG_EXPRESSION = "FILL(visible, 0) + FILL(in_flight, 0)"


@dataclass(frozen=True)
class Capacity:
    min: int
    max: int
    desired: int


@dataclass(frozen=True)
class Step:
    """A step adjustment: backlog in [lower, upper) sets the group to `capacity` (None: unbounded)."""
    lower: Optional[float]
    upper: Optional[float]
    capacity: int


def capacity(mode: str, min_size: int, max_size: int, desired: int) -> Capacity:
    """Group bounds: queue mode scales between min and max; gang mode holds max nodes."""
    if mode == "gang":
        return Capacity(max_size, max_size, max_size)
    return Capacity(min_size, max_size, desired)


def desired_for_backlog(visible: int, in_flight: int, min_size: int, max_size: int,
                        jobs_per_node: int = JOBS_PER_NODE) -> int:
    """Nodes wanted for `visible` waiting and `in_flight` running jobs."""
    wanted = math.ceil((visible + in_flight) / jobs_per_node)
    return max(min_size, min(max_size, wanted))


def _step_capacities(min_size: int, max_size: int, max_steps: int) -> list[int]:
    if max_size - min_size + 1 <= max_steps:
        return list(range(min_size, max_size + 1))
    span = max_size - min_size
    return sorted({min_size + math.ceil(i * span / (max_steps - 1)) for i in range(max_steps)})


def backlog_steps(min_size: int, max_size: int, jobs_per_node: int = JOBS_PER_NODE,
                  max_steps: int = MAX_STEP_ADJUSTMENTS) -> list[Step]:
    """ExactCapacity steps over the backlog (alarm threshold 0). Bounds sit half-way between
    integers, so an integer backlog never lands on a boundary."""
    caps = _step_capacities(min_size, max_size, max_steps)
    steps, lower = [], 0.0
    for i, cap in enumerate(caps):
        upper = None if i == len(caps) - 1 else cap * jobs_per_node + 0.5
        steps.append(Step(lower, upper, cap))
        lower = upper
    return steps


def step_capacity(steps: Sequence[Step], backlog: float) -> int:
    """The capacity Auto Scaling sets for `backlog` (lower bound inclusive, upper exclusive)."""
    for step in steps:
        if (step.lower is None or backlog >= step.lower) and (step.upper is None or backlog < step.upper):
            return step.capacity
    raise ValueError(f"backlog {backlog} is below every step")
