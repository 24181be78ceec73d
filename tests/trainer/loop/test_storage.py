"""The Store API on local directories and on S3 (moto server over real HTTP)."""
from __future__ import annotations

import boto3
import pytest
from boto3.s3.transfer import TransferConfig

from trainer.errors import UsageError
from trainer.clouds.s3store import S3Store
from trainer.loop.storage import LocalStore, open_store


@pytest.fixture
def bucket(moto_endpoint):
    boto3.client("s3").create_bucket(Bucket="ckpt", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    return "ckpt"


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    if request.param == "local":
        return open_store(str(tmp_path / "root"))
    request.getfixturevalue("bucket")
    return open_store("s3://ckpt/jobs/j1")


def test_store_contract(store, tmp_path):
    assert store.list() == [] and not store.exists("a/b.bin")
    store.write_bytes("a/b.bin", b"hello")
    store.write_bytes("a/c.bin", b"")
    store.write_bytes("z.json", b"{}")
    assert store.read_bytes("a/b.bin") == b"hello" and store.read_bytes("a/c.bin") == b""
    assert store.exists("a/b.bin")
    assert store.list() == ["a/b.bin", "a/c.bin", "z.json"]
    assert store.list("a/") == ["a/b.bin", "a/c.bin"]
    src = tmp_path / "src.bin"
    src.write_bytes(b"x" * 1000)
    store.upload_file("f/src.bin", src)
    store.download_file("f/src.bin", tmp_path / "back.bin")
    assert (tmp_path / "back.bin").read_bytes() == b"x" * 1000
    store.write_bytes("a/b.bin", b"replaced")
    assert store.read_bytes("a/b.bin") == b"replaced"
    store.delete("a/b.bin")
    store.delete("a/never-written")  # not an error
    assert store.list("a/") == ["a/c.bin"]
    with pytest.raises(FileNotFoundError):
        store.read_bytes("a/b.bin")
    with pytest.raises(FileNotFoundError):
        store.download_file("nope", tmp_path / "nope")


def test_s3_keys_live_under_the_uri_prefix(bucket):
    open_store("s3://ckpt/jobs/j1/").write_bytes("step.json", b"1")
    open_store("s3://ckpt/jobs/j2").write_bytes("step.json", b"2")
    keys = [o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket="ckpt")["Contents"]]
    assert sorted(keys) == ["jobs/j1/step.json", "jobs/j2/step.json"]
    assert open_store("s3://ckpt/jobs/j1").list() == ["step.json"]


def test_s3_multipart_round_trip(bucket):
    store = open_store("s3://ckpt/big")
    store.transfer = TransferConfig(multipart_threshold=5 * 2**20, multipart_chunksize=5 * 2**20, max_concurrency=4)
    data = bytes(range(256)) * (11 * 2**20 // 256)
    store.write_bytes("blob", data)
    head = boto3.client("s3").head_object(Bucket="ckpt", Key="big/blob")
    assert head["ETag"].strip('"').endswith("-3")  # three parts
    assert store.read_bytes("blob") == data


def test_s3_client_retries_and_endpoint(bucket, moto_endpoint):
    store = open_store("s3://ckpt")
    assert isinstance(store, S3Store)
    assert store.client.meta.config.retries == {"mode": "standard", "total_max_attempts": 10}
    assert store.client.meta.endpoint_url == moto_endpoint  # AWS_ENDPOINT_URL, honoured by boto3 itself


def test_local_store_keys_cannot_escape(tmp_path):
    store = LocalStore(tmp_path / "root")
    with pytest.raises(ValueError):
        store.write_bytes("../outside", b"x")


def test_local_delete_prunes_empty_directories(tmp_path):
    store = LocalStore(tmp_path / "root")
    store.write_bytes("a/b/c.bin", b"x")
    store.delete("a/b/c.bin")
    assert list((tmp_path / "root").iterdir()) == []


@pytest.mark.parametrize("uri,kind", [("ck", LocalStore), ("file:///tmp/ck", LocalStore), ("s3://b/p", S3Store)])
def test_open_store_schemes(uri, kind):
    assert isinstance(open_store(uri), kind)


@pytest.mark.parametrize("uri,message", [
    ("gs://bucket/x", "unsupported scheme 'gs'"),
    ("s3:///prefix", "missing bucket"),
])
def test_open_store_rejects(uri, message):
    with pytest.raises(UsageError, match=message):
        open_store(uri)
