"""The job lifecycle table (trainer.slurm.states): every Slurm state's record state, written out here literally."""
from __future__ import annotations

import pytest

from trainer.slurm import states
from trainer.slurm.states import Outcome, exit_status, lifecycle

# state -> (record state, reason, final, counts): the expectations, not read from states.TABLE.
EXPECTED = {
    "PENDING": ("queued", None, False, False),
    "CONFIGURING": ("queued", "nodes powering up", False, False),
    "RUNNING": ("running", None, False, False),
    "COMPLETING": ("running", None, False, False),
    "SUSPENDED": ("running", "suspended", False, False),
    "RESIZING": ("running", None, False, False),
    "STAGE_OUT": ("running", None, False, False),
    "SIGNALING": ("running", None, False, False),
    "REQUEUED": ("preempted", "preemption", False, False),
    "REQUEUE_FED": ("preempted", "preemption", False, False),
    "REQUEUE_HOLD": ("preempted", "preemption", False, False),
    "PREEMPTED": ("preempted", "preemption", False, False),
    "NODE_FAIL": ("preempted", "node failure", False, False),
    "BOOT_FAIL": ("preempted", "boot failure", False, False),
    "COMPLETED": ("succeeded", None, True, False),
    "FAILED": ("failed", "failure", True, True),
    "OUT_OF_MEMORY": ("failed", "out of memory", True, True),
    "TIMEOUT": ("failed", "timeout", True, True),
    "DEADLINE": ("failed", "deadline", True, True),
    "CANCELLED": ("cancelled", "cancel", True, False),
    "REVOKED": ("cancelled", "revoked", True, False),
    "SPECIAL_EXIT": ("failed", "failure", True, True),
    "STOPPED": ("running", "stopped", False, False),
    "RESV_DEL_HOLD": ("queued", "held: its reservation was deleted", False, False),
}
PREEMPTION = Outcome("preempted", "preemption", False, False)


def as_tuple(o: Outcome) -> tuple:
    return (o.state, o.reason, o.final, o.counts)


def test_table_has_exactly_the_expected_states():
    assert set(states.TABLE) == set(EXPECTED)


@pytest.mark.parametrize("state", sorted(states.TABLE))
def test_every_table_row(state):
    assert as_tuple(states.TABLE[state]) == EXPECTED[state]
    assert as_tuple(lifecycle(state)) == EXPECTED[state]


@pytest.mark.parametrize("state", sorted(EXPECTED))
def test_a_plain_exit_status_leaves_the_row_alone(state):
    assert as_tuple(lifecycle(state, exit_code=0)) == EXPECTED[state]
    if EXPECTED[state][0] != "succeeded":
        assert as_tuple(lifecycle(state, exit_code=1)) == EXPECTED[state]


# --- exit 75: checkpointed, requeued by Slurm -------------------------------------------------------------------

@pytest.mark.parametrize("state", ["FAILED", "COMPLETED", "OUT_OF_MEMORY", "TIMEOUT", "DEADLINE", "SPECIAL_EXIT"])
def test_exit_75_after_an_ending_is_a_preemption(state):
    assert lifecycle(state, exit_code=75) == PREEMPTION


@pytest.mark.parametrize("state,expected", [("RUNNING", ("running", None, False, False)),
                                            ("CANCELLED", ("cancelled", "cancel", True, False)),
                                            ("PENDING", ("queued", None, False, False)),
                                            ("NODE_FAIL", ("preempted", "node failure", False, False))])
def test_exit_75_in_other_states_changes_nothing(state, expected):
    assert as_tuple(lifecycle(state, exit_code=75)) == expected


def test_failed_with_another_exit_status_counts():
    assert as_tuple(lifecycle("FAILED", exit_code=1)) == ("failed", "failure", True, True)
    assert as_tuple(lifecycle("FAILED", exit_code=143)) == ("failed", "failure", True, True)


# --- waiting again after a requeue ------------------------------------------------------------------------------

def test_pending_after_a_requeue_is_preempted():
    assert lifecycle("PENDING", restarts=1) == PREEMPTION
    assert lifecycle("PENDING", restarts=3) == PREEMPTION


def test_pending_without_restarts_is_queued():
    assert as_tuple(lifecycle("PENDING", restarts=0)) == ("queued", None, False, False)


def test_a_job_held_after_its_launch_failed_is_a_counted_failure():
    # what squeue --json said of a job whose slurmstepd could not start (restart_cnt 1, JobHeldUser)
    assert as_tuple(lifecycle("PENDING", exit_code=0, restarts=1, description="launch failed requeued held")) == \
        ("failed", "launch failure", True, True)
    assert lifecycle("PENDING", restarts=1, description="held by a user") == PREEMPTION  # a user's hold: waits


def test_configuring_after_a_requeue_is_preempted():
    assert lifecycle("CONFIGURING", restarts=1) == PREEMPTION


@pytest.mark.parametrize("state,expected", [("RUNNING", ("running", None, False, False)),
                                            ("COMPLETED", ("succeeded", None, True, False)),
                                            ("FAILED", ("failed", "failure", True, True))])
def test_restarts_leave_other_states_alone(state, expected):
    assert as_tuple(lifecycle(state, restarts=2)) == expected


# --- state text -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text,base", [("CANCELLED by 0", "CANCELLED"), ("CANCELLED+", "CANCELLED"),
                                       ("CANCELLED+ by 1000", "CANCELLED"), ("RUNNING+", "RUNNING"),
                                       ("COMPLETED ", "COMPLETED"), ("  PENDING", "PENDING")])
def test_suffixes_and_extra_words_map_like_the_base(text, base):
    assert as_tuple(lifecycle(text)) == EXPECTED[base]


@pytest.mark.parametrize("text", ["UNKNOWN", "running", "", "COMPLETE", "+"])
def test_unknown_state_is_a_value_error(text):
    with pytest.raises(ValueError) as exc:
        lifecycle(text)
    assert str(exc.value) == f"unknown Slurm job state {text!r}"


def test_none_state_is_a_value_error():
    with pytest.raises(ValueError):
        lifecycle(None)  # type: ignore[arg-type]


# --- exit statuses ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("raw,status", [(19200, 75), (768, 3), (9, 137), (15, 143), (0, 0), (256, 1),
                                        (None, None)])
def test_exit_status_of_a_wait_status(raw, status):
    assert exit_status(raw) == status


def test_exit_status_feeds_lifecycle():
    assert lifecycle("FAILED", exit_code=exit_status(19200)) == PREEMPTION
    assert as_tuple(lifecycle("FAILED", exit_code=exit_status(768))) == ("failed", "failure", True, True)
