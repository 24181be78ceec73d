"""Training data from object storage: the shards under ``s3://bucket/prefix``.

A shard is a flat file of fixed-size records (``record_bytes`` each, e.g. token windows). The
prefix is listed once, when the dataset is built; reads are ranged GETs of ``block_bytes``
blocks, kept in a local cache directory (the node's scratch disk) so a second epoch reads no
object storage. ``ShardDataset`` is map-style (any sampler); ``ShardStream`` is iterable and
splits whole shards across ranks and DataLoader workers.
"""
from __future__ import annotations

import bisect
import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from trainer.errors import UsageError

DEFAULT_BLOCK_BYTES = 8 << 20


@dataclass(frozen=True)
class Shard:
    key: str
    size: int
    etag: str


def parse_s3_uri(uri: str) -> tuple[str, str]:
    u = urlparse(uri)
    if u.scheme != "s3" or not u.netloc:
        raise UsageError(f"--data: {uri!r} is not an s3://bucket/prefix URI")
    prefix = u.path.lstrip("/")
    return u.netloc, prefix if not prefix or prefix.endswith("/") else prefix + "/"


def assign(n_shards: int, rank: int, world: int, worker: int, workers: int) -> list[int]:
    """The shard indices one DataLoader worker of one rank reads: round-robin over rank x worker."""
    slot, slots = rank * workers + worker, world * workers
    return list(range(slot, n_shards, slots))


def blocks(offset: int, length: int, block_bytes: int) -> range:
    """Indices of the blocks that hold bytes [offset, offset + length)."""
    return range(offset // block_bytes, (offset + length - 1) // block_bytes + 1)


class _Source:
    """Listing plus cached ranged reads of one bucket prefix; picklable (the client is made per process)."""

    def __init__(self, uri: str, cache_dir: str | os.PathLike | None, block_bytes: int):
        self.bucket, self.prefix = parse_s3_uri(uri)
        self.block_bytes = block_bytes
        self.cache_dir = Path(cache_dir or tempfile.gettempdir()) / "shards"
        self._client = None
        self._pid = None
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix)
        self.shards = [Shard(o["Key"], o["Size"], o["ETag"].strip('"'))
                       for page in pages for o in page.get("Contents", []) if o["Size"] > 0]
        self.shards.sort(key=lambda s: s.key)
        if not self.shards:
            raise UsageError(f"--data: no shards under s3://{self.bucket}/{self.prefix}")

    @property
    def client(self):
        if self._client is None or self._pid != os.getpid():  # boto3 clients do not survive fork
            import boto3

            self._client, self._pid = boto3.client("s3"), os.getpid()
        return self._client

    def __getstate__(self):
        return {**self.__dict__, "_client": None, "_pid": None}

    def _block(self, shard: Shard, index: int) -> bytes:
        # The ETag in the name: a rewritten object never serves stale cached bytes.
        name = hashlib.sha256(f"{self.bucket}/{shard.key}/{shard.etag}".encode()).hexdigest()[:32]
        path = self.cache_dir / name / f"{self.block_bytes}-{index}"
        if path.exists():
            return path.read_bytes()
        start = index * self.block_bytes
        end = min(start + self.block_bytes, shard.size) - 1
        data = self.client.get_object(Bucket=self.bucket, Key=shard.key, Range=f"bytes={start}-{end}",
                                      IfMatch=shard.etag)["Body"].read()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)  # atomic: concurrent workers never see half a block
        return data

    def read(self, shard: Shard, offset: int, length: int) -> bytes:
        parts = [self._block(shard, i) for i in blocks(offset, length, self.block_bytes)]
        skip = offset % self.block_bytes
        return b"".join(parts)[skip:skip + length]


def _records(source: _Source, record_bytes: int) -> list[int]:
    for s in source.shards:
        if s.size % record_bytes:
            raise UsageError(f"--data: shard s3://{source.bucket}/{s.key} has {s.size} bytes, "
                             f"not a multiple of the record size {record_bytes}")
    return [s.size // record_bytes for s in source.shards]


def _tensor(data: bytes, dtype: torch.dtype) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=dtype)


class ShardDataset(Dataset):
    """Map-style: record i of the concatenated shards, as a 1-D tensor of ``dtype``."""

    def __init__(self, uri: str, record_bytes: int, dtype: torch.dtype = torch.uint8,
                 cache_dir: str | os.PathLike | None = None, block_bytes: int = DEFAULT_BLOCK_BYTES):
        self.source = _Source(uri, cache_dir, block_bytes)
        self.record_bytes, self.dtype = record_bytes, dtype
        counts = _records(self.source, record_bytes)
        self.starts = [sum(counts[:i]) for i in range(len(counts))]
        self.total = sum(counts)

    def __len__(self) -> int:
        return self.total

    def __getitem__(self, i: int) -> torch.Tensor:
        if not 0 <= i < self.total:
            raise IndexError(i)
        s = bisect.bisect_right(self.starts, i) - 1
        offset = (i - self.starts[s]) * self.record_bytes
        return _tensor(self.source.read(self.source.shards[s], offset, self.record_bytes), self.dtype)


class ShardStream(IterableDataset):
    """Iterable: each (rank, worker) streams its own whole shards, block by block, in key order."""

    def __init__(self, uri: str, record_bytes: int, dtype: torch.dtype = torch.uint8,
                 cache_dir: str | os.PathLike | None = None, block_bytes: int = DEFAULT_BLOCK_BYTES,
                 rank: int | None = None, world_size: int | None = None):
        self.source = _Source(uri, cache_dir, block_bytes)
        self.record_bytes, self.dtype = record_bytes, dtype
        _records(self.source, record_bytes)
        dist = torch.distributed
        on = dist.is_available() and dist.is_initialized()
        self.rank = rank if rank is not None else (dist.get_rank() if on else int(os.environ.get("RANK", 0)))
        self.world_size = world_size if world_size is not None else (
            dist.get_world_size() if on else int(os.environ.get("WORLD_SIZE", 1)))

    def my_shards(self) -> list[Shard]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        return [self.source.shards[i] for i in
                assign(len(self.source.shards), self.rank, self.world_size, worker, workers)]

    def __iter__(self):
        per_block = max(1, self.source.block_bytes // self.record_bytes)
        for shard in self.my_shards():
            n = shard.size // self.record_bytes
            for first in range(0, n, per_block):
                count = min(per_block, n - first)
                data = self.source.read(shard, first * self.record_bytes, count * self.record_bytes)
                for j in range(count):
                    yield _tensor(data[j * self.record_bytes:(j + 1) * self.record_bytes], self.dtype)
