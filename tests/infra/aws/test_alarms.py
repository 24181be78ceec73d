"""The `old-jobs` condition replayed over a queue's history, as SQS reports it and CloudWatch evaluates it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pytest

from infra.aws.alarms import WAIT_ALARM_S, WAITING_JOB, Threshold


@dataclass
class Job:
    queued: int                 # minute the message is sent
    started: Optional[int]      # minute a node receives it (its message goes in flight), None: still waiting
    ended: Optional[int] = None  # minute the message is deleted


def sqs_minute(jobs: list[Job], minute: int) -> dict[str, float]:
    """What SQS reports for one minute: waiting (visible) and running (in flight) messages, and the age in
    seconds of the oldest message not yet deleted, waiting or running."""
    live = [j for j in jobs if j.queued <= minute and (j.ended is None or minute < j.ended)]
    running = [j for j in live if j.started is not None and j.started <= minute]
    return {"ApproximateNumberOfMessagesVisible": float(len(live) - len(running)),
            "ApproximateNumberOfMessagesNotVisible": float(len(running)),
            "ApproximateAgeOfOldestMessage": float(max((minute - j.queued) * 60 for j in live)) if live else 0.0}


def periods(jobs: list[Job], until: int, alarm: Threshold) -> list[Optional[float]]:
    """The alarm's statistic over each whole period of one-minute datapoints up to `until`."""
    per = alarm.period_s // 60
    stat = {"Minimum": min, "Maximum": max}[alarm.statistic]
    return [stat(sqs_minute(jobs, m)[alarm.metric] for m in range(start, start + per))
            for start in range(0, until - per + 1, per)]


def fires(jobs: list[Job], until: int, alarm: Threshold = WAITING_JOB) -> bool:
    return alarm.in_alarm(periods(jobs, until, alarm))


def fires_at_any_time(jobs: list[Job], until: int, alarm: Threshold = WAITING_JOB) -> bool:
    return any(fires(jobs, t, alarm) for t in range(alarm.period_s // 60, until + 1))


# The alarm this replaces: the age of the oldest message counts running jobs too.
OLDEST_MESSAGE = Threshold(namespace="AWS/SQS", metric="ApproximateAgeOfOldestMessage", statistic="Maximum",
                           period_s=300, evaluation_periods=1, datapoints_to_alarm=1,
                           comparison="GreaterThanThreshold", threshold=3600, treat_missing_data="notBreaching")


def test_a_job_waiting_over_an_hour_fires():
    waiting = [Job(queued=2, started=None)]
    assert not fires(waiting, 55)
    assert fires(waiting, 70)
    assert WAIT_ALARM_S == 3600


def test_a_ten_hour_job_that_runs_does_not_fire():
    running = [Job(queued=0, started=3, ended=603)]
    assert not fires_at_any_time(running, 610)
    assert fires_at_any_time(running, 610, OLDEST_MESSAGE)  # what the old alarm did


def test_a_short_wait_beside_a_long_run_does_not_fire():
    jobs = [Job(queued=0, started=3, ended=603), Job(queued=100, started=140, ended=200)]
    assert not fires_at_any_time(jobs, 610)


def test_a_job_waiting_behind_a_long_run_fires():
    jobs = [Job(queued=0, started=3, ended=603), Job(queued=100, started=None)]
    assert not fires(jobs, 150)
    assert fires(jobs, 170)


@pytest.mark.parametrize("datapoints, expected", [
    ([1.0] * 12, True), ([1.0] * 11 + [0.0], False), ([0.0] + [1.0] * 12, True), ([1.0] * 11, False),
    ([1.0] * 6 + [None] + [1.0] * 5, False)])
def test_in_alarm_counts_breaching_periods(datapoints, expected):
    assert WAITING_JOB.in_alarm(datapoints) is expected
