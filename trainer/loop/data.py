"""Models and datasets by name, and the per-rank batch stream with a resumable position.

Built in: `text`, the bytes of Python's standard-library sources (present on every machine, no
download), cut into model-context-sized chunks; `synthetic`, random bytes of the same shape, for
speed tests; shards (trainer.loop.shards) at `s3://bucket/prefix` or in a local directory, records of
block_size + 1 bytes, each rank streaming its own shards. `--model module:factory` names
`factory() -> nn.Module` whose `forward(*batch)` returns the scalar loss; `--dataset module:factory`
names `factory(model) -> Dataset` of such batches. Datasets should be deterministic per index: exact
resume replays indices, not worker RNG; a shard stream resumes by starting at the batch count.
"""
from __future__ import annotations

import importlib
import itertools
import logging
import os
import sysconfig
import tempfile
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from trainer.loop.config import TrainConfig
from trainer.errors import UsageError
from trainer.loop.model import PRESETS, build_gpt
from trainer.loop.shards import ShardStream

log = logging.getLogger("trainer")
CORPUS_BYTES = 4 * 1024 * 1024
SYNTHETIC_SAMPLES = 8192


def stdlib_sources(max_bytes: int = CORPUS_BYTES) -> bytes:
    """The first max_bytes of the standard library's .py files, in sorted path order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out = bytearray()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("site-packages", "dist-packages", "__pycache__"))
        for name in sorted(filenames):
            if name.endswith(".py"):
                out += Path(dirpath, name).read_bytes()
                if len(out) >= max_bytes:
                    return bytes(out[:max_bytes])
    if not out:
        raise RuntimeError(f"no Python sources under {root}")
    return bytes(out)


class ByteChunks(Dataset):
    """Consecutive, non-overlapping chunks of a uint8 tensor: item i is (bytes, the same shifted by one)."""

    def __init__(self, data: torch.Tensor, block_size: int) -> None:
        self.data = data
        self.block_size = block_size

    def __len__(self) -> int:
        return (len(self.data) - 1) // self.block_size

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        chunk = self.data[i * self.block_size: (i + 1) * self.block_size + 1].long()
        return chunk[:-1], chunk[1:]


def load_factory(flag: str, spec: str):
    """The callable named by `module:attribute`."""
    module_name, _, attr = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise UsageError(f"{flag}: cannot load {spec!r}: {type(exc).__name__}: {exc}") from None
    if not callable(factory):
        raise UsageError(f"{flag}: {spec!r} is not a callable factory ({type(factory).__name__}); expected "
                         "module:function naming a function" + (" of the model" if flag == "--dataset" else "")
                         + " that returns the " + ("model (an nn.Module)" if flag == "--model" else "Dataset"))
    return factory


def build_model(cfg: TrainConfig) -> torch.nn.Module:
    if cfg.model in PRESETS:
        return build_gpt(cfg.model, cfg.dropout)
    if ":" in cfg.model:
        model = load_factory("--model", cfg.model)()
        if not isinstance(model, torch.nn.Module):
            raise UsageError(f"--model: {cfg.model!r} returned {type(model).__name__}, not a torch.nn.Module")
        return model
    raise UsageError(f"--model: {cfg.model!r} is not allowed; expected one of {', '.join(PRESETS)} or module:factory")


def is_shard_location(dataset: str) -> bool:
    """s3://bucket/prefix (or another URI, refused later) or a path with '/': shards, not a built-in or factory."""
    return "://" in dataset or "/" in dataset


def default_cache_dir() -> str:
    """The node's scratch disk when mounted (/mnt/scratch), else the temporary directory."""
    scratch = Path("/mnt/scratch")
    return str(scratch / "gpufleet-data" if scratch.is_dir() else Path(tempfile.gettempdir()) / "gpufleet-data")


def next_token_pair(record: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A record of block_size + 1 tokens -> (input, the same shifted by one), like ByteChunks' items."""
    record = record.long()
    return record[:-1], record[1:]


def build_dataset(cfg: TrainConfig, model: torch.nn.Module) -> Dataset:
    shards = is_shard_location(cfg.dataset)
    if ":" in cfg.dataset and not shards:
        return load_factory("--dataset", cfg.dataset)(model)
    if cfg.dataset not in ("text", "synthetic") and not shards:
        raise UsageError(f"--dataset: {cfg.dataset!r} is not allowed; expected text, synthetic, module:factory, "
                         "s3://bucket/prefix or a directory of shards (a path with '/')")
    block_size = getattr(model, "block_size", None)
    if not isinstance(block_size, int):
        raise UsageError(f"--dataset {cfg.dataset}: the model has no integer block_size attribute")
    if shards:
        stream = ShardStream(cfg.dataset, block_size + 1, cache_dir=cfg.data_cache or default_cache_dir(),
                             batch_size=cfg.batch_size, epochs=None, seed=cfg.seed, transform=next_token_pair)
        names = [stream.source.name(s) for s in stream.shards]
        log.info("data: rank %d of %d reads %d of %d shards, %d batches an epoch: %s", stream.rank,
                 stream.world_size, len(names), len(stream.source.shards), stream.batches_per_epoch,
                 " ".join(names[:8]) + (" ..." if len(names) > 8 else ""))
        return stream
    if cfg.dataset == "text":
        return ByteChunks(torch.frombuffer(bytearray(stdlib_sources()), dtype=torch.uint8), block_size)
    gen = torch.Generator().manual_seed(cfg.seed)
    data = torch.randint(0, 256, (SYNTHETIC_SAMPLES * block_size + 1,), dtype=torch.uint8, generator=gen)
    return ByteChunks(data, block_size)


class EpochSampler(DistributedSampler):
    """DistributedSampler limited to whole optimizer steps per epoch and able to start mid-epoch.

    Rank r takes positions r, r+W, r+2W, ... of the epoch's permutation, so the ranks' batches at a
    step together hold exactly the samples one rank with a W-times larger batch would take.
    """

    def __init__(self, dataset: Dataset, world: int, rank: int, seed: int, per_rank: int) -> None:
        super().__init__(dataset, num_replicas=world, rank=rank, shuffle=True, seed=seed, drop_last=True)
        self.per_rank = per_rank
        self.start = 0

    def __iter__(self):
        return itertools.islice(super().__iter__(), self.start, self.per_rank)

    def __len__(self) -> int:
        return self.per_rank - self.start


class DataStream:
    """Endless micro-batches for one rank. Position: (epoch, samples the whole job took in that epoch)."""

    def __init__(self, dataset: Dataset, cfg: TrainConfig, rank: int, world: int, device: torch.device) -> None:
        global_batch = cfg.batch_size * cfg.grad_accum * world
        self.steps_per_epoch = len(dataset) // global_batch
        if self.steps_per_epoch == 0:
            raise UsageError(
                f"--batch-size: a global batch of {global_batch} samples (batch {cfg.batch_size} x grad-accum "
                f"{cfg.grad_accum} x {world} ranks) exceeds the dataset's {len(dataset)} samples"
            )
        self.world = world
        self.batch_size = cfg.batch_size
        per_rank = self.steps_per_epoch * cfg.grad_accum * cfg.batch_size
        self.sampler = EpochSampler(dataset, world, rank, cfg.seed, per_rank)
        workers = cfg.num_workers if cfg.num_workers is not None else default_workers(device)
        pin = cfg.pin_memory if cfg.pin_memory is not None else device.type == "cuda"
        self.loader = DataLoader(
            dataset, batch_size=cfg.batch_size, sampler=self.sampler, num_workers=workers, pin_memory=pin,
            prefetch_factor=cfg.prefetch_factor if workers else None,
            persistent_workers=cfg.persistent_workers and workers > 0,
            generator=torch.Generator().manual_seed(cfg.seed),  # keeps the loader off the global RNG
        )
        self.epoch = 0
        self.taken = 0  # samples taken by the whole job in this epoch
        self._it = None

    def state(self) -> dict:
        return {"epoch": self.epoch, "samples": self.taken}

    def load_state(self, state: dict) -> None:
        if "samples" not in state:
            raise UsageError("--dataset: the checkpoint holds the position of a shard dataset; "
                             "resume with the dataset it was written with")
        self.epoch, self.taken = state["epoch"], state["samples"]
        self._it = None

    def next(self):
        if self._it is None:
            self.sampler.set_epoch(self.epoch)
            self.sampler.start = self.taken // self.world
            self._it = iter(self.loader)
        try:
            batch = next(self._it)
        except StopIteration:
            self.epoch, self.taken, self._it = self.epoch + 1, 0, None
            return self.next()
        self.taken += self.batch_size * self.world
        return batch


class StreamBatches:
    """Endless micro-batches of a ShardStream for one rank. Position: micro-batches every rank took so far."""

    def __init__(self, stream: ShardStream, cfg: TrainConfig, world: int, device: torch.device) -> None:
        workers = cfg.num_workers if cfg.num_workers is not None else default_workers(device)
        pin = cfg.pin_memory if cfg.pin_memory is not None else device.type == "cuda"
        self.stream, self.world = stream, world
        self.loader_args = dict(batch_size=cfg.batch_size, num_workers=workers, pin_memory=pin,
                                prefetch_factor=cfg.prefetch_factor if workers else None)
        self.taken = 0
        self._it = None

    def state(self) -> dict:
        return {"batches": self.taken, "world": self.world, "batch_size": self.loader_args["batch_size"]}

    def load_state(self, state: dict) -> None:
        if "batches" not in state:
            raise UsageError("--dataset: the checkpoint holds the position of a built-in or module:factory dataset, "
                             "not of shards; resume with the dataset it was written with")
        was = (state.get("world"), state.get("batch_size", self.loader_args["batch_size"]))
        if was != (self.world, self.loader_args["batch_size"]):
            raise UsageError(f"--dataset: each rank reads its own shards in batches, so the data order follows the "
                             f"ranks and the per-rank batch: the checkpoint read on {was[0]} ranks with --batch-size "
                             f"{was[1]}, this run has {self.world} with {self.loader_args['batch_size']}; resume with "
                             "those or give another --checkpoint-uri")
        self.taken, self._it = state["batches"], None

    def next(self):
        if self._it is None:  # one endless iterator (its workers live as long as the run)
            self.stream.start = self.taken
            self._it = iter(DataLoader(self.stream, **self.loader_args))
        self.taken += 1
        return next(self._it)


def open_stream(dataset: Dataset, cfg: TrainConfig, rank: int, world: int, device: torch.device):
    """The batch stream of a dataset: a shard stream starts at a batch count, others replay sampler indices."""
    if isinstance(dataset, ShardStream):
        return StreamBatches(dataset, cfg, world, device)
    return DataStream(dataset, cfg, rank, world, device)


def default_workers(device: torch.device) -> int:
    """0 on CPU (the cores train); on a GPU up to 4 per local process, leaving one core spare."""
    if device.type != "cuda":
        return 0
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return max(0, min(4, (os.cpu_count() or 1) // local - 1))
