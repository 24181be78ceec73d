"""The batch script of a job (or of a sweep: one Slurm job array), rendered by a pure function from its spec.

The script asks Slurm for the job's nodes (``--nodes``, one task each, ``--gres=gpu:N``), its time limit
(``--time`` from ``timeout``), to be requeued after a node failure or an exit 75 (``--requeue``) and to append
to its output across attempts (``--open-mode=append``). Its one command is ``srun`` of ``python -m trainer
task`` on every node (trainer.slurm.task), which runs the job's command with the job environment. The job's
spec travels inside the script (base64 JSON; an array's script holds one per index and passes its own), so a
requeued or restarted job needs nothing but Slurm's state.

The job's comment, ``gpufleet:<key>``, is how the bridge finds the attempt again after a restart (the message
id, or the sweep's nonce), so that no message is submitted twice.
"""
from __future__ import annotations

import base64
import json
import re
import shlex
from dataclasses import dataclass

from trainer.jobs.layout import DEFAULT_TEAM
from trainer.jobs.spec import Job

ACCOUNT_LINE = "#SBATCH --account="
COMMENT_PREFIX = "gpufleet:"
NAME_PREFIX = "gpufleet."
_SPEC_LINE = re.compile(r"\s*(?:(\d+)\) )?spec=([A-Za-z0-9+/=]+)(?: ;;)?")


@dataclass(frozen=True)
class Site:
    """Where and how the jobs of a cluster run."""

    bucket: str                 # the stack's bucket (records, checkpoints, logs)
    python: str                 # the node image's Python (the trainer is installed in it)
    output_dir: str             # where Slurm writes each job's output on its first node: <output_dir>/<team>/
    partition: str | None = None
    gpus: int = 0               # GPUs of a node of the partition (a job without gpus_per_node gets them all)
    instance_type: str | None = None  # the partition's instance type (records: GPU-hours and cost)
    account: str | None = None  # the Slurm account (team) the jobs run under; None: the submitter's default
    #                             (their records are then the default team's, trainer.jobs.layout)


def encode(entry: dict) -> str:
    return base64.b64encode(json.dumps(entry, separators=(",", ":")).encode()).decode()


def decode(text: str) -> dict:
    return json.loads(base64.b64decode(text.encode(), validate=True))


def time_limit(seconds: int) -> str:
    """Slurm's --time (days-hours:minutes:seconds) of a timeout in seconds."""
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"


def key_of(jobs: list[Job], message_id: str) -> str:
    """The attempt's key in Slurm (its comment): a sweep's nonce, or the message id of a single job."""
    return jobs[0].array["nonce"] if jobs[0].array else message_id


def render(jobs: list[Job], site: Site, key: str, first_attempts: list[int] | None = None) -> str:
    """The batch script of one job, or of a sweep's jobs as one array (job i is array index i). Every job of an
    array shares its shape (nodes, GPUs, timeout). ``first_attempts``: each job's attempt number of its first
    run under this script (earlier attempts: retries the bridge resubmitted); Slurm's restart count adds to it."""
    if not jobs:
        raise ValueError("no job to render")
    head = jobs[0]
    first = first_attempts or [len(j.attempts) + 1 for j in jobs]
    name = head.array["id"] if head.array else head.job_id
    output = f"{site.output_dir}/{site.account or DEFAULT_TEAM}"  # each team's own (setup makes it, 0700)
    lines = ["#!/bin/bash",
             f"#SBATCH --job-name={NAME_PREFIX}{name}",
             f"#SBATCH --comment={COMMENT_PREFIX}{key}",
             f"#SBATCH --nodes={head.nodes}",
             "#SBATCH --ntasks-per-node=1",
             "#SBATCH --requeue",
             "#SBATCH --open-mode=append",
             f"#SBATCH --chdir={output}",
             f"#SBATCH --output={output}/%x-{'%A_%a' if len(jobs) > 1 else '%j'}.out"]
    if site.partition:
        lines.append(f"#SBATCH --partition={site.partition}")
    if site.account:
        lines.append(f"{ACCOUNT_LINE}{site.account}")
    gpus = site.gpus if head.gpus_per_node is None else min(head.gpus_per_node, site.gpus)
    if head.gpus_per_node is None:
        lines.append("#SBATCH --exclusive")  # one job per node, all of its GPUs
    if gpus:
        lines.append(f"#SBATCH --gres=gpu:{gpus}")
    if head.timeout:
        lines.append(f"#SBATCH --time={time_limit(head.timeout)}")
    if len(jobs) > 1:
        lines.append(f"#SBATCH --array=0-{len(jobs) - 1}")
    specs = [encode({"spec": j.to_dict(), "first_attempt": n}) for j, n in zip(jobs, first)]
    lines.append("# The job's spec (base64 JSON; an array: one per index), then one task per node (trainer.slurm.task).")
    if len(jobs) == 1:
        lines.append(f"spec={specs[0]}")
    else:  # each index's spec in the script, so that no argument grows with the sweep
        lines.append('case "$SLURM_ARRAY_TASK_ID" in')
        lines += [f"  {i}) spec={spec} ;;" for i, spec in enumerate(specs)]
        lines.append("esac")
    task = [site.python, "-m", "trainer", "task", "--bucket", site.bucket, "--gpus", str(gpus)]
    if site.account:  # the job's team: its records, logs and checkpoints are under teams/<team>/
        task += ["--team", site.account]
    lines.append("exec srun --kill-on-bad-exit=1 --ntasks-per-node=1 --nodes=\"$SLURM_JOB_NUM_NODES\" "
                 + " ".join(shlex.quote(a) for a in task) + ' --spec "$spec"')
    return "\n".join(lines) + "\n"


def team_of(script: str) -> str:
    """The team of the jobs of a batch script :func:`render` wrote: its Slurm account, else the default team."""
    for line in script.splitlines():
        if line.startswith(ACCOUNT_LINE):
            return line.removeprefix(ACCOUNT_LINE)
    return DEFAULT_TEAM


def job_id_of(script: str, index: int | None = None) -> str | None:
    """The job id in a batch script :func:`render` wrote (an array's: that of element ``index``), or None (a
    script of someone else's, or no such element)."""
    for line in script.splitlines():
        m = _SPEC_LINE.fullmatch(line)
        if m and (m[1] is None) == (index is None) and (index is None or int(m[1]) == index):
            try:
                return str(decode(m[2])["spec"]["job_id"])
            except (ValueError, KeyError, TypeError):
                return None
    return None
