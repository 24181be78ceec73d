"""Training data in shards: the files under ``s3://bucket/prefix`` or in a local directory.

A shard is a flat file of fixed-size records (``record_bytes`` each, e.g. token windows). The
location is listed once, when the dataset is built. S3 reads are ranged GETs of ``block_bytes``
blocks (of the object as listed: its ETag is sent with each GET), kept in a local cache directory (the
node's scratch disk) so a second epoch reads no object storage. The cache keeps to CACHE_SHARE of its
disk (what it holds plus what was free when a process first wrote to it), dropping the least recently
used blocks; a full disk drops more and tries again, then stops with one line; blocks half-written by a
killed process are removed. ``ShardDataset`` is map-style (any sampler); ``ShardStream`` is iterable:
each rank reads its own whole shards, and DataLoader workers take its batches in turn.

The cache is shared by the node's jobs, so nothing read from it is trusted: a cached block is named by
the bucket, key and ETag listed when the dataset was built, must be a plain file (never a link) of the
block's length, and, when the location's manifest has digests, its CHUNK_BYTES chunks must hash (SHA-256)
to the manifest's, read from object storage when the dataset was built. A block that does not is logged,
dropped and read again from the object; bytes from the object that do not match their digests stop the
run (Fault: the shard changed since its manifest was written). A manifest without digests (written
before format 2), or none, leaves the length check only, said once in the log. Local directories are read
in place, uncached and unchecked.

``python -m trainer shards --out LOCATION --record-bytes N SOURCE...`` writes shards from text
files or directories (``write_shards``), and beside them ``.shards.json``: {"format": 2, "record_bytes",
"shards": [key, ...], "chunk_bytes", "digests": {key: {"bytes", "sha256": [hex digest of each chunk]}}}.
A location holds shards of one record size, and a reader refuses another size in one line.
"""
from __future__ import annotations

import bisect
import errno
import fcntl
import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator
from urllib.parse import urlparse

import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from trainer.errors import ArgumentParser, Fault, UsageError
from trainer.loop.storage import local_path, open_store, store_cloud

log = logging.getLogger("gpufleet.shards")

DEFAULT_BLOCK_BYTES = 8 << 20
CACHE_SHARE = 0.8  # of the cache disk's room (free + cached) the data cache may fill
DEFAULT_SHARD_BYTES = 64 << 20
CHUNK_BYTES = 1 << 20  # a digest per MiB of a shard: blocks of any multiple of it are checked whole
DIGEST = hashlib.sha256
MANIFEST = ".shards.json"
MANIFEST_FORMAT = 2  # 1: no digests
MAKE_SHARDS = "python -m trainer shards --out LOCATION --record-bytes {n} SOURCE..."


def read_manifest(data: bytes | None, where: str) -> dict | None:
    """The checked .shards.json of a location, or None when it has none."""
    if data is None:
        return None
    try:
        manifest = json.loads(data)
        if not isinstance(manifest, dict) or not isinstance(manifest.get("record_bytes"), int):
            raise ValueError("no integer record_bytes")
    except ValueError as exc:
        raise UsageError(f"{where}/{MANIFEST} is not a shard manifest ({exc}); remove it or write the shards "
                         "again") from None
    return manifest


def chunk_digests(data: bytes, chunk_bytes: int) -> list[str]:
    """Hex SHA-256 of each ``chunk_bytes`` chunk of ``data`` (the last one may be shorter)."""
    view = memoryview(data)
    return [DIGEST(view[i:i + chunk_bytes]).hexdigest() for i in range(0, len(data), chunk_bytes)]


def manifest_digests(manifest: dict | None, where: str) -> tuple[int, dict[str, tuple[int, bytes]]] | None:
    """(chunk_bytes, {key: (bytes, the chunks' digests concatenated)}) of a manifest, None when it has none."""
    if manifest is None or "digests" not in manifest:
        return None
    try:
        chunk, entries = manifest.get("chunk_bytes"), manifest["digests"]
        if not isinstance(chunk, int) or chunk < 1 or not isinstance(entries, dict):
            raise ValueError("no positive integer chunk_bytes, or digests not an object")
        digests = {}
        for key, entry in entries.items():
            size, sums = entry["bytes"], bytes.fromhex("".join(entry["sha256"]))
            if not isinstance(size, int) or len(sums) != -(-size // chunk) * DIGEST().digest_size:
                raise ValueError(f"the digests of {key} do not cover its {size!r} bytes")
            digests[key] = (size, sums)
    except (ValueError, TypeError, KeyError) as exc:
        why = f"a digests entry has no {exc}" if isinstance(exc, KeyError) else exc
        raise UsageError(f"{where}/{MANIFEST} is not a shard manifest ({why}); remove it or write the shards "
                         "again") from None
    return chunk, digests


@dataclass(frozen=True)
class Shard:
    key: str
    size: int
    etag: str


def parse_s3_uri(uri: str) -> tuple[str, str]:
    u = urlparse(uri)
    if u.scheme != "s3" or not u.netloc:
        raise UsageError(f"--dataset: {uri!r} is not an s3://bucket/prefix URI")
    prefix = u.path.lstrip("/")
    return u.netloc, prefix if not prefix or prefix.endswith("/") else prefix + "/"


def assign(n_shards: int, rank: int, world: int) -> list[int]:
    """The shard indices one rank reads: round-robin in key order."""
    return list(range(rank, n_shards, world))


def blocks(offset: int, length: int, block_bytes: int) -> range:
    """Indices of the blocks that hold bytes [offset, offset + length)."""
    return range(offset // block_bytes, (offset + length - 1) // block_bytes + 1)


class _S3Source:
    """Listing plus cached ranged reads of one bucket prefix; picklable (the client is made per process)."""

    def __init__(self, uri: str, cache_dir: str | os.PathLike | None, block_bytes: int):
        from botocore.exceptions import ClientError  # lazy: AWS SDK (~0.2 s) only when used

        self.bucket, self.prefix = parse_s3_uri(uri)
        self.uri = f"s3://{self.bucket}/{self.prefix}"
        self.block_bytes = block_bytes
        self.cache_dir = Path(cache_dir or tempfile.gettempdir()) / "shards"
        self._client = None
        self._pid = None
        self._recent: dict[tuple[str, int], bytes] = {}
        self._used: int | None = None  # this process's tally of the cache's bytes (None: not yet walked)
        self._limit: int | None = None
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix)
        try:
            self.shards = [Shard(o["Key"], o["Size"], o["ETag"].strip('"'))
                           for page in pages for o in page.get("Contents", [])
                           if o["Size"] > 0 and not o["Key"].rsplit("/", 1)[-1].startswith(".")]
            try:
                data = self.client.get_object(Bucket=self.bucket, Key=self.prefix + MANIFEST)["Body"].read()
            except self.client.exceptions.NoSuchKey:
                data = None
        except ClientError as exc:
            raise UsageError(f"--dataset: cannot list {self.uri}: {exc.response['Error']['Code']}") from None
        self.manifest = read_manifest(data, self.uri.rstrip("/"))
        self.shards.sort(key=lambda s: s.key)
        self._check_digests()

    def _check_digests(self) -> None:
        """Keep the manifest's digests of the listed shards (read from the bucket now, never from the cache);
        say once when cached blocks can be checked by length only."""
        self.chunk_bytes, self.digests = 0, {}
        found = manifest_digests(self.manifest, self.uri.rstrip("/"))
        if found is None:
            log.warning("data cache: %s %s, so cached blocks of its shards are checked by length only; write "
                        "the shards again with python -m trainer shards to have them checked against digests",
                        self.uri, f"has no {MANIFEST}" if self.manifest is None else
                        f"has a {MANIFEST} without digests (format {self.manifest.get('format', 1)})")
            return
        self.chunk_bytes, digests = found
        if self.block_bytes % self.chunk_bytes:
            raise UsageError(f"block_bytes {self.block_bytes}: {self.uri} has digests of {self.chunk_bytes}-byte "
                             f"chunks; read it in blocks of a multiple of {self.chunk_bytes} bytes")
        unlisted = []
        for shard in self.shards:
            size, sums = digests.get(shard.key[len(self.prefix):], (None, b""))
            if size is None:
                unlisted.append(self.name(shard))
            elif size != shard.size:
                raise Fault(f"shard {self.name(shard)} changed since its manifest was written: {shard.size} bytes, "
                            f"the manifest's digests are of {size}; write the shards again with python -m trainer "
                            "shards")
            else:
                self.digests[shard.key] = sums
        if unlisted:
            log.warning("data cache: %d shards under %s are not in its %s (%s), so their cached blocks are checked "
                        "by length only", len(unlisted), self.uri, MANIFEST, " ".join(unlisted[:3])
                        + (" ..." if len(unlisted) > 3 else ""))

    def _matches(self, shard: Shard, index: int, data: bytes) -> bool:
        """Whether block ``index`` of ``shard`` hashes to the manifest's digests (True when it has none)."""
        sums = self.digests.get(shard.key)
        if sums is None:
            return True
        if len(data) != min(self.block_bytes, shard.size - index * self.block_bytes):
            return False
        size = DIGEST().digest_size
        first = index * (self.block_bytes // self.chunk_bytes)
        view = memoryview(data)
        for k, i in enumerate(range(0, len(data), self.chunk_bytes), start=first):
            if DIGEST(view[i:i + self.chunk_bytes]).digest() != sums[k * size:(k + 1) * size]:
                return False
        return True

    def _verified(self, path: Path, shard: Shard, index: int, data: bytes | None) -> bytes | None:
        """A cached block that hashes to its digests; None (and the entry removed) for one that does not."""
        if data is None or self._matches(shard, index, data):
            return data
        log.warning("data cache: %s does not hash to the digests of block %d of %s in its manifest (another "
                    "process rewrote it); dropped, read again from the object", path, index, self.name(shard))
        path.unlink(missing_ok=True)
        return None

    def name(self, shard: Shard) -> str:
        return f"s3://{self.bucket}/{shard.key}"

    @property
    def client(self):
        if self._client is None or self._pid != os.getpid():  # boto3 clients do not survive fork
            import boto3  # lazy: AWS SDK (~0.2 s) only when used

            self._client, self._pid = boto3.client("s3"), os.getpid()
        return self._client

    def __getstate__(self):
        return {**self.__dict__, "_client": None, "_pid": None, "_recent": {}, "_used": None, "_limit": None}

    def _block(self, shard: Shard, index: int) -> bytes:
        if (shard.key, index) in self._recent:
            return self._recent[shard.key, index]
        # The ETag in the name: a rewritten object never serves stale cached bytes.
        name = hashlib.sha256(f"{self.bucket}/{shard.key}/{shard.etag}".encode()).hexdigest()[:32]
        path = self.cache_dir / name / f"{self.block_bytes}-{index}"
        length = min(self.block_bytes, shard.size - index * self.block_bytes)
        data = self._verified(path, shard, index, _cached_block(path, length))
        if data is None:
            path.parent.mkdir(parents=True, exist_ok=True)
            lock = _open_unlinked_link(path.parent / f".{path.name}.lock")
            try:
                fcntl.flock(lock, fcntl.LOCK_EX)  # the node's other readers of this block wait, then hit the cache
                data = self._verified(path, shard, index, _cached_block(path, length))
                if data is None:
                    data = self._download(shard, index, path)
            finally:
                os.close(lock)
        else:
            os.utime(path, follow_symlinks=False)  # recently used: evicted last
        self._recent = {**dict(list(self._recent.items())[-1:]), (shard.key, index): data}  # the last two blocks
        return data

    def _download(self, shard: Shard, index: int, path: Path) -> bytes:
        start = index * self.block_bytes
        end = min(start + self.block_bytes, shard.size) - 1
        data = self.client.get_object(Bucket=self.bucket, Key=shard.key, Range=f"bytes={start}-{end}",
                                      IfMatch=shard.etag)["Body"].read()
        if not self._matches(shard, index, data):
            raise Fault(f"shard {self.name(shard)} changed since its manifest was written: bytes {start}-{end} do "
                        f"not hash to the digests in {self.uri}{MANIFEST}; write the shards again with "
                        "python -m trainer shards")
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        self._make_room(len(data))
        for attempt in (1, 2):
            try:
                tmp.write_bytes(data)
                os.replace(tmp, path)  # atomic: readers never see half a block
                self._used += len(data)
                return data
            except OSError as exc:
                tmp.unlink(missing_ok=True)
                if exc.errno != errno.ENOSPC:
                    raise
                if attempt == 2:
                    raise Fault(f"data cache {self.cache_dir}: no space left for a {len(data) >> 10} KiB "
                                       "block; free space there or give --data-cache another disk") from None
                self._limit = max(0, self._tally() - len(data))  # the disk is smaller than it looked: shrink
                self._make_room(len(data))

    def _cached(self) -> list[tuple[float, int, Path]]:
        """(mtime, size, path) of every cached block; half-written blocks of dead processes are removed."""
        found = []
        for path in self.cache_dir.glob("*/*"):
            name = path.name
            try:
                if name.endswith(".tmp"):
                    pid = int(name.rsplit(".", 2)[-2])
                    if pid != os.getpid() and not Path(f"/proc/{pid}").exists():
                        path.unlink()  # a block a killed process left half-written
                    continue
                if name.startswith("."):
                    continue
                st = path.stat()
            except (OSError, ValueError):
                continue
            found.append((st.st_mtime, st.st_size, path))
        return found

    def _tally(self) -> int:
        self._used = sum(size for _, size, _ in self._cached())
        return self._used

    def _make_room(self, need: int) -> None:
        """Keep the cache within its limit: drop least recently used blocks until ``need`` more bytes fit."""
        if self._used is None:
            self._tally()
            self._limit = int(CACHE_SHARE * (shutil.disk_usage(self.cache_dir).free + self._used))
        if self._used + need <= self._limit:
            return
        blocks = sorted(self._cached())
        self._used = sum(size for _, size, _ in blocks)
        for _, size, path in blocks:
            if self._used + need <= self._limit:
                break
            path.unlink(missing_ok=True)
            self._used -= size

    def read(self, shard: Shard, offset: int, length: int) -> bytes:
        parts = [self._block(shard, i) for i in blocks(offset, length, self.block_bytes)]
        skip = offset % self.block_bytes
        return b"".join(parts)[skip:skip + length]


class _DirSource:
    """The files of a local directory (recursively, in path order; not hidden ones), read in place."""

    def __init__(self, path: str):
        root = Path(path).expanduser()
        if not root.is_dir():
            raise UsageError(f"--dataset: {path!r} is not a directory of shards (or an s3://bucket/prefix URI)")
        self.uri = str(root)
        self.shards = [Shard(str(p), p.stat().st_size, "") for p in sorted(root.rglob("*"))
                       if p.is_file() and not p.name.startswith(".") and p.stat().st_size > 0]
        self.manifest = read_manifest((root / MANIFEST).read_bytes() if (root / MANIFEST).is_file() else None,
                                      self.uri)

    def name(self, shard: Shard) -> str:
        return shard.key

    def read(self, shard: Shard, offset: int, length: int) -> bytes:
        fd = os.open(shard.key, os.O_RDONLY)
        try:
            return os.pread(fd, length, offset)
        finally:
            os.close(fd)


def _cached_block(path: Path, length: int) -> bytes | None:
    """The cached block at ``path`` if it is a plain file of the block's length; None (and the entry removed) for a
    link, or a block of another length (another process's job wrote it): the caller downloads it again."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        path.unlink(missing_ok=True)
        return None
    with os.fdopen(fd, "rb") as f:
        data = f.read(length + 1)
    if len(data) != length:
        log.warning("data cache: %s holds %d bytes, not the block's %d; read again from the object",
                    path, len(data), length)
        path.unlink(missing_ok=True)
        return None
    return data


def _open_unlinked_link(path: Path) -> int:
    """A descriptor of the lock file at ``path``, never opened through a link (a link someone left there is
    removed): opening it for writing through a link would truncate the link's target."""
    for _ in (1, 2):
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            path.unlink(missing_ok=True)
    raise Fault(f"data cache: {path} is replaced by a link again and again; give --data-cache a directory of "
                "your own")


def open_source(location: str, cache_dir: str | os.PathLike | None, block_bytes: int):
    """Listed shards of s3://bucket/prefix or of a local directory; UsageError when there are none."""
    cloud, scheme = store_cloud(location), urlparse(location).scheme
    if not cloud and scheme not in ("", "file"):
        raise UsageError(f"--dataset: {location!r} has the unsupported scheme {scheme!r}; "
                         "expected s3://bucket/prefix or a local directory")
    if cloud == "aws":
        source = _S3Source(location, cache_dir, block_bytes)
    elif cloud:
        raise UsageError(f"--dataset: {location!r}: shards are read from s3://bucket/prefix or a local directory")
    else:
        source = _DirSource(local_path(location))
    if not source.shards:
        raise UsageError(f"--dataset: no shards under {source.uri}")
    return source


def _records(source, record_bytes: int) -> list[int]:
    written = (source.manifest or {}).get("record_bytes")
    if written is not None and written != record_bytes:
        raise UsageError(f"--dataset: {source.uri} holds shards of {written}-byte records; the model needs "
                         f"{record_bytes}-byte records (block_size + 1); make them with "
                         + MAKE_SHARDS.format(n=record_bytes))
    for s in source.shards:
        if s.size % record_bytes:
            if written is None:
                raise UsageError(f"--dataset: {source.uri} is not a shard directory ({source.name(s)} is not "
                                 f"whole {record_bytes}-byte records); make shards with "
                                 + MAKE_SHARDS.format(n=record_bytes))
            raise UsageError(f"--dataset: shard {source.name(s)} has {s.size} bytes, "
                             f"not a multiple of the record size {record_bytes}")
    return [s.size // record_bytes for s in source.shards]


def _tensor(data: bytes, dtype: torch.dtype) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=dtype)


class ShardDataset(Dataset):
    """Map-style: record i of the concatenated shards, as a 1-D tensor of ``dtype``."""

    def __init__(self, uri: str, record_bytes: int, dtype: torch.dtype = torch.uint8,
                 cache_dir: str | os.PathLike | None = None, block_bytes: int = DEFAULT_BLOCK_BYTES):
        self.source = open_source(uri, cache_dir, block_bytes)
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
    """Iterable: rank r reads shards r, r+W, ... (its whole shards, no other rank's), as batches of records.

    An epoch of a rank is its shards' records in order (with ``seed``: the shards' order reshuffled
    each epoch), cut into ``batch_size`` batches, the incomplete last one dropped. The rank's k-th
    batch, counted from ``start`` across ``epochs`` (None: endless), goes to DataLoader worker
    k % workers, which yields its records one by one: a DataLoader of the same batch_size returns the
    rank's batches in order for any number of workers, and a stream started at a batch count
    continues exactly where another left off.
    """

    def __init__(self, uri: str, record_bytes: int, dtype: torch.dtype = torch.uint8,
                 cache_dir: str | os.PathLike | None = None, block_bytes: int = DEFAULT_BLOCK_BYTES,
                 rank: int | None = None, world_size: int | None = None, batch_size: int = 1,
                 epochs: int | None = 1, seed: int | None = None, transform: Callable | None = None):
        self.source = open_source(uri, cache_dir, block_bytes)
        self.record_bytes, self.dtype = record_bytes, dtype
        counts = _records(self.source, record_bytes)
        dist = torch.distributed
        on = dist.is_available() and dist.is_initialized()
        self.rank = rank if rank is not None else (dist.get_rank() if on else int(os.environ.get("RANK", 0)))
        self.world_size = world_size if world_size is not None else (
            dist.get_world_size() if on else int(os.environ.get("WORLD_SIZE", 1)))
        self.batch_size, self.epochs, self.seed, self.transform = batch_size, epochs, seed, transform
        self.start = 0
        # Every rank checks every rank's share, so all refuse the same bad input together.
        for r in range(self.world_size):
            records = sum(counts[i] for i in assign(len(counts), r, self.world_size))
            if records < batch_size:
                raise UsageError(
                    f"--dataset: rank {r} of {self.world_size} gets {records} records from its shards "
                    f"(shard i goes to rank i mod {self.world_size}; {len(counts)} shards), fewer than a batch of "
                    f"{batch_size}; write more or smaller shards")
        self.shards = [self.source.shards[i] for i in assign(len(counts), self.rank, self.world_size)]
        self.batches_per_epoch = sum(s.size for s in self.shards) // record_bytes // batch_size

    def order(self, epoch: int) -> list[Shard]:
        """This rank's shards in the order of one epoch."""
        if self.seed is None:
            return self.shards
        perm = torch.randperm(len(self.shards), generator=torch.Generator().manual_seed(self.seed + epoch))
        return [self.shards[i] for i in perm.tolist()]

    def _batch(self, shards: list[Shard], index: int) -> Iterator[torch.Tensor]:
        """The records of batch `index` of the epoch whose shards are `shards`, read range by range."""
        first, last = index * self.batch_size, (index + 1) * self.batch_size  # record positions in the epoch
        start = 0
        for shard in shards:
            n = shard.size // self.record_bytes
            lo, hi = max(first, start) - start, min(last, start + n) - start
            if lo < hi:
                data = self.source.read(shard, lo * self.record_bytes, (hi - lo) * self.record_bytes)
                for j in range(hi - lo):
                    yield _tensor(data[j * self.record_bytes:(j + 1) * self.record_bytes], self.dtype)
            start += n
            if start >= last:
                return

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        k, order = self.start + worker, None
        while self.epochs is None or k < self.epochs * self.batches_per_epoch:
            epoch, index = divmod(k, self.batches_per_epoch)
            if order is None or order[0] != epoch:
                order = (epoch, self.order(epoch))
            for record in self._batch(order[1], index):
                yield self.transform(record) if self.transform else record
            k += workers


def _source_files(source: str) -> list[Path]:
    path = Path(source)
    if path.is_file():
        return [path]
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.is_file())
    raise UsageError(f"source {source!r}: no such file or directory")


def write_shards(sources: list[str], out: str, record_bytes: int, shard_bytes: int = DEFAULT_SHARD_BYTES,
                 chunk_bytes: int = CHUNK_BYTES) -> list[str]:
    """Cut the bytes of text files (directories: their files, in path order) into records of record_bytes
    and write them as shards ``shard-00000.bin``, ... of whole records to ``out`` (a directory or
    s3://bucket/prefix), and the manifest with the SHA-256 of each ``chunk_bytes`` chunk of each shard.
    An incomplete last record is dropped. Returns the shard keys written.
    """
    if record_bytes < 2 or shard_bytes < record_bytes:
        raise UsageError(f"--record-bytes {record_bytes} / --shard-bytes {shard_bytes}: expected "
                         "2 <= record bytes <= shard bytes")
    if chunk_bytes < 1:
        raise UsageError(f"chunk_bytes {chunk_bytes}: expected a positive number of bytes")
    files = [f for s in sources for f in _source_files(s)]
    store = open_store(out)
    try:
        held = read_manifest(store.read_bytes(MANIFEST), out.rstrip("/"))
    except FileNotFoundError:
        held = None
    if held is None and any(k.startswith("shard-") for k in store.list("shard-")):
        raise UsageError(f"--out {out}: holds shards of an unknown record size (no {MANIFEST}); "
                         "write to an empty location")
    if held is not None and held["record_bytes"] != record_bytes:
        raise UsageError(f"--out {out}: holds shards of {held['record_bytes']}-byte records; refusing to add "
                         f"{record_bytes}-byte records to them; write to another location or remove the old shards")
    per_shard = shard_bytes // record_bytes * record_bytes
    keys, pending, digests = [], bytearray(), {}

    def flush(n: int) -> None:
        key, data = f"shard-{len(keys):05d}.bin", bytes(pending[:n])
        store.write_bytes(key, data)
        digests[key] = {"bytes": n, "sha256": chunk_digests(data, chunk_bytes)}
        del pending[:n]
        keys.append(key)

    for f in files:
        pending += f.read_bytes()
        while len(pending) >= per_shard:
            flush(per_shard)
    if len(pending) >= record_bytes:
        flush(len(pending) // record_bytes * record_bytes)
    if not keys:
        raise UsageError(f"sources {', '.join(sources)}: fewer than {record_bytes} bytes, not one record")
    store.write_bytes(MANIFEST, json.dumps({"format": MANIFEST_FORMAT, "record_bytes": record_bytes, "shards": keys,
                                            "chunk_bytes": chunk_bytes, "digests": digests}).encode())
    for key in set((held or {}).get("shards", [])) - set(keys):  # an earlier, longer run's shards
        store.delete(key)
    return keys


def parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m trainer shards", description="Write shards for `train --dataset`.")
    p.add_argument("sources", nargs="+", metavar="SOURCE", help="text files or directories of them")
    p.add_argument("--out", required=True, help="a directory or s3://bucket/prefix")
    p.add_argument("--record-bytes", type=int, required=True,
                   help="the model's block_size + 1 (gpt-tiny 33, gpt-small 129, gpt-base 257)")
    p.add_argument("--shard-bytes", type=int, default=DEFAULT_SHARD_BYTES, help="at most (default %(default)s)")
    return p


def main(argv: list[str]) -> int:
    try:
        args = parser().parse_args(argv)
        keys = write_shards(args.sources, args.out, args.record_bytes, args.shard_bytes)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {len(keys)} shards of {args.record_bytes}-byte records to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
