"""`python -m trainer controller`: the bridge from the job queue to Slurm, on the controller.

Each message becomes an ``sbatch`` of the batch script its spec renders (trainer.slurm.batch); the jobs of a
sweep (spec "array") are gathered by their submit's nonce and become one Slurm job array. Each team has a queue of
its own, which only the team's submit identity may send to (the stack's queue policy): a job's team, and so its
Slurm account and the records it is among (``teams/<team>/`` in the bucket, trainer.jobs.layout), is the queue its
message came through, never anything its body says; the same job id through two teams' queues is two jobs, one
of each team. Slurm then does the
scheduling, the gang allocation, requeues and node health; the bridge keeps every job's record true from
Slurm's own state (``squeue --json``, through the one table in trainer.slurm.states) and does what Slurm does not:

- a message is deleted only after its Slurm job id is in the record; a message found again is first looked up
  in Slurm by its key (the job's comment: the message id, or the sweep's nonce), so a bridge killed at any
  point and restarted loses no job and submits none twice;
- a failure (FAILED, TIMEOUT, ...) is resubmitted while the job's ``retries`` allow (preemptions never count;
  an exit status in ``on_exit_codes`` always retries), each resubmission with its own key;
- a cancel asked in the record (`gpufleet jobs cancel`) is ``scancel``;
- a job slurmctld lost (killed before it saved the job: after its restart the job is gone from it, its steps
  killed, while accounting keeps it running) is submitted again, its attempt ended as a preemption, once
  slurmctld has nothing left to tell accounting (``sdiag``'s DBD agent queue is empty);
- jobs submitted with ``sbatch`` directly are mirrored as records ``slurm-<id>`` (kind "sbatch") of the team
  their Slurm account names;
- an invalid message goes to the dead-letter queue at once, with one line in its record when it names a job of
  its queue's team;
- a record shows its job's env names, never their values: the bridge keeps the values of the jobs it submits on
  the controller (trainer.slurm.envkeep) and fills them in when the job comes again without them (a retry);
- once a minute, the jobs' gauges the stack's alarms and dashboard read (:func:`job_gauges`: pending, running,
  pending for over an hour) as EMF records in the file GPUFLEET_EMF_LOG names ("-": standard output, where the
  controller's unit appends it to /var/log/gpufleet/controller-metrics.log for the CloudWatch agent).

Each team's jobs run as the team's Unix user (trainer.slurm.users): the bridge submits and cancels them as it
(``sudo -n -u gpufleet-<team>``; ``--submit-as self`` submits as the bridge's own user, for a box whose user
cannot make others).

Nodes are not the bridge's: it runs as an unprivileged user, and powering a node down needs Slurm's
administrator. ``python -m trainer nodes heal`` (trainer.slurm.nodes) does that, as the slurm user.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Callable

from trainer.errors import ArgumentParser, UsageError
from trainer.jobs import records as rc
from trainer.jobs.layout import DEFAULT_TEAM, team_of_account
from trainer.jobs.queue import JobQueue, Message, open_queue
from trainer.jobs.records import RecordStore, UnknownJob
from trainer.jobs.spec import JOB_ID, Job, hidden_names, parse_job, retry_decision, validate
from trainer.node import metric_names, node_schema
from trainer.node.emf import Emitter
from trainer.slurm import accounts, batch, client, users
from trainer.slurm.client import SlurmError, SlurmJob
from trainer.slurm.envkeep import DEFAULT_DIR, EnvKeep
from trainer.slurm.states import lifecycle

log = logging.getLogger("gpufleet.bridge")

ARRAY_WAIT_S = 60.0   # a sweep whose members do not all arrive within this runs them as single jobs
SYNC_EVERY_S = 1.0
MIRROR_PREFIX = "slurm-"
CANCEL_POLL_S = 2.0
GAUGES_EVERY_S = 60.0  # how often the controller's gauges are published
ACCOUNTING_EVERY_S = 30.0  # how often jobs gone from squeue are looked up in accounting
HOLD_VISIBILITY_S = 120  # a sweep member held while its siblings arrive stays hidden this long


Ref = tuple[str, str]  # a record: (its team, its job id)


@dataclass
class _Gathering:
    count: int
    first_seen: float
    members: dict[int, tuple[Message, Job]] = field(default_factory=dict)


def failures_counted(attempts: list[dict], since: int) -> list[dict]:
    """A record's attempts since its budget began, as retry_decision reads them."""
    out = []
    for a in attempts[since:]:
        reason = a.get("reason")
        outcome = "failed" if reason == "failure" else "timeout" if reason == "timeout" else "preempted"
        out.append({"outcome": outcome, "exit_status": a.get("exit_status")})
    return out


# Pending by request, not for want of a node: not counted among the jobs pending too long (they still are pending).
WAITING_BY_REQUEST = ("Dependency", "DependencyNeverSatisfied", "BeginTime", "JobHeldUser", "JobHeldAdmin")


def job_gauges(jobs: list[SlurmJob], now: float) -> dict[str, float]:
    """The controller's job gauges from squeue's jobs (each element of an array counted): pending (PENDING);
    running (RUNNING, or CONFIGURING while its nodes power up); pending longer than PENDING_ALARM_S, from Slurm's
    submit time (a requeued job's counts from its requeue), unless it waits by request (a dependency, a begin
    time, a hold)."""
    pending = running = old = 0
    for j in jobs:
        if j.state == "PENDING":
            pending += j.tasks
            if (j.submit_time is not None and now - j.submit_time > metric_names.PENDING_ALARM_S
                    and j.reason not in WAITING_BY_REQUEST):
                old += j.tasks
        elif j.state in ("RUNNING", "CONFIGURING"):
            running += j.tasks
    return {metric_names.JOBS_PENDING: float(pending), metric_names.JOBS_RUNNING: float(running),
            metric_names.PENDING_OVER_AN_HOUR: float(old)}


class Bridge:
    def __init__(self, queue: JobQueue | None, records_of: Callable[[str], RecordStore], site: batch.Site,
                 slurm=client, clock=time.time, receive_wait_s: int = 1, array_wait_s: float = ARRAY_WAIT_S,
                 emitter=None, env_keep: EnvKeep | None = None, team_queues: dict[str, JobQueue] | None = None,
                 team_users: bool = False):
        # each team's queue (a message's team is the queue it came through); or one queue, for site.account's team
        self.queues: dict[str, JobQueue] = dict(team_queues) if team_queues else {
            site.account or DEFAULT_TEAM: queue}
        self._turn = 0                        # the queue received from next, in turn while nothing comes
        self.records_of = records_of          # a team -> its records (RecordStore.of_bucket(bucket, team))
        self._records: dict[str, RecordStore] = {}
        for team in self.queues:  # made now, not between a message's receipt and its sbatch
            self.records(team)
        # each team's jobs submitted as the team's Unix user (trainer.slurm.users), which they then run as; else
        # as the bridge's own user (a box whose user cannot make others)
        self.team_users = team_users
        # one queue and no account: sbatch under the bridge user's default account, the records the default team's
        self.users_account = not team_queues and site.account is None and not team_users
        self.site, self.slurm = site, slurm
        self.env_keep = env_keep              # the jobs' env values (records show names only), or None
        self.clock, self.receive_wait_s, self.array_wait_s = clock, receive_wait_s, array_wait_s
        self.emitter = emitter                # the gauges' EMF emitter (trainer.node.emf.Emitter), or None
        self.gathering: dict[tuple[str, str], _Gathering] = {}  # (team, sweep nonce) -> its members so far
        self.known: dict[str, Ref] = {}       # Slurm job id -> (team, record job id)
        self.seen: dict[str, tuple] = {}      # Slurm job id -> the state last applied
        self.loaded = False
        self.cancelling: set[str] = set()     # Slurm job ids scancel was sent for
        self._cancelled: set[str] = set()
        self.final: set[str] = set()          # Slurm job ids Slurm is done with (nothing more to read)
        self.listed: list[SlurmJob] | None = None  # the jobs squeue listed at the last sync
        self._last_sync = self._last_cancel_poll = self._last_accounting = self._last_progress = 0.0
        self._last_gauges: float | None = None

    # --- the loop ---------------------------------------------------------------------------------------------

    def serve(self, stop: threading.Event) -> int:
        log.info("bridge: %s -> Slurm; records in %s", ", ".join(
            f"team {team}'s queue {getattr(q, 'url', '?')}" for team, q in self.queues.items()),
            ", ".join(self.records(team).store.uri for team in self.queues))
        while not stop.is_set():
            self.step()
        return 0

    def step(self) -> None:
        try:
            team = list(self.queues)[self._turn % len(self.queues)]
            msg = self.queues[team].receive(self.receive_wait_s)
            if msg is not None:
                self.take(msg, team)
            else:
                self._turn += 1
            self.flush_gatherings()
            if self.clock() - self._last_sync >= SYNC_EVERY_S:
                self.sync()
                self._last_sync = self.clock()
                self.publish()
        except SlurmError as exc:  # slurmctld restarting, say: nothing is lost, try again
            log.warning("Slurm: %s; trying again", exc)
            time.sleep(1)
        except Exception as exc:  # the queue or the bucket away for a moment
            log.warning("bridge step failed (%s: %s); trying again", type(exc).__name__, exc)
            time.sleep(1)

    # --- messages -> sbatch ---------------------------------------------------------------------------------

    def records(self, team: str) -> RecordStore:
        """The records of ``team`` (its part of the bucket)."""
        if team not in self._records:
            self._records[team] = self.records_of(team)
        return self._records[team]

    def take(self, msg: Message, team: str) -> None:
        """A message from ``team``'s queue: a job of that team, whatever its body says."""
        queue = self.queues[team]
        try:
            job = self.with_values(parse_job(msg.body))
        except UsageError as exc:
            self.refuse(msg, exc, team)
            return
        rec = self._record(job, team)
        if rec["state"] in rc.TERMINAL or (rec.get("slurm") or {}).get("message") == msg.id:
            # finished or cancelled before it ran (`retry` queues the record before it sends), or submitted
            # before a restart that lost the delete
            log.info("job %s: %s, message %s already taken; deleted, nothing submitted", job.job_id, rec["state"],
                     msg.id)
            queue.delete(msg)
            return
        if job.array:
            nonce = (team, job.array["nonce"])  # a sweep is one team's: another's message cannot join it
            g = self.gathering.setdefault(nonce, _Gathering(job.array["count"], self.clock()))
            g.members[job.array["index"]] = (msg, job)
            queue.extend(msg, HOLD_VISIBILITY_S)
            if len(g.members) == g.count:
                del self.gathering[nonce]
                members = [g.members[i] for i in range(g.count)]
                self.submit(team, members, batch.key_of([j for _, j in members], msg.id))
            return
        self.submit(team, [(msg, job)], batch.key_of([job], msg.id))

    def refuse(self, msg: Message, exc: UsageError, team: str) -> None:
        """An invalid message from ``team``'s queue: to the dead-letter queue at once; one line in its record if
        it names a job of the team."""
        log.error("message %s: invalid job, moved to the dead-letter queue: %s", msg.id, exc)
        try:
            job_id = json.loads(msg.body).get("job_id")
        except (ValueError, AttributeError):
            job_id = None
        if isinstance(job_id, str) and JOB_ID.fullmatch(job_id):
            try:
                self.records(team).update(job_id, lambda r: r if r["state"] in rc.TERMINAL
                                          else {**r, "state": "failed", "reason": f"invalid: {exc}",
                                                "updated": self.clock()})
            except UnknownJob:
                pass
        self.queues[team].dead_letter(msg, f"invalid job: {exc}")

    def with_values(self, job: Job) -> Job:
        """The job with the env values its message (`jobs retry`'s, or the record's spec) names only, as kept when
        it last ran (:meth:`submit` keeps them); UsageError (one line) when they were not."""
        if self.env_keep is None:
            if hidden_names(job):
                raise UsageError(f"job {job.job_id}: env {', '.join(hidden_names(job))}: no values are kept by this "
                                 "bridge; submit the job again with its --env and --again")
            return job
        return self.env_keep.fill(job)

    def _record(self, job: Job, team: str) -> dict:
        """The job's record among ``team``'s, made if missing."""
        now = self.clock()
        return self.records(team).update(job.job_id, lambda r: r if r.get("team") == team else {**r, "team": team},
                                         missing=lambda: {**rc.new_record(job.to_dict(), now), "team": team})

    def flush_gatherings(self) -> None:
        """Sweep members whose siblings did not all come in time: each runs as a single job."""
        now = self.clock()
        for nonce, g in list(self.gathering.items()):
            if now - g.first_seen >= self.array_wait_s:
                del self.gathering[nonce]
                log.warning("sweep %s: %d of %d members arrived; running them as single jobs", nonce[1],
                            len(g.members), g.count)
                for msg, job in g.members.values():
                    self.submit(nonce[0], [(msg, job)], msg.id)

    def find(self, key: str) -> str | None:
        """The Slurm job (or array) submitted with this key, if Slurm knows one."""
        comment = batch.COMMENT_PREFIX + key
        for j in self.slurm.jobs():
            if j.comment == comment:
                return str(j.array_job_id) if j.array_job_id else j.id
        return None

    def submit(self, team: str, members: list[tuple[Message, Job]], key: str, resubmit: bool = False) -> str:
        """One sbatch for these jobs of ``team`` (one, or a sweep as an array) under its Slurm account, unless
        Slurm has them already; then each record names its Slurm job, then the messages are deleted."""
        jobs = [j for _, j in members]
        book = self.records(team)
        recs = [book.get(j.job_id) for j in jobs]
        queue = self.queues.get(team)
        account = None if self.users_account else team
        first = [len(r["attempts"]) + 1 for r in recs]
        slurm_id = self.find(key)
        if self.env_keep is not None:
            for job in jobs:  # for a retry, which comes with the names only
                self.env_keep.keep(job)
        if slurm_id is None:
            script = batch.render(jobs, replace(self.site, account=account), key, first)
            slurm_id = self.slurm.sbatch(script, **self._as(team))
            log.info("submitted %s as Slurm job %s (key %s)", ", ".join(j.job_id for j in jobs), slurm_id, key)
        else:
            log.info("%s: Slurm job %s has key %s already; not submitted again", ", ".join(j.job_id for j in jobs),
                     slurm_id, key)
        for i, ((msg, job), rec) in enumerate(zip(members, recs)):
            sid = f"{slurm_id}_{i}" if len(jobs) > 1 else slurm_id
            budget = (rec.get("slurm") or {}).get("budget_from", 0) if resubmit else len(rec["attempts"])

            def named(r: dict, sid=sid, msg=msg, budget=budget, first=first[i]) -> dict:
                return {**r, "slurm": {"id": sid, "key": key, "message": msg.id if msg else None,
                                       "first_attempt": first, "budget_from": budget}}

            book.update(job.job_id, named)
            self.known[sid] = (team, job.job_id)
            self.seen.pop(sid, None)
        for msg, _ in members:
            if msg is not None:
                queue.delete(msg)
        return slurm_id

    def _as(self, team: str, j: SlurmJob | None = None) -> dict:
        """Whom a Slurm command for ``team`` runs as (client's ``user``): the team's user where the bridge submits
        as it (for a job: where the job is that user's); else the bridge itself (no argument)."""
        user = users.name_of(team)
        return {"user": user} if self.team_users and (j is None or j.user == user) else {}

    # --- gauges --------------------------------------------------------------------------------------------

    def publish(self) -> None:
        """The job gauges of the last sync, once every GAUGES_EVERY_S (nothing without an emitter)."""
        now = self.clock()
        if self.emitter is None or self.listed is None or (
                self._last_gauges is not None and now - self._last_gauges < GAUGES_EVERY_S):
            return
        self.emitter.emit(job_gauges(self.listed, now))
        self._last_gauges = now

    # --- Slurm's state -> records ---------------------------------------------------------------------------

    def load_known(self) -> None:
        """Slurm job ids of the records (after a restart); those of finished records need no more reading."""
        for team in self.queues:
            for rec in self.records(team).all():
                sid = (rec.get("slurm") or {}).get("id")
                if sid:
                    self.known[sid] = (team, rec["job_id"])
                    if rec["state"] in rc.TERMINAL:
                        self.final.add(sid)
        self.loaded = True

    def sync(self) -> None:
        if not self.loaded:
            self.load_known()
        cancelled = self.cancels()
        listed = self.listed = self.slurm.jobs()
        for j in listed:
            if j.array_job_id and j.array_task_id is None:
                continue  # an array's members still pending together: their records say queued
            ref = self.known.get(j.id)
            if ref is None:
                if j.comment.startswith(batch.COMMENT_PREFIX):
                    continue  # ours, its record not written yet (submit names it next)
                ref = self.mirror(j)
            final = lifecycle(j.state, j.exit_code, j.restarts, j.description).final
            if ref in cancelled and not final and j.id not in self.cancelling:
                log.info("job %s (team %s): cancel asked; scancel %s", ref[1], ref[0], j.id)
                self.slurm.scancel(j.id, **self._as(ref[0], j))
                self.cancelling.add(j.id)
            state = (j.state, j.restarts, j.exit_code, j.nodes, j.description)
            if self.seen.get(j.id) == state:
                continue
            self._apply(ref, j, final)
            self.seen[j.id] = state
        self.read_accounting({j.id for j in listed},
                             {str(j.array_job_id) for j in listed if j.array_job_id and j.array_task_id is None})
        self.index_progress(listed)

    def index_progress(self, listed: list[SlurmJob]) -> None:
        """Running jobs' progress into the records' index, once every ``records.progress_every_s``: a job's task
        writes its record alone (RecordStore(index=False)), since an index shard holds other jobs' entries."""
        now = self.clock()
        if now - self._last_progress < rc.PROGRESS_EVERY_S:
            return
        self._last_progress = now
        for j in listed:
            ref = self.known.get(j.id)
            if j.state == "RUNNING" and ref is not None and j.id not in self.final:
                try:
                    self.records(ref[0]).reindex(ref[1])
                except UnknownJob:
                    pass

    def _apply(self, ref: Ref, j: SlurmJob, final: bool) -> None:
        try:
            self.apply(ref, j)
        except UnknownJob:
            log.warning("Slurm job %s: its record %s (team %s) is gone", j.id, ref[1], ref[0])
        if final:
            self.final.add(j.id)

    def read_accounting(self, listed: set[str], pending_arrays: set[str]) -> None:
        """Jobs of unfinished records that squeue no longer lists (they ended while the bridge was away for
        longer than MinJobAge): their end from accounting, every ACCOUNTING_EVERY_S. ``pending_arrays``: arrays
        whose elements squeue lists as one line while they all wait."""
        gone = [sid for sid in self.known
                if sid not in listed and sid not in self.final and sid.partition("_")[0] not in pending_arrays]
        if not gone or self.clock() - self._last_accounting < ACCOUNTING_EVERY_S:
            return
        self._last_accounting = self.clock()
        try:
            ended = self.slurm.finished(gone)
        except SlurmError as exc:
            log.warning("accounting: %s; jobs %s looked up again later", exc, ", ".join(gone))
            return
        unfinished = [j for j in ended if not lifecycle(j.state, j.exit_code, 0).final]
        # unfinished in accounting, unknown to slurmctld, and nothing of slurmctld's on its way to accounting: lost
        lost = {j.id for j in unfinished} if unfinished and self.slurm.accounting_backlog() == 0 else set()
        for j in ended:
            ref = self.known[j.id]
            if j.id in lost:
                self._lost(ref, j)
                continue
            run = ((self.records(ref[0]).get(ref[1]).get("attempts") or [{}])[-1].get("run") or "").partition("#")
            restarts = int(run[2]) if run[0] == j.id and run[2].isdigit() else 0  # the attempt the record has
            log.info("job %s: Slurm job %s ended while the bridge was away: %s (from accounting)", ref[1], j.id,
                     j.state)
            self._apply(ref, replace(j, restarts=restarts),
                        lifecycle(j.state, j.exit_code, restarts).final)

    def _lost(self, ref: Ref, j: SlurmJob) -> None:
        """A Slurm job slurmctld lost (killed before it saved the job, it forgets it at its restart and kills its
        steps as orphans; accounting keeps it running forever): its attempt ends as a preemption, which no retry
        budget counts, and the job is submitted again; a user's own sbatch job is failed (theirs to submit)."""
        team, job_id = ref
        self.final.add(j.id)
        book = self.records(team)
        rec = book.get(job_id)
        if (rec.get("slurm") or {}).get("id") != j.id or rec["state"] in rc.TERMINAL:
            return
        spec, now = rec.get("spec") or {}, self.clock()
        mine = spec.get("kind") != "sbatch"
        log.error("job %s: Slurm job %s is %s in accounting but slurmctld no longer knows it: lost%s", job_id, j.id,
                  j.state, "; submitted again" if mine else "")
        outcome = "queued" if mine else "failed"
        book.update(job_id, lambda r: rc.end(r, outcome, None, "lost", now) if r["state"] == "running"
                            else {**r, "state": outcome, "reason": "lost", "updated": now}
                            if r["state"] not in rc.TERMINAL else r)
        if mine:
            job = self.with_values(validate({k: v for k, v in spec.items() if k != "array"}))
            self.submit(team, [(None, job)], f"{job_id}.lost.{len(rec['attempts'])}", resubmit=True)

    def cancels(self) -> set[Ref]:
        """Jobs whose record asks for a cancel (read from each known team's records' index every
        CANCEL_POLL_S)."""
        now = self.clock()
        if now - self._last_cancel_poll >= CANCEL_POLL_S:
            self._last_cancel_poll = now
            self._cancelled = {(team, r["job_id"]) for team in {*self.queues, *self._records}
                               for r in self.records(team).all()
                               if r.get("cancel_requested") or r["state"] == "cancelled"}
        return self._cancelled

    def mirror(self, j: SlurmJob) -> Ref:
        """A job submitted with sbatch directly: its record, ``slurm-<id>``, kind sbatch, among the records of the
        team its Slurm account names (the default team's when that is no team's name)."""
        job_id = f"{MIRROR_PREFIX}{j.id}"
        team = team_of_account(j.account)
        spec = {"job_id": job_id, "kind": "sbatch", "name": j.name, "user": j.user, "partition": j.partition}
        now = j.submit_time or self.clock()
        self.records(team).update(job_id, lambda r: r, missing=lambda: {
            **rc.new_record(spec, now), "team": team,
            "slurm": {"id": j.id, "key": None, "message": None, "first_attempt": 1, "budget_from": 0}})
        self.known[j.id] = (team, job_id)
        return team, job_id

    def apply(self, ref: Ref, j: SlurmJob) -> None:
        """Move the record to what Slurm says of its job: an attempt claimed when it ran, ended when it stopped."""
        if j.state == "COMPLETING":  # between runs: Slurm may count the requeue already; the next state tells
            return
        out = lifecycle(j.state, j.exit_code, j.restarts, j.description)
        team, job_id = ref
        book = self.records(team)
        rec = book.get(job_id)
        slurm = rec.get("slurm") or {}
        if slurm.get("id") != j.id or rec["state"] in rc.TERMINAL:
            return  # an older Slurm job of this record (a retry runs under its own id), or a finished record
        now = self.clock()
        run = f"{j.id}#{j.restarts}"
        last = rec["attempts"][-1] if rec["attempts"] else None
        ran = bool(j.nodes) and out.state not in ("queued", "preempted")
        if ran and not (last is not None and last.get("run") == run):
            rec = self._claim(ref, j, int(slurm.get("first_attempt") or 1) + j.restarts, run)
        if out.state == "queued" and rec["state"] == "queued" and rec.get("reason") != out.reason:
            book.update(job_id, lambda r: {**r, "reason": out.reason} if r["state"] == "queued" else r)
        if out.state in ("running", "queued"):
            return
        if out.state == "preempted":
            book.update(job_id, lambda r: rc.end(r, "preempted", j.exit_code, out.reason, now)
                                if r["state"] == "running" else r)
            return
        if out.state == "failed":
            if j.state == "PENDING":  # held by Slurm after a failed launch
                if (rec.get("spec") or {}).get("kind") == "sbatch":  # a user's own job: theirs to release
                    book.update(job_id, lambda r: {**r, "reason": f"held by Slurm: {j.description}"}
                                        if r["state"] not in rc.TERMINAL else r)
                    return
                self.slurm.scancel(j.id, **self._as(team, j))
                log.error("job %s: Slurm job %s could not be launched on its node (%s); cancelled", job_id, j.id,
                          j.description)
            self._failed(ref, rec, j, out.reason)
            return
        book.update(job_id, lambda r: r if r["state"] in rc.TERMINAL or not rc.allowed(r["state"], out.state)
                            else rc.end(r, out.state, j.exit_code, out.reason, now))

    def _claim(self, ref: Ref, j: SlurmJob, n: int, run: str) -> dict:
        now = j.start_time or self.clock()
        attempt = {"nodes": list(j.nodes), "instance_type": self.site.instance_type, "gpus": self.site.gpus, "n": n}

        def fn(r: dict) -> dict:
            if r["state"] in rc.TERMINAL:
                return r
            new = rc.claim(r, attempt, now)
            new["attempts"][-1]["run"] = run
            return new

        return self.records(ref[0]).update(ref[1], fn)

    def _failed(self, ref: Ref, rec: dict, j: SlurmJob, reason: str) -> None:
        """A failed attempt: submitted again while the job's retries allow, else the record fails."""
        team, job_id = ref
        book = self.records(team)
        now = self.clock()
        spec = rec.get("spec") or {}
        status = j.exit_code if j.exit_code is not None else 1
        earlier = failures_counted(rec["attempts"][:-1], int((rec.get("slurm") or {}).get("budget_from") or 0))
        retry, why = (False, "sbatch jobs are not retried by the bridge") if spec.get("kind") == "sbatch" else \
            retry_decision(spec.get("retries") or {}, earlier, status)
        state = "queued" if retry else "failed"
        book.update(job_id, lambda r: rc.end(r, state, status, reason, now) if r["state"] == "running"
                            else r if r["state"] in rc.TERMINAL else {**r, "state": state, "reason": reason})
        if not retry:
            log.error("job %s: %s with exit status %s; failed (%s)", job_id, reason, status, why)
            return
        try:
            job = self.with_values(validate({k: v for k, v in spec.items() if k != "array"}))
        except UsageError as exc:
            log.error("job %s: not submitted again: %s", job_id, exc)
            book.update(job_id, lambda r: {**r, "state": "failed", "reason": f"invalid: {exc}",
                                                   "updated": self.clock()} if r["state"] == "queued" else r)
            return
        log.warning("job %s: %s with exit status %s; submitted again (%s)", job_id, reason, status, why)
        self.submit(team, [(None, job)], f"{job_id}.retry.{len(rec['attempts'])}", resubmit=True)


def parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m trainer controller", description="The bridge from the job queue to Slurm "
                       "(on the controller): each message an sbatch, each record kept true from Slurm's state.")
    p.add_argument("--queue-url", default=os.environ.get("GPUFLEET_QUEUE_URL"),
                   help="the job queue, of the team --account names (default GPUFLEET_QUEUE_URL); see --team-queue")
    p.add_argument("--team-queue", action="append", metavar="TEAM=URL",
                   help="a team's queue: its jobs run under the team's Slurm account (repeat for each team; default "
                        "GPUFLEET_TEAM_QUEUES, space-separated); given, --queue-url and --account are not used")
    p.add_argument("--bucket", default=os.environ.get("GPUFLEET_BUCKET"), help="the stack's bucket")
    p.add_argument("--partition", help="the partition jobs go to (default: Slurm's default partition)")
    p.add_argument("--gpus", type=int, default=0, help="GPUs of a node of the partition")
    p.add_argument("--account", default=os.environ.get("GPUFLEET_ACCOUNT"),
                   help="the Slurm account (team) jobs from the queue run under (default GPUFLEET_ACCOUNT; none: the "
                        "bridge user's default account)")
    p.add_argument("--submit-as", choices=("team", "self"), default="team",
                   help="team (default): each team's jobs are submitted as, and run as, the team's Unix user "
                        "(trainer.slurm.users; sudo); self: as the bridge's own user (a box run by a user that "
                        "cannot make others)")
    p.add_argument("--instance-type", help="the partition's instance type (for GPU-hours and cost)")
    p.add_argument("--output-dir", default="/var/log/gpufleet/jobs",
                   help="where Slurm writes job output on nodes (a directory per team below it)")
    p.add_argument("--python", default=sys.executable, help="the nodes' Python with the trainer")
    p.add_argument("--env-dir", default=os.path.join(os.environ["STATE_DIRECTORY"], "env")
                   if os.environ.get("STATE_DIRECTORY") else DEFAULT_DIR,
                   help="where the jobs' env values are kept, the bridge's own (default: $STATE_DIRECTORY/env, "
                        f"else {DEFAULT_DIR})")
    add_gauge_flags(p)
    return p


def add_gauge_flags(p: ArgumentParser) -> None:
    p.add_argument("--emf-log", default=os.environ.get("GPUFLEET_EMF_LOG"),
                   help="the EMF file the controller's gauges go to (default GPUFLEET_EMF_LOG; \"-\": standard output; "
                   "none: no gauges)")
    p.add_argument("--metric-namespace", help="the stack's metric namespace (default: the metric_namespace of "
                   f"{node_schema.CONTROLLER_PATH})")


def metric_namespace(given: str | None, settings: str | None = None) -> str | None:
    """The namespace of the controller's gauges: the one given, else controller.json's (the stack's, which the
    alarms read; ``settings``: its path, default node_schema.CONTROLLER_PATH), else None."""
    if given:
        return given
    try:
        doc = json.loads(Path(settings or node_schema.CONTROLLER_PATH).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict):
        return None
    if doc.get("metric_namespace"):
        return str(doc["metric_namespace"])
    return metric_names.namespace(doc["stack"]) if doc.get("stack") else None


def gauge_emitter(emf_log: str | None, namespace: str | None, command: str):
    """The EMF emitter of a controller daemon's gauges (no dimensions: one series per stack), appending to
    ``emf_log`` ("-": standard output); None without a file, or, with a warning, where it cannot be written (the
    daemon runs on without gauges). UsageError without a namespace."""
    if not emf_log:
        return None
    if not namespace:
        raise UsageError(f"{command}: --emf-log {emf_log} needs --metric-namespace (or {node_schema.CONTROLLER_PATH} "
                         "with the stack's metric_namespace)")
    if emf_log == "-":
        return Emitter(namespace, sys.stdout)
    try:
        out = open(emf_log, "a", buffering=1)
    except OSError as exc:
        log.warning("gauges: %s cannot be written (%s); running without them", emf_log, exc.strerror)
        return None
    return Emitter(namespace, out)


def team_queues(given: list[str]) -> dict[str, str]:
    """``TEAM=URL`` pairs as a mapping; UsageError (one line) for a malformed pair, a bad team or a team twice."""
    out: dict[str, str] = {}
    for pair in given:
        team, sep, url = pair.partition("=")
        if not sep or not url:
            raise UsageError(f"controller: --team-queue {pair!r}: expected TEAM=URL")
        if not accounts.TEAM_NAME.match(team):
            raise UsageError(f"controller: --team-queue {pair!r}: team {team!r} is not a team name (1-15 lowercase "
                             "letters and digits, starting with a letter)")
        if team in out:
            raise UsageError(f"controller: --team-queue: team {team} given twice")
        out[team] = url
    return out


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    teams = team_queues(args.team_queue or os.environ.get("GPUFLEET_TEAM_QUEUES", "").split())
    if not (teams or args.queue_url) or not args.bucket:
        raise UsageError("controller: --team-queue (or --queue-url) and --bucket are required (or "
                         "GPUFLEET_TEAM_QUEUES, GPUFLEET_QUEUE_URL, GPUFLEET_BUCKET)")
    site = batch.Site(args.bucket, args.python, args.output_dir, args.partition, args.gpus, args.instance_type,
                      None if teams else args.account)
    emitter = gauge_emitter(args.emf_log, metric_namespace(args.metric_namespace), "controller")
    bridge = Bridge(None if teams else open_queue(args.queue_url), partial(RecordStore.of_bucket, args.bucket), site,
                    emitter=emitter, env_keep=EnvKeep(args.env_dir),
                    team_queues={team: open_queue(url) for team, url in teams.items()},
                    team_users=args.submit_as == "team")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return bridge.serve(stop)
