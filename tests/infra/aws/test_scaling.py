"""Scaling math (pure): capacity per mode, backlog steps from zero to max and back to zero."""
import pytest

from infra import scaling


def test_gang_mode_holds_a_fixed_size():
    assert scaling.capacity("gang", 4, 4, 4) == scaling.Capacity(4, 4, 4)


def test_queue_mode_keeps_configured_bounds():
    assert scaling.capacity("queue", 0, 4, 0) == scaling.Capacity(0, 4, 0)


@pytest.mark.parametrize("visible,in_flight,expected", [
    (0, 0, 0), (1, 0, 1), (0, 1, 1), (2, 1, 3), (3, 3, 4), (100, 0, 4)])
def test_backlog_counts_in_flight_jobs(visible, in_flight, expected):
    assert scaling.desired_for_backlog(visible, in_flight, 0, 4) == expected


def test_min_size_is_a_floor():
    assert scaling.desired_for_backlog(0, 0, 2, 8) == 2
    assert scaling.desired_for_backlog(5, 0, 0, 8, jobs_per_node=2) == 3


@pytest.mark.parametrize("min_size,max_size,per", [(0, 4, 1), (0, 1, 1), (2, 10, 1), (0, 19, 1), (0, 6, 3)])
def test_steps_match_the_rule_exactly_when_few(min_size, max_size, per):
    steps = scaling.backlog_steps(min_size, max_size, per)
    assert len(steps) <= scaling.MAX_STEP_ADJUSTMENTS
    for backlog in range(0, max_size * per + 10):
        assert scaling.step_capacity(steps, backlog) == scaling.desired_for_backlog(backlog, 0, min_size, max_size, per)


def test_scale_out_from_zero_and_back_to_zero():
    steps = scaling.backlog_steps(0, 4)
    path = [0, 1, 3, 7, 20, 5, 2, 0]
    assert [scaling.step_capacity(steps, b) for b in path] == [0, 1, 3, 4, 4, 4, 2, 0]


def test_steps_are_contiguous_and_open_ended():
    steps = scaling.backlog_steps(0, 50)
    assert steps[0].lower == 0 and steps[-1].upper is None
    assert all(a.upper == b.lower for a, b in zip(steps, steps[1:]))


def test_many_nodes_never_leave_a_job_without_a_node():
    steps = scaling.backlog_steps(0, 100)
    assert len(steps) == scaling.MAX_STEP_ADJUSTMENTS
    assert steps[0].capacity == 0 and steps[-1].capacity == 100
    for backlog in range(0, 130):
        got = scaling.step_capacity(steps, backlog)
        exact = scaling.desired_for_backlog(backlog, 0, 0, 100)
        assert exact <= got <= 100
        assert got - exact < 100 / (scaling.MAX_STEP_ADJUSTMENTS - 1) + 1
