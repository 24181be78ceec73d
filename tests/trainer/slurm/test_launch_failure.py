"""The bridge where squeue alone does not tell: a job whose batch script Slurm could not launch on its node is
requeued and held by Slurm, and would wait forever: the bridge cancels the held job and fails the record in one
line (counted against retries); a job submitted with sbatch directly stays the user's to release, its record
saying why it waits. A job that ended while the bridge was away past MinJobAge is read from accounting; one that
accounting has running but slurmctld lost (killed before it saved it) is submitted again. Slurm's
part is a fake here, with the fields squeue --json and sacct gave for such jobs on this machine (the box's tests
run the real ones); the records are in moto."""
from __future__ import annotations

import time

import boto3

from trainer.jobs.records import RecordStore, new_record
from trainer.jobs.spec import Job
from trainer.slurm import batch
from trainer.slurm.bridge import Bridge
from trainer.slurm.client import SlurmJob


def held(job_id: str) -> SlurmJob:
    return SlurmJob(id=job_id, array_job_id=None, array_task_id=None, name="gpufleet.x", comment="", state="PENDING",
                    reason="JobHeldUser", description="launch failed requeued held", exit_code=0, restarts=1,
                    nodes=(), user="root", partition="gpu", submit_time=None, start_time=None, end_time=None)


class FakeSlurm:
    def __init__(self, jobs, ended=()):
        self._jobs, self.ended, self.cancelled, self.asked = jobs, list(ended), [], []
        self.backlog, self.scripts = 0, []  # sdiag's DBD agent queue; what sbatch was given

    def accounting_backlog(self):
        return self.backlog

    def sbatch(self, script):
        self.scripts.append(script)
        return str(100 + len(self.scripts))

    def jobs(self):
        return self._jobs

    def finished(self, ids):
        self.asked.append(sorted(ids))
        return [j for j in self.ended if j.id in ids]

    def scancel(self, job_id):
        self.cancelled.append(job_id)

    def node_states(self):
        return {}


def test_a_held_launch_failure_fails_the_record_and_cancels_the_held_job(moto_endpoint):
    boto3.client("s3").create_bucket(Bucket="held", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    recs = RecordStore.of_bucket("held", None)
    now = time.time()
    ours = {"job_id": "ours", "kind": "code", "command": ["true"], "retries": {"on_error": 0}}
    theirs = {"job_id": "slurm-6", "kind": "sbatch", "name": "wrap", "user": "alice", "partition": "gpu"}
    for spec, sid in ((ours, "5"), (theirs, "6")):
        recs.update(spec["job_id"], lambda r: r, missing=lambda spec=spec, sid=sid: {
            **new_record(spec, now), "slurm": {"id": sid, "key": "k", "message": None, "first_attempt": 1,
                                               "budget_from": 0}})
    slurm = FakeSlurm([held("5"), held("6")])
    bridge = Bridge(None, lambda team: recs, batch.Site("held", "python", "/tmp", None, 0, None), slurm=slurm)
    bridge.sync()
    rec = recs.get("ours")
    assert (rec["state"], rec["reason"]) == ("failed", "launch failure")
    assert slurm.cancelled == ["5"]  # the held job is gone from Slurm's queue; the user's is left alone
    mirrored = recs.get("slurm-6")
    assert (mirrored["state"], mirrored["reason"]) == ("queued", "held by Slurm: launch failed requeued held")


def test_a_job_that_left_squeue_while_the_bridge_was_away_ends_from_accounting(moto_endpoint):
    from dataclasses import replace

    boto3.client("s3").create_bucket(Bucket="acct", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    recs = RecordStore.of_bucket("acct", None)
    now = time.time()
    attempt = {"n": 2, "nodes": ["gpu-1"], "start": now, "end": None, "exit_status": None, "reason": None,
               "run": "9#1"}  # its second run (one requeue), running when the bridge went away
    for job_id, sid in (("gone", "9"), ("waits", "12_1")):
        spec = {"job_id": job_id, "kind": "code", "command": ["true"]}
        recs.update(job_id, lambda r: r, missing=lambda spec=spec, sid=sid: {
            **new_record(spec, now), "state": "running" if sid == "9" else "queued",
            "attempts": [attempt] if sid == "9" else [],
            "slurm": {"id": sid, "key": "k", "message": None, "first_attempt": 1, "budget_from": 0}})
    ended = replace(held("9"), state="COMPLETED", reason="", description="", restarts=0, nodes=("gpu-1",))
    pending_array = replace(held("12"), array_job_id=12, description="", restarts=0)  # 12_[0-3], one line
    slurm = FakeSlurm([pending_array], ended=[ended])
    clock = [1000.0]
    bridge = Bridge(None, lambda team: recs, batch.Site("acct", "python", "/tmp", None, 0, None), slurm=slurm,
                    clock=lambda: clock[0])
    bridge.sync()
    rec = recs.get("gone")
    assert rec["state"] == "succeeded" and [a["n"] for a in rec["attempts"]] == [2]  # that run ended, no new one
    assert rec["attempts"][0]["exit_status"] == 0
    assert slurm.asked == [["9"]]  # the waiting array element is listed under its array: not looked up
    bridge.sync()
    assert slurm.asked == [["9"]]  # done with: never asked again


def test_a_job_slurmctld_lost_is_submitted_again_once_accounting_has_all_slurmctld_knows(moto_endpoint):
    """Seen in the box: slurmctld killed a few seconds after it started a job, before it saved it, forgot the job at
    its restart and killed its steps as orphans; accounting keeps it RUNNING, and the record stayed running forever.
    The bridge takes such a job, once slurmctld has nothing left to tell accounting, as a lost attempt: ended as a
    preemption (no retry budget spent), the job submitted again; a user's own sbatch job is failed."""
    from dataclasses import replace

    boto3.client("s3").create_bucket(Bucket="lost", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    recs = RecordStore.of_bucket("lost", None)
    now = time.time()
    for job_id, sid, kind in (("ours", "31", "trainer"), ("slurm-32", "32", "sbatch")):
        spec = Job(job_id, args=("--steps", "2")).to_dict() if kind == "trainer" else \
            {"job_id": job_id, "kind": "sbatch", "name": "wrap", "user": "alice", "partition": "gpu"}
        attempt = {"n": 1, "nodes": ["gpu-1"], "start": now, "end": None, "exit_status": None, "reason": None,
                   "run": f"{sid}#0"}
        recs.update(job_id, lambda r: r, missing=lambda spec=spec, sid=sid, attempt=attempt: {
            **new_record(spec, now), "state": "running", "attempts": [attempt],
            "slurm": {"id": sid, "key": "k", "message": None, "first_attempt": 1, "budget_from": 0}})
    running = [replace(held(sid), state="RUNNING", reason="", description="", restarts=0, nodes=("gpu-1",))
               for sid in ("31", "32")]
    slurm = FakeSlurm([], ended=running)
    slurm.backlog = 3  # slurmctld has news for accounting still: the end may be among them
    clock = [1000.0]
    bridge = Bridge(None, lambda team: recs, batch.Site("lost", "python", "/tmp", None, 0, None), slurm=slurm,
                    clock=lambda: clock[0])
    bridge.sync()
    assert recs.get("ours")["state"] == "running" and slurm.scripts == []
    slurm.backlog = 0
    clock[0] += 60
    bridge.sync()
    rec = recs.get("ours")
    assert rec["state"] == "queued" and [(a["n"], a["reason"]) for a in rec["attempts"]] == [(1, "lost")]
    assert len(slurm.scripts) == 1 and batch.job_id_of(slurm.scripts[0]) == "ours"
    assert rec["slurm"]["id"] == "101" and rec["slurm"]["first_attempt"] == 2  # the next attempt, its own key
    assert (recs.get("slurm-32")["state"], recs.get("slurm-32")["reason"]) == ("failed", "lost")
    clock[0] += 60
    bridge.sync()
    assert slurm.asked == [["31", "32"], ["31", "32"], ["101"]] and len(slurm.scripts) == 1  # each lost once
