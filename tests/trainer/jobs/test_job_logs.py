"""Job output in the bucket (moto's S3 and a local directory): chunks by size and by time, the final flush,
reading in order, following while a writer appends and after the writer (and its file) are gone."""
from __future__ import annotations

import threading
import time

import boto3
import pytest

from trainer.jobs import logs
from trainer.jobs.logs import LogShipper
from trainer.loop.storage import LocalStore, open_store


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    if request.param == "local":
        return LocalStore(tmp_path / "bucket")
    request.getfixturevalue("moto_endpoint")
    boto3.client("s3").create_bucket(Bucket="ckpt", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    return open_store("s3://ckpt/")


def test_chunks_by_size_in_order_and_the_final_flush(store, tmp_path):
    out = tmp_path / "out.log"
    out.write_bytes(b"".join(b"line %03d\n" % i for i in range(30)))  # 270 bytes
    shipper = LogShipper(store, "j", 1, "node/a", out, chunk_bytes=100)
    assert shipper.ship() == 3  # 100 + 100 + 70
    assert shipper.ship() == 0  # nothing new
    with open(out, "ab") as f:
        f.write(b"tail without newline")
    shipper.close()  # never started: close is the final flush alone
    assert logs.chunks(store, "j", 1) == [f"jobs/j/logs/1/node_a/{i:08d}.log" for i in range(4)]
    data = b"".join(d for _, d in logs.read(store, "j", 1))
    assert data == out.read_bytes()
    assert {node for node, _ in logs.read(store, "j", 1)} == {"node_a"}


def test_chunk_order_is_numeric_per_node(tmp_path):
    store = LocalStore(tmp_path)
    for seq in (10, 9, 100):
        store.write_bytes(logs.chunk_key("j", 2, "b", seq), b"b%d," % seq)
    store.write_bytes(logs.chunk_key("j", 2, "a", 1), b"a1,")
    assert b"".join(d for _, d in logs.read(store, "j", 2)) == b"a1,b9,b10,b100,"
    assert logs.attempts(store, "j") == [2]


def test_follow_while_the_writer_appends_and_after_it_is_gone(store, tmp_path):
    out = tmp_path / "out.log"
    out.write_bytes(b"")
    shipper = LogShipper(store, "j", 1, "n1", out, every_s=0.2, poll_s=0.05).start()
    done = threading.Event()
    lines = [b"step %d\n" % i for i in range(40)]

    def writer():
        with open(out, "ab", buffering=0) as f:
            for line in lines:
                f.write(line)
                time.sleep(0.02)
        shipper.close()
        out.unlink()  # the node is gone: only the bucket has the output
        done.set()

    threading.Thread(target=writer).start()
    got = []
    for attempt, node, data in logs.follow(store, "j", done.is_set, first_attempt=1, poll_s=0.1):
        assert (attempt, node) == (1, "n1")
        got.append(data)
    assert b"".join(got) == b"".join(lines)
    assert len(got) > 1  # it came in pieces while the writer ran, not at the end alone
    # Later, with the node long gone, the whole output is still there.
    assert b"".join(d for _, d in logs.read(store, "j", 1)) == b"".join(lines)


def test_follow_goes_on_to_the_next_attempt(tmp_path):
    store = LocalStore(tmp_path)
    store.write_bytes(logs.chunk_key("j", 1, "n1", 0), b"first attempt\n")
    state = {"finished": False, "looks": 0}

    def finished():
        state["looks"] += 1
        if state["looks"] == 2:  # a preemption: the second attempt starts on another node, then ends
            store.write_bytes(logs.chunk_key("j", 2, "n2", 0), b"second attempt\n")
            return True
        return False

    got = list(logs.follow(store, "j", finished, poll_s=0))
    assert got == [(1, "n1", b"first attempt\n"), (2, "n2", b"second attempt\n")]
