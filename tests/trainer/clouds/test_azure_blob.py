"""Checkpoints on Azure Blob Storage, against Azurite over real HTTP on loopback."""
from __future__ import annotations

import hashlib
import os
import uuid

import pytest

from tests.trainer.azurite import ACCOUNT, Azurite
from trainer.clouds.azure import AzureBlobStore, parse_uri
from trainer.errors import UsageError
from trainer.loop.storage import open_store

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def azurite():
    with Azurite() as az:
        from azure.storage.blob import BlobServiceClient

        BlobServiceClient.from_connection_string(az.connection_string).create_container("checkpoints")
        yield az


@pytest.fixture
def env(azurite, monkeypatch):
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite.connection_string)
    monkeypatch.delenv("AZURE_STORAGE_ACCOUNT", raising=False)
    return azurite


def _job() -> str:
    return f"jobs/{uuid.uuid4().hex[:8]}"


def test_bytes_round_trip_list_exists_delete(env):
    store = open_store(f"az://checkpoints/{_job()}")
    assert isinstance(store, AzureBlobStore) and store.list() == []
    store.write_bytes("step-1/model", b"weights-1")
    store.write_bytes("step-1.json", b"{}")
    store.write_bytes("step-2/model", b"weights-2")
    assert store.read_bytes("step-1/model") == b"weights-1"
    assert store.list() == ["step-1.json", "step-1/model", "step-2/model"]
    assert store.list("step-1/") == ["step-1/model"]
    assert store.exists("step-1.json") and not store.exists("step-3.json")
    store.write_bytes("step-1/model", b"overwritten")
    assert store.read_bytes("step-1/model") == b"overwritten"
    store.delete("step-1/model")
    store.delete("step-1/model")  # a missing key is not an error
    assert store.list() == ["step-1.json", "step-2/model"]


def test_missing_key_is_file_not_found_and_leaves_no_file(env, tmp_path):
    store = open_store(f"az://checkpoints/{_job()}")
    with pytest.raises(FileNotFoundError):
        store.read_bytes("nope")
    target = tmp_path / "nope"
    with pytest.raises(FileNotFoundError):
        store.download_file("nope", target)
    assert not target.exists()


def test_large_file_goes_up_in_blocks_and_comes_back_whole(env, tmp_path):
    src = tmp_path / "shard.bin"
    src.write_bytes(os.urandom(20 * 1024 * 1024 + 123))  # above the 16 MiB single-put limit
    store = open_store(f"az://checkpoints/{_job()}")
    store.upload_file("shard.bin", src)
    out = tmp_path / "back.bin"
    store.download_file("shard.bin", out)
    assert hashlib.sha256(out.read_bytes()).digest() == hashlib.sha256(src.read_bytes()).digest()


def test_https_url_and_az_uri_address_the_same_blobs_and_prefixes_isolate(env):
    job = _job()
    https = open_store(f"https://{ACCOUNT}.blob.core.windows.net/checkpoints/{job}/")
    https.write_bytes("a", b"1")
    assert open_store(f"az://checkpoints/{job}").read_bytes("a") == b"1"
    assert open_store(f"az://checkpoints/{job}-other").list() == []
    assert https.uri == f"https://{ACCOUNT}.blob.core.windows.net/checkpoints/{job}/"


def test_checkpointer_commits_prunes_and_resumes_from_blob(env):
    from trainer.loop.checkpoint import Checkpointer

    ckpt = Checkpointer(open_store(f"az://checkpoints/{_job()}"), keep=2)
    for step in (1, 2, 3):
        ckpt.save(step, {"model": f"model-{step}".encode(), "optim": b"o" * step})
    assert ckpt.steps() == [3, 2]  # newest first
    step, parts = ckpt.load_latest()
    assert step == 3 and parts == {"model": b"model-3", "optim": b"ooo"}


@pytest.mark.parametrize("uri, message", [
    ("az://", "missing container"),
    ("https://acc.blob.core.windows.net/", "missing container"),
    ("https://example.com/c/p", "expected az://container/prefix"),
])
def test_bad_uri_is_one_usage_line(uri, message):
    with pytest.raises(UsageError, match=message) as err:
        parse_uri(uri)
    assert "\n" not in str(err.value)


def test_az_uri_without_an_account_says_which_variable(monkeypatch):
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING", raising=False)
    monkeypatch.delenv("AZURE_STORAGE_ACCOUNT", raising=False)
    with pytest.raises(UsageError, match="AZURE_STORAGE_ACCOUNT"):
        open_store("az://checkpoints/x")


def test_sharded_checkpoints_resume_exactly_from_blob(env, tmp_path, monkeypatch):
    """DCP shards through the trainer's writer over the Blob store: stop, resume, the same losses bitwise."""
    import json

    import tests.trainer.trainer_hooks as hooks
    from trainer import EXIT_OK, EXIT_PREEMPTED
    from trainer.__main__ import main
    from trainer.loop.checkpoint import SHARDED_FORMAT, Checkpointer

    uri = f"az://checkpoints/{_job()}"
    args = ["--model", "gpt-tiny", "--steps", "6", "--batch-size", "2", "--dropout", "0.1", "--parallel", "fsdp",
            "--checkpoint-every", "2", "--dataset", "tests.trainer.trainer_hooks:signalling_text"]
    whole = tmp_path / "whole.jsonl"
    assert main(["train", *args, "--checkpoint-uri", str(tmp_path / "local"), "--metrics-file", str(whole)]) == EXIT_OK
    metrics = tmp_path / "m.jsonl"
    monkeypatch.setattr(hooks, "SIGTERM_AT_FETCH", 7)  # in step 4, a checkpoint step: its checkpoint stands
    assert main(["train", *args, "--checkpoint-uri", uri, "--metrics-file", str(metrics)]) == EXIT_PREEMPTED
    checkpoints = Checkpointer(open_store(uri), 3)
    assert checkpoints.steps() == [4, 2] and checkpoints.manifest(4)["format"] == SHARDED_FORMAT
    assert "step-000000004/__0_0.distcp" in checkpoints.store.list("step-000000004/")
    assert main(["train", *args, "--checkpoint-uri", uri, "--metrics-file", str(metrics)]) == EXIT_OK

    def losses(path):
        return [json.loads(line)["loss"] for line in path.read_text().splitlines()]

    assert losses(metrics) == losses(whole)


def test_code_bundles_go_to_the_checkpoints_container_once(env, tmp_path):
    from trainer.jobs import bundle
    from trainer.jobs.layout import team_base

    work = tmp_path / "proj"
    work.mkdir()
    (work / "train.py").write_text(f"print({uuid.uuid4().hex!r})\n")
    packed = bundle.pack(work)
    uri, sent = bundle.upload(packed, team_base("az://checkpoints", "nlp"))
    assert (uri, sent) == (f"az://checkpoints/teams/nlp/code/{packed.sha256}.tar.gz", True)
    assert bundle.upload(bundle.pack(work), team_base("az://checkpoints", "nlp")) == (uri, False)
    unpacked = bundle.unpack(bundle.fetch(uri, tmp_path / "cache"), tmp_path / "code")
    assert (unpacked / "train.py").read_text() == (work / "train.py").read_text()
