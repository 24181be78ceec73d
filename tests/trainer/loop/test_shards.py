"""Shards from S3 (moto server over real HTTP): listing, rank/worker split, ranged reads, local cache."""
from __future__ import annotations

import boto3
import pytest
import torch
from torch.utils.data import DataLoader

from trainer.errors import UsageError
from trainer.loop.shards import ShardDataset, ShardStream, assign, blocks, parse_s3_uri

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
