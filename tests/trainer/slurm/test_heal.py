"""`python -m trainer nodes heal`: CLOUD nodes that are DOWN are powered down (POWER_DOWN_FORCE: Slurm runs the
suspend program, then the node is idle and powered down, ready for the next job). A node that stopped answering goes
at once; a node whose machine could not be started ("resume failed: ..." from a node provider) or did not register
within ResumeTimeout (the providers' reason after ResumeFailProgram, or Slurm's own "ResumeTimeout reached") is held
DOWN for RESUME_FAIL_HOLD_S first, counted from the time Slurm stamped on its reason (so a restarted healer holds
it no longer and no shorter), so that the next job does not ask the same scarce capacity again at once.

Slurm is a fake here with the states and reasons Slurm 22.05 showed on this machine for such nodes (a resume
program that sets DOWN: "down#" until ResumeTimeout, then "down~" with "ResumeTimeout reached"; sinfo's reason and
its time) and the reason 23.11 and later make of an older one and Slurm's own (" : " between them); the clock is
the healer's own, injected. The last test runs the real client against `sinfo`/`scontrol` stubs.
"""
from __future__ import annotations

import io
import json
import os
import threading
from datetime import datetime

import pytest

from trainer.errors import UsageError
from trainer.slurm import client, nodes
from trainer.slurm.client import SlurmError, SlurmNode
from trainer.slurm.nodes import RESUME_FAIL_HOLD_S, heal

NO_CAPACITY = "resume failed: InsufficientInstanceCapacity: We currently do not have sufficient p5.48xlarge capacity"
NOT_REGISTERED = "resume failed: did not register within ResumeTimeout"
APPENDED = "held after: resume failed: InsufficientInstanceCapacity : ResumeTimeout reached"  # 23.11 and later


class FakeSlurm:
    def __init__(self, nodes: dict[str, tuple[str, str, float | None]]):
        self.nodes = dict(nodes)  # name -> (sinfo's state, reason, the reason's time)
        self.updates: list[tuple[str, dict]] = []

    def listed(self) -> list[SlurmNode]:
        return [SlurmNode(n, state, why, stamp) for n, (state, why, stamp) in self.nodes.items()]

    def update_node(self, name: str, **fields: str) -> None:
        self.updates.append((name, fields))
        if fields.get("state") == "POWER_DOWN_FORCE":
            self.nodes[name] = ("idle%", fields.get("reason", ""), self.nodes[name][2])


def healed(slurm: FakeSlurm, now: float, first_seen: dict | None = None) -> list[str]:
    return heal(slurm.listed(), now, slurm, first_seen)


def powered_down(slurm: FakeSlurm) -> list[str]:
    return [n for n, f in slurm.updates if f.get("state") == "POWER_DOWN_FORCE"]


def test_a_node_that_stopped_answering_is_powered_down_at_once():
    slurm = FakeSlurm({"gpu-1": ("down*", "Not responding", 990.0), "gpu-2": ("idle", "", None),
                       "gpu-3": ("idle~", "", None), "gpu-4": ("idle%", "", None),
                       "gpu-5": ("drained", "notice: spot terminate", 900.0)})
    assert healed(slurm, 1000.0) == ["gpu-1"]
    assert slurm.updates == [("gpu-1", {"state": "POWER_DOWN_FORCE", "reason": "not responding"})]


@pytest.mark.parametrize("state, why, held_as", [
    ("down#", NO_CAPACITY, NO_CAPACITY), ("down~", NOT_REGISTERED, NOT_REGISTERED),
    ("down~", "ResumeTimeout reached", "ResumeTimeout reached"), ("down~", APPENDED, "ResumeTimeout reached"),
])
def test_a_node_whose_resume_failed_is_held_down_then_powered_down(state, why, held_as):
    slurm = FakeSlurm({"big-1": (state, why, 1000.0), "big-2": ("down*", "Not responding", 1000.0)})
    assert healed(slurm, 1000.0) == ["big-2"]  # the unresponsive one at once; the failed one held
    for t in (1005.0, 1000.0 + RESUME_FAIL_HOLD_S - 1):
        assert healed(slurm, t) == []
    assert healed(slurm, 1000.0 + RESUME_FAIL_HOLD_S) == ["big-1"]
    (name, fields), = [u for u in slurm.updates if u[0] == "big-1"]
    assert fields["state"] == "POWER_DOWN_FORCE" and fields["reason"].startswith(f"held after: {held_as}")
    assert len(fields["reason"]) <= 200
    assert healed(slurm, 1000.0 + RESUME_FAIL_HOLD_S + 3600) == []
    assert powered_down(slurm) == ["big-2", "big-1"]  # powering down, then idle: left alone


def test_the_hold_counts_from_the_time_slurm_stamped_on_the_reason():
    """Nothing is remembered between rounds: a healer that starts (or restarts) late holds a node for what is left
    of its hold, no more."""
    slurm = FakeSlurm({"gpu-1": ("down#", NO_CAPACITY, 1000.0)})
    assert healed(slurm, 1300.0) == []  # first seen 300 s after it failed
    slurm.nodes["gpu-2"] = ("down#", NO_CAPACITY, 1300.0)  # failed later
    assert healed(slurm, 1000.0 + RESUME_FAIL_HOLD_S) == ["gpu-1"]
    assert healed(slurm, 1300.0 + RESUME_FAIL_HOLD_S - 1) == []
    assert healed(slurm, 1300.0 + RESUME_FAIL_HOLD_S) == ["gpu-2"]


def test_a_node_that_fails_again_later_is_held_again_from_then():
    slurm = FakeSlurm({"gpu-1": ("down#", NO_CAPACITY, 1000.0)})
    assert healed(slurm, 1000.0) == []
    slurm.nodes["gpu-1"] = ("idle~", "", None)  # an operator resumed it, say
    assert healed(slurm, 1200.0) == []
    slurm.nodes["gpu-1"] = ("down#", NO_CAPACITY, 2000.0)  # the next try failed too: a new reason, a new stamp
    assert healed(slurm, 2000.0) == []
    assert healed(slurm, 2000.0 + RESUME_FAIL_HOLD_S - 1) == []
    assert healed(slurm, 2000.0 + RESUME_FAIL_HOLD_S) == ["gpu-1"]


def test_a_reason_without_a_stamp_is_held_from_when_the_healer_first_saw_it():
    slurm = FakeSlurm({"gpu-1": ("down#", NO_CAPACITY, None)})
    seen: dict[str, float] = {}
    assert healed(slurm, 1000.0, seen) == [] and seen == {"gpu-1": 1000.0}
    assert healed(slurm, 1000.0 + RESUME_FAIL_HOLD_S - 1, seen) == []
    assert healed(slurm, 1000.0 + RESUME_FAIL_HOLD_S, seen) == ["gpu-1"] and seen == {}


def test_a_powered_down_node_down_for_another_reason_is_left_as_it_is():
    slurm = FakeSlurm({"gpu-1": ("down~", "maintenance: NIC swap", 1000.0), "gpu-2": ("down%", NO_CAPACITY, 1000.0)})
    for t in (1000.0, 1000.0 + 10 * RESUME_FAIL_HOLD_S):
        assert healed(slurm, t) == []
    assert slurm.updates == []


class Rounds:
    """The client as the daemon uses it, for a few rounds: then the daemon is asked to stop."""

    def __init__(self, listings: list, stop: threading.Event):
        self.listings, self.stop, self.updates = list(listings), stop, []

    def nodes(self):
        listing = self.listings.pop(0)
        if not self.listings:
            self.stop.set()
        if isinstance(listing, Exception):
            raise listing
        return listing

    def update_node(self, name, **fields):
        self.updates.append((name, fields))


def test_the_daemon_heals_each_round_and_publishes_the_node_gauges_once_a_minute(caplog):
    from trainer.node.emf import Emitter

    stop = threading.Event()
    gone = [SlurmNode("gpu-1", "down*", "Not responding", 0.0), SlurmNode("gpu-2", "alloc", "", None)]
    fine = [SlurmNode("gpu-1", "idle%", "not responding", 0.0), SlurmNode("gpu-2", "alloc", "", None)]
    slurm = Rounds([gone, SlurmError("sinfo: slurm_load_node error: Unable to contact slurm controller"), fine, fine],
                   stop)
    times = iter([1000.0, 1030.0, 1060.0])
    out = io.StringIO()
    assert nodes.serve_heal(stop, every_s=0.001, emitter=Emitter("gpufleet/dev", out), slurm=slurm,
                            clock=lambda: next(times)) == 0
    assert slurm.updates == [("gpu-1", {"state": "POWER_DOWN_FORCE", "reason": "not responding"})]
    docs = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(d["NodesUp"], d["NodesFailedToResume"]) for d in docs] == [(2.0, 0.0), (1.0, 0.0)]  # at 1000 and 1060
    assert docs[0]["_aws"]["CloudWatchMetrics"][0]["Dimensions"] == [[]]
    assert "Unable to contact slurm controller; trying again" in caplog.text


@pytest.mark.parametrize("argv, message", [
    (["heal", "gpu-1"], "nodes heal: takes no hostlist (got 'gpu-1'); it looks at every node"),
    (["heal", "--every", "0"], "nodes heal: --every 0 is not allowed; expected seconds > 0"),
    (["heal", "--emf-log", "/tmp/x"], "nodes heal: --emf-log /tmp/x needs --metric-namespace"),
    (["resume"], "nodes resume: a hostlist is required"),
])
def test_the_command_says_what_is_wrong_in_one_line(argv, message, monkeypatch, tmp_path):
    monkeypatch.setattr("trainer.node.node_schema.CONTROLLER_PATH", str(tmp_path / "none.json"))
    with pytest.raises(UsageError) as told:
        nodes.main(argv)
    assert str(told.value).startswith(message) and "\n" not in str(told.value)


def test_heal_reads_the_reason_and_its_time_through_the_real_client(tmp_path, monkeypatch):
    """The real client against `sinfo`/`scontrol` stubs printing what Slurm 22.05 printed here for a node whose
    resume program set it DOWN."""
    stamp = "2026-12-02T12:28:08"
    failed_at = datetime.fromisoformat(stamp).timestamp()
    record = tmp_path / "updates"
    (tmp_path / "sinfo").write_text(f"#!/bin/sh\necho 'big-1|down#|{stamp}|{NO_CAPACITY}'\n")
    (tmp_path / "scontrol").write_text(f"#!/bin/sh\necho \"$*\" >> {record}\n")
    for stub in ("scontrol", "sinfo"):
        (tmp_path / stub).chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert heal(client.nodes(), failed_at + 10, client) == []
    assert not record.exists()
    assert heal(client.nodes(), failed_at + RESUME_FAIL_HOLD_S, client) == ["big-1"]
    assert record.read_text() == (f"update nodename=big-1 state=POWER_DOWN_FORCE reason=held after: {NO_CAPACITY}"
                                  "\n")
