"""The box's node provider (trainer.slurm.nodes.LocalProvider): a resume starts a node's ``slurmd -b`` only once
the wall clock has left the second slurmctld stamped on the request, so that slurmctld never takes the node to have
booted before it was asked to (its registration would be dropped and the job requeued after ResumeTimeout). A fake
clock here; the box's tests run the real thing."""
from __future__ import annotations

import math

import pytest

from trainer.errors import UsageError
from trainer.slurm import nodes


class FakeClock:
    def __init__(self, now: float):
        self.now, self.slept = now, []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds * 0.6  # a sleep may end early: the wait reads the clock again


@pytest.mark.parametrize("now", [1000.0, 1000.5, 1000.999])
def test_the_wait_ends_in_the_next_whole_second(now):
    clock = FakeClock(now)
    nodes.after_the_resume_second(clock, clock.sleep)
    assert math.floor(now) + 1 <= clock.now < math.floor(now) + 1 + 1e-3
    assert clock.slept and all(s > 0 for s in clock.slept)


def slurmctld_boot_time(request_s: int, slurmd_read_s: float, registered_s: float, tick_phase: float) -> int:
    """What Slurm 22.05 takes a ``slurmd -b`` node's boot time to be: slurmctld's whole second at the registration
    minus the uptime slurmd reports, the difference between the host's uptime (whole seconds, ticking at
    ``tick_phase`` past each wall-clock second) at the registration and at slurmd's first reading."""
    uptime = math.floor(registered_s - tick_phase) - math.floor(slurmd_read_s - tick_phase)
    return math.floor(registered_s) - uptime


@pytest.mark.parametrize("phase", [0.0, 0.25, 0.764, 0.999])
def test_a_slurmd_started_after_the_wait_is_never_taken_to_have_booted_before_its_request(phase):
    request = 1000  # slurmctld's boot_req_time; the resume program runs in that second or later
    for called in (1000.0, 1000.4, 1000.76, 1000.99, 1001.3):
        clock = FakeClock(called)
        nodes.after_the_resume_second(clock, clock.sleep)
        for startup in (0.0, 0.004, 0.3, 1.7):      # slurmd's start up to its first uptime reading
            for to_register in (0.001, 0.007, 0.9):  # then to its registration reaching slurmctld
                read = clock.now + startup
                assert slurmctld_boot_time(request, read, read + to_register, phase) >= request
    # without the wait: read just before a tick, registered just after it, in the request's second
    assert slurmctld_boot_time(request, 1000.763, 1000.770, 0.764) < request


def test_resume_waits_before_it_starts_any_slurmd_and_refuses_a_stranger_first(monkeypatch, tmp_path):
    events = []
    monkeypatch.setattr(nodes, "after_the_resume_second", lambda: events.append("wait"))
    config = {"run_dir": str(tmp_path), "spool_dir": str(tmp_path / "spool"), "log_dir": str(tmp_path),
              "slurm_conf": str(tmp_path / "slurm.conf"), "python": "python",
              "nodes": {n: {"imds": "http://127.0.0.1:1/", "notice_file": str(tmp_path / n / "notice")}
                        for n in ("gpu-1", "gpu-2")}}
    provider = nodes.LocalProvider(config, str(tmp_path / "nodes.json"))
    monkeypatch.setattr(provider, "_daemon", lambda argv, **_: events.append(argv[argv.index("-N") + 1]
                                                                            if "-N" in argv else "watch") or 1)
    with pytest.raises(UsageError, match="gpu-9 is not a node of this box"):
        provider.resume(["gpu-1", "gpu-9"])
    assert events == []  # nothing started for a hostlist with a stranger in it
    provider.resume(["gpu-1", "gpu-2"])
    assert events == ["wait", "gpu-1", "watch", "gpu-2", "watch"]
