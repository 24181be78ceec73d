"""Job records: one JSON document per job at ``<store>/jobs/<job_id>/record.json``, beside its checkpoints; the
store is a team's part of the bucket (``teams/<team>/``, trainer.jobs.layout), so each team has its own records,
index and job ids.

A record: ``{"job_id", "kind", "spec" (the job's message, env values hidden), "state", "reason",
"cancel_requested", "submitted", "updated", "rev", "attempts": [{"n", "nodes", "instance_type", "gpus", "start",
"end", "exit_status", "reason"}], "progress": {"step", "total", "loss", "samples_per_s", "gpu_util", "at"}}``; times are Unix seconds.

The states and what moves a job between them are pure functions of a record (:data:`TRANSITIONS`, :func:`claim`,
:func:`end`, :func:`cancel`, :func:`retry`, :func:`with_progress`). :class:`RecordStore` applies them with the
store's conditional writes (read with the version, write only if it is still that version, retry on a
Conflict), so the bridge, the task of a job's node rank 0 (its progress) and the user's `cancel` never lose each
other's update.

An index makes `jobs list` one read per shard instead of one per job: after each record write the writer puts
the record (without its spec) into ``jobs-index/<shard>.json`` (``INDEX_SHARDS`` shards by a hash of the id,
conditional writes again, an entry never replaced by an older revision). A job's own task writes no index
(``index=False``): a shard holds other jobs' entries, whose cancels and Slurm ids the bridge reads from it, so
the bridge copies a running job's progress into the index (:meth:`RecordStore.reindex`). The record stays the
truth: `status` reads it, and ``RecordStore.all(scan=True)`` reads every record (a bucket written before the
index).
"""
from __future__ import annotations

import json
import logging
import zlib
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from trainer.errors import UsageError
from trainer.jobs.layout import team_base
from trainer.jobs.spec import hidden_values
from trainer.loop.storage import Conflict, Store, open_store

log = logging.getLogger("gpufleet.records")

STATES = ("queued", "running", "preempted", "succeeded", "failed", "cancelled")
TERMINAL = frozenset({"succeeded", "failed", "cancelled"})
# state -> the states it may move to. queued again: a failure within its retries; preempted: an attempt stopped by
# its node going away, the job waits for the next one; failed/cancelled -> queued: `retry`.
TRANSITIONS = {
    "queued": {"running", "cancelled", "failed"},
    "running": {"queued", "preempted", "succeeded", "failed", "cancelled"},
    "preempted": {"running", "queued", "cancelled", "failed"},
    "succeeded": set(),
    "failed": {"queued"},
    "cancelled": {"queued"},
}
PROGRESS_FIELDS = ("step", "total", "loss", "samples_per_s", "gpu_util")
PROGRESS_EVERY_S = 30.0
MAX_TRIES = 50  # read-modify-write cycles before a contended update gives up
INDEX_PREFIX = "jobs-index/"
INDEX_SHARDS = 16


def record_key(job_id: str) -> str:
    return f"jobs/{job_id}/record.json"


def index_key(job_id: str) -> str:
    return f"{INDEX_PREFIX}{zlib.crc32(job_id.encode()) % INDEX_SHARDS:02d}.json"


def summary(rec: dict) -> dict:
    """A record's index entry: everything but its spec."""
    return {k: v for k, v in rec.items() if k != "spec"}


def reused(job_id: str, state: str) -> str:
    """The one line that refuses a finished job's id."""
    return (f"--job-id: job {job_id} exists ({state}); ids are not reused: choose another id, or pass --again "
            "for a new attempt of that job (it resumes from its checkpoints)")


class Transition(UsageError):
    """A move the state machine does not allow (retry of a running job, ...): one line."""


def allowed(src: str, dst: str) -> bool:
    return dst in TRANSITIONS[src]


def _move(rec: dict, dst: str, now: float, reason: str | None = None) -> dict:
    if not allowed(rec["state"], dst):
        raise Transition(f"job {rec['job_id']} is {rec['state']}; it cannot become {dst}")
    return {**rec, "state": dst, "reason": reason, "updated": now}


def new_record(spec: dict, now: float) -> dict:
    """The queued record of a job (``spec``: its message, Job.to_dict(); the record shows env names, never their
    values: trainer.jobs.spec.hidden_values)."""
    return {"job_id": spec["job_id"], "kind": spec.get("kind", "trainer"), "spec": hidden_values(spec),
            "state": "queued", "reason": None, "cancel_requested": False, "submitted": now, "updated": now, "rev": 0,
            "attempts": [], "progress": None}


def _close_open(attempts: list[dict], now: float, reason: str) -> list[dict]:
    """An attempt still open when the next one starts lost its node without ending: close it."""
    return [{**a, "end": now, "reason": reason} if a.get("end") is None else a for a in attempts]


def claim(rec: dict, attempt: dict, now: float) -> dict:
    """A node (or gang) starts an attempt: running, one more attempt, no progress yet. ``attempt``: nodes (or
    node), instance_type, gpus (per node), n (the node's count; never below the record's next number, so a
    job queued again by `retry` goes on counting)."""
    attempts = _close_open(rec["attempts"], now, "lost")
    nodes = attempt.get("nodes") or ([attempt["node"]] if attempt.get("node") else [])
    entry = {"n": max(attempt.get("n") or 0, len(attempts) + 1), "nodes": list(nodes),
             "instance_type": attempt.get("instance_type"), "gpus": attempt.get("gpus"), "start": now,
             "end": None, "exit_status": None, "reason": None}
    if rec["state"] == "running":  # its last attempt was lost: the record never heard it end
        rec = {**rec, "state": "queued"}
    return {**_move(rec, "running", now), "attempts": [*attempts, entry], "progress": None}


def end(rec: dict, outcome: str, exit_status: int | None, reason: str | None, now: float) -> dict:
    """The running attempt ended: the job is now ``outcome`` (succeeded, failed, preempted, cancelled, or queued
    again); the attempt gets its end, exit status and reason."""
    attempts = list(rec["attempts"])
    if attempts and attempts[-1].get("end") is None:
        attempts[-1] = {**attempts[-1], "end": now, "exit_status": exit_status, "reason": reason}
    return {**_move(rec, outcome, now, reason), "attempts": attempts}


def cancel(rec: dict, now: float) -> tuple[dict, str]:
    """(the record after a user's cancel, what happened): a waiting job is cancelled at once; a running one gets
    cancel_requested (the bridge cancels it in Slurm and marks it cancelled); a finished one is unchanged."""
    if rec["state"] in TERMINAL:
        return rec, f"job {rec['job_id']} has already {'been ' if rec['state'] == 'cancelled' else ''}" \
                    f"{rec['state']}; nothing changed"
    if rec["state"] == "running":
        return {**rec, "cancel_requested": True, "updated": now}, \
            f"job {rec['job_id']} is running: its node stops it (checkpoint, exit) and marks it cancelled"
    return _move(rec, "cancelled", now, "cancel"), f"job {rec['job_id']} cancelled (it was {rec['state']})"


def retry(rec: dict, now: float) -> dict:
    """A failed or cancelled job queued again, its attempts kept."""
    if rec["state"] not in ("failed", "cancelled"):
        raise Transition(f"job {rec['job_id']} is {rec['state']}; only a failed or cancelled job can be retried")
    return {**_move(rec, "queued", now, "retry"), "cancel_requested": False}


def with_progress(rec: dict, progress: dict, now: float) -> dict:
    """The latest progress of a running job (unknown fields dropped); other states unchanged."""
    if rec["state"] != "running":
        return rec
    return {**rec, "progress": {**{k: progress.get(k) for k in PROGRESS_FIELDS}, "at": now}, "updated": now}


def attempt_hours(attempt: dict, now: float) -> float:
    """Hours the attempt held its nodes (up to now while it runs), per node."""
    if attempt.get("start") is None:
        return 0.0
    return max(0.0, ((attempt.get("end") or now) - attempt["start"]) / 3600.0)


def gpu_hours(rec: dict, now: float) -> float:
    """GPU-hours of every attempt so far: hours x nodes x GPUs per node."""
    return sum(attempt_hours(a, now) * max(1, len(a.get("nodes") or ())) * (a.get("gpus") or 0)
               for a in rec.get("attempts", []))


def cost(rec: dict, price_hour: Callable[[str], float | None], now: float) -> float | None:
    """Cost so far: hours x nodes x the hourly price of each attempt's instance type (``price_hour``: type ->
    price, None when unknown); None when an attempt's type has no price."""
    total = 0.0
    for a in rec.get("attempts", []):
        price = price_hour(a["instance_type"]) if a.get("instance_type") else None
        if price is None:
            return None
        total += attempt_hours(a, now) * max(1, len(a.get("nodes") or ())) * price
    return total


def _indexed(shard: dict, rec: dict) -> dict:
    """The index shard with ``rec``'s entry, unless it holds a newer revision (a later writer's) already."""
    old = shard.get(rec["job_id"])
    if old is not None and old.get("rev", 0) > rec.get("rev", 0) and old.get("submitted") == rec.get("submitted"):
        return shard
    return {**shard, rec["job_id"]: summary(rec)}


class UnknownJob(UsageError):
    pass


class RecordStore:
    """The records of one store (the stack's bucket): :meth:`create`, :meth:`get`, :meth:`update`, :meth:`all`
    (submit, the bridge and the commands) and :meth:`progress` (a job's task, while it runs)."""

    def __init__(self, store: Store, progress_every_s: float = PROGRESS_EVERY_S, clock: Callable[[], float] = time.time,
                 index: bool = True):
        self.store = store
        self.index = index
        self.progress_every_s = progress_every_s
        self.clock = clock
        self._last_progress: dict[str, float] = {}
        self._lock = threading.Lock()

    @classmethod
    def of_bucket(cls, bucket: str, team: str | None, **kw) -> "RecordStore":
        """The records of ``team`` (None: the default team) in the cluster's bucket (an S3 bucket name, or a store
        URI: az://, https://, cos://)."""
        return cls(open_store(team_base(bucket, team)), **kw)

    # --- reading and conditional writing ----------------------------------------------------------

    def get(self, job_id: str) -> dict:
        try:
            return json.loads(self.store.read_bytes(record_key(job_id)))
        except FileNotFoundError:
            raise UnknownJob(f"job {job_id!r}: no such job in {self.store.uri} (`gpufleet jobs list` lists them)") \
                from None

    def update(self, job_id: str, fn: Callable[[dict], dict], missing: Callable[[], dict] | None = None) -> dict:
        """Read-modify-write: ``fn(record) -> record`` applied with a conditional write, again from a fresh read
        whenever another writer got in between. A missing record is ``missing()`` (UnknownJob without it).
        An unchanged record is not written."""
        new = self._cas(record_key(job_id), job_id, fn, missing)
        if self.index:
            self._index(job_id, new)
        return new

    def reindex(self, job_id: str) -> dict:
        """The record as it is now, copied into its index entry (a running job's progress, which its task wrote
        to the record alone)."""
        rec = self.get(job_id)
        self._index(job_id, rec)
        return rec

    def _index(self, job_id: str, rec: dict) -> None:
        try:
            self._cas(index_key(job_id), job_id, lambda shard: _indexed(shard, rec), dict)
        except Exception as exc:  # the record is written; the index catches up at the job's next write
            log.warning("job %s: index not updated (%s)", job_id, exc)

    def _cas(self, key: str, job_id: str, fn: Callable[[dict], dict], missing: Callable[[], dict] | None) -> dict:
        for tries in range(MAX_TRIES):
            try:
                data, version = self.store.read_versioned(key)
                current = json.loads(data)
            except FileNotFoundError:
                if missing is None:
                    raise UnknownJob(f"job {job_id!r}: no such job in {self.store.uri}") from None
                current, version = missing(), None
            new = fn(current)
            if new == current and version is not None:
                return current
            if key.startswith("jobs/"):
                new = {**new, "rev": current.get("rev", 0) + 1 if version is not None else 0}
            try:
                self.store.write_if(key, json.dumps(new).encode(), version)
                return new
            except Conflict:
                time.sleep(random.uniform(0, 0.01 * min(tries + 1, 10)))  # let the other writer finish
        raise RuntimeError(f"{self.store.uri}{key}: still contended after {MAX_TRIES} tries")

    def create(self, spec: dict, again: bool = False) -> dict:
        """The queued record of a submitted job. A job id is never silently reused: an id whose job is not
        finished is refused, and so is a finished one's unless ``again`` (a new attempt of that job, by a user
        who asked for it: its attempts so far are kept and numbered on; it resumes from its checkpoints)."""
        placeholder = new_record(spec, self.clock())

        def fresh(rec: dict) -> dict:
            if rec is placeholder:
                return placeholder
            if rec["state"] not in TERMINAL:
                raise UsageError(f"--job-id: job {spec['job_id']} exists and is {rec['state']}; choose another id "
                                 "(or `gpufleet jobs cancel` it first)")
            if not again:
                raise UsageError(reused(spec["job_id"], rec["state"]))
            # its attempts, and its team: the bridge submits the job only through that team's queue
            return {**placeholder, "attempts": rec["attempts"], **{k: rec[k] for k in ("team",) if k in rec}}

        return self.update(spec["job_id"], fresh, missing=lambda: placeholder)

    def all(self, scan: bool = False, workers: int = 16) -> list[dict]:
        """Every job, oldest submission first: the index entries (no spec), or with ``scan`` (or no index yet)
        every record, read in parallel."""
        shards = [] if scan else self.store.list(INDEX_PREFIX)
        with ThreadPoolExecutor(max_workers=workers) as pool:
            if shards:
                recs = [r for shard in pool.map(self._read_or_none, shards)
                        for r in (shard or {}).values()]
            else:
                recs = list(pool.map(self._read_or_none, map(record_key, self.store.children("jobs/"))))
        return sorted((r for r in recs if r), key=lambda r: (r.get("submitted") or 0, r["job_id"]))

    def _read_or_none(self, key: str) -> dict | None:
        try:
            return json.loads(self.store.read_bytes(key))
        except FileNotFoundError:
            return None

    # --- progress, from the job's node -----------------------------------------------------------------

    def progress(self, job_id: str, progress: dict) -> bool:
        """The job's latest progress (step, total, loss, samples_per_s, gpu_util), written at most once every
        ``progress_every_s`` per job; True when written."""
        now = self.clock()
        with self._lock:
            if now - self._last_progress.get(job_id, float("-inf")) < self.progress_every_s:
                return False
            self._last_progress[job_id] = now
        self.update(job_id, lambda rec: with_progress(rec, progress, now))
        return True

    # --- the queue agent's calls: only tests/infra/test_jobs_cli.py still sets records up with them (issue 22: they
    # go once it uses claim/end through update, as the bridge does) ----------------------------------------------

    def claimed(self, job_id: str, attempt: dict, spec: dict | None = None) -> int | None:
        """An attempt of the job starts: its number; None when the job was cancelled or has succeeded already."""
        now = self.clock()
        number = None

        def fn(rec: dict) -> dict:
            nonlocal number
            if rec["state"] in TERMINAL or rec.get("cancel_requested"):
                number = None
                return rec
            new = claim(rec, attempt, now)
            number = new["attempts"][-1]["n"]
            return new

        self.update(job_id, fn, missing=(lambda: new_record(spec, now)) if spec else None)
        return number

    def ended(self, job_id: str, outcome: str, exit_status: int | None = None, reason: str | None = None) -> dict:
        """The attempt ended and the job is now ``outcome``; a record already finished is left as it is."""
        now = self.clock()
        with self._lock:
            self._last_progress.pop(job_id, None)

        def fn(rec: dict) -> dict:
            if rec["state"] in TERMINAL or not allowed(rec["state"], outcome):
                log.warning("job %s is %s; not marking it %s", job_id, rec["state"], outcome)
                return rec
            return end(rec, outcome, exit_status, reason, now)

        return self.update(job_id, fn)

    def cancel_requested(self, job_id: str) -> bool:
        """Whether the user asked to cancel the job (one read; False for a job with no record)."""
        try:
            return bool(self.get(job_id).get("cancel_requested"))
        except UnknownJob:
            return False
