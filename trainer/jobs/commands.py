"""What `gpufleet jobs list|status|logs|cancel|retry` do, on the stack's bucket and queue (the records of
trainer.jobs.records, the output of trainer.jobs.logs). The console (flags, the table, prices from the
catalog) is infra/jobs.py; this module needs neither Pulumi nor infra.

Where the jobs are: ``--stack NAME`` (the outputs of ``pulumi stack output --json --stack NAME``, run in the
project directory; ``--stack box``: the running cluster in a box, see :func:`box_target`), or ``--queue-url``/``--bucket`` (environment: GPUFLEET_QUEUE_URL, GPUFLEET_BUCKET,
GPUFLEET_DLQ_URL).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

from trainer.errors import UsageError
from trainer.jobs import logs, records
from trainer.jobs.layout import job_uri
from trainer.jobs.queue import open_queue
from trainer.jobs.records import RecordStore

if TYPE_CHECKING:
    from trainer.jobs.queue import JobQueue

BOX_STACK = "box"  # --stack box: the running cluster in a box, no Pulumi
ENV = {"queue_url": "GPUFLEET_QUEUE_URL", "bucket": "GPUFLEET_BUCKET", "dlq_url": "GPUFLEET_DLQ_URL",
       "team": "GPUFLEET_TEAM"}
DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])\Z")
UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


@dataclass(frozen=True)
class Target:
    bucket: str
    queue_url: str | None = None
    dlq_url: str | None = None
    team: str | None = None     # whose jobs (records under teams/<team>/, its queues); None: the default team

    def records(self) -> RecordStore:
        return RecordStore.of_bucket(self.bucket, self.team)


def stack_outputs(stack: str, project_dir, run=subprocess.run) -> dict:
    """``pulumi stack output --json --stack NAME`` in the project directory; one line for each way it fails."""
    try:
        proc = run(["pulumi", "stack", "output", "--json", "--stack", stack], cwd=project_dir,
                   capture_output=True, text=True, timeout=120)
    except FileNotFoundError:
        raise UsageError("--stack: the pulumi CLI is not on PATH; install it, or give --queue-url and --bucket "
                         "(or GPUFLEET_QUEUE_URL and GPUFLEET_BUCKET)") from None
    if proc.returncode != 0:
        why = next((ln.strip() for ln in proc.stderr.splitlines() if ln.strip()), f"exit status {proc.returncode}")
        raise UsageError(f"--stack {stack}: `pulumi stack output` failed: {why}")
    try:
        outputs = json.loads(proc.stdout or "{}")
    except ValueError:
        raise UsageError(f"--stack {stack}: `pulumi stack output --json` printed no JSON") from None
    return outputs if isinstance(outputs, dict) else {}


def team_inlet(where: str, team: str | None, queues: dict, dead_letters: dict,
                first: str) -> tuple[str, str | None, str | None] | None:
    """The queue, dead-letter queue and team of ``team`` (None: the team whose queue is ``first``, the stack's
    first queue; None without team queues); UsageError for a team the stack has no queue for."""
    if team is None:
        team = next((t for t, url in (queues or {}).items() if url == first), None)
        if team is None:
            return None
    if team not in (queues or {}):
        raise UsageError(f"--team: {where} has no queue for team {team!r}; its teams' queues: {', '.join(queues)}")
    return queues[team], (dead_letters or {}).get(team), team


def target_of_outputs(stack: str, outputs: dict, team: str | None = None) -> Target:
    """The bucket (an S3 bucket name, the Azure checkpoints container URL, cos://<bucket> on Tencent), queue
    and dead-letter queue of a stack's outputs (``team``'s, where each team has its own)."""
    bucket = outputs.get("containerUrl") or outputs.get("bucket")
    if bucket and str(outputs.get("checkpointUriTemplate", "")).startswith("cos://"):
        bucket = f"cos://{bucket}"
    if not bucket or not outputs.get("queueUrl"):
        raise UsageError(f"--stack {stack}: the stack has no outputs (bucket, queueUrl); deploy it first "
                         f"(`pulumi up --stack {stack}`), or give --queue-url and --bucket")
    dlq = outputs.get("dlqUrl") or outputs.get("poisonQueueUrl")
    if not outputs.get("teamQueues"):  # one queue for all (Azure): its jobs are the first team's
        first = (outputs.get("teams") or [None])[0]
        if team is not None and team != first:
            raise UsageError(f"--team: stack {stack} has one queue, for team {first or 'default'}; team {team!r} has "
                             "none")
        return Target(bucket, outputs["queueUrl"], dlq, first)
    own = team_inlet(f"stack {stack}", team, outputs["teamQueues"], outputs.get("teamDeadLetterQueues"),
                     outputs["queueUrl"])
    return Target(bucket, *own) if own else Target(bucket, outputs["queueUrl"], dlq)


def box_dir(environ=os.environ) -> Path:
    """Where the cluster in a box lives (`gpufleet box up --dir`): GPUFLEET_BOX_DIR, else ~/.gpufleet/box."""
    return Path(environ.get("GPUFLEET_BOX_DIR") or Path.home() / ".gpufleet" / "box")


def box_target(environ=os.environ, team: str | None = None) -> Target:
    """The running box's bucket and queues (its state.json); its account (moto on loopback) becomes this
    process's AWS endpoint unless one is set."""
    path = box_dir(environ) / "state.json"
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        raise UsageError(f"--stack box: no box is running ({path} is missing); start one with `gpufleet box up` "
                         "(or set GPUFLEET_BOX_DIR to its --dir)") from None
    for key, value in (("AWS_ENDPOINT_URL", state["endpoint"]), ("AWS_DEFAULT_REGION", state["region"]),
                       ("AWS_ACCESS_KEY_ID", "box"), ("AWS_SECRET_ACCESS_KEY", "box"),
                       ("AWS_EC2_METADATA_DISABLED", "true")):
        environ.setdefault(key, value)
    own = team_inlet("the box", team, state.get("team_queues"), state.get("team_dead_letters"), state["queue_url"])
    return Target(state["bucket"], *own) if own else Target(state["bucket"], state["queue_url"], state.get("dlq_url"))


def resolve(stack: str | None, project_dir, queue_url: str | None, bucket: str | None, dlq_url: str | None = None,
            environ=os.environ, team: str | None = None) -> Target:
    """Where a command's jobs are: a stack's (``team``: that team's queues, else the first team's), the box's,
    or the flags and variables given."""
    if stack == BOX_STACK:
        return box_target(environ, team)
    if stack:
        return target_of_outputs(stack, stack_outputs(stack, project_dir), team)
    bucket = bucket or environ.get(ENV["bucket"])
    if not bucket:
        raise UsageError(f"no jobs bucket: give --stack NAME, or --bucket (or {ENV['bucket']})")
    return Target(bucket, queue_url or environ.get(ENV["queue_url"]), dlq_url or environ.get(ENV["dlq_url"]),
                  team or environ.get(ENV["team"]) or None)


def parse_since(text: str, now: float) -> float:
    """``--since``: a duration back from now (90s, 30m, 2h, 7d) or an ISO date/time (UTC unless it says)."""
    m = DURATION.match(text.strip())
    if m:
        return now - float(m.group(1)) * UNIT_S[m.group(2)]
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise UsageError(f"--since: {text!r} is not allowed; expected a duration (30m, 2h, 7d) or an ISO date/time "
                         "(2026-05-01 or 2026-05-01T12:00)") from None
    return (when if when.tzinfo else when.replace(tzinfo=timezone.utc)).timestamp()


def select(recs: list[dict], state: str | None, since: float | None) -> list[dict]:
    if state and state not in records.STATES:
        raise UsageError(f"--state: {state!r} is not allowed; expected one of {', '.join(records.STATES)}")
    return [r for r in recs if (not state or r["state"] == state) and (since is None or r["submitted"] >= since)]


def age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def row(rec: dict, now: float, price_hour: Callable[[str], float | None] | None = None) -> dict:
    """One job as the `list` table shows it (`list --format json`: the record with gpu_hours and cost added)."""
    last = rec["attempts"][-1] if rec.get("attempts") else None
    progress = rec.get("progress") or {}
    step = progress.get("step")
    return {
        "job_id": rec["job_id"], "kind": rec.get("kind"), "state": rec["state"]
        + (" (cancelling)" if rec.get("cancel_requested") and rec["state"] == "running" else ""),
        "attempts": len(rec.get("attempts", [])), "node": ",".join(last["nodes"]) if last else "",
        "progress": "" if step is None else f"{step}/{progress['total']}" if progress.get("total") else str(step),
        "age": age(now - rec["submitted"]), "gpu_hours": round(records.gpu_hours(rec, now), 3),
        "cost": None if price_hour is None else records.cost(rec, price_hour, now),
    }


def checkpoint_uri(target: Target, rec: dict) -> str:
    """Where the job checkpoints: its own --checkpoint-uri, else <bucket>/teams/<team>/jobs/<job_id>/."""
    args = list((rec.get("spec") or {}).get("args") or [])
    for i, arg in enumerate(args):
        if arg == "--checkpoint-uri" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--checkpoint-uri="):
            return arg.partition("=")[2]
    return job_uri(target.bucket, target.team, rec["job_id"])


def output(target: Target, job_id: str, attempt: int | None, follow: bool, poll_s: float = 2.0) \
        -> Iterator[tuple[int, str, bytes]]:
    """(attempt, node, bytes) of the job's output: one attempt (default: the latest), or with ``follow`` every
    chunk as it comes until the job is finished."""
    rs = target.records()
    rs.get(job_id)  # an unknown id is one line, not an empty output
    store = rs.store
    if follow:
        def finished() -> bool:
            return rs.get(job_id)["state"] in records.TERMINAL

        yield from logs.follow(store, job_id, finished, attempt, poll_s, only_attempt=attempt is not None)
        return
    numbers = logs.attempts(store, job_id)
    if attempt is not None and attempt not in numbers:
        raise UsageError(f"--attempt: job {job_id} has no output of attempt {attempt}; attempts with output: "
                         f"{', '.join(map(str, numbers)) or 'none yet'}")
    chosen = attempt if attempt is not None else (numbers[-1] if numbers else None)
    if chosen is None:
        return
    for node, data in logs.read(store, job_id, chosen):
        yield chosen, node, data


def cancel(target: Target, job_id: str) -> str:
    """The user's cancel, told in one line."""
    told = ""

    def fn(rec: dict) -> dict:
        nonlocal told
        new, told = records.cancel(rec, time.time())
        return new

    target.records().update(job_id, fn)
    return told


def retry(target: Target, job_id: str) -> str:
    """A failed (or dead-lettered) or cancelled job back on the queue: a fresh message from its spec with a fresh
    retry budget (the record keeps every attempt), the dead-letter copy removed when there is one, the record
    queued. It resumes from its newest checkpoint."""
    if not target.queue_url:
        raise UsageError(f"retry: no queue; give --stack NAME or --queue-url (or {ENV['queue_url']})")
    rs = target.records()
    rec = rs.get(job_id)
    if rec.get("kind") == "sbatch":
        raise UsageError(f"retry: job {job_id} was submitted with sbatch on the controller, not through the queue; "
                         "submit its script again with sbatch")
    queue = open_queue(target.queue_url)
    dlq = open_queue(target.dlq_url) if target.dlq_url else queue.dead_letters()
    removed = remove_dead_letter(dlq, job_id) if dlq else 0
    if removed and rec["state"] not in ("failed", "cancelled"):  # dead-lettered before the bridge could say so
        rs.update(job_id, lambda r: records.end(r, "failed", None, "dead-lettered", time.time()))
    rec = rs.update(job_id, lambda r: records.retry(r, time.time()))  # refuses a job that is not finished badly
    queue.send(json.dumps({k: v for k, v in rec["spec"].items() if k != "attempts"}))
    return (f"job {job_id} queued again after {len(rec['attempts'])} attempt(s)"
            + ("; its dead-letter message removed" if removed else ""))


def remove_dead_letter(dlq: JobQueue, job_id: str, wait_s: int = 1) -> int:
    """Delete the job's messages from the dead-letter queue (others are made visible again); how many."""
    others, removed = [], 0
    while (msg := dlq.receive(wait_s)) is not None:
        try:
            mine = json.loads(msg.body).get("job_id") == job_id
        except (ValueError, AttributeError):
            mine = False
        if mine:
            dlq.delete(msg)
            removed += 1
        else:
            others.append(msg)
            if len(others) > 1000:
                break
    for msg in others:
        dlq.release(msg)
    return removed
