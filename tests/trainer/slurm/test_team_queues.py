"""Each team has a queue of its own, which only the team's submit identity may send to (the stack's queue policy,
tests/infra/aws): a job's team, its Slurm account and its records' prefix, is the queue its message came through,
never its body. The
records are in moto; Slurm's part and the queues are fakes that keep what the bridge asked of them (the box's tests
run the real ones, tests/infra/box)."""
from __future__ import annotations

import json
from dataclasses import replace
from functools import partial

import boto3
import pytest

from trainer.errors import UsageError
from trainer.jobs.queue import JobQueue, Message
from trainer.jobs.records import RecordStore
from trainer.slurm import batch
from trainer.slurm.bridge import Bridge, main, team_queues
from trainer.slurm.client import SlurmJob


class Queue(JobQueue):
    def __init__(self, *bodies: str):
        self.waiting = [Message(f"m{i}-{id(self)}", b, f"r{i}", 1) for i, b in enumerate(bodies)]
        self.deleted, self.dead = [], []

    def receive(self, wait_s):
        return self.waiting.pop(0) if self.waiting else None

    def extend(self, msg, visibility_s):
        pass

    def delete(self, msg):
        self.deleted.append(msg.id)

    def dead_letter(self, msg, reason):
        self.dead.append((msg.id, reason))


class Slurm:
    def __init__(self):
        self.scripts, self.listed, self.cancelled = [], [], []
        self.submitters, self.cancellers = [], []  # whom each sbatch and scancel ran as (None: the bridge)

    def jobs(self):
        return list(self.listed)

    def sbatch(self, script, user=None):
        self.scripts.append(script)
        self.submitters.append(user)
        return str(100 + len(self.scripts))

    def scancel(self, slurm_id, user=None):
        self.cancelled.append(slurm_id)
        self.cancellers.append(user)

    def finished(self, ids):
        return []


def running(slurm_id: str, user: str = "gpufleet") -> SlurmJob:
    return SlurmJob(id=slurm_id, array_job_id=None, array_task_id=None, name="gpufleet.shared",
                    comment=batch.COMMENT_PREFIX + "k", state="RUNNING", reason="None", description="", exit_code=0,
                    restarts=0, nodes=("gpu-1",), user=user, partition="gpu", submit_time=None,
                    start_time=None, end_time=None, tasks=1)


def body(job_id: str, **more) -> str:
    return json.dumps({"spec": 1, "job_id": job_id, "kind": "image", "image": "busybox:1", "command": ["true"],
                       **more})


def account_of(script: str) -> str | None:
    lines = [ln.removeprefix("#SBATCH --account=") for ln in script.splitlines() if ln.startswith("#SBATCH --account=")]
    return lines[0] if lines else None


@pytest.fixture
def recs(moto_endpoint):
    boto3.client("s3").create_bucket(Bucket="teams", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    return partial(RecordStore.of_bucket, "teams")  # a team's records


def bridge_of(recs, queues, slurm, team_users: bool = False) -> Bridge:
    return Bridge(None, recs, batch.Site("teams", "python", "/tmp"), slurm=slurm, team_queues=queues,
                  team_users=team_users)


def test_a_job_runs_under_the_account_of_the_queue_it_came_through_whatever_its_body_says(recs):
    vision, nlp, slurm = Queue(body("v1")), Queue(body("n1", team="vision", account="vision")), Slurm()
    bridge = bridge_of(recs, {"vision": vision, "nlp": nlp}, slurm)
    for _ in range(4):
        bridge.step()
    # nlp's message claims vision in its body: the body has no say (the spec refuses fields it does not know)
    assert [account_of(s) for s in slurm.scripts] == ["vision"]
    assert recs("vision").get("v1")["team"] == "vision" and vision.deleted == [f"m0-{id(vision)}"]
    assert nlp.dead and "team" in nlp.dead[0][1]


def test_the_same_id_through_another_teams_queue_is_that_teams_own_job(recs):
    vision, nlp, slurm = Queue(body("shared")), Queue(), Slurm()
    bridge = bridge_of(recs, {"vision": vision, "nlp": nlp}, slurm)
    bridge.step()
    before = recs("vision").get("shared")
    assert before["team"] == "vision" and account_of(slurm.scripts[0]) == "vision"
    # nlp sends the same id (say with --again, to restore vision's checkpoints, once under jobs/shared/)
    nlp.waiting.append(Message("evil", body("shared", command=["sh", "-c", "cat /secret"]), "r", 1))
    bridge.step()
    bridge.step()
    assert [account_of(s) for s in slurm.scripts] == ["vision", "nlp"]  # nlp's job, under nlp's account
    assert "--team nlp" in slurm.scripts[1] and "--team vision" in slurm.scripts[0]  # its task's records
    assert recs("vision").get("shared") == before  # vision's record untouched
    theirs = recs("nlp").get("shared")
    assert theirs["team"] == "nlp" and theirs["spec"]["command"] == ["sh", "-c", "cat /secret"]
    assert {ref for ref in bridge.known.values()} == {("vision", "shared"), ("nlp", "shared")}


def test_a_cancel_in_one_teams_records_cancels_that_teams_job_only(recs):
    vision, nlp, slurm = Queue(body("shared")), Queue(body("shared")), Slurm()
    bridge = bridge_of(recs, {"vision": vision, "nlp": nlp}, slurm)
    for _ in range(4):
        bridge.step()
    ids = {team: recs(team).get("shared")["slurm"]["id"] for team in ("vision", "nlp")}
    assert len(set(ids.values())) == 2
    slurm.listed = [running(sid) for sid in ids.values()]
    recs("nlp").update("shared", lambda r: {**r, "cancel_requested": True})
    bridge._last_cancel_poll = 0.0
    bridge.sync()
    assert slurm.cancelled == [ids["nlp"]]


def test_with_team_users_each_teams_jobs_are_submitted_and_cancelled_as_its_own_user(recs):
    """On a cluster (--submit-as team) Slurm runs each job as the user who submitted it: the bridge submits a
    team's jobs as the team's user, and cancels as it; a job someone else submitted under the team's account is
    cancelled as the bridge itself (Slurm lets the team's user cancel its own jobs only)."""
    vision, nlp, slurm = Queue(body("v1")), Queue(body("n1")), Slurm()
    bridge = bridge_of(recs, {"vision": vision, "nlp": nlp}, slurm, team_users=True)
    for _ in range(4):
        bridge.step()
    assert sorted(zip(map(account_of, slurm.scripts), slurm.submitters)) == [
        ("nlp", "gpufleet-nlp"), ("vision", "gpufleet-vision")]
    v1, n1 = recs("vision").get("v1")["slurm"]["id"], recs("nlp").get("n1")["slurm"]["id"]
    alices = replace(running("7", "alice"), comment="", account="vision")  # her own sbatch, under vision
    slurm.listed = [running(v1, "gpufleet-vision"), running(n1, "gpufleet-nlp"), alices]
    bridge.sync()  # mirrors alice's job 7 among vision's records
    for job_id in ("v1", "slurm-7"):
        recs("vision").update(job_id, lambda r: {**r, "cancel_requested": True})
    bridge._last_cancel_poll = 0.0
    bridge.sync()
    assert set(zip(slurm.cancelled, slurm.cancellers)) == {("7", None), (v1, "gpufleet-vision")}


def test_a_sweep_is_gathered_within_one_team(recs):
    def member(i: int, job_id: str | None = None) -> str:
        return body(job_id or f"sw-{i}", array={"id": "sw", "index": i, "count": 2, "nonce": "0f" * 8})

    # nlp sends a member 1 of vision's sweep (its nonce): it cannot complete vision's array, nor run in it
    vision, nlp, slurm = Queue(member(0)), Queue(member(1, "mine-1")), Slurm()
    bridge = bridge_of(recs, {"vision": vision, "nlp": nlp}, slurm)
    for _ in range(4):
        bridge.step()
    assert slurm.scripts == []  # each team's gathering holds one member of two
    vision.waiting.append(Message("v-1", member(1), "r", 1))
    bridge.step()
    bridge.step()
    assert len(slurm.scripts) == 1 and "#SBATCH --array=0-1" in slurm.scripts[0]
    assert [batch.job_id_of(slurm.scripts[0], i) for i in (0, 1)] == ["sw-0", "sw-1"]
    assert account_of(slurm.scripts[0]) == "vision"


def test_a_retry_runs_under_the_records_team(recs):
    nlp, slurm = Queue(body("n2", retries={"on_error": 1})), Slurm()
    bridge = bridge_of(recs, {"vision": Queue(), "nlp": nlp}, slurm)
    bridge.step()
    bridge.step()
    rec = recs("nlp").get("n2")
    bridge._failed(("nlp", "n2"), {**rec, "attempts": [{"n": 1, "reason": "failure", "exit_status": 1}]},
                   type("J", (), {"exit_code": 1})(), "failure")
    assert [account_of(s) for s in slurm.scripts] == ["nlp", "nlp"]


def test_one_queue_keeps_its_account_and_teams_flags_are_checked():
    assert team_queues(["vision=https://q/v", "nlp=https://q/n"]) == {"vision": "https://q/v", "nlp": "https://q/n"}
    for bad, says in ((["vision"], "expected TEAM=URL"), (["Vision=https://q"], "not a team name"),
                      (["a=https://q", "a=https://r"], "given twice")):
        with pytest.raises(UsageError, match=says):
            team_queues(bad)
    with pytest.raises(UsageError, match="--team-queue .*--bucket are required"):
        main(["--bucket", "b"])
