"""Job records: the store's conditional writes on a local directory, moto's S3 and Azurite's Blob (two writers
racing lose no update), the state machine as pure functions, progress and cancel, the index `list` reads."""
from __future__ import annotations

import json
import threading
import uuid
from dataclasses import replace

import boto3
import pytest

from tests.trainer.azurite import Azurite
from trainer.errors import UsageError
from trainer.jobs import records
from trainer.jobs.records import RecordStore, Transition, UnknownJob
from trainer.jobs.spec import Job
from trainer.loop.storage import Conflict, LocalStore, open_store


@pytest.fixture(scope="module")
def azurite():
    with Azurite() as az:
        from azure.storage.blob import BlobServiceClient

        BlobServiceClient.from_connection_string(az.connection_string).create_container("checkpoints")
        yield az


def _bucket():
    boto3.client("s3").create_bucket(Bucket="ckpt", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    return "ckpt"


@pytest.fixture(params=["local", "s3", "blob"])
def uri(request, tmp_path, monkeypatch):
    """A fresh store URI of each kind; ``open_store(uri)`` gives an independent client (a second writer)."""
    if request.param == "local":
        return str(tmp_path / "bucket")
    if request.param == "s3":
        request.getfixturevalue("moto_endpoint")
        return f"s3://{_bucket()}/"
    az = request.getfixturevalue("azurite")
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", az.connection_string)
    return f"az://checkpoints/{uuid.uuid4().hex[:8]}/"


def test_conditional_writes(uri):
    store = open_store(uri)
    with pytest.raises(FileNotFoundError):
        store.read_versioned("jobs/a/record.json")
    v1 = store.write_if("jobs/a/record.json", b"one", None)
    assert store.read_versioned("jobs/a/record.json") == (b"one", v1)
    with pytest.raises(Conflict):  # create: only while absent
        store.write_if("jobs/a/record.json", b"again", None)
    v2 = store.write_if("jobs/a/record.json", b"two", v1)
    assert v2 != v1 and store.read_versioned("jobs/a/record.json") == (b"two", v2)
    with pytest.raises(Conflict):  # a stale version: someone wrote since
        store.write_if("jobs/a/record.json", b"lost", v1)
    assert store.read_bytes("jobs/a/record.json") == b"two"
    assert store.list() == ["jobs/a/record.json"]  # no lock or temporary file shows
    store.write_bytes("jobs/b/1/part", b"x")
    assert store.children("jobs/") == ["a", "b"]


def test_two_writers_racing_lose_no_update(uri):
    """Two writers (own clients), each appending its mark to the same record 15 times at once: all 30 marks
    are there, whoever lost a race read again and reapplied its change."""
    RecordStore(open_store(uri)).create(Job("race").to_dict())
    start = threading.Barrier(2)

    def writer(mark: str):
        mine = RecordStore(open_store(uri))
        start.wait()
        for i in range(15):
            mine.update("race", lambda rec: {**rec, "reason": (rec["reason"] or "") + f"{mark}{i},"})

    threads = [threading.Thread(target=writer, args=(m,)) for m in "ab"]
    [t.start() for t in threads]
    [t.join() for t in threads]
    rec = RecordStore(open_store(uri)).get("race")
    marks = rec["reason"].rstrip(",").split(",")
    assert sorted(marks) == sorted(f"{m}{i}" for m in "ab" for i in range(15))
    assert [m for m in marks if m[0] == "a"] == [f"a{i}" for i in range(15)]  # each writer's order kept
    assert rec["rev"] == 30
    assert RecordStore(open_store(uri)).all()[0]["rev"] == 30  # the index caught every revision


# --- the state machine: pure functions -----------------------------------------------------------

def test_transitions():
    assert records.allowed("queued", "running") and records.allowed("running", "preempted")
    assert records.allowed("preempted", "running") and records.allowed("failed", "queued")
    assert not records.allowed("succeeded", "queued") and not records.allowed("queued", "succeeded")
    assert set(records.TRANSITIONS) == set(records.STATES)
    assert all(dst in records.STATES for dsts in records.TRANSITIONS.values() for dst in dsts)


def test_a_job_through_preemption_to_success():
    rec = records.new_record(Job("j").to_dict(), 100.0)
    assert (rec["state"], rec["attempts"], rec["cancel_requested"]) == ("queued", [], False)
    rec = records.claim(rec, {"node": "i-1", "instance_type": "g5.xlarge", "gpus": 1}, 110.0)
    rec = records.with_progress(rec, {"step": 5, "total": 10, "loss": 2.5, "bogus": 1}, 120.0)
    assert rec["progress"] == {"step": 5, "total": 10, "loss": 2.5, "samples_per_s": None, "gpu_util": None,
                               "at": 120.0}
    rec = records.end(rec, "preempted", 75, "preemption", 130.0)
    assert rec["state"] == "preempted" and rec["attempts"][0] == {
        "n": 1, "nodes": ["i-1"], "instance_type": "g5.xlarge", "gpus": 1, "start": 110.0, "end": 130.0,
        "exit_status": 75, "reason": "preemption"}
    assert records.with_progress(rec, {"step": 6}, 131.0) == rec  # only a running job has progress
    rec = records.claim(rec, {"nodes": ["i-2", "i-3"], "instance_type": "g5.xlarge", "gpus": 1}, 140.0)
    assert rec["progress"] is None and rec["attempts"][1]["n"] == 2
    rec = records.end(rec, "succeeded", 0, None, 3740.0)
    assert rec["state"] == "succeeded"
    # 20 s on one node, then an hour on two nodes, one GPU each
    assert records.gpu_hours(rec, 9999.0) == pytest.approx(20 / 3600 + 2.0)
    assert records.cost(rec, {"g5.xlarge": 1.0}.get, 9999.0) == pytest.approx(20 / 3600 + 2.0)
    assert records.cost(rec, {}.get, 9999.0) is None
    with pytest.raises(Transition, match="job j is succeeded; it cannot become running"):
        records.claim(rec, {"node": "i-4"}, 4000.0)


def test_a_claim_after_a_lost_attempt_closes_it():
    rec = records.claim(records.new_record(Job("j").to_dict(), 0.0), {"node": "i-1", "gpus": 8}, 10.0)
    rec = records.claim(rec, {"node": "i-2", "gpus": 8}, 50.0)  # i-1 died without a word
    assert [(a["nodes"], a["end"], a["reason"]) for a in rec["attempts"]] == [(["i-1"], 50.0, "lost"),
                                                                             (["i-2"], None, None)]
    assert records.gpu_hours(rec, 50.0 + 3600) == pytest.approx(8 * 40 / 3600 + 8.0)


@pytest.mark.parametrize("state, after, cancel_requested, told", [
    ("queued", "cancelled", False, "job j cancelled (it was queued)"),
    ("preempted", "cancelled", False, "job j cancelled (it was preempted)"),
    ("running", "running", True, "job j is running: its node stops it"),
    ("succeeded", "succeeded", False, "job j has already succeeded; nothing changed"),
    ("failed", "failed", False, "job j has already failed; nothing changed"),
    ("cancelled", "cancelled", False, "job j has already been cancelled; nothing changed"),
])
def test_cancel_in_each_state(state, after, cancel_requested, told):
    rec = {**records.new_record(Job("j").to_dict(), 0.0), "state": state}
    new, message = records.cancel(rec, 5.0)
    assert (new["state"], new["cancel_requested"]) == (after, cancel_requested)
    assert message.startswith(told)
    if state in records.TERMINAL:
        assert new == rec


def test_retry_only_of_a_failed_or_cancelled_job():
    rec = {**records.new_record(Job("j").to_dict(), 0.0), "state": "failed", "cancel_requested": True}
    assert records.retry(rec, 1.0)["state"] == "queued" and not records.retry(rec, 1.0)["cancel_requested"]
    for state in ("queued", "running", "succeeded"):
        with pytest.raises(Transition, match=f"job j is {state}; only a failed or cancelled job can be retried"):
            records.retry({**rec, "state": state}, 1.0)


# --- what the task and the user's cancel call, on a local store --------------------------------------------

class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_progress_is_written_at_a_bounded_rate_and_a_cancel_is_requested(tmp_path):
    clock = Clock()
    rs = RecordStore(LocalStore(tmp_path), progress_every_s=30, clock=clock)
    rs.create(Job("j1", args=("--steps", "9")).to_dict())
    rs.update("j1", lambda rec: records.claim(rec, {"nodes": ["n1"], "instance_type": "g5.xlarge", "gpus": 1},
                                              clock()))  # as the bridge does once Slurm runs it
    assert rs.progress("j1", {"step": 1}) is True
    clock.now += 29
    assert rs.progress("j1", {"step": 2}) is False  # within 30 s of the last write: not written
    assert rs.get("j1")["progress"]["step"] == 1
    clock.now += 1
    assert rs.progress("j1", {"step": 3}) is True and rs.get("j1")["progress"] == {
        "step": 3, "total": None, "loss": None, "samples_per_s": None, "gpu_util": None, "at": 1030.0}
    assert not rs.get("j1")["cancel_requested"]
    rs.update("j1", lambda rec: records.cancel(rec, clock())[0])  # the user's cancel
    rec = rs.get("j1")
    assert rec["cancel_requested"] and rec["state"] == "running"  # the bridge cancels it in Slurm
    with pytest.raises(UnknownJob, match="job 'nope': no such job in"):
        rs.get("nope")


def test_create_refuses_a_taken_id_and_reuses_a_finished_one_only_when_asked_again(tmp_path):
    # issue 23, finding 6: a submit of an id another user had used replaced that job's record (and its job then
    # restored the other's weights)
    rs = RecordStore(LocalStore(tmp_path))
    rs.create(Job("j").to_dict())
    with pytest.raises(UsageError, match="--job-id: job j exists and is queued; choose another id"):
        rs.create(Job("j").to_dict())
    rs.update("j", lambda rec: records.end(records.claim(rec, {"node": "n1", "gpus": 1}, 5.0), "succeeded", 0, None, 6.0))
    before = rs.get("j")
    with pytest.raises(UsageError) as refused:
        rs.create(Job("j", args=("--steps", "2")).to_dict())
    assert str(refused.value) == ("--job-id: job j exists (succeeded); ids are not reused: choose another id, or "
                                  "pass --again for a new attempt of that job (it resumes from its checkpoints)")
    assert rs.get("j") == before  # nothing lost
    again = rs.create(Job("j", args=("--steps", "2")).to_dict(), again=True)
    assert again["state"] == "queued" and again["spec"]["args"] == ["--steps", "2"]
    assert again["attempts"] == before["attempts"]  # the next attempt is numbered on
    assert [r["state"] for r in rs.all()] == ["queued"]


def test_list_reads_the_index_and_scan_reads_the_records(tmp_path):
    clock = Clock()
    rs = RecordStore(LocalStore(tmp_path), clock=clock)
    for i in range(5):
        clock.now += 1
        rs.create(Job(f"j{i}").to_dict())
    rs.update("j3", lambda rec: records.claim(rec, {"nodes": ["n"]}, clock()))
    listed = rs.all()
    assert [r["job_id"] for r in listed] == ["j0", "j1", "j2", "j3", "j4"] and "spec" not in listed[0]
    assert listed[3]["state"] == "running"
    assert [summary for summary in rs.all(scan=True) if summary["job_id"] == "j3"][0]["spec"]["job_id"] == "j3"
    shards = [k for k in rs.store.list() if k.startswith(records.INDEX_PREFIX)]
    assert 1 < len(shards) <= records.INDEX_SHARDS
    # An index entry is never replaced by an older revision of the same submission.
    shard = json.loads(rs.store.read_bytes(records.index_key("j3")))
    older = {**rs.get("j3"), "rev": 0, "state": "queued"}
    assert records._indexed(shard, older) == shard


def test_a_jobs_task_writes_no_index_and_the_bridge_copies_its_running_progress_in(tmp_path):
    """A job's credentials reach its own prefix only (trainer.clouds.aws_credentials): an index shard holds other
    jobs' entries, whose cancels and Slurm ids the bridge acts on, so the task writes its record alone and the
    bridge copies a running job's progress into the index, once every progress interval."""
    from trainer.slurm import batch
    from trainer.slurm.bridge import Bridge
    from trainer.slurm.client import SlurmJob

    clock = Clock()
    bridge_side = RecordStore(LocalStore(tmp_path), clock=clock, progress_every_s=30)
    bridge_side.create(Job("run1").to_dict())
    bridge_side.update("run1", lambda rec: records.claim(rec, {"nodes": ["n"]}, clock()))
    task_side = RecordStore(LocalStore(tmp_path), clock=clock, progress_every_s=0, index=False)
    before = LocalStore(tmp_path).read_bytes(records.index_key("run1"))
    task_side.progress("run1", {"step": 7, "total": 10})
    assert LocalStore(tmp_path).read_bytes(records.index_key("run1")) == before  # the task left the index alone
    assert bridge_side.get("run1")["progress"]["step"] == 7 and not bridge_side.all()[0]["progress"]

    running = SlurmJob(id="41", array_job_id=None, array_task_id=None, name="run1", comment=batch.COMMENT_PREFIX,
                       state="RUNNING", reason="None", description="", exit_code=0, restarts=0, nodes=("n",),
                       user="u", partition="gpu", submit_time=None, start_time=None, end_time=None, tasks=1)
    bridge = Bridge(None, lambda team: bridge_side, batch.Site("b", "python", "/tmp"), clock=clock)
    bridge.known["41"] = ("default", "run1")
    clock.now += 30
    bridge.index_progress([running])
    assert bridge_side.all()[0]["progress"]["step"] == 7
    task_side.progress("run1", {"step": 9, "total": 10})
    clock.now += 10
    bridge.index_progress([running])  # within the interval: not read again
    assert bridge_side.all()[0]["progress"]["step"] == 7
    clock.now += 20
    bridge.index_progress([running, replace(running, id="42")])  # a Slurm job of no record: skipped
    assert bridge_side.all()[0]["progress"]["step"] == 9
