"""Each team has a queue of its own, which only the team's submit identity may send to (the stack's queue policy,
tests/infra/aws): a job's team, its Slurm account, is the queue its message came through, never its body. The
records are in moto; Slurm's part and the queues are fakes that keep what the bridge asked of them (the box's tests
run the real ones, tests/infra/box)."""
from __future__ import annotations

import json

import boto3
import pytest

from trainer.errors import UsageError
from trainer.jobs.queue import JobQueue, Message
from trainer.jobs.records import RecordStore
from trainer.slurm import batch
from trainer.slurm.bridge import Bridge, main, team_queues


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
        self.scripts = []

    def jobs(self):
        return []

    def sbatch(self, script):
        self.scripts.append(script)
        return str(100 + len(self.scripts))


def body(job_id: str, **more) -> str:
    return json.dumps({"spec": 1, "job_id": job_id, "kind": "image", "image": "busybox:1", "command": ["true"],
                       **more})


def account_of(script: str) -> str | None:
    lines = [ln.removeprefix("#SBATCH --account=") for ln in script.splitlines() if ln.startswith("#SBATCH --account=")]
    return lines[0] if lines else None


@pytest.fixture
def recs(moto_endpoint):
    boto3.client("s3").create_bucket(Bucket="teams", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    return RecordStore.of_bucket("teams")


def bridge_of(recs, queues, slurm) -> Bridge:
    return Bridge(None, recs, batch.Site("teams", "python", "/tmp"), slurm=slurm, team_queues=queues)


def test_a_job_runs_under_the_account_of_the_queue_it_came_through_whatever_its_body_says(recs):
    vision, nlp, slurm = Queue(body("v1")), Queue(body("n1", team="vision", account="vision")), Slurm()
    bridge = bridge_of(recs, {"vision": vision, "nlp": nlp}, slurm)
    for _ in range(4):
        bridge.step()
    # nlp's message claims vision in its body: the body has no say (the spec refuses fields it does not know)
    assert [account_of(s) for s in slurm.scripts] == ["vision"]
    assert recs.get("v1")["team"] == "vision" and vision.deleted == [f"m0-{id(vision)}"]
    assert nlp.dead and "team" in nlp.dead[0][1]


def test_a_message_through_another_teams_queue_cannot_take_over_a_job(recs):
    vision, nlp, slurm = Queue(body("shared")), Queue(), Slurm()
    bridge = bridge_of(recs, {"vision": vision, "nlp": nlp}, slurm)
    bridge.step()
    before = recs.get("shared")
    assert before["team"] == "vision" and account_of(slurm.scripts[0]) == "vision"
    # nlp sends the same id again (say with --again, to restore vision's checkpoints under jobs/shared/)
    nlp.waiting.append(Message("evil", body("shared", command=["sh", "-c", "cat /secret"]), "r", 1))
    bridge.step()
    bridge.step()
    assert len(slurm.scripts) == 1  # nothing submitted for nlp
    assert nlp.dead == [("evil", "invalid job: job shared is team vision's; a message through team nlp's queue "
                                 "cannot submit it (pick another job id)")]
    after = recs.get("shared")
    assert after["spec"] == before["spec"] and after["state"] == before["state"]  # vision's record untouched
    assert "reason" not in after or after["reason"] == before.get("reason")


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
    rec = recs.get("n2")
    bridge._failed("n2", {**rec, "attempts": [{"n": 1, "reason": "failure", "exit_status": 1}]},
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
