"""Slurm's own commands, called as a user would (sbatch, squeue --json, scancel, scontrol), SLURM_CONF from the
environment. Every failure is a SlurmError with Slurm's own first line."""
from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass

from trainer.errors import Fault

TIMEOUT_S = 60
SEARCH_PATH = "/usr/local/bin:/usr/bin:/usr/local/sbin:/usr/sbin:/bin:/sbin"


class SlurmError(Fault):
    pass


@dataclass(frozen=True)
class SlurmJob:
    """One job (or array element) as squeue --json shows it."""

    id: str                 # "123", or "123_4" for an array element
    array_job_id: int | None
    array_task_id: int | None
    name: str
    comment: str
    state: str
    reason: str
    description: str        # Slurm's description of the state (e.g. "launch failed requeued held"), or ""
    exit_code: int | None   # the batch script's exit status (trainer.slurm.states.exit_status of Slurm's)
    restarts: int
    nodes: tuple[str, ...]
    user: str
    partition: str
    submit_time: float | None
    start_time: float | None
    end_time: float | None


def exe(name: str) -> str:
    """A Slurm program's path: slurmctld runs its programs without PATH, so the usual places are tried too."""
    return shutil.which(name) or shutil.which(name, path=SEARCH_PATH) or name


def _run(argv: list[str], input: str | None = None, check: bool = True) -> str:
    try:
        proc = subprocess.run([exe(argv[0]), *argv[1:]], input=input, capture_output=True, text=True, timeout=TIMEOUT_S)
    except FileNotFoundError:
        raise SlurmError(f"{argv[0]}: not found; install Slurm's client commands (Debian: slurm-client)") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{argv[0]}: no answer within {TIMEOUT_S} s (is slurmctld running?)") from None
    if check and proc.returncode != 0:
        why = next((ln.strip() for ln in proc.stderr.splitlines() if ln.strip()), f"exit status {proc.returncode}")
        raise SlurmError(f"{argv[0]}: {why}")
    return proc.stdout


def hostnames(hostlist: str) -> list[str]:
    """Slurm's hostlist expression (q-[1-3],g-2) as names."""
    return _run(["scontrol", "show", "hostnames", hostlist]).split()


def sbatch(script: str) -> str:
    """Submit a batch script (on stdin); the job id Slurm gave it."""
    return _run(["sbatch", "--parsable"], input=script).strip().split(";")[0]


def _time(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def _job(raw: dict) -> SlurmJob:
    from trainer.slurm.states import exit_status

    array_job, task = raw.get("array_job_id") or None, raw.get("array_task_id")
    job_id = f"{array_job}_{task}" if array_job and task is not None else str(raw["job_id"])
    nodes = raw.get("nodes") or ""
    return SlurmJob(
        id=job_id, array_job_id=array_job, array_task_id=task, name=raw.get("name") or "",
        comment=raw.get("comment") or "", state=raw.get("job_state") or "", reason=raw.get("state_reason") or "",
        description=raw.get("state_description") or "",
        exit_code=exit_status(raw.get("exit_code")), restarts=int(raw.get("restart_cnt") or 0),
        nodes=tuple(hostnames(nodes)) if nodes else (), user=raw.get("user_name") or "",
        partition=raw.get("partition") or "", submit_time=_time(raw.get("submit_time")),
        start_time=_time(raw.get("start_time")), end_time=_time(raw.get("end_time")))


def jobs() -> list[SlurmJob]:
    """Every job slurmctld knows (pending, running, and finished within MinJobAge), array elements apart."""
    data = json.loads(_run(["squeue", "--json", "--all", "--states=all"]) or "{}")
    return [_job(j) for j in data.get("jobs", [])]


def finished(ids: list[str]) -> list[SlurmJob]:
    """Jobs that have left squeue (MinJobAge after they ended) as accounting has them: `sacct` through slurmdbd,
    or `sacct -c` from the job completion file when the cluster has no slurmdbd (the file lists an array's
    elements under job ids of their own, so those are not found there). The ids it does not know are left out."""
    if not ids:
        return []
    argv = ["sacct", "-X", "-n", "-P", "-o", "JobID,State,ExitCode,NodeList,Start,End", "-j", ",".join(ids)]
    if _accounting_storage() == "accounting_storage/none":
        argv.insert(1, "-c")
    found = []
    for line in _run(argv).splitlines():
        fields = line.split("|")
        if len(fields) != 6 or fields[0] not in ids:
            continue
        job_id, state, exit_code, nodes, start, end = fields
        status, _, signal = exit_code.partition(":")
        code = 128 + int(signal) if signal.isdigit() and int(signal) else int(status) if status.isdigit() else None
        array_job, _, task = job_id.partition("_")
        found.append(SlurmJob(
            id=job_id, array_job_id=int(array_job) if task else None, array_task_id=int(task) if task else None,
            name="", comment="", state=state.split()[0] if state else "", reason="", description="",
            exit_code=code, restarts=0, nodes=tuple(hostnames(nodes)) if nodes and nodes != "None assigned" else (),
            user="", partition="", submit_time=None, start_time=_iso(start), end_time=_iso(end)))
    return found


def _iso(text: str) -> float | None:
    from datetime import datetime

    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:  # Unknown, None
        return None


_STORAGE: list[str] = []


def _accounting_storage() -> str:
    """AccountingStorageType of the cluster (read once)."""
    if not _STORAGE:
        out = _run(["scontrol", "show", "config"])
        _STORAGE.append(next((ln.split("=", 1)[1].strip() for ln in out.splitlines()
                              if ln.startswith("AccountingStorageType")), ""))
    return _STORAGE[0]


def scancel(job_id: str) -> None:
    _run(["scancel", job_id])


def requeue(job_id: str) -> None:
    _run(["scontrol", "requeue", job_id])


def update_node(name: str, **fields: str) -> None:
    _run(["scontrol", "update", f"nodename={name}", *(f"{k}={v}" for k, v in fields.items())])


def node_fields(name: str) -> dict[str, str]:
    """A node as slurmctld has it (`scontrol show node -o`): NodeAddr, Gres, AvailableFeatures, State, ..."""
    out = _run(["scontrol", "show", "node", "-o", name])
    return dict(word.partition("=")[::2] for word in out.split() if "=" in word)


def node_addr(name: str) -> str:
    """The address Slurm has for a node (NodeAddr), its name when it has none."""
    return node_fields(name).get("NodeAddr") or name


def jobs_on(node: str) -> list[str]:
    """Ids of the jobs running on a node."""
    return _run(["squeue", "-h", "-w", node, "-t", "RUNNING,CONFIGURING,COMPLETING", "-o", "%i"]).split()


def node_states() -> dict[str, str]:
    """Every node's state as sinfo writes it (idle~ powered down, down* not responding, drained, ...)."""
    out = _run(["sinfo", "-h", "-N", "-o", "%N %T"])
    return dict(line.split(None, 1) for line in out.splitlines() if " " in line)
