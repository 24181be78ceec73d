"""`gpufleet jobs submit|list|status|logs|cancel|retry` as a user runs them (`python -m infra.cli`, a process
of its own), against moto's S3 and SQS on loopback; `--stack` through a fake `pulumi` on PATH that prints the
stack's outputs as `pulumi stack output --json` does."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import boto3
import pytest

from trainer.jobs import logs
from trainer.jobs.records import RecordStore
from trainer.jobs.spec import Job, validate

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cluster(moto_endpoint, tmp_path, monkeypatch):
    """A moto bucket, queue and dead-letter queue, and a fake pulumi whose stack `dev` has them as outputs."""
    boto3.client("s3").create_bucket(Bucket="ckpt", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    sqs = boto3.client("sqs")
    queue, dlq = (sqs.create_queue(QueueName=n)["QueueUrl"] for n in ("jobs", "jobs-dlq"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    outputs = {"dev": {"bucket": "ckpt", "queueUrl": queue, "dlqUrl": dlq, "region": "eu-west-1"}, "empty": {}}
    (tmp_path / "outputs.json").write_text(json.dumps(outputs))
    pulumi = bin_dir / "pulumi"
    pulumi.write_text(f"""#!{sys.executable}
import json, sys
args = sys.argv[1:]
assert args[:3] == ["stack", "output", "--json"] and args[3] == "--stack", args
outputs = json.load(open({str(tmp_path / "outputs.json")!r}))
if args[4] not in outputs:
    print(f"error: no stack named '{{args[4]}}' found", file=sys.stderr)
    sys.exit(255)
print(json.dumps(outputs[args[4]]))
""")
    pulumi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return {"sqs": sqs, "queue": queue, "dlq": dlq, "records": RecordStore.of_bucket("ckpt", None)}


def gpufleet(*args, env=None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "infra.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          env=env, timeout=120, **kw)


def err(proc) -> str:
    """The last line on stderr (the SDKs log their INFO lines before it)."""
    return proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ""


def bodies(sqs, url) -> list[dict]:
    out = []
    while msgs := sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", []):
        out += [json.loads(m["Body"]) for m in msgs]
    return out


def test_submit_with_stack_writes_a_record_per_job_then_list_shows_them(cluster):
    proc = gpufleet("jobs", "submit", "--stack", "dev", "--job-id", "exp", "--sweep", "lr=1e-3,3e-4", "--",
                    "--steps", "5", "--model", "gpt-tiny")
    assert proc.returncode == 0, proc.stderr
    assert [b["job_id"] for b in bodies(cluster["sqs"], cluster["queue"])] == ["exp.lr-1e-3", "exp.lr-3e-4"]
    rs = cluster["records"]
    rec = rs.get("exp.lr-3e-4")
    assert (rec["state"], rec["attempts"], rec["spec"]["args"][-2:]) == ("queued", [], ["--lr", "3e-4"])

    # One of them runs on a g5.xlarge (1 GPU, catalog price 1.006 USD/h) for a while: an hour and a half ago.
    rs.clock = lambda: time.time() - 5400
    assert rs.claimed("exp.lr-1e-3", {"node": "i-0abc", "instance_type": "g5.xlarge", "gpus": 1})
    rs.clock = time.time
    rs.progress("exp.lr-1e-3", {"step": 3, "total": 5, "loss": 4.2})

    table = gpufleet("jobs", "list", "--stack", "dev")
    assert table.returncode == 0, table.stderr
    running = next(line for line in table.stdout.splitlines() if "exp.lr-1e-3" in line).split()
    cells = [w for w in running if w not in ("│", "┃")]
    assert cells[:6] == ["exp.lr-1e-3", "trainer", "running", "1", "i-0abc", "3/5"]
    assert cells[-3:] == ["1.50", "1.51", "USD"]  # GPU-hours; cost = 1.5 h x 1.006
    assert "exp.lr-3e-4" in table.stdout and "2 job(s)" in table.stdout

    doc = json.loads(gpufleet("jobs", "list", "--stack", "dev", "--format", "json", "--state", "running").stdout)
    assert [(d["job_id"], d["state"], round(d["gpu_hours"], 2), round(d["cost"], 2), d["currency"]) for d in doc] == [
        ("exp.lr-1e-3", "running", 1.5, 1.51, "USD")]
    assert doc[0]["progress"]["loss"] == 4.2 and doc[0]["attempts"][0]["nodes"] == ["i-0abc"]
    assert json.loads(gpufleet("jobs", "list", "--stack", "dev", "--format", "json", "--since", "2030-01-01").stdout) == []
    assert len(json.loads(gpufleet("jobs", "list", "--stack", "dev", "--format", "json", "--since", "1h").stdout)) == 2

    status = gpufleet("jobs", "status", "--stack", "dev", "exp.lr-1e-3")
    assert status.returncode == 0, status.stderr
    assert status.stdout.splitlines()[0] == "job exp.lr-1e-3 (trainer): running"
    assert "checkpoints: s3://ckpt/teams/default/jobs/exp.lr-1e-3/" in status.stdout
    assert "progress: step 3, total 5, loss 4.2" in status.stdout
    assert "attempt 1: i-0abc (g5.xlarge, 1 GPU(s)/node)" in status.stdout
    full = json.loads(gpufleet("jobs", "status", "--stack", "dev", "exp.lr-1e-3", "--format", "json").stdout)
    assert full["spec"]["args"][-2:] == ["--lr", "1e-3"] and full["checkpoint_uri"] == \
        "s3://ckpt/teams/default/jobs/exp.lr-1e-3/"


def test_the_flags_and_the_environment_name_the_bucket_too(cluster):
    cluster["records"].create(Job("j1").to_dict())
    by_flag = gpufleet("jobs", "list", "--bucket", "ckpt", "--format", "json")
    by_env = gpufleet("jobs", "list", "--format", "json", env={**os.environ, "GPUFLEET_BUCKET": "ckpt"})
    assert [d["job_id"] for d in json.loads(by_flag.stdout)] == [d["job_id"] for d in json.loads(by_env.stdout)] \
        == ["j1"]


def test_logs_and_follow_until_the_job_ends(cluster, tmp_path):
    rs = cluster["records"]
    rs.create(Job("j").to_dict())
    rs.claimed("j", {"node": "i-1", "instance_type": "g5.xlarge", "gpus": 1})
    out = tmp_path / "job.out"
    out.write_bytes(b"starting\n")
    shipper = logs.LogShipper(rs.store, "j", 1, "i-1", out, every_s=0.2, poll_s=0.05).start()
    follower = subprocess.Popen([sys.executable, "-m", "infra.cli", "jobs", "logs", "--stack", "dev", "j", "-f",
                                 "--poll-interval", "0.2"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        with open(out, "ab", buffering=0) as f:
            for i in range(20):
                f.write(b"step %d\n" % i)
                time.sleep(0.05)
        shipper.close()
        out.unlink()  # the node is gone
        rs.ended("j", "succeeded", 0)
        stdout, stderr = follower.communicate(timeout=60)
    finally:
        follower.kill()
    assert follower.returncode == 0, stderr
    expected = b"starting\n" + b"".join(b"step %d\n" % i for i in range(20))
    assert stdout == b"--- attempt 1, node i-1 ---\n" + expected
    again = gpufleet("jobs", "logs", "--stack", "dev", "j")
    assert (again.returncode, again.stdout) == (0, expected.decode())
    none = gpufleet("jobs", "logs", "--stack", "dev", "j", "--attempt", "2")
    assert (none.returncode, err(none)) == (2, "error: --attempt: job j has no output of attempt 2; attempts with "
                                               "output: 1")


def test_cancel_in_each_state(cluster):
    rs = cluster["records"]
    for job_id in ("waiting", "busy", "done"):
        rs.create(Job(job_id).to_dict())
    rs.claimed("busy", {"node": "i-1"})
    rs.claimed("done", {"node": "i-2"})
    rs.ended("done", "succeeded", 0)
    before = rs.get("done")

    told = {j: gpufleet("jobs", "cancel", "--stack", "dev", j) for j in ("waiting", "busy", "done")}
    assert {j: (p.returncode, p.stdout.strip()) for j, p in told.items()} == {
        "waiting": (0, "job waiting cancelled (it was queued)"),
        "busy": (0, "job busy is running: its node stops it (checkpoint, exit) and marks it cancelled"),
        "done": (0, "job done has already succeeded; nothing changed")}
    assert rs.get("waiting")["state"] == "cancelled"
    assert (rs.get("busy")["state"], rs.get("busy")["cancel_requested"]) == ("running", True)
    assert rs.cancel_requested("busy")  # what the running job's agent reads
    assert rs.get("done") == before  # not even rewritten
    assert not rs.claimed("waiting", {"node": "i-3"})  # its message, delivered later, is not run


def test_retry_of_a_failed_job_queues_it_with_a_fresh_budget_and_drops_the_dead_letter(cluster):
    rs, sqs = cluster["records"], cluster["sqs"]
    spec = Job("bad", args=("--steps", "5")).to_dict()
    rs.create(spec)
    rs.claimed("bad", {"node": "i-1", "instance_type": "g5.xlarge", "gpus": 1})
    rs.ended("bad", "failed", 1, "failure")
    sqs.send_message(QueueUrl=cluster["dlq"], MessageBody=json.dumps(spec))
    sqs.send_message(QueueUrl=cluster["dlq"], MessageBody=json.dumps(Job("other").to_dict()))

    proc = gpufleet("jobs", "retry", "--stack", "dev", "bad")
    assert (proc.returncode, proc.stdout.strip()) == (
        0, "job bad queued again after 1 attempt(s); its dead-letter message removed"), proc.stderr
    (message,) = bodies(sqs, cluster["queue"])
    assert message["job_id"] == "bad" and message["args"] == ["--steps", "5"]
    assert "attempts" not in message and validate(message).attempts == ()  # its retries counted afresh
    assert [(a["n"], a["exit_status"], a["reason"]) for a in rs.get("bad")["attempts"]] == [(1, 1, "failure")]
    assert [b["job_id"] for b in bodies(sqs, cluster["dlq"])] == ["other"]
    assert (rs.get("bad")["state"], rs.get("bad")["reason"]) == ("queued", "retry")

    again = gpufleet("jobs", "retry", "--stack", "dev", "bad")
    assert (again.returncode, err(again)) == (2, "error: job bad is queued; only a failed or cancelled job can be "
                                                 "retried")


def test_retry_of_a_dead_lettered_job_no_agent_marked(cluster):
    rs, sqs = cluster["records"], cluster["sqs"]
    spec = Job("crashy").to_dict()
    rs.create(spec)
    rs.claimed("crashy", {"node": "i-1"})  # its node died each time; the queue dead-lettered it
    sqs.send_message(QueueUrl=cluster["dlq"], MessageBody=json.dumps(spec))
    proc = gpufleet("jobs", "retry", "--stack", "dev", "crashy")
    assert proc.returncode == 0, proc.stderr
    rec = rs.get("crashy")
    assert rec["state"] == "queued" and rec["attempts"][0]["reason"] == "dead-lettered"
    assert [b["job_id"] for b in bodies(sqs, cluster["queue"])] == ["crashy"]


@pytest.mark.parametrize("argv, message", [
    (["jobs", "status", "--stack", "dev", "nope"], "error: job 'nope': no such job in s3://ckpt/teams/default/ "
                                                   "(`gpufleet jobs list` lists them)"),
    (["jobs", "cancel", "--stack", "dev", "nope"], "error: job 'nope': no such job in s3://ckpt/teams/default/"),
    (["jobs", "logs", "--stack", "dev", "nope"], "error: job 'nope': no such job in s3://ckpt/teams/default/ "
                                                 "(`gpufleet jobs list` lists them)"),
    (["jobs", "list", "--stack", "empty"], "error: --stack empty: the stack has no outputs (bucket, queueUrl); "
                                           "deploy it first (`pulumi up --stack empty`), or give --queue-url and "
                                           "--bucket"),
    (["jobs", "list", "--stack", "gone"], "error: --stack gone: `pulumi stack output` failed: error: no stack "
                                          "named 'gone' found"),
    (["jobs", "list"], "error: no jobs bucket: give --stack NAME, or --bucket (or GPUFLEET_BUCKET)"),
    (["jobs", "list", "--stack", "dev", "--state", "done"], "error: --state: 'done' is not allowed; expected one "
                                                            "of queued, running, preempted, succeeded, failed, "
                                                            "cancelled"),
    (["jobs", "list", "--stack", "dev", "--since", "yesterday"], "error: --since: 'yesterday' is not allowed; "
                                                                 "expected a duration (30m, 2h, 7d) or an ISO "
                                                                 "date/time (2026-05-01 or 2026-05-01T12:00)"),
    (["jobs", "retry", "--bucket", "ckpt", "nope"], "error: retry: no queue; give --stack NAME or --queue-url "
                                                    "(or GPUFLEET_QUEUE_URL)"),
])
def test_user_errors_are_one_line_exit_2(cluster, argv, message):
    proc = gpufleet(*argv)
    assert (proc.returncode, err(proc), "Traceback" in proc.stderr) == (2, message, False)


def test_no_pulumi_on_path_and_no_credentials(cluster, tmp_path):
    env = {**os.environ, "PATH": os.path.dirname(sys.executable)}
    proc = gpufleet("jobs", "list", "--stack", "dev", env=env)
    assert (proc.returncode, err(proc)) == (2, "error: --stack: the pulumi CLI is not on PATH; install it, or give "
                                               "--queue-url and --bucket (or GPUFLEET_QUEUE_URL and GPUFLEET_BUCKET)")
    bare = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") or k == "AWS_ENDPOINT_URL"}
    bare.update(AWS_EC2_METADATA_DISABLED="true", AWS_DEFAULT_REGION="eu-west-1",
                AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"), AWS_CONFIG_FILE=str(tmp_path / "none"))
    proc = gpufleet("jobs", "status", "--stack", "dev", "j", env=bare)
    assert proc.returncode == 2 and err(proc).startswith("error: no usable AWS credentials (Unable to locate "
                                                         "credentials); set AWS_ACCESS_KEY_ID"), proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_bucket_and_queues_of_each_clouds_outputs():
    from trainer.jobs.commands import Target, target_of_outputs

    assert target_of_outputs("dev", {"bucket": "b", "queueUrl": "q", "dlqUrl": "d"}) == Target("b", "q", "d")
    assert target_of_outputs("azure", {"containerUrl": "https://acct.blob.core.windows.net/checkpoints",
                                       "queueUrl": "https://acct.queue.core.windows.net/jobs",
                                       "poisonQueueUrl": "https://acct.queue.core.windows.net/jobs-poison"}) == Target(
        "https://acct.blob.core.windows.net/checkpoints", "https://acct.queue.core.windows.net/jobs",
        "https://acct.queue.core.windows.net/jobs-poison")
    tencent = {"bucket": "gpufleet-t-data-125", "queueUrl": "q", "dlqUrl": "d",
               "checkpointUriTemplate": "cos://gpufleet-t-data-125/teams/<team>/jobs/<job_id>/"}
    assert target_of_outputs("tencent", tencent) == Target("cos://gpufleet-t-data-125", "q", "d")


def test_a_teams_queues_from_the_outputs_and_a_team_without_one_is_one_line():
    from trainer.errors import UsageError
    from trainer.jobs.commands import Target, resolve, target_of_outputs

    outputs = {"bucket": "b", "queueUrl": "qv", "dlqUrl": "dv", "teamQueues": {"vision": "qv", "nlp": "qn"},
               "teamDeadLetterQueues": {"vision": "dv", "nlp": "dn"}}
    assert target_of_outputs("dev", outputs, "nlp") == Target("b", "qn", "dn", "nlp")
    assert target_of_outputs("dev", outputs) == Target("b", "qv", "dv", "vision")  # the stack's queue: its team's
    with pytest.raises(UsageError, match=r"^--team: stack dev has no queue for team 'speech'; its teams' queues: "
                                         r"vision, nlp$"):
        target_of_outputs("dev", outputs, "speech")
    one = {"bucket": "b", "queueUrl": "q", "teams": ["ml", "nlp"]}  # one queue for all: the first team's
    assert target_of_outputs("azure", one) == target_of_outputs("azure", one, "ml") == Target("b", "q", None, "ml")
    with pytest.raises(UsageError, match=r"^--team: stack azure has one queue, for team ml; team 'nlp' has none$"):
        target_of_outputs("azure", one, "nlp")
    assert target_of_outputs("old", {"bucket": "b", "queueUrl": "q"}) == Target("b", "q")  # the default team's
    # no stack: the team given, else GPUFLEET_TEAM, else the default team
    assert resolve(None, ".", "q", "b", team="nlp") == Target("b", "q", None, "nlp")
    assert resolve(None, ".", "q", "b", environ={"GPUFLEET_TEAM": "ml"}) == Target("b", "q", None, "ml")
    assert resolve(None, ".", "q", "b", environ={}).records().store.uri == "s3://b/teams/default/"


def test_a_teams_commands_neither_see_nor_touch_another_teams_job(moto_endpoint):
    # issue 23, finding 6 (any job could cancel another team's): each team's records are its own prefix's
    from trainer.jobs import records
    from trainer.jobs.commands import Target, cancel, retry
    from trainer.jobs.records import UnknownJob, new_record

    boto3.client("s3").create_bucket(Bucket="rt-teams", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    sqs = boto3.client("sqs")
    queue = sqs.create_queue(QueueName="rt-vision")["QueueUrl"]
    nlp = RecordStore.of_bucket("rt-teams", "nlp")
    spec = {"spec": 1, "job_id": "nlp-1", "kind": "trainer", "args": []}
    nlp.update("nlp-1", lambda r: r, missing=lambda: {**new_record(spec, time.time()), "state": "failed"})
    with pytest.raises(UnknownJob, match=r"^job 'nlp-1': no such job in s3://rt-teams/teams/vision/ "):
        retry(Target("rt-teams", queue, None, "vision"), "nlp-1")
    assert "Messages" not in sqs.receive_message(QueueUrl=queue, WaitTimeSeconds=0)
    nlp.update("nlp-1", lambda r: {**r, "state": "queued"})
    before = nlp.get("nlp-1")
    with pytest.raises(UnknownJob, match=r"^job 'nlp-1': no such job in s3://rt-teams/teams/vision/"):
        cancel(Target("rt-teams", queue, None, "vision"), "nlp-1")
    assert nlp.get("nlp-1") == before
    assert Target("rt-teams", queue, None, "vision").records().all() == []  # nor listed
    assert "cancel" in cancel(Target("rt-teams", queue, None, "nlp"), "nlp-1")
    assert nlp.get("nlp-1")["state"] == "cancelled"
    assert sorted(k["Key"] for k in boto3.client("s3").list_objects_v2(Bucket="rt-teams")["Contents"]) == [
        f"teams/nlp/{records.index_key('nlp-1')}", "teams/nlp/jobs/nlp-1/record.json"]
