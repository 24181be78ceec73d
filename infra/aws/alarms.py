"""Alarm conditions as data, and how CloudWatch evaluates them: pure, so tests can replay a queue's history.

`WAITING_JOB` is the `old-jobs` alarm: some job has waited for a node, not run, for over an hour. SQS's
`ApproximateAgeOfOldestMessage` cannot say that: it counts messages in flight, so a job that runs for an
hour trips it. The number of visible messages can: its minimum over a period is above zero only when a
job waited through the whole period, and twelve such 5-minute periods in a row are an hour of waiting.
A job that runs (its message in flight, hidden by the agent's heartbeat) is not visible and never counts.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

_COMPARE = {
    "GreaterThanThreshold": lambda v, t: v > t,
    "GreaterThanOrEqualToThreshold": lambda v, t: v >= t,
    "LessThanThreshold": lambda v, t: v < t,
    "LessThanOrEqualToThreshold": lambda v, t: v <= t,
}


@dataclass(frozen=True)
class Threshold:
    """A single-metric CloudWatch alarm condition."""
    namespace: str
    metric: str
    statistic: str
    period_s: int
    evaluation_periods: int
    datapoints_to_alarm: int
    comparison: str
    threshold: float
    treat_missing_data: str

    def alarm_args(self, dimensions: dict) -> dict:
        """The matching `aws.cloudwatch.MetricAlarm` arguments."""
        return dict(namespace=self.namespace, metric_name=self.metric, dimensions=dimensions,
                    statistic=self.statistic, period=self.period_s, evaluation_periods=self.evaluation_periods,
                    datapoints_to_alarm=self.datapoints_to_alarm, comparison_operator=self.comparison,
                    threshold=self.threshold, treat_missing_data=self.treat_missing_data)

    def in_alarm(self, datapoints: Sequence[Optional[float]]) -> bool:
        """Whether CloudWatch puts the alarm in ALARM after these per-period values (oldest first; None
        where no data came, counted as `treat_missing_data` says: breaching or notBreaching): at least
        `datapoints_to_alarm` of the last `evaluation_periods` breach."""
        window = list(datapoints[-self.evaluation_periods:])
        window = [None] * (self.evaluation_periods - len(window)) + window

        def breaches(value: Optional[float]) -> bool:
            if value is None:
                return self.treat_missing_data == "breaching"
            return _COMPARE[self.comparison](value, self.threshold)

        return sum(map(breaches, window)) >= self.datapoints_to_alarm


WAIT_ALARM_S = 3600
_WAIT_PERIOD_S = 300
WAITING_JOB = Threshold(
    namespace="AWS/SQS", metric="ApproximateNumberOfMessagesVisible", statistic="Minimum",
    period_s=_WAIT_PERIOD_S, evaluation_periods=WAIT_ALARM_S // _WAIT_PERIOD_S,
    datapoints_to_alarm=WAIT_ALARM_S // _WAIT_PERIOD_S, comparison="GreaterThanThreshold", threshold=0,
    treat_missing_data="notBreaching")
