"""Tencent Cloud adapters against fakes written from Tencent's documentation (tests/trainer/fake_tencent.py: the
CVM metadata service, TDMQ CMQ's data-flow API, API 3.0) and moto's S3 server as the stand-in for COS's
S3-compatible endpoint, all over real HTTP on loopback."""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time

import boto3
import pytest

from tests.trainer.fake_tencent import KEY, ROLE, FakeCmq, FakeMetadata
from trainer.clouds import node_cloud
from trainer.clouds.tencent import CmqJobQueue, NodePlatform, SpotWatcher, credentials, open_queue, parse_queue_url
from trainer.clouds.tencent_api import (ApiError, Credentials, Metadata, RoleCredentials, StaticCredentials,
                                        cmq_signature)
from trainer.errors import UsageError
from trainer.jobs.queue import open_queue as open_any_queue
from trainer.loop.stop import StopNotice
from trainer.loop.storage import open_store
from tests.trainer.gated import wait_for

BUCKET = "gpufleet-test-data-1250000000"


@pytest.fixture
def metadata(monkeypatch):
    with FakeMetadata() as fake:
        monkeypatch.setenv("TENCENTCLOUD_METADATA_ENDPOINT", fake.endpoint)
        monkeypatch.setenv("TENCENTCLOUD_REGION", "ap-shanghai")
        for var in ("TENCENTCLOUD_SECRET_ID", "TENCENTCLOUD_SECRET_KEY", "TENCENTCLOUD_SESSION_TOKEN"):
            monkeypatch.delenv(var, raising=False)
        yield fake


@pytest.fixture
def cmq():
    with FakeCmq() as fake:
        fake.create("jobs-dead")
        fake.create("jobs", visibility_s=30, dead_letter="jobs-dead", max_receives=3)
        yield fake


def queue(cmq, name="jobs", **kw) -> CmqJobQueue:
    return CmqJobQueue(cmq.url(name), credentials_provider=StaticCredentials(KEY), **kw)


# --- credentials and metadata ------------------------------------------------------------------------------

def test_the_role_key_comes_from_the_metadata_service_and_is_fetched_again_before_it_expires(metadata):
    metadata.key_lifetime_s = 200  # less than the refresh margin: every get fetches a fresh key
    provider = credentials({"cloud": "tencent", "tencent": {"role_name": ROLE}})
    assert isinstance(provider, RoleCredentials)
    first = provider.get()
    assert (first.secret_id, first.secret_key, first.token) == (KEY.secret_id, KEY.secret_key, KEY.token)
    assert first.expires_at == pytest.approx(time.time() + 200, abs=5)
    provider.get()
    assert metadata.key_fetches == 2
    metadata.key_lifetime_s = 7200
    provider.get(), provider.get()
    assert metadata.key_fetches == 3  # a key with time left is reused


def test_the_role_is_found_from_the_listing_when_node_json_names_none(metadata):
    assert Metadata().role_credentials().secret_id == KEY.secret_id
    assert "meta-data/cam/security-credentials/" in metadata.gets


def test_an_environment_key_wins_and_without_any_there_is_one_clear_error(monkeypatch):
    monkeypatch.delenv("TENCENTCLOUD_METADATA_ENDPOINT", raising=False)
    monkeypatch.setenv("TENCENTCLOUD_SECRET_ID", "AKIDenv")
    monkeypatch.setenv("TENCENTCLOUD_SECRET_KEY", "envkey")
    assert credentials({}).get() == Credentials("AKIDenv", "envkey", "")
    monkeypatch.delenv("TENCENTCLOUD_SECRET_ID")
    with pytest.raises(UsageError, match="^no Tencent Cloud credentials: set TENCENTCLOUD_SECRET_ID"):
        credentials({})


def test_only_a_tencent_node_or_the_metadata_variable_lets_the_trainer_contact_a_metadata_service(monkeypatch):
    monkeypatch.delenv("TENCENTCLOUD_METADATA_ENDPOINT", raising=False)
    assert node_cloud({}) is None
    assert node_cloud({"cloud": "tencent"}) == "tencent"
    monkeypatch.setenv("TENCENTCLOUD_METADATA_ENDPOINT", "http://127.0.0.1:9")
    assert node_cloud({}) == "tencent"


# --- on the Slurm controller: controller.json, no node.json ------------------------------------------------

CONTROLLER_ROLE = "gpufleet-test-controller"


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """Where this machine's settings files are (none yet), with no key, region or metadata variable set."""
    from trainer.clouds import tencent

    monkeypatch.setattr(tencent, "NODE_JSON", str(tmp_path / "node.json"))
    monkeypatch.setattr(tencent, "CONTROLLER_JSON", str(tmp_path / "controller.json"))
    for var in ("TENCENTCLOUD_SECRET_ID", "TENCENTCLOUD_SECRET_KEY", "TENCENTCLOUD_SESSION_TOKEN",
                "TENCENTCLOUD_METADATA_ENDPOINT", "TENCENTCLOUD_REGION"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path


def _controller_json(machine, region="ap-nanjing"):
    (machine / "controller.json").write_text(json.dumps({
        "cloud": "tencent", "stack": "t", "region": region, "bucket": f"cos://{BUCKET}",
        "tencent": {"app_id": "1250000000", "role_name": CONTROLLER_ROLE,
                    "cos_endpoint": f"https://cos.{region}.myqcloud.com"}}))


def test_on_the_controller_its_settings_give_the_role_and_the_region(machine):
    from trainer.clouds import tencent

    with pytest.raises(UsageError, match="node or the controller of the stack"):
        credentials()
    _controller_json(machine)
    provider = credentials()  # nothing contacted yet: the key is fetched on first use
    assert isinstance(provider, RoleCredentials) and provider.role == CONTROLLER_ROLE
    assert tencent.region_of() == "ap-nanjing"


def test_on_a_node_node_json_wins_over_any_controller_json(machine):
    from trainer.clouds import tencent

    _controller_json(machine)
    (machine / "node.json").write_text(json.dumps({"cloud": "tencent", "region": "ap-shanghai",
                                                   "tencent": {"role_name": ROLE}}))
    assert credentials().role == ROLE and tencent.region_of() == "ap-shanghai"


def test_the_bridge_on_the_controller_reaches_the_queue_with_the_controller_role_key(machine, monkeypatch, cmq):
    """CmqJobQueue as the bridge opens it (no key given): the controller role's key from the metadata service."""
    _controller_json(machine, region="ap-shanghai")
    with FakeMetadata(role=CONTROLLER_ROLE) as fake:
        monkeypatch.setenv("TENCENTCLOUD_METADATA_ENDPOINT", fake.endpoint)
        q = open_queue(cmq.url("jobs"))
        q.send("job")
        assert fake.gets.count(f"meta-data/cam/security-credentials/{CONTROLLER_ROLE}") == 1
    assert cmq.bodies("jobs") == ["job"] and cmq.calls[-1][1]["Token"] == KEY.token


# --- COS through the S3 store ------------------------------------------------------------------------------

def test_cos_store_round_trip_on_the_s3_compatible_endpoint_with_the_role_key(metadata, moto_endpoint):
    boto3.client("s3", region_name="ap-shanghai").create_bucket(
        Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": "ap-shanghai"})
    store = open_store(f"cos://{BUCKET}/runs/r1")
    assert store.uri == f"cos://{BUCKET}/runs/r1/"
    store.write_bytes("step-1.json", b"{}")
    store.write_bytes("step-1/model.pt", b"x" * (17 * 2**20))  # multipart
    assert store.read_bytes("step-1.json") == b"{}"
    assert store.list("step-1") == ["step-1.json", "step-1/model.pt"]
    assert store.exists("step-1/model.pt") and not store.exists("nope")
    with pytest.raises(FileNotFoundError):
        store.read_bytes("nope")
    store.delete("step-1.json")
    assert store.list() == ["step-1/model.pt"]
    signer = store.client._request_signer._credentials.get_frozen_credentials()
    assert (signer.access_key, signer.token) == (KEY.secret_id, KEY.token)
    assert metadata.key_fetches >= 1
    listed = boto3.client("s3", region_name="ap-shanghai").list_objects_v2(Bucket=BUCKET)["Contents"]
    assert [o["Key"] for o in listed] == ["runs/r1/step-1/model.pt"]


def test_cos_uri_without_a_bucket_or_a_region_is_one_line(metadata, monkeypatch):
    with pytest.raises(UsageError, match="missing bucket"):
        open_store("cos:///x")
    monkeypatch.delenv("TENCENTCLOUD_REGION")
    with pytest.raises(UsageError, match="^no Tencent Cloud region: set TENCENTCLOUD_REGION"):
        open_store(f"cos://{BUCKET}/x")


# --- TDMQ CMQ ----------------------------------------------------------------------------------------------

def test_requests_are_signed_and_a_wrong_key_is_refused(cmq):
    q = queue(cmq)
    q.send("job")
    assert cmq.calls[-1][0] == "SendMessage" and cmq.calls[-1][1]["Token"] == KEY.token
    wrong = CmqJobQueue(cmq.url("jobs"), credentials_provider=StaticCredentials(Credentials(KEY.secret_id, "x", KEY.token)))
    with pytest.raises(ApiError) as err:
        wrong.send("job")
    assert err.value.code == 4100


def test_signature_is_the_documented_string_to_sign():
    # POST + host + path + ? + parameters sorted by name, raw values, HMAC-SHA256, base64 (the CMQ signature page).
    params = {"queueName": "q1", "Action": "SendMessage", "msgBody": "a&b=c"}
    text = b"POSTsh.mqadapter.cmq.tencentyun.com/v2/index.php?Action=SendMessage&msgBody=a&b=c&queueName=q1"
    expected = base64.b64encode(hmac.new(b"key", text, hashlib.sha256).digest()).decode()
    assert cmq_signature("key", "POST", "sh.mqadapter.cmq.tencentyun.com", "/v2/index.php", params) == expected


def test_send_receive_delete(cmq):
    q = queue(cmq)
    body = json.dumps({"job_id": "j-1", "args": ["--steps", "10", "--note", "a&b=c<d>'\""]})
    q.send(body)
    msg = q.receive(wait_s=2)
    assert msg.body == body and msg.receive_count == 1
    assert cmq.counts("jobs") == (0, 1) and q.receive(wait_s=0) is None  # hidden from other receivers
    q.delete(msg)
    assert cmq.counts("jobs") == (0, 0)


def test_an_empty_queue_long_polls_then_answers_nothing(cmq):
    q = queue(cmq)
    start = time.monotonic()
    assert q.receive(wait_s=1) is None
    assert time.monotonic() - start >= 0.9


def test_a_received_message_stays_hidden_and_extending_it_changes_nothing(cmq):
    q = queue(cmq)
    q.send("job")
    msg = q.receive(wait_s=1)
    q.extend(msg, 600)  # CMQ has no per-message visibility: hidden for the queue's visibility timeout anyway
    assert q.receive(wait_s=0) is None and cmq.counts("jobs") == (0, 1)


def test_release_hands_the_job_back_at_once_without_counting_a_delivery(cmq):
    q = queue(cmq)
    q.send("job")
    first = q.receive(wait_s=1)
    q.release(first)
    again = q.receive(wait_s=1)
    assert again.body == "job" and again.receive_count == 1 and again.id != first.id
    q.extend(again, 0)  # a zero extension is a release too
    assert q.receive(wait_s=1).receive_count == 1


def test_retry_finds_the_dead_letter_queue_from_the_queue_url_and_removes_only_that_jobs_copy(cmq):
    from trainer.jobs.commands import remove_dead_letter

    q = queue(cmq)
    dlq = q.dead_letters()
    assert (dlq.url, dlq.cmq.credentials) == (cmq.url("jobs-dead"), q.cmq.credentials)  # the same CAM key
    for job in ("a", "b"):
        q.send(json.dumps({"job_id": job}))
        q.dead_letter(q.receive(wait_s=1), "out of retries")
    assert remove_dead_letter(dlq, "a", wait_s=0) == 1
    assert [json.loads(b)["job_id"] for b in cmq.bodies("jobs-dead")] == ["b"]


def test_a_message_whose_receiver_died_comes_back_after_the_visibility_timeout_and_cmq_dead_letters_it(cmq):
    cmq.queues["jobs"].visibility_s = 1
    q = queue(cmq)
    q.send("job")
    for n in (1, 2, 3):
        msg = q.receive(wait_s=3)  # the receiver dies: no delete, no release
        assert msg.receive_count == n
    time.sleep(1.1)
    assert q.receive(wait_s=0) is None
    assert cmq.bodies("jobs-dead") == ["job"]


def test_open_queue_picks_cmq_for_its_endpoints_and_refuses_a_malformed_url(metadata):
    for url in ("http://sh.mqadapter.cmq.tencentyun.com/gpufleet-prod-jobs",
                "https://cmq-sh.public.tencenttdmq.com/gpufleet-prod-jobs"):
        q = open_any_queue(url)
        assert isinstance(q, CmqJobQueue) and q.queue == "gpufleet-prod-jobs"
        assert q.dead_letter_queue == "gpufleet-prod-jobs-dead"
    assert parse_queue_url("http://127.0.0.1:1/jobs") == ("http://127.0.0.1:1", "jobs")
    with pytest.raises(UsageError, match="not a TDMQ CMQ queue URL"):
        open_queue("http://sh.mqadapter.cmq.tencentyun.com/a/b")


# --- spot reclamation and the node platform -----------------------------------------------------------------

def test_the_watcher_turns_the_reclamation_time_into_a_stop_notice(metadata):
    notice = StopNotice()
    watcher = SpotWatcher(notice, interval_s=0.05)
    watcher.start()
    wait_for(lambda: metadata.gets.count("meta-data/spot/termination-time") >= 2, what="two quiet polls")
    assert not notice.is_set()
    when = metadata.reclaim()
    wait_for(notice.is_set, what="the stop notice")
    assert notice.reason == f"spot reclamation at {when} (UTC+8)"
    watcher.join(timeout=5)
    assert not watcher.is_alive()  # done once the notice is set


NODE = {"cloud": "tencent", "region": "ap-shanghai", "tencent": {"role_name": ROLE}}


def test_the_platform_reads_the_instance_type_from_the_metadata_service(metadata):
    assert NodePlatform(NODE).instance_type() == "GN10Xp.2XLARGE40"


def test_the_platform_off_a_node_cannot_tell_its_type(monkeypatch):
    monkeypatch.setenv("TENCENTCLOUD_METADATA_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    assert NodePlatform(NODE).instance_type() is None


def test_an_api_error_and_a_silent_metadata_service_are_one_line_each():
    from trainer import clouds
    from trainer.clouds import tencent
    from trainer.clouds.tencent_api import ApiError, MetadataUnavailable
    from trainer.errors import Fault, UsageError

    denied = clouds.explain(ApiError("UnauthorizedOperation.NoPermission", "the role may not"))
    assert isinstance(denied, UsageError) and "CAM role" in str(denied) and "\n" not in str(denied)
    assert isinstance(clouds.explain(ApiError("InternalError", "try later")), Fault)
    assert isinstance(clouds.explain(MetadataUnavailable("refused")), Fault)
    assert tencent.explain(ValueError("not ours")) is None and clouds.explain(ValueError("not ours")) is None
