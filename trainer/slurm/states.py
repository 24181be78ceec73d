"""The job lifecycle as one pure table: Slurm's job state (and exit status) -> the record's state and reason.

The bridge reads each job's state from Slurm (``squeue --json``) and moves the job's record with
:func:`lifecycle`; nothing else decides what a Slurm state means. A record's states (trainer.jobs.records):

- queued     the job waits for nodes (PENDING, or CONFIGURING while its nodes power up);
- running    its batch script runs (RUNNING, COMPLETING, SUSPENDED);
- preempted  an attempt was stopped by its node going away (a notice, a node failure, exit 75) and Slurm has
             requeued it: it runs again from its checkpoint; never counted against retries;
- succeeded  COMPLETED;
- failed     FAILED (any exit status but 75), TIMEOUT, OUT_OF_MEMORY, DEADLINE: counted against retries;
             the bridge resubmits it while ``retries`` allow;
- cancelled  CANCELLED (`gpufleet jobs cancel`, or scancel).
"""
from __future__ import annotations

from dataclasses import dataclass

from trainer.slurm.conf import EXIT_REQUEUE


@dataclass(frozen=True)
class Outcome:
    state: str            # the record's state
    reason: str | None    # the attempt's reason (why it ended), or why the job waits
    final: bool           # Slurm is done with this job id (the bridge may resubmit a failure)
    counts: bool = False  # a failure that counts against retries.on_error


# Slurm job state -> (record state, reason, final, counts). Slurm's states (22.05 to 26.05), squeue's long names.
TABLE: dict[str, Outcome] = {
    "PENDING": Outcome("queued", None, False),
    "CONFIGURING": Outcome("queued", "nodes powering up", False),
    "RUNNING": Outcome("running", None, False),
    "COMPLETING": Outcome("running", None, False),
    "SUSPENDED": Outcome("running", "suspended", False),
    "RESIZING": Outcome("running", None, False),
    "STAGE_OUT": Outcome("running", None, False),
    "SIGNALING": Outcome("running", None, False),
    "STOPPED": Outcome("running", "stopped", False),                  # its tasks got SIGSTOP (scontrol suspend)
    "RESV_DEL_HOLD": Outcome("queued", "held: its reservation was deleted", False),
    "REQUEUED": Outcome("preempted", "preemption", False),
    "REQUEUE_FED": Outcome("preempted", "preemption", False),
    "REQUEUE_HOLD": Outcome("preempted", "preemption", False),
    "PREEMPTED": Outcome("preempted", "preemption", False),
    "NODE_FAIL": Outcome("preempted", "node failure", False),
    "BOOT_FAIL": Outcome("preempted", "boot failure", False),
    "COMPLETED": Outcome("succeeded", None, True),
    "FAILED": Outcome("failed", "failure", True, counts=True),
    "OUT_OF_MEMORY": Outcome("failed", "out of memory", True, counts=True),
    "TIMEOUT": Outcome("failed", "timeout", True, counts=True),
    "DEADLINE": Outcome("failed", "deadline", True, counts=True),
    "CANCELLED": Outcome("cancelled", "cancel", True),
    "REVOKED": Outcome("cancelled", "revoked", True),
    "SPECIAL_EXIT": Outcome("failed", "failure", True, counts=True),
}


def exit_status(raw: int | None) -> int | None:
    """The exit status of a Slurm exit code as squeue --json gives it (a wait status: status << 8 | signal)."""
    if raw is None:
        return None
    signal = raw & 0x7F
    return 128 + signal if signal else raw >> 8


LAUNCH_FAILED = "launch failed requeued held"  # squeue's state_description of a job whose launch failed
LAUNCH_FAILURE = Outcome("failed", "launch failure", True, counts=True)


def lifecycle(state: str, exit_code: int | None = None, restarts: int = 0, description: str = "") -> Outcome:
    """What a Slurm job's state means for its record. ``exit_code``: the status the batch script exited with
    (a plain number, see :func:`exit_status`); ``restarts``: Slurm's requeue count of the job; ``description``:
    Slurm's description of its state (squeue's state_description).

    A job whose batch script could not be launched on its node (slurmstepd failed) is requeued and held by
    Slurm (PENDING, JobHeldUser, "launch failed requeued held"): it would wait forever, so it is a failure
    (final: the bridge cancels the held job) that counts against retries.

    A job that waits again after Slurm requeued it (restarts > 0) is preempted, not queued: its attempt ended
    by a preemption and the next starts from its checkpoint. A job that ended with exit 75 checkpointed and is
    requeued by Slurm (RequeueExit=75): preempted too, whatever state Slurm reports in between.
    """
    base = state.split()[0].rstrip("+") if state else ""
    outcome = TABLE.get(base)
    if outcome is None:
        raise ValueError(f"unknown Slurm job state {state!r}")
    if base == "PENDING" and description.startswith(LAUNCH_FAILED):
        return LAUNCH_FAILURE
    if exit_code == EXIT_REQUEUE and outcome.state in ("failed", "succeeded"):
        return Outcome("preempted", "preemption", False)
    if outcome.state == "queued" and restarts > 0:
        return Outcome("preempted", "preemption", False)
    return outcome
