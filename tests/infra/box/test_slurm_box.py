"""Jobs through a real Slurm in the box: a sweep as one job array, a 2-node job, a direct sbatch job in `jobs
list`, cancel, retries and `retry`, a bad message, a spot notice, a node killed without notice (powered down by the
healer), the bridge killed with -9, slurmctld restarted. Every job goes in through `gpufleet jobs submit --stack
box`, as a user sends it.

The tests run in file order on one box with two CLOUD nodes; the ones that take a node away come last.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.infra.box.conftest import EXAMPLES, gpufleet, wait_for
from trainer.jobs import logs
from trainer.slurm import batch, users

TINY = ["--model", "gpt-tiny", "--dataset", "synthetic", "--batch-size", "4", "--num-workers", "0",
        "--checkpoint-every", "0", "--warmup-steps", "1"]


def slow_job(box, job_id: str, steps: int = 400, sleep: float = 0.1, *extra: str) -> Path:
    """examples/train.py as a code bundle, slowed down; its metrics (rank 0, one line a step) in the box's folder
    that jobs may write (they run as the team's user)."""
    metrics = box.job_files / f"{job_id}.jsonl"
    box.submit("--workdir", str(EXAMPLES), "--job-id", job_id, *extra, "--", "python", "train.py", "--steps",
               str(steps), "--step-sleep", str(sleep), "--metrics", str(metrics))
    return metrics


def steps_of(metrics: Path) -> list[tuple[int, int]]:
    """(attempt, step) of every line."""
    if not metrics.exists():
        return []
    return [(r["attempt"], r["step"]) for r in map(json.loads, metrics.read_text().splitlines())]


@contextlib.contextmanager
def taken_port():
    """A port held here whose next seven (the rest of a two-node box's eight: slurmctld, slurmd, each node and its
    credentials endpoint, slurmdbd, MariaDB) are free: only the first is reported taken."""
    def free(port: int) -> bool:
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
                return True
            except OSError:
                return False

    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
            if port < 65528 and all(free(port + i) for i in range(1, 8)):
                yield port
                return
    raise AssertionError("no port with seven free ones after it")


def test_a_second_box_and_a_taken_port_are_one_line_each(box, tmp_path):
    again = gpufleet("box", "up", "--dir", str(box.dir))
    assert again.returncode == 2 and again.stderr.count("\n") == 1
    assert again.stderr.startswith(f"error: box: a box is already running in {box.dir} (pid {box.state['pid']})")
    with taken_port() as port:
        taken = gpufleet("box", "up", "--dir", str(tmp_path / "other"), "--port", str(port))
    assert taken.returncode == 2 and taken.stderr.count("\n") == 1
    assert taken.stderr.startswith(f"error: --port: {port} taken on 127.0.0.1")
    env = gpufleet("box", "env", "--dir", str(box.dir))
    assert env.stdout.splitlines() == [f"export SLURM_CONF={box.state['slurm_conf']}",
                                       f"export GPUFLEET_BOX_DIR={box.dir}"]


def test_a_box_its_teams_users_cannot_reach_is_one_line_and_starts_nothing(tmp_path):
    """Run by root, a box runs its jobs as the teams' users: below a folder they cannot search (pytest's own, 0700)
    it is refused in one line before anything starts."""
    assert os.geteuid() == 0, "the box's tests run as root (CI does)"
    root = tmp_path / "box"
    done = gpufleet("box", "up", "--dir", str(root))
    assert done.returncode == 2, done.stderr
    blocked = next(p for p in root.parents if not os.stat(p).st_mode & 0o001)
    assert done.stderr.strip() == (
        f"error: box: could not start: the teams' users cannot reach {root}: {blocked} is not searchable by others "
        f"(give --dir below a directory they can reach, such as /tmp) (see {root / 'box.log'})")
    assert not (root / "state.json").exists() and not (root / "account").exists()


def test_without_slurm_box_up_is_one_line(monkeypatch, tmp_path, capsys):
    from infra import cli
    from infra.box import cli as box_cli

    monkeypatch.setattr(box_cli, "NEEDS", {"slurmctld-not-here": "slurmctld"})
    assert cli.main(["box", "up", "--dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == ("error: box: Slurm is not installed: slurmctld-not-here (slurmctld) missing; run `make tools` (as "
                   "root) or install the Debian packages slurm-wlm, slurmdbd, mariadb-server and munge\n")
    assert not (tmp_path / "state.json").exists()


def test_an_idle_box_holds_no_node_and_a_sweep_runs_as_one_job_array(box):
    assert set(box.slurm("sinfo", "-h", "-N", "-o", "%T").split()) == {"idle~"}  # powered down
    ids = box.submit("--job-id", "sw", "--sweep", "lr=1e-3,3e-4", "--", *TINY, "--steps", "4")
    assert ids == ["sw.lr-1e-3", "sw.lr-3e-4"]
    recs = [box.wait_state(i, "succeeded") for i in ids]
    sids = [r["slurm"]["id"] for r in recs]
    array = sids[0].split("_")[0]
    assert sids == [f"{array}_0", f"{array}_1"]  # one sbatch, two array indexes
    assert all(len(r["attempts"]) == 1 and r["attempts"][0]["exit_status"] == 0 for r in recs)
    assert "slurmd and its notice watcher started" in (box.dir / "slurm" / "log" / "power.log").read_text()
    # through slurmdbd: the bridge submits under the stack's first team (Pulumi.dev.yaml: vision)
    assert box.slurm("sacct", "-X", "-n", "-P", "-o", "Account", "-j", array).split() == ["vision", "vision"]


def test_a_two_node_job_runs_on_both_nodes_and_ships_both_outputs_and_its_metrics(box):
    emf = box.dir / "slurm" / "log" / "metrics.log"  # GPUFLEET_EMF_LOG of the box's jobs
    before = emf.stat().st_size if emf.exists() else 0
    (job_id,) = box.submit("--job-id", "pair", "--nodes", "2", "--", *TINY, "--steps", "4")
    rec = box.wait_state(job_id, "succeeded", "failed")
    assert rec["state"] == "succeeded", rec
    with emf.open("rb") as f:
        f.seek(before)
        docs = [json.loads(line) for line in f.read().splitlines()]
    summaries = [d for d in docs if "Steps" in d]  # EMF summaries of the train run, by rank 0 only
    assert sum(d["Steps"] for d in summaries) == 4 and all(d["StepTime"] > 0 for d in summaries)
    assert {m["Name"] for d in summaries for m in d["_aws"]["CloudWatchMetrics"][0]["Metrics"]} >= {"Steps",
                                                                                                   "StepTime"}
    assert sorted(rec["attempts"][0]["nodes"]) == ["gpu-1", "gpu-2"]
    store = box.records().store
    assert {node for node, _ in logs.read(store, job_id, 1)} == {"gpu-1", "gpu-2"}
    out: dict[str, str] = {}
    for node, data in logs.read(store, job_id, 1):
        out[node] = out.get(node, "") + data.decode()
    assert sum("step 4/4" in text for text in out.values()) == 1  # the trainer prints its steps on global rank 0


def test_a_job_submitted_with_sbatch_is_in_its_teams_jobs_list(box):
    """A job a team member submits with sbatch under the team's account is among that team's jobs."""
    job = box.slurm("sbatch", "--parsable", "--account=nlp", "-o", "/dev/null", "--wrap", "echo direct").strip()
    rec = box.wait_state(f"slurm-{job}", "succeeded", team="nlp")
    assert rec["kind"] == "sbatch" and rec["spec"]["name"] == "wrap" and rec["slurm"]["id"] == job
    assert f"slurm-{job}" not in {r["job_id"] for r in box.records("vision").all()}  # not vision's
    listed = box.jobs("list", "--team", "nlp", "--format", "json")
    assert listed.returncode == 0, listed.stderr
    row = next(r for r in json.loads(listed.stdout) if r["job_id"] == f"slurm-{job}")
    assert row["state"] == "succeeded" and row["kind"] == "sbatch"


def test_each_team_is_an_account_with_its_fair_share_and_its_gpu_limit(box):
    """gpufleet:teams of Pulumi.dev.yaml: vision (fair share 2), nlp (fair share 1, one GPU at a time)."""
    rows = [ln.split("|") for ln in box.slurm("sshare", "-n", "-P", "-o", "Account,User,RawShares").splitlines()]
    shares = {account.strip(): raw for account, user, raw in rows if not user and account.strip() != "root"}
    assert shares == {"vision": "2", "nlp": "1"}
    limits = box.slurm("sacctmgr", "-n", "-P", "show", "assoc", "where", "user=", "format=account,grptres")
    assert set(limits.split()) >= {"vision|", "nlp|gres/gpu=1"}
    def gpu_job(account: str) -> str:
        return box.slurm("sbatch", "--parsable", f"--account={account}", "--gres=gpu:1", "-o", "/dev/null",
                         "--wrap", "sleep 600").strip()

    first, second, other = gpu_job("nlp"), gpu_job("nlp"), gpu_job("vision")
    try:
        def states():
            rows = box.slurm("squeue", "-h", "-o", "%i|%T|%r", "-j", f"{first},{second},{other}").split()
            return {i: (t, r) for i, t, r in (row.split("|") for row in rows)}

        wait_for(lambda: states().get(first, ("",))[0] == "RUNNING" and states().get(other, ("",))[0] == "RUNNING",
                 180, "one nlp job and the vision job running")
        assert states()[second] == ("PENDING", "AssocGrpGRES")  # nlp's limit: one GPU, held by its first job
        refused = subprocess.run(["sbatch", "--account=nobody", "--wrap", "true"], env=box.env(),
                                 capture_output=True, text=True)
        assert refused.returncode == 1 and "Invalid account" in refused.stderr, refused.stderr
    finally:
        box.slurm("scancel", first, second, other)
    wait_for(lambda: not box.slurm("squeue", "-h", "-j", f"{first},{second},{other}", "-o", "%i", check=False).split(),
             120, "the teams' jobs gone")


def test_a_job_runs_under_the_team_of_its_queue_and_the_same_id_from_another_team_is_another_job(box):
    """Each team of Pulumi.dev.yaml has its queue (in AWS only its submit role may send to it: tests/infra/aws): a
    job sent through nlp's runs under Slurm account nlp, its record, logs and checkpoints under teams/nlp/; vision
    sending the same id (to run its own code on nlp's checkpoints, finding 6) runs vision's own job under vision's
    account and prefix, and nlp's record and checkpoints are left as they were."""
    import boto3

    sqs = boto3.client("sqs", endpoint_url=box.state["endpoint"], region_name=box.state["region"],
                       aws_access_key_id="box", aws_secret_access_key="box")
    s3 = boto3.client("s3", endpoint_url=box.state["endpoint"], region_name=box.state["region"],
                      aws_access_key_id="box", aws_secret_access_key="box")
    assert set(box.state["team_queues"]) == {"vision", "nlp"}
    spec = {"spec": 1, "job_id": "shared-id", "kind": "trainer", "args": [*TINY, "--steps", "2"]}
    sqs.send_message(QueueUrl=box.state["team_queues"]["nlp"], MessageBody=json.dumps(spec))
    rec = box.wait_state("shared-id", "succeeded", "failed", team="nlp")
    assert (rec["state"], rec["team"]) == ("succeeded", "nlp"), rec

    def keys(team: str) -> set[str]:
        listed = s3.list_objects_v2(Bucket=box.state["bucket"], Prefix=f"teams/{team}/jobs/shared-id/")
        return {o["Key"] for o in listed.get("Contents", [])}

    theirs = keys("nlp")
    assert any("/step-000000002/" in k for k in theirs) and any("/logs/1/" in k for k in theirs)
    accounts = box.slurm("sacct", "-X", "-n", "-P", "-o", "Account", "-j", rec["slurm"]["id"]).split()
    assert accounts == ["nlp"]
    hostile = {**spec, "args": [*TINY, "--steps", "3"]}
    sqs.send_message(QueueUrl=box.state["team_queues"]["vision"], MessageBody=json.dumps(hostile))
    own = box.wait_state("shared-id", "succeeded", "failed", team="vision")
    assert (own["state"], own["team"], len(own["attempts"])) == ("succeeded", "vision", 1), own
    assert box.slurm("sacct", "-X", "-n", "-P", "-o", "Account", "-j", own["slurm"]["id"]).split() == ["vision"]
    assert box.record("shared-id", "nlp") == rec and keys("nlp") == theirs  # nlp's job untouched
    assert any("/step-000000003/" in k for k in keys("vision"))  # vision's 3 steps, in its own prefix


HOSTILE_CREDENTIALS = """import json, os, urllib.error, urllib.request
import boto3
out = {"static": [k for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY") if k in os.environ]}
out["method"] = boto3.Session().get_credentials().method
out["arn"] = boto3.client("sts").get_caller_identity()["Arn"]
token, url = os.environ["AWS_CONTAINER_AUTHORIZATION_TOKEN"], os.environ["AWS_CONTAINER_CREDENTIALS_FULL_URI"]
slurm_id, secret = token.split(".")
def status(t):
    try:
        return urllib.request.urlopen(urllib.request.Request(url, headers={"Authorization": t})).status
    except urllib.error.HTTPError as e:
        return e.code
out["own"], out["forged"] = status(token), status(f"{int(slurm_id) - 1}.{secret}")
print("CREDS " + json.dumps(out))
"""


def test_a_job_holds_credentials_of_its_own_and_a_forged_claim_gets_none_of_anothers(box, tmp_path):
    """Issue 23, finding 1: the job's processes have no static keys and hold the job role, for this Slurm job, through
    the endpoint the TaskProlog named; another job's number with its token's secret is refused; the Epilog revokes
    the grant. A script that carries another job's spec, submitted as the bridge's user (as a job's code could), is
    granted its own mirror job's prefix, not the victim's."""
    work = tmp_path / "creds"
    work.mkdir()
    (work / "creds.py").write_text(HOSTILE_CREDENTIALS)
    box.submit("--workdir", str(work), "--job-id", "creds-own", "--", "python", "creds.py")
    rec = box.wait_state("creds-own", "succeeded", "failed")
    out = b"".join(d for _, d in logs.read(box.records().store, "creds-own", 1)).decode()
    line = next((ln for ln in out.splitlines() if ln.startswith("CREDS ")), None)
    assert rec["state"] == "succeeded" and line, out
    sid = rec["slurm"]["id"]
    assert json.loads(line[6:]) == {"static": [], "method": "container-role", "own": 200, "forged": 403,
                                    "arn": f"arn:aws:sts::123456789012:assumed-role/dev-job/gpufleet-{sid}"}
    granted = box.dir / "credentials" / rec["attempts"][-1]["nodes"][0]
    assert (granted / "grants").is_dir()
    wait_for(lambda: not (granted / "tokens" / sid).exists() and not (granted / "grants" / f"{sid}.json").exists(),
             30, "the Epilog to revoke the grant")
    claim = batch.encode({"spec": rec["spec"], "first_attempt": 1})
    forged = box.slurm("sbatch", "--parsable", "-o", "/dev/null", input=f"#!/bin/bash\nspec={claim}\ntrue\n").strip()
    box.wait_state(f"slurm-{forged}", "succeeded", "failed", team="root")  # the mirror, of its account (root's)
    log = (box.dir / "slurm" / "log" / "credentials.log").read_text()
    assert f"Slurm job {forged} is job slurm-{forged} of team root: granted" in log
    assert f"Slurm job {sid} is job creds-own of team vision: granted" in log


HOSTILE_TEAM = """import json, os, pwd, subprocess
def run(*argv):
    done = subprocess.run(list(argv), capture_output=True, text=True)
    return [done.returncode, ((done.stderr or done.stdout).strip().splitlines() or [""])[-1]]
out = {"user": pwd.getpwuid(os.getuid()).pw_name, "uid": os.getuid()}
out["sbatch"] = run("sbatch", "--account=nlp", "--parsable", "-o", "/dev/null", "--wrap=sleep 1")
out["scancel"] = run("scancel", os.environ["VICTIM"])
out["sudo"] = run("sudo", "-n", "-u", "gpufleet-nlp", "true")
out["their_files"] = os.access(os.environ["THEIR_DIR"], os.X_OK)
home = pwd.getpwuid(os.getuid()).pw_dir
try:
    with open(os.path.join(home, ".probe"), "w") as f:
        f.write("mine")
    out["home"] = [home, "written"]
except OSError as exc:
    out["home"] = [home, str(exc)]
print("TEAM " + json.dumps(out))
"""


def test_a_job_runs_as_its_teams_user_and_can_neither_submit_for_nor_cancel_another_team(box, tmp_path):
    """Issue 23, finding 6 (any job could cancel another team's job) and the teams' accounts: a job runs as its
    team's Unix user (the bridge submitted it as that user), which Slurm lets submit under its own account only and
    cancel its own jobs only; it cannot become another team's user nor reach that team's files on the node. Its
    home (a node's /var/lib/gpufleet/teams/<team>) is its own to write."""
    victim = box.slurm("runuser", "-u", "gpufleet-nlp", "--", "sbatch", "--parsable", "--account=nlp", "-o",
                       "/dev/null", "--chdir=/", "--wrap=sleep 300").strip()
    try:
        wait_for(lambda: box.slurm("squeue", "-h", "-j", victim, "-o", "%T").strip() == "RUNNING", 120,
                 "nlp's job to run")
        work = tmp_path / "team"
        work.mkdir()
        (work / "hostile.py").write_text(HOSTILE_TEAM)
        box.submit("--workdir", str(work), "--job-id", "team-hostile", "--env", f"VICTIM={victim}", "--env",
                   f"THEIR_DIR={box.dir / 'work' / 'teams' / 'nlp'}", "--", "python", "hostile.py")
        rec = box.wait_state("team-hostile", "succeeded", "failed")
        out = b"".join(d for _, d in logs.read(box.records().store, "team-hostile", 1)).decode()
        line = next((ln for ln in out.splitlines() if ln.startswith("TEAM ")), None)
        assert rec["state"] == "succeeded" and line, out
        seen = json.loads(line[5:])
        assert (seen["user"], seen["uid"]) == ("gpufleet-vision", users.uid_of("vision"))
        assert seen["sbatch"][0] != 0 and "Invalid account" in seen["sbatch"][1], seen
        assert seen["scancel"][0] != 0 and "Access/permission denied" in seen["scancel"][1], seen
        assert seen["sudo"][0] != 0 and seen["their_files"] is False, seen
        assert seen["home"] == [users.home_of("vision"), "written"], seen  # its own HOME, as on a node
        assert box.slurm("squeue", "-h", "-j", victim, "-o", "%T %u").split() == ["RUNNING", "gpufleet-nlp"]
        sid = rec["slurm"]["id"]
        assert box.slurm("sacct", "-X", "-n", "-P", "-o", "User,Account", "-j", sid).split() == [
            "gpufleet-vision|vision"]
    finally:
        box.slurm("scancel", victim)


def test_cancel_stops_a_running_job_and_a_queued_one_never_runs(box):
    slow_job(box, "long-a")
    slow_job(box, "long-b")
    box.wait_state("long-a", "running")
    box.wait_state("long-b", "running")
    slow_job(box, "long-c")  # both nodes are taken: it waits
    wait_for(lambda: box.record("long-c").get("slurm"), 60, "long-c in Slurm")
    told = box.jobs("cancel", "long-c")
    assert told.returncode == 0 and "cancelled" in told.stdout
    for job_id in ("long-a", "long-b"):
        assert box.jobs("cancel", job_id).returncode == 0
    for job_id in ("long-a", "long-b", "long-c"):
        rec = box.wait_state(job_id, "cancelled", "succeeded", "failed")
        assert rec["state"] == "cancelled", rec
    assert box.record("long-c")["attempts"] == []
    slurm_ids = {box.record(j)["slurm"]["id"] for j in ("long-a", "long-b", "long-c")}
    states = box.slurm("squeue", "-h", "--states=all", "-o", "%i %T").split("\n")
    assert {ln.split()[1] for ln in states if ln and ln.split()[0] in slurm_ids} == {"CANCELLED"}


def test_a_failure_is_retried_within_its_budget_and_retry_gives_a_fresh_one(box, tmp_path):
    import boto3

    secret = f"pw-{os.urandom(8).hex()}"  # a secret under a name the denylist does not know (issue 23, finding 9)
    digest = hashlib.sha256(secret.encode()).hexdigest()[:16]
    work = tmp_path / "failing"
    work.mkdir()
    (work / "fail.py").write_text("import hashlib, os, sys\nprint('attempt', os.environ['GPUFLEET_ATTEMPT'], "
                                  "hashlib.sha256(os.environ['DB_PASS'].encode()).hexdigest()[:16])\nsys.exit(3)\n")
    box.submit("--workdir", str(work), "--job-id", "flaky", "--retries", "1", "--env", f"DB_PASS={secret}", "--",
               "python", "fail.py")
    rec = wait_for(lambda: (r := box.record("flaky"))["state"] == "failed" and len(r["attempts"]) == 2 and r,
                   240, "two failed attempts")
    assert [(a["n"], a["exit_status"], a["reason"]) for a in rec["attempts"]] == [(1, 3, "failure"), (2, 3, "failure")]
    again = box.jobs("retry", "flaky")
    assert again.returncode == 0, again.stderr
    rec = wait_for(lambda: (r := box.record("flaky"))["state"] == "failed" and len(r["attempts"]) == 4 and r,
                   240, "two more failed attempts after retry")
    assert [a["n"] for a in rec["attempts"]] == [1, 2, 3, 4]
    # every attempt had the value: the bridge's own retry and `jobs retry` (which sends the record's spec, names
    # only) both get it from what the bridge kept
    for n in (1, 2, 3, 4):
        out = b"".join(d for _, d in logs.read(box.records().store, "flaky", n)).decode()
        assert f"attempt {n} {digest}" in out, (n, out)
    assert rec["spec"]["env"] == {"DB_PASS": {"hidden": True}}
    s3 = boto3.client("s3", endpoint_url=box.state["endpoint"], region_name=box.state["region"],
                      aws_access_key_id="box", aws_secret_access_key="box")
    bucket = box.state["bucket"]
    keys = [o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket)
            for o in page.get("Contents", [])]
    leaked = [k for k in keys if secret.encode() in s3.get_object(Bucket=bucket, Key=k)["Body"].read()]
    assert keys and leaked == []
    assert secret not in (box.dir / "slurm" / "log" / "bridge.out").read_text()


def test_a_bad_message_is_dead_lettered_at_once_with_one_line_in_its_record(box):
    import boto3

    from trainer.jobs.records import new_record

    sqs = boto3.client("sqs", endpoint_url=box.state["endpoint"], region_name=box.state["region"],
                       aws_access_key_id="box", aws_secret_access_key="box")
    spec = {"spec": 1, "job_id": "bad-one", "kind": "trainer", "args": ["--no-such-flag"]}
    box.records().update("bad-one", lambda r: r, missing=lambda: new_record(spec, time.time()))
    sqs.send_message(QueueUrl=box.state["queue_url"], MessageBody=json.dumps(spec))
    rec = box.wait_state("bad-one", "failed", timeout_s=60)
    assert rec["reason"].startswith("invalid: job bad-one: ") and "\n" not in rec["reason"]
    got = wait_for(lambda: [m for m in sqs.receive_message(QueueUrl=box.state["dlq_url"], WaitTimeSeconds=1,
                                                           MaxNumberOfMessages=10).get("Messages", [])
                            if json.loads(m["Body"]).get("job_id") == "bad-one"], 60, "the dead letter")
    assert len(got) == 1
    assert "slurm" not in box.record("bad-one")


def test_a_job_that_ended_while_the_bridge_was_stopped_is_read_from_accounting(box):
    (job_id,) = box.submit("--job-id", "while-away", "--", *TINY, "--steps", "2")
    sid = box.wait_state(job_id, "running")["slurm"]["id"]
    (bridge,) = [pid for pid in box.processes()
                 if b"trainer\0controller" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    os.kill(bridge, signal.SIGSTOP)  # away: it reads nothing of Slurm while the job ends and leaves squeue
    try:
        wait_for(lambda: sid not in box.slurm("squeue", "-h", "--states=all", "-o", "%i").split(), 300,
                 f"Slurm job {sid} gone from squeue (MinJobAge)")
    finally:
        os.kill(bridge, signal.SIGCONT)
    rec = box.wait_state(job_id, "succeeded", "failed", timeout_s=120)
    assert rec["state"] == "succeeded" and rec["attempts"][-1]["exit_status"] == 0, rec
    assert f"Slurm job {sid} ended while the bridge was away: COMPLETED (from accounting)" in \
        (box.dir / "slurm" / "log" / "bridge.out").read_text()


def test_a_node_failing_its_health_check_when_it_starts_is_drained(box):
    # gpu-2's Slurm definition says EFA, which this machine lacks: its watcher's preflight drains it at start
    node_state = lambda: box.slurm("sinfo", "-h", "-n", "gpu-2", "-o", "%T").strip()  # noqa: E731
    wait_for(lambda: node_state() in ("idle", "idle~"), 120, "gpu-2 idle")
    if node_state() == "idle":
        box.slurm("scontrol", "update", "nodename=gpu-2", "state=POWER_DOWN_FORCE")
        wait_for(lambda: node_state() == "idle~", 120, "gpu-2 powered down")
    box.slurm("scontrol", "update", "nodename=gpu-2", "availablefeatures=g6.xlarge,spot,efa",
              "activefeatures=g6.xlarge,spot,efa")
    job = box.slurm("sbatch", "--parsable", "-w", "gpu-2", "-o", "/dev/null", "--wrap", "sleep 30").strip()
    try:
        wait_for(lambda: node_state().startswith("drain"), 120, "gpu-2 drained")
        reason = box.slurm("sinfo", "-h", "-n", "gpu-2", "-o", "%E").strip()
        assert reason.startswith("preflight: efa: 0 EFA devices found, 1 expected"), reason
        # the watcher logs once the node's jobs are requeued too, a moment after the drain Slurm already shows
        log = box.dir / "slurm" / "log" / "watch-gpu-2.log"
        wait_for(lambda: "node gpu-2: preflight: efa" in log.read_text(), 60, "the drain in the watcher's log")
    finally:
        box.slurm("scancel", job)
        box.slurm("scontrol", "update", "nodename=gpu-2", "availablefeatures=g6.xlarge,spot",
                  "activefeatures=g6.xlarge,spot")
        box.slurm("scontrol", "update", "nodename=gpu-2", "state=RESUME", check=False)
    wait_for(lambda: not node_state().startswith("drain"), 60, "gpu-2 back in service")


def test_a_spot_notice_requeues_the_job_which_resumes_elsewhere_losing_no_step(box, tmp_path):
    metrics = slow_job(box, "spot", steps=200, sleep=0.1)  # ~20 s left once noticed
    node = box.node_of_running("spot")
    wait_for(lambda: len(steps_of(metrics)) >= 5, 120, "five steps")
    noticed = gpufleet("box", "notice", node, "--dir", str(box.dir))
    assert noticed.returncode == 0, noticed.stderr
    rec = box.wait_state("spot", "succeeded", "failed", timeout_s=300)
    assert rec["state"] == "succeeded", rec
    first, second = rec["attempts"]
    assert (first["n"], first["reason"], second["n"], second["reason"]) == (1, "preemption", 2, None)
    power = (box.dir / "slurm" / "log" / "power.log").read_text()
    if second["nodes"] == first["nodes"]:  # the same name, a fresh machine: powered down, then up again
        assert power.index(f"node {node}: stopped") < power.rindex(f"node {node}: slurmd and its notice watcher")
    done = steps_of(metrics)
    assert [s for _, s in done] == list(range(1, 201))  # none lost, none done twice
    assert {a for a, _ in done} == {1, 2}


def _kill_node(box, node: str, slurm_id: str) -> None:
    """The node's machine goes without notice: its slurmd, the job's slurmstepd and the job's processes stop at
    once (SIGSTOP: a machine that is gone says nothing more), and die once Slurm has marked the node DOWN. The
    processes are looked for again after each stop until no new one shows: one forked while they were being
    listed would otherwise run on, as no process of a machine that is gone does."""
    from infra.box.supervisor import box_processes

    run = box.dir / "slurm" / "run"

    def of_job() -> set[int]:
        found = {int((run / f"slurmd-{node}.pid").read_text())}
        for pid in box_processes(box.state["box_id"]):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if cmd.startswith(b"slurmstepd: [" + slurm_id.encode() + b".") or \
                    f"SLURM_JOB_ID={slurm_id}".encode() in env:
                found.add(pid)
        return found

    def signal_all(pids, sig) -> None:
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    victims: set[int] = set()
    while new := of_job() - victims:
        signal_all(new, signal.SIGSTOP)
        victims |= new
    wait_for(lambda: box.slurm("sinfo", "-h", "-n", node, "-o", "%T").strip().startswith("down"), 120,
             f"{node} marked down")
    signal_all(victims, signal.SIGKILL)


def test_a_node_killed_without_notice_is_marked_down_and_its_job_runs_again(box, tmp_path):
    """Slurm requeues the job once it marks the node DOWN, and the healer powers the node down; the job runs again
    on any node in the pool, which the killed one rejoins SuspendTimeout after its power-down: on another node, or
    on the same name powered up again, a fresh machine (Slurm does not keep a requeued job off its last nodes)."""
    metrics = slow_job(box, "lost", steps=200, sleep=0.1)
    node = box.node_of_running("lost")
    wait_for(lambda: steps_of(metrics), 120, "the job's first step")  # its processes all started
    power = box.dir / "slurm" / "log" / "power.log"
    before = power.stat().st_size
    _kill_node(box, node, box.record("lost")["slurm"]["id"])
    rec = box.wait_state("lost", "succeeded", "failed", timeout_s=300)
    assert rec["state"] == "succeeded", rec
    assert len(rec["attempts"]) == 2 and rec["attempts"][0]["reason"] == "preemption"
    if rec["attempts"][1]["nodes"] == [node]:  # the same name: stopped after the kill, then started afresh
        since = power.read_bytes()[before:].decode()
        assert f"node {node}: stopped" in since, since
        assert since.index(f"node {node}: stopped") < since.rindex(f"node {node}: slurmd and its notice watcher"), since
    wait_for(lambda: box.slurm("sinfo", "-h", "-n", node, "-o", "%T").strip() in ("idle~", "idle", "idle%"), 120,
             f"{node} powered down and back in the pool")
    # powered down by the healer (`trainer nodes heal`, Slurm's administrator), not by the bridge
    assert f"node {node}: down and not responding; powering it down" in \
        (box.dir / "slurm" / "log" / "heal.out").read_text()


def test_the_bridge_killed_at_any_point_loses_no_job_and_submits_none_twice(box, tmp_path):
    """A bridge of its own on a queue of its own, killed (an exception, as -9 would stop it) right after each
    step of taking a message: after sbatch, after the record names the Slurm job; then the box's own bridge
    killed with -9 while jobs arrive."""
    import boto3

    from trainer.clouds.aws import SqsJobQueue
    from trainer.jobs.spec import Job
    from trainer.slurm import batch, bridge, client

    sqs = boto3.client("sqs", endpoint_url=box.state["endpoint"], region_name=box.state["region"],
                       aws_access_key_id="box", aws_secret_access_key="box")
    url = sqs.create_queue(QueueName="crash", Attributes={"VisibilityTimeout": "1"})["QueueUrl"]
    os.environ.update(SLURM_CONF=box.state["slurm_conf"], AWS_ENDPOINT_URL=box.state["endpoint"])
    queue = SqsJobQueue(url, box.state["region"])
    site = batch.Site(box.state["bucket"], os.sys.executable, str(box.dir / "slurm" / "output"))
    (box.dir / "slurm" / "output" / "default").mkdir(exist_ok=True)  # its jobs' output: as root, the default team

    class Crash(BaseException):
        """The bridge stops dead here, as kill -9 would stop it."""

    class SlurmThenCrash:
        def __getattr__(self, name):
            return getattr(client, name)

        def sbatch(self, script):
            client.sbatch(script)
            raise Crash()

    class QueueThatCrashesOnDelete:
        def __getattr__(self, name):
            return getattr(queue, name)

        def delete(self, msg):
            raise Crash()

    def crashing_at(point: str) -> bridge.Bridge:
        if point == "sbatch":
            return bridge.Bridge(queue, box.records, site, slurm=SlurmThenCrash())
        return bridge.Bridge(QueueThatCrashesOnDelete(), box.records, site)

    for point in ("sbatch", "delete"):
        job = Job(f"crash-{point}", args=tuple(TINY) + ("--steps", "2"))
        box.records("default").create(job.to_dict())  # a bridge of no account: the default team's
        queue.send(job.to_json())
        with pytest.raises(Crash):
            crashed = crashing_at(point)
            while True:
                crashed.step()
        fresh = bridge.Bridge(queue, box.records, site)
        wait_for(lambda: (fresh.step(), box.record(job.job_id, "default")["state"] == "succeeded")[1], 120,
                 f"{job.job_id} done after a crash at {point}")
        comments = [j for j in client.jobs() if j.name == f"gpufleet.{job.job_id}"]
        assert len(comments) == 1, comments  # submitted once
        assert queue.receive(1) is None  # its message is gone

    def bridge_pid(other_than: int | None = None) -> int | None:
        for pid in box.processes():
            try:
                if b"trainer\0controller" in Path(f"/proc/{pid}/cmdline").read_bytes() and pid != other_than:
                    return pid
            except OSError:
                pass
        return None

    ids = [f"k9-{i}" for i in range(6)]
    for job_id in ids:
        box.submit("--job-id", job_id, "--", *TINY, "--steps", "2")
        killed = wait_for(bridge_pid, 30, "the bridge")
        os.kill(killed, signal.SIGKILL)  # the supervisor starts it again, as systemd would
        wait_for(lambda: bridge_pid(other_than=killed), 30, "the bridge back")
    for job_id in ids:
        assert box.wait_state(job_id, "succeeded", "failed")["state"] == "succeeded"
        # slurmctld tells slurmdbd of a job's end on its own time: the record may be done before accounting has it
        assert len(wait_for(lambda: submitted(f"gpufleet.{job_id}"), 60, f"{job_id} in accounting")) == 1, job_id


def submitted(name: str) -> list[str]:
    """Ids of the Slurm jobs of this name in the last hour, from accounting (slurmdbd): squeue forgets a job
    MinJobAge after it ends, so it cannot count the submissions of a job that finished a while ago (one delayed
    job, a node power-up requeued after ResumeTimeout, is enough for that). A requeued job is one id."""
    out = subprocess.run(["sacct", "-X", "-n", "-P", "-S", "now-3600", "--name", name, "-o", "JobID"],
                         capture_output=True, text=True, check=True).stdout
    return out.split()


def test_slurmctld_restarted_running_jobs_keep_running_and_records_stay_true(box, tmp_path):
    metrics = slow_job(box, "steady", steps=300, sleep=0.1)  # running still when slurmctld is killed
    box.wait_state("steady", "running")
    wait_for(lambda: len(steps_of(metrics)) >= 3, 120, "three steps")
    # Slurm keeps a running job over a crash once its state is saved (StateSaveLocation's job_state, written within
    # seconds of a change by one thread that packs the state, then writes it); killed before that, slurmctld forgets
    # the job ("Purged files for defunct batch JobId") and kills its steps as orphans (seen here when the job started
    # on a node that was up already). A change of the job's own makes slurmctld save; the first write seen after it
    # may have been packed before the job was there (seen on a loaded machine), the one after that was not.
    job_state = box.dir / "slurm" / "state" / "job_state"
    saved = time.time()
    for _ in range(2):
        box.slurm("scontrol", "update", f"JobId={box.record('steady')['slurm']['id']}", "AdminComment=box-test")
        wait_for(lambda: job_state.exists() and job_state.stat().st_mtime > saved, 60, "the job's state saved")
        saved = job_state.stat().st_mtime
    ctld = int((box.dir / "slurm" / "run" / "slurmctld.pid").read_text())
    os.kill(ctld, signal.SIGKILL)
    wait_for(lambda: "UP" in box.slurm("scontrol", "ping", check=False), 60, "slurmctld back")
    rec = box.wait_state("steady", "succeeded", "failed", timeout_s=240)
    assert rec["state"] == "succeeded" and len(rec["attempts"]) == 1, rec
    assert [s for _, s in steps_of(metrics)] == list(range(1, 301))
