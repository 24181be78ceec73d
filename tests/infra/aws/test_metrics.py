"""The dashboard and every alarm read only metrics the trainer emits, with the dimensions it emits them.

The emitted side is the trainer's own code: on a node, its emitter (GPU sampler, metrics-file summary, preemption
events) fed with the dimensions an AWS node derives from its node.json and instance id; on the controller, the
bridge's job gauges and the healer's node gauges (`trainer nodes heal`), each through the code its daemon runs, in
the namespace they read from the controller.json the stack's user-data writes. The read side is parsed from the
rendered dashboard body and alarm inputs, metric rows and SEARCH expressions alike.
"""
from __future__ import annotations

import io
import json
import re
import threading

import pytest

from trainer.node import metric_names
from trainer.node.emf import Emitter, GpuSampler, MetricsTail
from trainer.slurm import batch, bridge, nodes
from trainer.slurm.client import SlurmJob, SlurmNode

T_ALARM = "aws:cloudwatch/metricAlarm:MetricAlarm"
T_DASHBOARD = "aws:cloudwatch/dashboard:Dashboard"
INSTANCE = "i-0123456789abcdef0"


@pytest.fixture(params=["dev", "prod"])
def built(request):
    return request.getfixturevalue(request.param)


def emitted(node: dict, tmp_path) -> set[tuple[str, str, frozenset]]:
    """(namespace, metric, {dimension: value}) of every series the agent's EMF lines create."""
    out = io.StringIO()
    emitter = Emitter(node["metric_namespace"], out, metric_names.dimensions(node["asg_name"], INSTANCE))
    GpuSampler(emitter, gpu=lambda: 42.0).flush()
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(json.dumps({"step": 1, "loss": 1.0, "step_time_s": 0.5, "samples_per_s": 64.0,
                                   "data_wait_frac": 0.1, "checkpoint_s": 2.0}) + "\n")
    MetricsTail(metrics, emitter).flush()
    emitter.emit({metric_names.PREEMPTIONS: 1.0, metric_names.STEPS_LOST: 3.0})  # as the agent does
    return series_of(out.getvalue())


def series_of(emf: str) -> set[tuple[str, str, frozenset]]:
    series = set()
    for line in emf.splitlines():
        doc = json.loads(line)
        for directive in doc["_aws"]["CloudWatchMetrics"]:
            for dims in directive["Dimensions"]:
                for metric in directive["Metrics"]:
                    series.add((directive["Namespace"], metric["Name"], frozenset((d, doc[d]) for d in dims)))
    return series


class OneRound:
    """Slurm for one round of the healer: two nodes, one whose machine could not be started."""

    def __init__(self, stop: threading.Event):
        self.stop = stop

    def nodes(self) -> list[SlurmNode]:
        self.stop.set()
        return [SlurmNode("gpu-1", "allocated", "", None),
                SlurmNode("gpu-2", "down#", "resume failed: InsufficientInstanceCapacity: none", 1.8e9)]

    def update_node(self, name: str, **fields: str) -> None:
        pass


def controller_emitted(built, tmp_path) -> set[tuple[str, str, frozenset]]:
    """(namespace, metric, {dimension: value}) of every series the controller's bridge and healer create: their
    namespace from the stack's controller.json, their EMF file as the units give it."""
    settings = tmp_path / "controller.json"
    settings.write_text(json.dumps(built.controller_file("/etc/gpufleet/controller.json")))
    namespace = bridge.metric_namespace(None, str(settings))
    emf = tmp_path / "controller-metrics.log"
    b = bridge.Bridge(None, lambda team: None, batch.Site("b", "python", "/tmp"), clock=lambda: 1.8e9,
                      emitter=bridge.gauge_emitter(str(emf), namespace, "controller"))
    b.listed = [SlurmJob(id="7", array_job_id=None, array_task_id=None, name="x", comment="", state="PENDING",
                         reason="Resources", description="", exit_code=0, restarts=0, nodes=(), user="u",
                         partition="gpu", submit_time=1.8e9 - 7200, start_time=None, end_time=None)]
    b.publish()
    stop = threading.Event()
    nodes.serve_heal(stop, every_s=0.001, emitter=bridge.gauge_emitter(str(emf), namespace, "nodes heal"),
                     slurm=OneRound(stop))
    return series_of(emf.read_text())


_SEARCH = re.compile(r"SEARCH\('\{(?P<schema>[^}]*)\}\s*(?P<terms>.*?)'\s*,")


def read_by_dashboard(body: dict) -> list[tuple[str, str, dict, bool]]:
    """(namespace, metric, dimensions, exact) of every metric row and SEARCH of a dashboard body; for a
    SEARCH, dimensions are the schema's names with the values the terms fix (None where any value)."""
    found = []
    for widget in body["widgets"]:
        for row in widget["properties"].get("metrics", []):
            if isinstance(row[0], dict):
                match = _SEARCH.search(row[0].get("expression", ""))
                assert match, row
                namespace, *names = [p.strip() for p in match["schema"].split(",")]
                terms = dict(re.findall(r'(\w+)="([^"]*)"', match["terms"]))
                metric = terms.pop("MetricName")
                assert set(terms) <= set(names), row
                found.append((namespace, metric, {n: terms.get(n) for n in names}, False))
            else:
                fields = [f for f in row if not isinstance(f, dict)]
                namespace, metric, rest = fields[0], fields[1], fields[2:]
                found.append((namespace, metric, dict(zip(rest[::2], rest[1::2])), True))
    return found


def read_by_alarm(alarm: dict) -> list[tuple[str, str, dict, bool]]:
    if alarm.get("metricName"):
        return [(alarm["namespace"], alarm["metricName"], alarm.get("dimensions", {}), True)]
    return [(q["metric"]["namespace"], q["metric"]["metricName"], q["metric"].get("dimensions", {}), True)
            for q in alarm.get("metricQueries", []) if "metric" in q]


def is_emitted(ref: tuple[str, str, dict, bool], series: set) -> bool:
    namespace, metric, dims, exact = ref
    for ns, name, emitted_dims in series:
        given = dict(emitted_dims)
        if (ns, name) != (namespace, metric) or set(given) != set(dims):
            continue
        if all(v is None and not exact or given[k] == v for k, v in dims.items()):
            return True
    return False


GAUGES = (metric_names.JOBS_PENDING, metric_names.JOBS_RUNNING, metric_names.PENDING_OVER_AN_HOUR,
          metric_names.NODES_UP, metric_names.NODES_FAILED_TO_RESUME)


def test_every_metric_the_stack_reads_is_emitted_with_its_dimensions(built, tmp_path):
    node = built.node_json()
    namespace = node["metric_namespace"]
    assert namespace == built.outputs["metricNamespace"] == metric_names.namespace(built.cfg.stack)
    controller = controller_emitted(built, tmp_path)
    assert {ns for ns, _, _ in controller} == {namespace}
    series = emitted(node, tmp_path) | controller
    body = json.loads(built.one(T_DASHBOARD).inputs["dashboardBody"])
    refs = read_by_dashboard(body) + [r for a in built.of_type(T_ALARM) for r in read_by_alarm(a.inputs)]
    ours = [r for r in refs if r[0] == namespace]
    assert not [r for r in refs if r[0].startswith("gpufleet/") and r[0] != namespace]
    # the idle-GPU alarm and the group and per-node GPU views read node metrics
    assert {(r[1], tuple(sorted(r[2])), r[3]) for r in ours} >= {
        ("GPUUtilization", ("AutoScalingGroupName",), True), ("GPUUtilization", ("AutoScalingGroupName", "InstanceId"),
                                                               False)}
    # the alarms on jobs pending too long and nodes that failed to power up, and the dashboard's job and node
    # widgets, read the controller's gauges: one series per stack, no dimension
    assert {(r[1], tuple(sorted(r[2])), r[3]) for r in ours} >= {(g, (), True) for g in GAUGES}
    missing = [r for r in ours if not is_emitted(r, series)]
    assert missing == []


def test_a_metric_read_under_other_dimensions_is_caught(prod, tmp_path):
    """The mismatch this guards against: the nodes publishing without the group's dimension."""
    node = prod.node_json()
    series = emitted(node, tmp_path)
    undimensioned = {(ns, name, frozenset()) for ns, name, _ in series}
    gpu = (node["metric_namespace"], "GPUUtilization", {"AutoScalingGroupName": node["asg_name"]}, True)
    assert is_emitted(gpu, series) and not is_emitted(gpu, undimensioned)
    other_group = (gpu[0], gpu[1], {"AutoScalingGroupName": "someone-else"}, True)
    assert not is_emitted(other_group, series)


def test_a_gauge_published_under_a_dimension_is_caught(dev, tmp_path):
    """The mismatch this guards against on the controller: a gauge with a dimension the alarm does not name."""
    series = controller_emitted(dev, tmp_path)
    namespace = dev.node_json()["metric_namespace"]
    pending_long = (namespace, metric_names.PENDING_OVER_AN_HOUR, {}, True)
    assert is_emitted(pending_long, series)
    grouped = {(ns, name, frozenset({("AutoScalingGroupName", "g")})) for ns, name, _ in series}
    assert not is_emitted(pending_long, grouped)
