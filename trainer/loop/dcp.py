"""Sharded checkpoints: torch.distributed.checkpoint (DCP) under the checkpoint commit protocol.

Every rank writes its own shard files of step N in parallel to `step-N/` (`__<rank>_<i>.distcp`); DCP's
coordinator (rank 0) writes `step-N/.metadata` once every rank has reported its writes, and then the
manifest `step-N.json` (format 2: the shard files and their sizes), the commit. A checkpoint with a missing
shard or no manifest is never loaded. DCP reshards on load: W ranks' checkpoint resumes on W' ranks.

Where the bytes go:
- a local path: DCP's FileSystemWriter / FileSystemReader;
- a store that offers DCP storage of its own (`dcp_writer(key)` / `dcp_reader(key)`; S3 with
  s3torchconnector installed): that;
- any other store (Azure Blob; S3 without s3torchconnector): DCP's file-system writer over the Store API.

Asynchronous save (`dcp.async_save`): the state is staged into host memory (pinned on a GPU) while
training waits, then written in a background thread that talks over a gloo group of its own; at most one
save is in flight: the next save, a load or close() waits for it first. Staging is a real copy, into host
buffers DCP's stager allocates at the first save and copies into again at every later one (they are free
again by then: the write that read them is over), on one intra-op thread (see HostStager).
"""
from __future__ import annotations

import contextlib
import io
import logging
import os
import tempfile
import time
from concurrent.futures import Future
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystemBase
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.storage import StorageWriter

from trainer.loop.checkpoint import METADATA, SHARDED_FORMAT, Checkpointer, CorruptCheckpoint, step_name, verify_present
from trainer.loop.storage import LocalStore, Store

log = logging.getLogger("trainer")


class StoreFileSystem(FileSystemBase):
    """DCP's file-system interface over a Store: paths are store keys; a written file goes up on close."""

    def __init__(self, store: Store) -> None:
        self.store = store

    @contextlib.contextmanager
    def create_stream(self, path, mode: str):
        key = str(path)
        if mode == "rb":
            yield io.BytesIO(self.store.read_bytes(key))
            return
        if mode != "wb":
            raise ValueError(f"unsupported mode {mode!r}")
        fd, spool = tempfile.mkstemp(prefix="gpufleet-shard-")  # on disk, not in memory: shards can be large
        try:
            with os.fdopen(fd, "w+b") as out:
                yield out
            self.store.upload_file(key, spool)
        finally:
            os.unlink(spool)

    def concat_path(self, path, suffix: str) -> str:
        return f"{str(path).rstrip('/')}/{suffix}"

    def init_path(self, path) -> str:
        return str(path)

    def rename(self, path, new_path) -> None:
        self.store.write_bytes(str(new_path), self.store.read_bytes(str(path)))
        self.store.delete(str(path))

    def mkdir(self, path) -> None:
        pass  # keys need no directories

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return True

    def exists(self, path) -> bool:
        return self.store.exists(str(path))

    def rm_file(self, path) -> None:
        self.store.delete(str(path))


class StoreWriter(FileSystemWriter):
    def __init__(self, store: Store, key: str) -> None:
        super().__init__(key, sync_files=False)
        self.fs = StoreFileSystem(store)


class StoreReader(FileSystemReader):
    def __init__(self, store: Store, key: str) -> None:
        super().__init__(key)
        self.fs = StoreFileSystem(store)


def writer_for(store: Store, key: str) -> StorageWriter:
    if isinstance(store, LocalStore):
        return FileSystemWriter(store.root / key, sync_files=True)
    own = getattr(store, "dcp_writer", None)
    return (own and own(key)) or StoreWriter(store, key)


def reader_for(store: Store, key: str):
    if isinstance(store, LocalStore):
        return FileSystemReader(store.root / key)
    own = getattr(store, "dcp_reader", None)
    return (own and own(key)) or StoreReader(store, key)


class Committing(StorageWriter):
    """A StorageWriter that, after the inner writer's finish (DCP's .metadata, on the coordinator once every
    rank's writes are in), commits the manifest: the step exists from then on."""

    def __init__(self, inner: StorageWriter, commit) -> None:
        self.inner, self.commit = inner, commit

    def reset(self, checkpoint_id=None) -> None:
        self.inner.reset(checkpoint_id)

    def set_up_storage_writer(self, is_coordinator: bool, *args, **kwargs) -> None:
        self.inner.set_up_storage_writer(is_coordinator, *args, **kwargs)

    def prepare_local_plan(self, plan):
        return self.inner.prepare_local_plan(plan)

    def prepare_global_plan(self, plans):
        return self.inner.prepare_global_plan(plans)

    def write_data(self, plan, planner):
        return self.inner.write_data(plan, planner)

    def finish(self, metadata, results) -> None:
        self.inner.finish(metadata, results)
        self.commit(results)

    def storage_meta(self):
        return self.inner.storage_meta()

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return True


def shard_files(results) -> dict[str, dict]:
    """{file: {"bytes": n}} of every rank's write results (each item is a byte range of one file)."""
    files: dict[str, int] = {}
    for rank_results in results:
        for result in rank_results:
            info = result.storage_data
            end = info.offset + info.length
            files[info.relative_path] = max(files.get(info.relative_path, 0), end)
    return {name: {"bytes": size} for name, size in sorted(files.items())}


@contextlib.contextmanager
def one_intraop_thread():
    """ATen's intra-op parallelism off for the block on the calling thread, restored after. OpenMP keeps the count
    per thread: threads already running keep theirs (a thread started meanwhile would take one)."""
    threads = torch.get_num_threads()
    if threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


class HostStager(DefaultStager):
    """DCP's DefaultStager, synchronous (training may change the tensors once save() returns, so the copy is done
    by then), whose copy runs on the calling thread alone.

    It copies host to host one `copy_` per storage (about 300 for a GPT and its AdamW moments), each large one an
    OpenMP fork/join over the intra-op threads. The copy is bound by memory bandwidth, which one thread nearly
    fills (the bench's 230 MB on a quiet 2-core machine: 49 ms on one thread, 43 ms on two); but with any other
    runnable process on the machine, each join waits for the intra-op thread it has descheduled, a scheduler slice
    per tensor (the same copy beside one busy process: 0.4-0.8 s on two threads, 0.08-0.12 s on one). The trainer
    computes nothing else meanwhile: training waits, the save before is written (save() waits for it first), and
    this save's writer thread starts after staging. A copy from a GPU uses no intra-op threads: no change there.
    """

    def __init__(self, device: torch.device) -> None:
        gpu = device.type == "cuda"
        super().__init__(StagingOptions(use_pinned_memory=gpu, use_shared_memory=False, use_async_staging=False,
                                        use_non_blocking_copy=False))

    def stage(self, state_dict, **kwargs):
        with one_intraop_thread():
            return super().stage(state_dict, **kwargs)


class ShardedCheckpoints:
    """DCP saves and loads of one run, committed through a Checkpointer's manifests."""

    def __init__(self, checkpointer: Checkpointer, device: torch.device, background: bool) -> None:
        self.checkpointer = checkpointer
        self.device = device
        self.background = background
        # the background thread's collectives get a group of their own, apart from training's
        self.group = dist.new_group(backend="gloo") if dist.is_initialized() else None
        self.stager = HostStager(device) if background else None
        self.pending: Future | None = None
        self.pending_step: int | None = None

    def save(self, step: int, state: dict, background: bool | None = None, before_commit=None) -> float:
        """Save `state` as step `step`; returns the seconds training was held up (waiting for the save in
        flight, staging, and for a foreground save the whole write). ``before_commit`` runs on the coordinator
        once every shard is written, before the manifest. A full disk removes this step's shards and raises
        Fault (one line), as whole-file saves do."""
        began = time.perf_counter()
        self.wait()
        world = dist.get_world_size(self.group) if self.group is not None else 1

        def commit(results) -> None:
            if before_commit:
                before_commit()
            self.checkpointer.commit(step, {METADATA: {}, **shard_files(results)}, SHARDED_FORMAT, world=world)

        writer = Committing(writer_for(self.checkpointer.store, step_name(step)), commit)
        if self.background if background is None else background:
            self.stager = self.stager or HostStager(self.device)
            self.pending = dcp.async_save(state, storage_writer=writer, process_group=self.group,
                                          async_stager=self.stager)
            self.pending_step = step
        else:
            try:
                dcp.save(state, storage_writer=writer, process_group=self.group)
            except Exception as exc:
                if not self.checkpointer.filled_up(exc):
                    raise
                raise self.checkpointer.out_of_space(step, self.checkpointer.room_needed()) from None
        return time.perf_counter() - began

    def wait(self) -> None:
        """Until the save in flight (if any) is committed; its failure is raised here."""
        if self.pending is not None:
            pending, step, self.pending, self.pending_step = self.pending, self.pending_step, None, None
            started = time.perf_counter()
            try:
                pending.result()
            except Exception as exc:
                if not self.checkpointer.filled_up(exc):
                    raise
                raise self.checkpointer.out_of_space(step, self.checkpointer.room_needed()) from None
            log.info("checkpoint of step %d committed in the background (waited %.2fs)", step,
                     time.perf_counter() - started)

    def load(self, step: int, state: dict) -> None:
        """Fill `state` (the shapes of this run's sharding) from the committed checkpoint of `step`."""
        self.wait()
        dcp.load(state, storage_reader=reader_for(self.checkpointer.store, step_name(step)), process_group=self.group)

    def close(self) -> None:
        try:
            self.wait()
        finally:
            if self.stager is not None:
                self.stager.close()


def download(checkpointer: Checkpointer, step: int, into: Path) -> Path:
    """A committed DCP checkpoint as a local directory (itself for a local store)."""
    manifest = checkpointer.manifest(step)
    if manifest["format"] != SHARDED_FORMAT:
        raise CorruptCheckpoint(f"{step_name(step)} is not a sharded (DCP) checkpoint")
    verify_present(checkpointer.store, step, manifest)
    store = checkpointer.store
    if isinstance(store, LocalStore):
        return store.root / step_name(step)
    into.mkdir(parents=True, exist_ok=True)
    for name in manifest["parts"]:
        store.download_file(f"{step_name(step)}/{name}", into / name)
    return into
