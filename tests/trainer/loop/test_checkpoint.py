"""Checkpoint commit protocol, retention and verification, locally and on S3 (moto server)."""
from __future__ import annotations

import hashlib
import json
import logging

import boto3
import pytest

from tests.trainer.trainer_hooks import one_torch_thread  # noqa: F401 (autouse fixture)
from trainer import EXIT_OK
from trainer.__main__ import main
from trainer.loop.checkpoint import Checkpointer, CorruptCheckpoint, NoValidCheckpoint
from trainer.loop.storage import LocalStore, open_store


class RecordingStore(LocalStore):
    def __init__(self, root):
        super().__init__(root)
        self.writes: list[str] = []

    def write_bytes(self, key, data):
        self.writes.append(key)
        super().write_bytes(key, data)


def test_parts_first_manifest_last_and_round_trip(tmp_path):
    store = RecordingStore(tmp_path)
    state = {"a.pt": b"A" * 10, "b.pt": b"B"}
    Checkpointer(store, keep=2).save(7, state)
    assert sorted(store.writes[:-1]) == ["step-000000007/a.pt", "step-000000007/b.pt"]
    assert store.writes[-1] == "step-000000007.json"  # the commit comes last
    manifest = json.loads(store.read_bytes("step-000000007.json"))
    assert manifest["step"] == 7
    assert manifest["parts"]["a.pt"] == {"bytes": 10, "sha256": hashlib.sha256(b"A" * 10).hexdigest()}
    assert Checkpointer(store, keep=2).load_latest() == (7, state)


def test_parts_without_a_manifest_are_not_a_checkpoint(tmp_path):
    store = LocalStore(tmp_path)
    ckpt = Checkpointer(store, keep=3)
    ckpt.save(1, {"a.pt": b"one"})
    store.write_bytes("step-000000002/a.pt", b"half-written save, crashed before its manifest")
    assert ckpt.steps() == [1]
    assert ckpt.load_latest() == (1, {"a.pt": b"one"})
    ckpt.save(3, {"a.pt": b"three"})  # the orphan parts of step 2 go with the next prune
    assert not store.exists("step-000000002/a.pt")


def test_only_the_newest_k_are_kept(tmp_path):
    store = LocalStore(tmp_path)
    ckpt = Checkpointer(store, keep=2)
    for step in (10, 20, 30, 40):
        ckpt.save(step, {"a.pt": str(step).encode()})
    assert ckpt.steps() == [40, 30]
    assert store.list() == ["step-000000030.json", "step-000000030/a.pt", "step-000000040.json", "step-000000040/a.pt"]


@pytest.mark.parametrize("damage", ["flip a byte", "truncate", "delete part", "bad manifest"])
def test_corrupt_newest_falls_back_to_the_previous_with_a_warning(tmp_path, caplog, damage):
    store = LocalStore(tmp_path)
    ckpt = Checkpointer(store, keep=3)
    ckpt.save(1, {"a.pt": b"first"})
    ckpt.save(2, {"a.pt": b"second"})
    if damage == "flip a byte":
        data = bytearray(store.read_bytes("step-000000002/a.pt"))
        data[len(data) // 2] ^= 1
        store.write_bytes("step-000000002/a.pt", bytes(data))
    elif damage == "truncate":
        store.write_bytes("step-000000002/a.pt", store.read_bytes("step-000000002/a.pt")[:-5])
    elif damage == "delete part":
        store.delete("step-000000002/a.pt")
    else:
        store.write_bytes("step-000000002.json", b"{not json")
    with pytest.raises(CorruptCheckpoint):
        ckpt.load(2)
    with caplog.at_level(logging.WARNING, logger="trainer"):
        assert ckpt.load_latest() == (1, {"a.pt": b"first"})
    assert "step-000000002 is corrupt" in caplog.text


def test_no_checkpoint_means_a_fresh_start_and_only_corrupt_ones_are_refused(tmp_path):
    store = LocalStore(tmp_path)
    assert Checkpointer(store, keep=3).load_latest() is None
    Checkpointer(store, keep=3).save(1, {"a.pt": b"x"})
    store.write_bytes("step-000000001/a.pt", b"y")
    with pytest.raises(NoValidCheckpoint, match="every checkpoint at .* is corrupt \\(steps 1\\)"):
        Checkpointer(store, keep=3).load_latest()


@pytest.mark.slow
def test_training_on_s3_resumes_past_a_corrupt_newest_checkpoint(moto_endpoint, tmp_path, caplog):
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="fleet", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    uri = "s3://fleet/jobs/j-1/"
    args = ["train", "--model", "gpt-tiny", "--batch-size", "4", "--steps", "6", "--checkpoint-every", "2",
            "--checkpoint-uri", uri]
    assert main([*args, "--metrics-file", str(tmp_path / "first.jsonl")]) == EXIT_OK
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket="fleet")["Contents"])
    assert "jobs/j-1/step-000000006.json" in keys and "jobs/j-1/step-000000006/model.pt" in keys
    assert Checkpointer(open_store(uri), 3).steps() == [6, 4, 2]

    s3.put_object(Bucket="fleet", Key="jobs/j-1/step-000000006/model.pt", Body=b"garbage")
    with caplog.at_level(logging.INFO, logger="trainer"):
        assert main([*args, "--metrics-file", str(tmp_path / "second.jsonl")]) == EXIT_OK
    assert "step-000000006 is corrupt" in caplog.text
    assert "resuming from the checkpoint of step 4" in caplog.text
    first = [json.loads(line) for line in (tmp_path / "first.jsonl").read_text().splitlines()]
    second = [json.loads(line) for line in (tmp_path / "second.jsonl").read_text().splitlines()]
    assert [r["step"] for r in second] == [5, 6]
    assert [r["loss"] for r in second] == [r["loss"] for r in first[4:]]  # bitwise the same steps again
    assert Checkpointer(open_store(uri), 3).load(6)  # rewritten, valid again
