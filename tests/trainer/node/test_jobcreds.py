"""A job's own credentials (trainer.node.jobcreds, trainer.clouds.aws_credentials): the session policy STS gets,
grants and tokens on disk (modes, owners, links), the endpoint as botocore's container provider reads it against
moto's STS in a process without static keys, its refusals, its cache, and which gpufleet job a Slurm job is.

The box (tests/infra/box/test_slurm_box.py) runs the same parts under a real Slurm: Prolog, TaskProlog, Epilog."""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from trainer.clouds.aws_credentials import MAX_POLICY_CHARS, JobRoleIssuer, packed, session_policy
from trainer.errors import UsageError
from trainer.jobs.records import RecordStore, index_key
from trainer.jobs.spec import Job
from trainer.loop.storage import open_store
from trainer.node import jobcreds
from trainer.node.jobcreds import PATH, Broker, Denied, job_of, read_grant, remove_grant, write_grant
from trainer.slurm import batch

ROLE = "arn:aws:iam::123456789012:role/dev-job"
REPO = Path(__file__).resolve().parents[3]


# --- the session policy ---------------------------------------------------------------------------------------

def test_the_session_policy_writes_only_the_jobs_prefix_and_reads_only_its_teams():
    policy = session_policy("dev-bucket", "vision", "run1", "eu-west-1")
    writes = [s for s in policy["Statement"] if "s3:PutObject" in s["Action"]]
    assert [s["Resource"] for s in writes] == ["arn:aws:s3:::dev-bucket/teams/vision/jobs/run1/*"]
    assert index_key("run1") not in json.dumps(policy)
    reads = {r for s in policy["Statement"] if s["Action"] == "s3:GetObject" for r in s["Resource"]}
    assert reads == {"arn:aws:s3:::dev-bucket/teams/vision/code/*", "arn:aws:s3:::dev-bucket/teams/vision/data/*"}
    (listing,) = [s for s in policy["Statement"] if s["Action"] == "s3:ListBucket"]
    assert listing["Condition"]["StringLike"]["s3:prefix"] == [
        "teams/vision/jobs/run1/*", "teams/vision/code/*", "teams/vision/data/*"]
    assert "arn:aws-cn:s3:::b/teams/nlp/jobs/run1/*" in json.dumps(session_policy("b", "nlp", "run1", "cn-north-1"))
    with pytest.raises(UsageError, match="not a team name"):  # never a path out of the teams' prefixes
        session_policy("b", "../x", "run1", "eu-west-1")


def test_the_longest_team_job_id_and_bucket_fit_stss_limit():
    longest = packed(session_policy("b" * 63, "t" * 15, "j" * 128, "cn-northwest-1"))
    assert len(longest) <= MAX_POLICY_CHARS
    with pytest.raises(ValueError, match="at most 2048"):
        packed({"Statement": ["x" * MAX_POLICY_CHARS]})


# --- which job a Slurm job is ---------------------------------------------------------------------------------

def test_a_batch_script_names_its_job_and_each_array_elements():
    site = batch.Site(bucket="b", python="/usr/bin/python3", output_dir="/var/log/out")
    one = Job(job_id="run1", kind="trainer")
    assert batch.job_id_of(batch.render([one], site, "m1")) == "run1"
    assert batch.job_id_of(batch.render([one], site, "m1"), 0) is None
    sweep = [Job(job_id=f"sweep.lr-{i}", kind="trainer", array={"id": "sweep", "nonce": "ab12cd34", "index": i,
                                                                  "count": 3}) for i in range(3)]
    script = batch.render(sweep, site, "ab12cd34")
    assert [batch.job_id_of(script, i) for i in range(3)] == ["sweep.lr-0", "sweep.lr-1", "sweep.lr-2"]
    assert batch.job_id_of(script) is None and batch.job_id_of(script, 3) is None
    assert batch.job_id_of("#!/bin/bash\nspec=not-base64!\n") is None
    assert batch.job_id_of("#!/bin/bash\nsrun hostname\n") is None


@dataclass
class SlurmJobStub:
    id: str
    user: str
    array_job_id: int | None = None
    array_task_id: int | None = None
    account: str = "vision"


class FakeSlurm:
    """slurmctld's answers for one job (trainer.slurm.client.job and batch_script)."""

    def __init__(self, job, script):
        self._job, self._script = job, script

    def job(self, slurm_id):
        return self._job

    def batch_script(self, slurm_id):
        return self._script


@pytest.fixture
def records(tmp_path):
    """A team's records (what RecordStore.of_bucket gives on a node)."""
    return lambda team: RecordStore(open_store(str(tmp_path / "bucket" / "teams" / team)))


def _submitted(records, job_id: str, slurm_id: str | None, team: str = "default"):
    records(team).create({"job_id": job_id, "kind": "trainer"})
    if slurm_id:
        records(team).update(job_id, lambda r: {**r, "slurm": {"id": slurm_id}})


def test_the_bridges_job_is_the_one_its_script_and_record_name(records):
    site = batch.Site(bucket="b", python="python3", output_dir="/o")
    script = batch.render([Job(job_id="run1", kind="trainer")], site, "m1")
    _submitted(records, "run1", "42")
    assert job_of("42", "gpufleet", records, FakeSlurm(SlurmJobStub("42", "gpufleet"), script)) == ("default", "run1")
    # under a team's account: that team's job, from that team's records (the same id in another team's is another)
    nlp = batch.render([Job(job_id="run1", kind="trainer")], replace(site, account="nlp"), "m2")
    _submitted(records, "run1", "43", team="nlp")
    assert job_of("43", "gpufleet", records, FakeSlurm(SlurmJobStub("43", "gpufleet", account="nlp"), nlp)) == (
        "nlp", "run1")


def test_a_script_claiming_another_jobs_spec_gets_its_own_mirror_prefix(records):
    """A job's code submitting, as the bridge's user, a script with a victim's spec: the victim's record names the
    victim's Slurm job, so the claim is the mirror job's."""
    site = batch.Site(bucket="b", python="python3", output_dir="/o")
    _submitted(records, "victim", "41")
    forged = batch.render([Job(job_id="victim", kind="trainer")], site, "m1")
    naps = []
    assert job_of("99", "gpufleet", records, FakeSlurm(SlurmJobStub("99", "gpufleet"), forged), wait_s=1.0,
                  sleep=naps.append) == ("vision", "slurm-99")  # the mirror's team: its own account's
    assert naps  # it waited for the bridge before it decided
    assert job_of("77", "alice", records, FakeSlurm(SlurmJobStub("77", "alice"), forged), wait_s=0) == ("vision", "slurm-77")
    assert job_of("78", "gpufleet", records, FakeSlurm(SlurmJobStub("78", "gpufleet"), "#!/bin/sh\nhostname\n"),
                  wait_s=0) == ("vision", "slurm-78")
    # a script naming another team's account and job: that team's record names another Slurm job
    _submitted(records, "theirs", "60", team="nlp")
    claims = batch.render([Job(job_id="theirs", kind="trainer")], replace(site, account="nlp"), "m3")
    assert job_of("79", "gpufleet", records, FakeSlurm(SlurmJobStub("79", "gpufleet"), claims), wait_s=0) == (
        "vision", "slurm-79")
    sweep = Job(job_id="s.lr-1", kind="trainer", array={"id": "s", "nonce": "ab12cd34", "index": 1, "count": 2})
    script = batch.render([Job(job_id="s.lr-0", kind="trainer"), sweep], site, "ab12cd34")
    _submitted(records, "s.lr-1", "50_1")
    assert job_of("52", "gpufleet", records, FakeSlurm(SlurmJobStub("50_1", "gpufleet", 50, 1), script)) == (
        "default", "s.lr-1")
    with pytest.raises(UsageError, match="slurmctld does not know it"):
        job_of("53", "gpufleet", records, FakeSlurm(None, ""))


def test_with_team_users_a_job_is_its_teams_only_when_that_teams_user_submitted_it_under_that_account(records):
    """On a cluster the bridge submits each team's jobs as the team's user (trainer.slurm.users): the Prolog takes
    a job for a team's only when that user submitted it under that team's account, and the script names the same
    team; anything else is a mirror, and the bridge's own user no longer vouches for a job."""
    site = batch.Site(bucket="b", python="python3", output_dir="/o", account="vision")
    script = batch.render([Job(job_id="run1", kind="trainer")], site, "m1")
    _submitted(records, "run1", "42", team="vision")
    own = SlurmJobStub("42", "gpufleet-vision")
    assert job_of("42", None, records, FakeSlurm(own, script)) == ("vision", "run1")
    # another team's user (whose job could only be under its own account), the bridge's user, a person
    for user, account in (("gpufleet-nlp", "nlp"), ("gpufleet", "vision"), ("alice", "vision")):
        stub = SlurmJobStub("42", user, account=account)
        assert job_of("42", None, records, FakeSlurm(stub, script), wait_s=0) == (account, "slurm-42"), user
    # nlp's user, under nlp's account, with a script whose account line says vision (an `sbatch --account=nlp`
    # over it): not vision's job
    stub = SlurmJobStub("42", "gpufleet-nlp", account="nlp")
    assert job_of("42", None, records, FakeSlurm(stub, script), wait_s=0) == ("nlp", "slurm-42")


# --- grants and tokens on disk --------------------------------------------------------------------------------

@pytest.fixture
def searchable_dir():
    """A directory other users can reach (pytest's own is 0700 at its top)."""
    path = Path(tempfile.mkdtemp(prefix="gpufleet-creds-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


@pytest.mark.skipif(os.geteuid() != 0, reason="owners and other users' reads need root")
def test_a_token_is_its_jobs_users_alone_and_nothing_a_job_planted_is_followed(searchable_dir):
    d = searchable_dir / "credentials"
    token = write_grant(d, "42", "vision", "run1", 65534, 65534)
    assert (_mode(d / "grants"), _mode(d / "grants" / "42.json"), _mode(d / "tokens"), _mode(d / "tokens" / "42")) \
        == (0o700, 0o600, 0o711, 0o400)
    assert (d / "tokens" / "42").stat().st_uid == 65534 and (d / "grants" / "42.json").stat().st_uid == 0
    assert jobcreds.TOKEN.fullmatch(token) and token.startswith("42.")

    def read_as(uid: int, path: Path) -> subprocess.CompletedProcess:
        return subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "cat", str(path)],
                              capture_output=True, text=True)

    assert read_as(65534, d / "tokens" / "42").stdout == token
    write_grant(d, "43", "vision", "run2", 65533, 65533)
    assert read_as(65534, d / "tokens" / "43").returncode != 0      # another job's user's token
    assert read_as(65534, d / "grants" / "42.json").returncode != 0  # the grants are root's
    victim = searchable_dir / "victim"
    victim.write_text("intact")
    (d / "tokens" / "44").symlink_to(victim)                          # a link where the next token goes
    write_grant(d, "44", "vision", "run3", 65534, 65534)
    assert victim.read_text() == "intact" and not (d / "tokens" / "44").is_symlink()
    remove_grant(d, "42")
    assert read_grant(d, "42") is None and not (d / "tokens" / "42").exists()
    with pytest.raises(UsageError, match="expected digits"):
        write_grant(d, "42/../x", "vision", "run1", 65534, 65534)


# --- the endpoint -------------------------------------------------------------------------------------------------

class CountingIssuer:
    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def __call__(self, team, job_id, session):
        self.calls.append((team, job_id, session))
        return self.inner(team, job_id, session)


@pytest.fixture
def endpoint(tmp_path, moto_endpoint):
    issuer = CountingIssuer(JobRoleIssuer(ROLE, "dev-bucket", "eu-west-1"))
    broker = Broker(tmp_path / "credentials", issuer)
    server = jobcreds.serve(broker, port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}{PATH}", broker, issuer
    server.shutdown()
    server.server_close()


def _job_process(url: str, token: str, code: str, moto: str) -> subprocess.CompletedProcess:
    """A job's process as the TaskProlog leaves it: no static keys, the container-credentials variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_CONTAINER_CREDENTIALS_FULL_URI=url, AWS_CONTAINER_AUTHORIZATION_TOKEN=token,
               AWS_ENDPOINT_URL=moto, AWS_DEFAULT_REGION="eu-west-1", AWS_EC2_METADATA_DISABLED="true")
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)


def test_a_jobs_process_holds_the_job_role_for_its_own_job_through_botocores_container_provider(endpoint, tmp_path,
                                                                                               moto_endpoint):
    url, broker, issuer = endpoint
    token = write_grant(broker.dir, "42", "vision", "run1", os.getuid(), os.getgid())
    done = _job_process(url, token, "import boto3; s = boto3.Session(); c = s.get_credentials()\n"
                        "print(c.method); print(boto3.client('sts').get_caller_identity()['Arn'])\n"
                        "print(boto3.client('sts').get_caller_identity()['Arn'])", moto_endpoint)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["container-role", "arn:aws:sts::123456789012:assumed-role/dev-job/gpufleet-42"
                                        ] + ["arn:aws:sts::123456789012:assumed-role/dev-job/gpufleet-42"]
    assert issuer.calls == [("vision", "run1", "42")]  # cached: one STS call for the job


def _get(url: str, token: str | None) -> int:
    req = urllib.request.Request(url, headers={"Authorization": token} if token is not None else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_no_token_a_forged_one_and_a_revoked_one_are_refused(endpoint):
    url, broker, issuer = endpoint
    token = write_grant(broker.dir, "42", "vision", "run1", os.getuid(), os.getgid())
    other = write_grant(broker.dir, "43", "vision", "run2", os.getuid(), os.getgid())
    forged = "43." + token.split(".", 1)[1]  # another job's number with this job's secret
    assert [_get(url, t) for t in (None, "", "42", "42.short", forged, token, other)] == [
        401, 401, 401, 401, 403, 200, 200]
    assert _get(url.replace(PATH, "/latest/meta-data/"), token) == 404
    remove_grant(broker.dir, "42")  # the Epilog: the job left the node
    assert _get(url, token) == 403
    assert [c for c in issuer.calls] == [("vision", "run1", "42"), ("vision", "run2", "43")]


def test_credentials_are_renewed_before_botocore_would_ask_again(tmp_path):
    now = [1000.0]
    calls = []

    def issuer(team, job_id, session):
        calls.append(now[0])
        return {"AccessKeyId": f"A{len(calls)}"}, now[0] + 3600

    broker = Broker(tmp_path, issuer, clock=lambda: now[0])
    token = write_grant(tmp_path, "7", "vision", "run7", os.getuid(), os.getgid())
    assert broker.credentials(token) == broker.credentials(token) == {"AccessKeyId": "A1"}
    now[0] += 3600 - jobcreds.RENEW_BEFORE_S + 1
    assert broker.credentials(token) == {"AccessKeyId": "A2"} and len(calls) == 2
    with pytest.raises(Denied) as refused:
        broker.credentials("7." + "x" * 43)
    assert refused.value.status == 403


def test_the_endpoint_listens_on_loopback_only_and_bad_setup_is_one_line(tmp_path):
    with pytest.raises(UsageError, match="loopback only"):
        jobcreds.serve(Broker(tmp_path, lambda *a: ({}, 0.0)), host="0.0.0.0")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    for argv in (["prolog", "--bucket", "b", "--region", "eu-west-1"], ["serve", "--bucket", "b"]):
        done = subprocess.run([sys.executable, "-m", "trainer", "credentials", *argv, "--dir", str(tmp_path)],
                              env=env, capture_output=True, text=True, cwd=REPO, timeout=60)
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and done.stderr.startswith("error: credentials"), \
            done.stderr


def test_a_jobs_platform_knows_its_instance_from_what_root_published_not_from_the_metadata_service(tmp_path,
                                                                                                  monkeypatch):
    from infra.demo.imds import FakeImds
    from trainer.clouds.aws import Imds, NodePlatform, instance_facts

    monkeypatch.delenv("AWS_EC2_METADATA_DISABLED")
    with FakeImds("i-0abc", "p5.48xlarge") as fake:
        facts = instance_facts(Imds(fake.endpoint))  # root's, at the endpoint's start
    assert facts == {"instance_id": "i-0abc", "instance_type": "p5.48xlarge"}
    published = tmp_path / "instance.json"
    published.write_text(json.dumps(facts))
    monkeypatch.setattr(jobcreds, "INSTANCE", str(published))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # a job's process: the filter refuses it
    platform = NodePlatform({"cloud": "aws", "asg_name": "dev-gpu"}, imds=Imds())
    assert (platform.instance_id, platform.instance_type()) == ("i-0abc", "p5.48xlarge")
    assert platform.metric_dimensions()["InstanceId"] == "i-0abc"
