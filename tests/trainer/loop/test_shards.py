"""Shards from S3 (moto server over real HTTP): listing, rank/worker split, ranged reads, local cache."""
from __future__ import annotations

import hashlib
import json
import logging

import boto3
import pytest
import torch
from torch.utils.data import DataLoader

from trainer.errors import Fault, UsageError
from trainer.loop.shards import ShardDataset, ShardStream, assign, blocks, parse_s3_uri, write_shards

RECORD = 12  # bytes: 3 int32 values
SHARD_RECORDS = (5, 7, 4, 6, 3)


def shard_values(k: int) -> torch.Tensor:
    first = sum(SHARD_RECORDS[:k]) * 3
    return torch.arange(first, first + SHARD_RECORDS[k] * 3, dtype=torch.int32)


@pytest.fixture
def bucket(moto_endpoint):
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="data", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    for k in range(len(SHARD_RECORDS)):
        s3.put_object(Bucket="data", Key=f"train/shard-{k:03d}.bin", 
                      Body=bytes(shard_values(k).untyped_storage()))
    s3.put_object(Bucket="data", Key="other/ignored.bin", Body=b"x" * RECORD)
    return s3


def every_record() -> list[list[int]]:
    return torch.cat([shard_values(k) for k in range(len(SHARD_RECORDS))]).view(-1, 3).tolist()


CHUNK = 16  # bytes a digest covers: a 32-byte block is two chunks; a 60-byte shard's last block 28 bytes, 1.75 chunks


@pytest.fixture
def written(bucket, tmp_path) -> list[str]:
    """The same records written by write_shards to s3://data/sums/: 5 shards of 5 records (60 bytes), and a
    manifest with the SHA-256 of each 16-byte chunk."""
    source = tmp_path / "records.bin"
    source.write_bytes(b"".join(bytes(shard_values(k).untyped_storage()) for k in range(len(SHARD_RECORDS))))
    return write_shards([str(source)], "s3://data/sums", RECORD, shard_bytes=5 * RECORD, chunk_bytes=CHUNK)


def length_only(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "checked by length only" in r.getMessage()]


def test_pure_helpers():
    assert parse_s3_uri("s3://b/p") == ("b", "p/")
    assert parse_s3_uri("s3://b") == ("b", "")
    with pytest.raises(UsageError, match="not an s3://bucket/prefix URI"):
        parse_s3_uri("/local/path")
    assert assign(10, rank=1, world=4) == [1, 5, 9]
    slots = [assign(10, r, 3) for r in range(3)]
    assert sorted(i for s in slots for i in s) == list(range(10))
    assert list(blocks(0, 10, 8)) == [0, 1] and list(blocks(16, 8, 8)) == [2]


def test_map_style_reads_ranges_and_then_only_the_cache(bucket, tmp_path):
    ds = ShardDataset("s3://data/train", RECORD, torch.int32, cache_dir=tmp_path, block_bytes=40)
    assert len(ds) == sum(SHARD_RECORDS)
    assert [ds[i].tolist() for i in range(len(ds))] == every_record()
    cached = sorted(p.stat().st_size for p in tmp_path.rglob("40-*"))
    # blocks of 40 bytes, the last block of each shard shorter: ranged reads, not whole objects
    assert max(cached) == 40 and len(cached) == sum(-(-n * RECORD // 40) for n in SHARD_RECORDS)
    for k in range(len(SHARD_RECORDS)):
        bucket.delete_object(Bucket="data", Key=f"train/shard-{k:03d}.bin")
    assert [ds[i].tolist() for i in range(len(ds))] == every_record()  # second epoch: cache only
    with pytest.raises(IndexError):
        ds[len(ds)]


def test_a_poisoned_block_or_a_planted_link_in_the_shared_cache_is_not_read_or_followed(bucket, tmp_path):
    """Finding 3 of the isolation review: another job wrote POISONPOISON into the node's shared cache and a training
    read it back; a link planted at a lock file made a reader truncate the link's target."""
    ds = ShardDataset("s3://data/train", RECORD, torch.int32, cache_dir=tmp_path, block_bytes=40)
    assert ds[0].tolist() == every_record()[0]
    (first,) = [p for p in tmp_path.rglob("40-0") if p.stat().st_size == 40][:1]
    first.write_bytes(b"POISONPOISON")
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me")
    lock = first.parent / ".40-1.lock"
    lock.unlink(missing_ok=True)
    lock.symlink_to(victim)
    fresh = ShardDataset("s3://data/train", RECORD, torch.int32, cache_dir=tmp_path, block_bytes=40)
    assert [fresh[i].tolist() for i in range(len(fresh))] == every_record()  # read again from the object
    assert victim.read_bytes() == b"keep me" and not lock.is_symlink()
    assert first.read_bytes() != b"POISONPOISON"


def test_a_cached_block_poisoned_with_bytes_of_its_own_length_is_dropped_and_the_object_read(written, tmp_path,
                                                                                               caplog):
    """Finding 3 as users saw it: another job overwrote a cached block with POISONPOISON... of the block's own
    length, and a training read it back (the cache checked only the length)."""
    manifest = json.loads(boto3.client("s3").get_object(Bucket="data", Key="sums/.shards.json")["Body"].read())
    first = boto3.client("s3").get_object(Bucket="data", Key="sums/shard-00000.bin")["Body"].read()
    assert manifest["chunk_bytes"] == CHUNK and manifest["digests"]["shard-00000.bin"] == {
        "bytes": 60, "sha256": [hashlib.sha256(first[i:i + CHUNK]).hexdigest() for i in range(0, 60, CHUNK)]}
    cache = tmp_path / "cache"
    ds = ShardDataset("s3://data/sums", RECORD, torch.int32, cache_dir=cache, block_bytes=2 * CHUNK)
    assert [ds[i].tolist() for i in range(len(ds))] == every_record()
    poisoned = sorted(cache.rglob("32-1"))  # the last block of each shard, 28 bytes
    assert len(poisoned) == 5 and {p.stat().st_size for p in poisoned} == {28}
    for path in poisoned[1:]:
        path.write_bytes((b"POISON" * 5)[:28])
    with caplog.at_level(logging.WARNING, logger="gpufleet.shards"):
        fresh = ShardDataset("s3://data/sums", RECORD, torch.int32, cache_dir=cache, block_bytes=2 * CHUNK)
        assert [fresh[i].tolist() for i in range(len(fresh))] == every_record()  # the objects' bytes
    dropped = [r.getMessage() for r in caplog.records if "does not hash" in r.getMessage()]
    assert len(dropped) == 4 and all(any(f"data cache: {p} does not hash to the digests of block 1 of s3://data/sums/"
                                         in line for line in dropped) for p in poisoned[1:])
    assert all(p.read_bytes() != (b"POISON" * 5)[:28] and p.stat().st_size == 28 for p in poisoned)  # fetched again
    assert not length_only(caplog)
    for k in range(5):  # from now on, the cache only: it holds the objects' bytes
        boto3.client("s3").delete_object(Bucket="data", Key=f"sums/shard-{k:05d}.bin")
    assert [fresh[i].tolist() for i in range(len(fresh))] == every_record()


def test_shards_without_digests_still_read_and_say_once_that_blocks_are_checked_by_length_only(bucket, tmp_path,
                                                                                               caplog):
    with caplog.at_level(logging.WARNING, logger="gpufleet.shards"):
        ds = ShardDataset("s3://data/train", RECORD, torch.int32, cache_dir=tmp_path, block_bytes=40)
        assert [ds[i].tolist() for i in range(len(ds))] == every_record()
    assert length_only(caplog) == [
        "data cache: s3://data/train/ has no .shards.json, so cached blocks of its shards are checked by length "
        "only; write the shards again with python -m trainer shards to have them checked against digests"]
    caplog.clear()
    old = {"format": 1, "record_bytes": RECORD, "shards": [f"shard-{k:03d}.bin" for k in range(len(SHARD_RECORDS))]}
    bucket.put_object(Bucket="data", Key="train/.shards.json", Body=json.dumps(old).encode())  # written before digests
    with caplog.at_level(logging.WARNING, logger="gpufleet.shards"):
        ds = ShardDataset("s3://data/train", RECORD, torch.int32, cache_dir=tmp_path, block_bytes=40)
        assert [ds[i].tolist() for i in range(len(ds))] == every_record()  # from the cache
        ds = ShardDataset("s3://data/train", RECORD, torch.int32, cache_dir=tmp_path / "new", block_bytes=40)
        assert [ds[i].tolist() for i in range(len(ds))] == every_record()  # from the objects
    assert length_only(caplog) == [
        "data cache: s3://data/train/ has a .shards.json without digests (format 1), so cached blocks of its shards "
        "are checked by length only; write the shards again with python -m trainer shards to have them checked "
        "against digests"] * 2  # once per dataset, not per block


def test_a_shard_rewritten_after_its_manifest_stops_with_one_line(written, tmp_path):
    s3 = boto3.client("s3")
    body = s3.get_object(Bucket="data", Key="sums/shard-00001.bin")["Body"].read()
    s3.put_object(Bucket="data", Key="sums/shard-00001.bin", Body=body[::-1])  # same length, other bytes
    cache = tmp_path / "cache"
    ds = ShardDataset("s3://data/sums", RECORD, torch.int32, cache_dir=cache, block_bytes=2 * CHUNK)
    assert [ds[i].tolist() for i in range(5)] == every_record()[:5]  # shard 0 is as its manifest says
    with pytest.raises(Fault) as told:
        ds[5]
    assert str(told.value) == (
        "shard s3://data/sums/shard-00001.bin changed since its manifest was written: bytes 0-31 do not hash to the "
        "digests in s3://data/sums/.shards.json; write the shards again with python -m trainer shards")
    assert len(list(cache.rglob("32-*"))) == 2  # shard 0's blocks; none of the changed shard's bytes
    s3.put_object(Bucket="data", Key="sums/shard-00002.bin", Body=body + body[:RECORD])  # another length
    with pytest.raises(Fault, match=r"^shard s3://data/sums/shard-00002.bin changed since its manifest was written: "
                                    r"72 bytes, the manifest's digests are of 60; write the shards again with "
                                    r"python -m trainer shards$"):
        ShardDataset("s3://data/sums", RECORD, torch.int32, cache_dir=cache, block_bytes=2 * CHUNK)


def test_blocks_that_do_not_align_with_the_digests_or_digests_that_do_not_cover_a_shard_are_one_line(written,
                                                                                                     tmp_path):
    with pytest.raises(UsageError, match=r"^block_bytes 40: s3://data/sums/ has digests of 16-byte chunks; read it "
                                         r"in blocks of a multiple of 16 bytes$"):
        ShardDataset("s3://data/sums", RECORD, torch.int32, cache_dir=tmp_path, block_bytes=40)
    s3 = boto3.client("s3")
    manifest = json.loads(s3.get_object(Bucket="data", Key="sums/.shards.json")["Body"].read())
    manifest["digests"]["shard-00003.bin"]["sha256"].pop()
    s3.put_object(Bucket="data", Key="sums/.shards.json", Body=json.dumps(manifest).encode())
    with pytest.raises(UsageError, match=r"^s3://data/sums/.shards.json is not a shard manifest \(the digests of "
                                         r"shard-00003.bin do not cover its 60 bytes\); remove it or write the "
                                         r"shards again$"):
        ShardDataset("s3://data/sums", RECORD, torch.int32, cache_dir=tmp_path, block_bytes=32)


def test_stream_splits_shards_across_ranks_and_workers(bucket, tmp_path):
    seen = []
    for rank in range(2):
        ds = ShardStream("s3://data/train/", RECORD, torch.int32, cache_dir=tmp_path, block_bytes=24,
                         rank=rank, world_size=2)
        loader = DataLoader(ds, batch_size=None, num_workers=2)  # same on every rank, as in a real job
        seen += [r.tolist() for r in loader]
    assert sorted(seen) == sorted(every_record())  # each record exactly once


def test_listing_happens_once(bucket, tmp_path):
    ds = ShardDataset("s3://data/train/", RECORD, torch.int32, cache_dir=tmp_path)
    bucket.put_object(Bucket="data", Key="train/shard-999.bin", Body=b"\0" * RECORD)
    assert len(ds) == sum(SHARD_RECORDS)


def test_bad_inputs_are_one_line(bucket, tmp_path):
    with pytest.raises(UsageError, match=r"no shards under s3://data/missing/"):
        ShardDataset("s3://data/missing", RECORD, cache_dir=tmp_path)
    with pytest.raises(UsageError, match=r"s3://data/train/ is not a shard directory \(s3://data/train/shard-000.bin "
                                         r"is not whole 7-byte records\); make shards with python -m trainer shards"):
        ShardDataset("s3://data/train", 7, cache_dir=tmp_path)
