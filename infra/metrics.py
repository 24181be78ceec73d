"""Metric names and dimensions: the one source for the nodes' emitter, the dashboards and the alarms.

The names live in the trainer package (`trainer.node.metric_names`, baked into the images, which must not
import infra); this module re-exports them and builds what the stack reads from them: alarm metric
stats and dashboard metric rows and searches, in the namespace and with the dimensions nodes publish.
"""
from __future__ import annotations

from trainer.node.metric_names import (ASG, GPU_UTILIZATION, INSTANCE, JOBS_PENDING, JOBS_RUNNING,  # noqa: F401
                                       NODES_FAILED_TO_RESUME, NODES_UP, PENDING_ALARM_S, PENDING_OVER_AN_HOUR,
                                       namespace)


def alarm_metric(namespace_: str, name: str, asg: str, stat: str, period: int) -> dict:
    """A MetricAlarm `metric_queries[].metric` reading the group-wide series of a node metric."""
    return {"namespace": namespace_, "metric_name": name, "dimensions": {ASG: asg}, "stat": stat, "period": period}


def dashboard_row(namespace_: str, name: str, asg: str, **options) -> list:
    """A dashboard `metrics` row for the group-wide series of a node metric."""
    return [namespace_, name, ASG, asg, *([options] if options else [])]


def per_node_search(namespace_: str, name: str, asg: str, stat: str, period: int) -> str:
    """A dashboard SEARCH expression giving one line per node of the group."""
    return (f"SEARCH('{{{namespace_},{ASG},{INSTANCE}}} MetricName=\"{name}\" {ASG}=\"{asg}\"', "
            f"'{stat}', {period})")
