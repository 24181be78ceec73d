"""Slurm's own commands, called as a user would (sbatch, squeue --json, sinfo, scancel, scontrol), SLURM_CONF from
the environment. Every failure is a SlurmError with Slurm's own first line.

What the commands print is read for the Slurm the box runs (Debian's 22.05) and the one the images bake (26.05,
built from source): ``squeue --json`` changed shape in 23.11 (data_parser v0.0.40 and later), so each job is first
brought to 22.05's shape by one normalising layer (:func:`normalise_job`, pure), and :class:`SlurmJob` and
everything above it read one shape. From 23.11 on, ``job_state`` is a list (the base state and its flags: ["PENDING"],
["COMPLETED", "COMPLETING"]), integers that may be unset or infinite are {"set", "infinite", "number"} (array ids,
times), and ``exit_code`` is {"status": [...], "return_code": {...}, "signal": {"id": {...}, "name": ...}} (Slurm's
src/plugins/data_parser/v0.0.4x/parsers.c, and the v0.0.4x_job_info schema of its REST API reference). The text
outputs read here (``sinfo -o``, ``scontrol show node -o``, ``sacct -P``) print the same fields and state names in
both, but for fields that may now follow a node's Reason (Comment, Extra, InstanceId, Topology, ...): see
:func:`parse_node_line`. Times are asked for as ISO 8601 (SLURM_TIME_FORMAT=standard, whatever the user's
environment says) and job array index lists in full (SLURM_BITSTR_LEN=0: by default a long one ends in "...").
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from datetime import datetime

from trainer.errors import Fault
from trainer.slurm import users
from trainer.slurm.states import exit_status

TIMEOUT_S = 60
SEARCH_PATH = "/usr/local/bin:/usr/bin:/usr/local/sbin:/usr/sbin:/bin:/sbin"
# The environment of the commands whose output is parsed: ISO times, whole array index lists.
READ_ENV = {"SLURM_TIME_FORMAT": "standard", "SLURM_BITSTR_LEN": "0"}


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
    tasks: int = 1          # the array elements this line stands for: a pending array's are one line until they start
    account: str = ""       # the Slurm account (team) it runs under


@dataclass(frozen=True)
class SlurmNode:
    """One node as sinfo shows it."""

    name: str
    state: str                  # sinfo's long state: idle~ powered down, down# powering up, down* not responding, ...
    reason: str                 # why it is down or drained, as it was set ("" when none), without Slurm's [user@time]
    reason_time: float | None   # when that reason was set (Slurm's own stamp), None when Slurm has none


def exe(name: str) -> str:
    """A Slurm program's path: slurmctld runs its programs without PATH, so the usual places are tried too."""
    return shutil.which(name) or shutil.which(name, path=SEARCH_PATH) or name


def _run(argv: list[str], input: str | None = None, check: bool = True, env: dict[str, str] | None = None,
         user: str | None = None) -> str:
    """A Slurm command's output; ``user``: run as that user (a team's: trainer.slurm.users.submit_argv), with
    this environment."""
    env = {**os.environ, **env} if env else None
    full = users.submit_argv(user, [exe(argv[0]), *argv[1:]], env or os.environ)
    try:
        proc = subprocess.run(full, input=input, capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
    except FileNotFoundError:
        raise SlurmError(f"{argv[0]}: not found; install Slurm's client commands (Debian: slurm-client)") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{argv[0]}: no answer within {TIMEOUT_S} s (is slurmctld running?)") from None
    if check and proc.returncode != 0:
        why = next((ln.strip() for ln in proc.stderr.splitlines() if ln.strip()), f"exit status {proc.returncode}")
        raise SlurmError(f"{argv[0]}{f' as {user}' if user else ''}: {why}")
    return proc.stdout


def hostnames(hostlist: str) -> list[str]:
    """Slurm's hostlist expression (q-[1-3],g-2) as names."""
    return _run(["scontrol", "show", "hostnames", hostlist]).split()


def sbatch(script: str, user: str | None = None) -> str:
    """Submit a batch script (on stdin), as ``user`` where given (the job then runs as that user); the job id
    Slurm gave it."""
    return _run(["sbatch", "--parsable"], input=script, user=user).strip().split(";")[0]


# --- squeue --json: 22.05's shape and 23.11's (data_parser v0.0.40 and later) -----------------------------------

# Slurm's job_state_string(): the one word 22.05 prints for a state, its first flag in this order, else the base.
_STATE_FLAGS = ("COMPLETING", "STAGE_OUT", "CONFIGURING", "RESIZING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD",
                "SPECIAL_EXIT", "STOPPED", "REVOKED", "RESV_DEL_HOLD", "SIGNALING")


def number(value) -> int | None:
    """An integer as squeue prints it: a plain number (22.05; null when unset) or {"set", "infinite", "number"}
    (23.11 and later). None when unset or infinite."""
    if isinstance(value, dict):
        if not value.get("set") or value.get("infinite"):
            return None
        value = value.get("number")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(value)


def job_state(value) -> str:
    """A job's state as 22.05 prints it (one word) from either shape: 23.11 and later print the base state and its
    flags as a list, read here as Slurm's own job_state_string() reads the bits (a flag first, in its order)."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list) or not value:
        return ""
    words = [str(v) for v in value]
    return next((f for f in _STATE_FLAGS if f in words), words[0])


def exit_code(value) -> int | None:
    """A job's exit code as 22.05 prints it (the wait status: code << 8, or the signal) from either shape: 23.11
    and later print {"status": ["SUCCESS" | "ERROR" | "SIGNALED" | "PENDING" | ...], "return_code": {...},
    "signal": {"id": {...}, "name": ...}}. None while there is none (status PENDING: return code and signal unset)."""
    if not isinstance(value, dict):
        return number(value)
    signal = number((value.get("signal") or {}).get("id"))
    if signal:
        return signal
    code = number(value.get("return_code"))
    return None if code is None else code << 8


def normalise_job(raw: dict) -> dict:
    """One job of ``squeue --json`` in 22.05's shape, whichever Slurm printed it; other fields as they are."""
    out = dict(raw)
    out["job_state"] = job_state(raw.get("job_state"))
    out["exit_code"] = exit_code(raw.get("exit_code"))
    for key in ("job_id", "array_job_id", "array_task_id", "restart_cnt", "submit_time", "start_time", "end_time"):
        if key in raw:
            out[key] = number(raw[key])
    return out


def array_size(task_ids: str) -> int:
    """How many array elements an index list names ("0-9", "1,3,5-7", "0-30:3", any "%N" limit after it); 1 for
    none (not an array line)."""
    count = 0
    for part in (task_ids or "").split("%")[0].split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+)(?::(\d+))?)?", part.strip())
        if m:
            first, last, step = int(m[1]), int(m[2] or m[1]), int(m[3] or 1)
            count += (last - first) // max(step, 1) + 1 if last >= first else 0
    return max(count, 1)


def _time(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def _job(raw: dict) -> SlurmJob:
    raw = normalise_job(raw)
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
        start_time=_time(raw.get("start_time")), end_time=_time(raw.get("end_time")),
        tasks=array_size(raw.get("array_task_string") or "") if array_job and task is None else 1,
        account=raw.get("account") or "")


def jobs() -> list[SlurmJob]:
    """Every job slurmctld knows (pending, running, and finished within MinJobAge), array elements apart."""
    data = json.loads(_run(["squeue", "--json", "--all", "--states=all"], env=READ_ENV) or "{}")
    return [_job(j) for j in data.get("jobs", [])]


def job(job_id: str) -> SlurmJob | None:
    """One job (an array element by its own job id) as slurmctld knows it, or None. 22.05's ``squeue --json``
    ignores --jobs (it prints every job), so the job is picked here."""
    data = json.loads(_run(["squeue", "--json", "--states=all", f"--jobs={job_id}"], env=READ_ENV) or "{}")
    found = [_job(j) for j in data.get("jobs", []) if number(j.get("job_id")) == int(job_id)]
    return found[0] if found else None


def batch_script(job_id: str) -> str:
    """The batch script a job was submitted with (an array's, for any of its elements): Slurm's own copy."""
    return _run(["scontrol", "write", "batch_script", job_id, "-"])


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
    for line in _run(argv, env=READ_ENV).splitlines():
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
    """A time Slurm printed (ISO 8601, local time) as a Unix time; None for Unknown, None and the like."""
    try:
        return datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:  # Unknown, None
        return None


def accounting_backlog() -> int | None:
    """What slurmctld still has to tell slurmdbd (``sdiag``'s "DBD Agent queue size"): 0 once accounting has all
    it knows; None where sdiag does not say (no slurmdbd)."""
    for line in _run(["sdiag"]).splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "DBD Agent queue size" and value.strip().isdigit():
            return int(value.strip())
    return None


_STORAGE: list[str] = []


def _accounting_storage() -> str:
    """AccountingStorageType of the cluster (read once)."""
    if not _STORAGE:
        out = _run(["scontrol", "show", "config"])
        _STORAGE.append(next((ln.split("=", 1)[1].strip() for ln in out.splitlines()
                              if ln.startswith("AccountingStorageType")), ""))
    return _STORAGE[0]


def scancel(job_id: str, user: str | None = None) -> None:
    """Cancel a job, as ``user`` where given (its owner: a team's user may cancel only its own jobs)."""
    _run(["scancel", job_id], user=user)


def requeue(job_id: str) -> None:
    _run(["scontrol", "requeue", job_id])


def update_node(name: str, **fields: str) -> None:
    _run(["scontrol", "update", f"nodename={name}", *(f"{k}={v}" for k, v in fields.items())])


# The fields of `scontrol show node -o` whose values may hold spaces: Reason, and what may follow it (22.05: Comment,
# Extra; 26.05 also InstanceId, InstanceType, ReservationName, TLSCertTokenSet, TLSCertLastRenewal, Topology,
# Parameters: src/api/node_info.c). Each runs to the next of them.
_SPACED = re.compile(r" (?=(?:Reason|Comment|Extra|InstanceId|InstanceType|ReservationName|TLSCertTokenSet|"
                     r"TLSCertLastRenewal|Topology|Parameters)=)")


def parse_node_line(line: str) -> dict[str, str]:
    """One line of `scontrol show node -o`: its KEY=VALUE fields, the last ones whole (the Reason with Slurm's
    " [user@time]" after it, a Comment, ...)."""
    head, *spaced = _SPACED.split(line.strip())
    fields = dict(word.partition("=")[::2] for word in head.split() if "=" in word)
    fields.update(part.strip().partition("=")[::2] for part in spaced)
    return {k: v for k, v in fields.items() if not (k == "Reason" and not v)}


def node_fields(name: str) -> dict[str, str]:
    """A node as slurmctld has it (`scontrol show node -o`): NodeAddr, Gres, AvailableFeatures, State, ... and its
    whole Reason (see :func:`parse_node_line`)."""
    return parse_node_line(_run(["scontrol", "show", "node", "-o", name], env=READ_ENV))


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


NODE_FORMAT = "%N|%T|%H|%E"  # name, state, when its reason was set, the reason (last: it may hold a "|")


def parse_nodes(text: str) -> list[SlurmNode]:
    """`sinfo -h -N -o NODE_FORMAT` (ISO times) as nodes, each once (sinfo lists a node once per partition)."""
    found: dict[str, SlurmNode] = {}
    for line in text.splitlines():
        fields = line.split("|", 3)
        if len(fields) != 4 or not fields[0]:
            continue
        name, state, stamp, reason = fields
        found.setdefault(name, SlurmNode(name, state.strip(), "" if reason.strip() == "none" else reason.strip(),
                                         _iso(stamp)))
    return list(found.values())


def nodes() -> list[SlurmNode]:
    """Every node with its state and its reason as Slurm keeps them (the reason's own time included)."""
    return parse_nodes(_run(["sinfo", "-h", "-N", "-o", NODE_FORMAT], env=READ_ENV))
