"""The controller's gauges, which the stack's alarms and dashboard read (no dimensions: one series per stack): the
bridge's job gauges (pending, running, pending for over PENDING_ALARM_S) and the healer's node gauges (powered up,
failed to resume), each a pure function of what squeue and sinfo list, published once a minute as EMF records in
the stack's namespace (controller.json's), to the file GPUFLEET_EMF_LOG names ("-": standard output).

The jobs and nodes are as the client reads them (tests/trainer/slurm/test_slurm_formats.py); the clocks are
injected."""
from __future__ import annotations

import io
import json
import sys

import pytest

from trainer.errors import UsageError
from trainer.node import metric_names
from trainer.node.emf import Emitter
from trainer.slurm import batch
from trainer.slurm.bridge import Bridge, gauge_emitter, job_gauges, metric_namespace
from trainer.slurm.client import SlurmJob, SlurmNode
from trainer.slurm.nodes import node_gauges

NOW = 1_800_000_000.0
HOUR = metric_names.PENDING_ALARM_S


def job(state: str, submitted_ago: float | None = 60.0, reason: str = "None", tasks: int = 1,
        restarts: int = 0) -> SlurmJob:
    return SlurmJob(id="1", array_job_id=1 if tasks > 1 else None, array_task_id=None, name="x", comment="",
                    state=state, reason=reason, description="", exit_code=0, restarts=restarts, nodes=(), user="u",
                    partition="gpu", submit_time=None if submitted_ago is None else NOW - submitted_ago,
                    start_time=None, end_time=None, tasks=tasks)


@pytest.mark.parametrize("jobs, pending, running, old", [
    ([], 0, 0, 0),
    ([job("PENDING"), job("RUNNING"), job("CONFIGURING")], 1, 2, 0),
    ([job("PENDING", HOUR + 1, "Resources")], 1, 0, 1),
    ([job("PENDING", HOUR, "Resources")], 1, 0, 0),  # over an hour, not an hour
    ([job("PENDING", HOUR + 1, "Resources", tasks=3), job("PENDING", 10, "Priority", tasks=4)], 7, 0, 3),
    ([job("PENDING", HOUR * 5, "BeginTime", restarts=1)], 1, 0, 0),  # waits by request
    ([job("PENDING", HOUR * 5, r) for r in ("Dependency", "JobHeldUser", "JobHeldAdmin")], 3, 0, 0),
    ([job("PENDING", HOUR * 5, "ReqNodeNotAvail, UnavailableNodes:gpu-[1-4]")], 1, 0, 1),
    ([job("PENDING", None)], 1, 0, 0),  # no submit time: not known to be old
    ([job(s) for s in ("COMPLETING", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "REQUEUED")], 0, 0, 0),
])
def test_job_gauges(jobs, pending, running, old):
    assert job_gauges(jobs, NOW) == {"JobsPending": pending, "JobsRunning": running, "JobsPendingOverAnHour": old}


def node(state: str, reason: str = "") -> SlurmNode:
    return SlurmNode("gpu-1", state, reason, NOW - 10 if reason else None)


@pytest.mark.parametrize("nodes, up, failed", [
    ([], 0, 0),
    ([node("idle"), node("allocated"), node("mixed"), node("completing"), node("idle#"), node("idle!")], 6, 0),
    ([node("idle~"), node("idle%"), node("drained~"), node("down~", "maintenance"), node("allocated%")], 0, 0),
    ([node("down*", "Not responding"), node("drained", "preflight: efa: 0 EFA devices found, 1 expected")], 2, 0),
    ([node("down#", "resume failed: InsufficientInstanceCapacity: no capacity"),
      node("down~", "ResumeTimeout reached"), node("down~", "held after: x : ResumeTimeout reached"),
      node("idle~", "resume failed: InsufficientInstanceCapacity: no capacity")], 0, 3),
])
def test_node_gauges(nodes, up, failed):
    assert node_gauges(nodes) == {"NodesUp": up, "NodesFailedToResume": failed}


class Records:
    progress_every_s = 30.0

    def all(self):
        return []


class Queue:
    url = "fake"

    def receive(self, wait_s):
        return None


class Slurm:
    def __init__(self):
        self.listing = [job("PENDING", HOUR + 5, "Resources", tasks=2)]

    def jobs(self):
        return [SlurmJob(**{**j.__dict__, "comment": batch.COMMENT_PREFIX + "k"}) for j in self.listing]


def test_the_bridge_publishes_the_job_gauges_of_its_last_sync_once_a_minute():
    clock = [NOW]
    out = io.StringIO()
    slurm = Slurm()
    bridge = Bridge(Queue(), lambda team: Records(), batch.Site("b", "python", "/tmp"), slurm=slurm, clock=lambda: clock[0],
                    emitter=Emitter("gpufleet/dev", out))
    for t, listing in ((NOW, None), (NOW + 30, None), (NOW + 60, [job("RUNNING")]), (NOW + 90, None)):
        clock[0] = t
        slurm.listing = listing or slurm.listing
        bridge.step()
    docs = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(d["JobsPending"], d["JobsRunning"], d["JobsPendingOverAnHour"]) for d in docs] == [(2, 0, 2), (0, 1, 0)]
    (directive,) = docs[0]["_aws"]["CloudWatchMetrics"]
    assert directive["Namespace"] == "gpufleet/dev" and directive["Dimensions"] == [[]]
    assert {m["Name"]: m["Unit"] for m in directive["Metrics"]} == {
        "JobsPending": "Count", "JobsRunning": "Count", "JobsPendingOverAnHour": "Count"}


def test_without_an_emitter_the_bridge_publishes_nothing():
    bridge = Bridge(Queue(), lambda team: Records(), batch.Site("b", "python", "/tmp"), slurm=Slurm(), clock=lambda: NOW)
    bridge.step()
    assert bridge.listed and bridge._last_gauges is None


def test_the_namespace_is_the_one_given_else_controller_jsons(tmp_path, monkeypatch):
    settings = tmp_path / "controller.json"
    monkeypatch.setattr("trainer.node.node_schema.CONTROLLER_PATH", str(settings))
    assert metric_namespace(None) is None  # no controller.json
    settings.write_text(json.dumps({"stack": "prod"}))
    assert metric_namespace(None) == "gpufleet/prod" == metric_names.namespace("prod")
    settings.write_text(json.dumps({"stack": "prod", "metric_namespace": "gpufleet/prod"}))
    assert metric_namespace(None) == "gpufleet/prod" and metric_namespace("gpufleet/box") == "gpufleet/box"
    settings.write_text("not json")
    assert metric_namespace(None) is None


def test_the_emitter_writes_to_the_file_or_standard_output(tmp_path, caplog):
    assert gauge_emitter(None, "gpufleet/dev", "controller") is None  # no file: no gauges
    to_file = gauge_emitter(str(tmp_path / "m.log"), "gpufleet/dev", "controller")
    to_file.emit({"JobsPending": 1.0})
    assert json.loads((tmp_path / "m.log").read_text())["JobsPending"] == 1.0
    assert gauge_emitter("-", "gpufleet/dev", "controller").out is sys.stdout
    assert gauge_emitter(str(tmp_path / "no" / "such" / "dir.log"), "gpufleet/dev", "controller") is None
    assert "cannot be written" in caplog.text
    with pytest.raises(UsageError, match="controller: --emf-log - needs --metric-namespace"):
        gauge_emitter("-", None, "controller")
