"""A job's own Tencent Cloud key (trainer.clouds.tencent_credentials, served by trainer.node.jobcreds): the CAM
policy STS gets, the AssumeRole call against a fake of STS written from Tencent's documentation
(tests/trainer/fake_tencent.py), and a job's process that, with nothing but the TaskProlog's variables, gets its
key from the node's loopback endpoint and writes its checkpoint through the trainer's COS store (moto's S3 server
standing in for COS's S3 API)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from urllib.parse import unquote

import pytest

from tests.trainer.fake_tencent import KEY, FakeApi3, FakeSts
from trainer.clouds import tencent
from trainer.clouds.tencent_api import (Api, EndpointCredentials, MetadataUnavailable, StaticCredentials,
                                        endpoint_credentials)
from trainer.clouds.tencent_credentials import JobRoleIssuer, bucket_of, packed, session_policy
from trainer.errors import UsageError
from trainer.jobs.records import index_key
from trainer.node import jobcreds
from trainer.node.jobcreds import PATH, Broker, write_grant

REGION, APP_ID = "ap-shanghai", "1250000000"
BUCKET = f"gpufleet-dev-data-{APP_ID}"
JOB_ROLE = "qcs::cam::uin/100000000001:roleName/gpufleet-dev-jobs"
REPO = Path(__file__).resolve().parents[3]
COS = f"qcs::cos:{REGION}:uid/{APP_ID}:{BUCKET}"


def test_the_policy_writes_only_the_jobs_prefix_and_reads_and_lists_only_its_teams():
    policy = session_policy(REGION, APP_ID, BUCKET, "vision", "run1")
    assert policy["version"] == "2.0" and "principal" not in json.dumps(policy)  # STS refuses a principal
    writes = [s for s in policy["statement"] if "name/cos:PutObject" in s["action"]]
    assert [s["resource"] for s in writes] == [[f"{COS}/teams/vision/jobs/run1/*"]]
    assert index_key("run1") not in json.dumps(policy)
    reads = {r for s in policy["statement"] if s["action"] == ["name/cos:GetObject", "name/cos:HeadObject"]
             for r in s["resource"]}
    assert reads == {f"{COS}/teams/vision/code/*", f"{COS}/teams/vision/data/*"}
    (listing,) = [s for s in policy["statement"] if s["action"] == ["name/cos:GetBucket"]]
    assert listing["resource"] == [f"{COS}/"] and listing["condition"] == {"string_like": {"cos:prefix": [
        "teams/vision/jobs/run1/*", "teams/vision/code/*", "teams/vision/data/*"]}}
    assert "teams/nlp" not in json.dumps(policy)
    with pytest.raises(UsageError, match="not a team name"):  # never a path out of the teams' prefixes
        session_policy(REGION, APP_ID, BUCKET, "../x", "run1")
    assert json.loads(unquote(packed(policy))) == policy and "{" not in packed(policy)
    assert bucket_of(f"cos://{BUCKET}/teams/") == bucket_of(BUCKET) == BUCKET


@pytest.fixture
def sts():
    with FakeApi3() as api:
        yield api, FakeSts((JOB_ROLE,)).install(api)


def issuer_of(api) -> JobRoleIssuer:
    return JobRoleIssuer(JOB_ROLE, BUCKET, REGION, APP_ID, Api(StaticCredentials(KEY), REGION, endpoint=api.endpoint))


def test_each_job_gets_a_key_of_the_job_role_narrowed_to_it_by_the_nodes_own_key(sts):
    api, fake = sts
    document, expires = issuer_of(api)("vision", "run1", "42")
    assert (document["AccessKeyId"], document["SecretAccessKey"], document["Token"]) == (
        "AKIDjob1", "jobkey1", "job-token-1")
    assert document["Expiration"].endswith("Z") and expires > 0
    ((service, action, params),) = api.calls  # signed with the node's key (the fake checks the signature)
    assert (service, action, api.regions) == ("sts", "AssumeRole", [REGION])
    assert (params["RoleArn"], params["RoleSessionName"], params["DurationSeconds"]) == (JOB_ROLE, "gpufleet-42", 3600)
    assert fake.issued == [("gpufleet-42", session_policy(REGION, APP_ID, BUCKET, "vision", "run1"))]


def test_a_role_sts_does_not_know_is_one_line(sts):
    api, _ = sts
    issuer = JobRoleIssuer(JOB_ROLE.replace("jobs", "other"), BUCKET, REGION, APP_ID,
                           Api(StaticCredentials(KEY), REGION, endpoint=api.endpoint))
    with pytest.raises(Exception) as failed:
        issuer("vision", "run1", "42")
    told = tencent.explain(failed.value)
    assert told is not None and "RoleNotExist" in str(told) and "\n" not in str(told)


@pytest.fixture
def endpoint(tmp_path, sts):
    api, fake = sts
    broker = Broker(tmp_path / "credentials", issuer_of(api))
    server = jobcreds.serve(broker, port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}{PATH}", broker, fake
    server.shutdown()
    server.server_close()


def test_a_jobs_process_writes_its_checkpoint_to_cos_with_its_own_key_from_the_node(endpoint, moto_endpoint):
    """What the TaskProlog leaves a task on a Tencent node: the endpoint and the job's token, no key, no metadata
    variable (the metadata service answers only root there). The trainer's own provider reads the endpoint, and so
    does boto3 pointed at COS's S3 API."""
    url, broker, fake = endpoint
    token = write_grant(broker.dir, "42", "vision", "run1", os.getuid(), os.getgid())
    import boto3

    boto3.client("s3", region_name="us-east-1").create_bucket(Bucket=BUCKET)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "TENCENTCLOUD_"))}
    env.update(AWS_CONTAINER_CREDENTIALS_FULL_URI=url, AWS_CONTAINER_AUTHORIZATION_TOKEN=token,
               AWS_ENDPOINT_URL=moto_endpoint, AWS_EC2_METADATA_DISABLED="true", TENCENTCLOUD_REGION=REGION)
    code = ("from trainer.clouds import tencent\n"
            "from trainer.loop.storage import open_store\n"
            "p = tencent.credentials({})\n"
            "print(type(p).__name__, p.get().secret_id)\n"
            f"s = open_store('cos://{BUCKET}/teams/vision/jobs/run1/')\n"
            "s.write_bytes('checkpoints/step-1/model.pt', b'weights')\n"
            "print(s.read_bytes('checkpoints/step-1/model.pt').decode())\n"
            "import boto3\n"
            "print(boto3.Session().get_credentials().get_frozen_credentials().access_key)\n")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                          cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["EndpointCredentials AKIDjob1", "weights", "AKIDjob1"]
    assert [session for session, _ in fake.issued] == ["gpufleet-42"]  # one issue for the job, cached by the node


def test_a_refused_token_or_an_endpoint_off_loopback_is_never_a_key(endpoint):
    url, broker, _ = endpoint
    with pytest.raises(MetadataUnavailable, match=r"refused this job's token \(HTTP 403\)"):
        EndpointCredentials(url, "42." + "x" * 43).get()
    for far in ("http://169.254.0.23/v1/credentials", "https://127.0.0.1/v1/credentials", "http://example.com/"):
        with pytest.raises(ValueError, match="only a loopback http:// address"):
            EndpointCredentials(far, "t")
        # an ECS task's or EKS pod's endpoint holds no Tencent key: the role's, or an error, as before
        assert endpoint_credentials({"AWS_CONTAINER_CREDENTIALS_FULL_URI": far,
                                     "AWS_CONTAINER_AUTHORIZATION_TOKEN": "t"}) is None


def test_the_nodes_daemon_is_told_in_one_line_what_it_lacks(tmp_path):
    """`credentials serve` on a Tencent node without the job role, and on an Azure node without team identities."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    node = tmp_path / "node.json"
    code = ("import sys; from trainer.node import node_schema; node_schema.PATH = sys.argv[1]\n"
            "from trainer.__main__ import main; sys.exit(main(['credentials', *sys.argv[2:]]))")
    for cloud, own, expected in (
            ("tencent", {"app_id": APP_ID, "role_name": "n", "cos_endpoint": "x", "bucket": BUCKET},
             "error: credentials serve: no job role: give --role-arn, or run on a node whose node.json has "
             "tencent.job_role_arn"),
            ("azure", {"client_id": "cid"}, "error: credentials serve: no team identities: run on a node whose "
                                            "node.json has azure.team_client_ids")):
        node.write_text(json.dumps({"cloud": cloud, "region": REGION, "bucket": "cos://b", cloud: own}))
        done = subprocess.run([sys.executable, "-c", code, str(node), "serve", "--dir", str(tmp_path / "c")],
                              env=env, capture_output=True, text=True, cwd=REPO, timeout=60)
        assert done.returncode == 2 and done.stderr.splitlines() == [expected], done.stderr


def test_a_jobs_platform_knows_its_instance_type_from_what_root_published(tmp_path, monkeypatch):
    from tests.trainer.fake_tencent import FakeMetadata
    from trainer.clouds.tencent_api import Metadata

    with FakeMetadata(instance_id="ins-9", instance_type="GN10Xp.2XLARGE40") as fake:
        facts = tencent.instance_facts(Metadata(fake.endpoint))  # root's, at the daemon's start
    assert facts == {"instance_id": "ins-9", "instance_type": "GN10Xp.2XLARGE40"}
    published = tmp_path / "instance.json"
    published.write_text(json.dumps(facts))
    monkeypatch.setattr(jobcreds, "INSTANCE", str(published))
    dead = Metadata("http://127.0.0.1:9", timeout_s=0.5)  # a job's process: the filter refuses it
    assert tencent.NodePlatform({"cloud": "tencent"}, metadata=dead).instance_type() == "GN10Xp.2XLARGE40"
    published.unlink()
    assert tencent.NodePlatform({"cloud": "tencent"}, metadata=dead).instance_type() is None
