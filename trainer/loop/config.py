"""`train` flags and config file -> one frozen TrainConfig.

Precedence: defaults < config file (--config FILE, a JSON object keyed by flag name, dashes or
underscores) < flags. Every value is checked here; a bad one raises UsageError naming the flag or
key, the bad value and what is allowed.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Any, Callable

from trainer.errors import ArgumentParser, UsageError

PRECISIONS = ("fp32", "bf16", "fp16")
PARALLELS = ("ddp", "fsdp")
CHECKPOINT_FORMATS = ("auto", "dcp", "full")


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 1000
    batch_size: int = 32
    grad_accum: int = 1
    precision: str = "fp32"
    checkpoint_uri: str = "checkpoints"
    checkpoint_every: int = 500
    keep_checkpoints: int = 3
    start_over: bool = False  # when every checkpoint is corrupt: train from step 0 instead of refusing
    seed: int = 0
    metrics_file: str | None = None
    lr: float = 3e-4
    warmup_steps: int = 100
    clip_grad: float = 1.0
    num_workers: int | None = None  # None: 0 on CPU, up to 4 per GPU process
    pin_memory: bool | None = None  # None: on when training on a GPU
    prefetch_factor: int = 2
    persistent_workers: bool = True
    model: str = "gpt-small"
    dataset: str = "text"
    data_cache: str | None = None  # None: /mnt/scratch/gpufleet-data when /mnt/scratch exists, else under $TMPDIR
    dropout: float = 0.0
    profile_steps: int = 0
    profile_dir: str = "profile"
    log_every: int = 10
    parallel: str = "ddp"
    reshard_after_forward: bool = True
    activation_checkpointing: bool = False
    compile: bool = False
    checkpoint_format: str = "auto"  # auto: dcp under fsdp, full under ddp
    async_checkpoint: bool = True  # dcp checkpoints only

    @property
    def dcp(self) -> bool:
        """Whether checkpoints are sharded (torch.distributed.checkpoint) rather than whole files of rank 0."""
        return self.checkpoint_format == "dcp" or (self.checkpoint_format == "auto" and self.parallel == "fsdp")


def _int(minimum: int) -> Callable[[Any], int]:
    def convert(value: Any) -> int:
        if isinstance(value, bool):
            raise ValueError
        if isinstance(value, str):
            value = int(value.strip())
        if not isinstance(value, int) or value < minimum:
            raise ValueError
        return value

    convert.allowed = f"an integer >= {minimum}"
    return convert


def _float(minimum: float, *, open_min: bool = False, maximum: float | None = None) -> Callable[[Any], float]:
    def convert(value: Any) -> float:
        if isinstance(value, bool):
            raise ValueError
        value = float(value)
        if value != value or value < minimum or (open_min and value == minimum) or (maximum and value >= maximum):
            raise ValueError
        return value

    low = f"> {minimum}" if open_min else f">= {minimum}"
    convert.allowed = f"a number {low}" + (f" and < {maximum}" if maximum else "")
    return convert


def _choice(*choices: str) -> Callable[[Any], str]:
    def convert(value: Any) -> str:
        if value not in choices:
            raise ValueError
        return value

    convert.allowed = "one of " + ", ".join(choices)
    return convert


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError
    return value


_text.allowed = "a non-empty string"


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    raise ValueError


_bool.allowed = "true or false"


def _optional(convert: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def optional(value: Any) -> Any:
        return None if value is None else convert(value)

    optional.allowed = convert.allowed + " (or null)"
    return optional


# field -> (converter, help). Booleans become --flag/--no-flag.
FIELDS: dict[str, tuple[Callable[[Any], Any], str]] = {
    "steps": (_int(1), "optimizer steps in the whole run"),
    "batch_size": (_int(1), "samples per micro-batch on each rank"),
    "grad_accum": (_int(1), "micro-batches per optimizer step"),
    "precision": (_choice(*PRECISIONS), "autocast precision; bf16 falls back to fp16 + GradScaler where missing"),
    "checkpoint_uri": (_text, "checkpoint location: a path or s3://bucket/prefix; the run resumes from it"),
    "checkpoint_every": (_int(0), "save every N steps (0: only at the end and on a stop)"),
    "keep_checkpoints": (_int(1), "checkpoints kept"),
    "start_over": (_bool, "when every checkpoint at --checkpoint-uri is corrupt, train from step 0 "
                          "instead of stopping (exit 2)"),
    "seed": (_int(0), "random seed"),
    "metrics_file": (_optional(_text), "JSON-lines file, one record per optimizer step (rank 0)"),
    "lr": (_float(0.0, open_min=True), "peak learning rate"),
    "warmup_steps": (_int(0), "linear warmup steps before the cosine decay"),
    "clip_grad": (_float(0.0), "max gradient norm (0: no clipping)"),
    "num_workers": (_optional(_int(0)), "DataLoader worker processes per rank"),
    "pin_memory": (_optional(_bool), "pin host batches (default: on with a GPU)"),
    "prefetch_factor": (_int(1), "batches prefetched per worker"),
    "persistent_workers": (_bool, "keep DataLoader workers across epochs"),
    "model": (_text, "built-in model (gpt-tiny, gpt-small, gpt-base, gpt-350m, gpt-1.3b) or module:factory"),
    "dataset": (_text, "text (Python's standard-library sources), synthetic, module:factory, or shards: "
                       "s3://bucket/prefix or a directory (a path with '/'; see python -m trainer shards)"),
    "data_cache": (_optional(_text), "cache directory of s3:// shard blocks "
                                     "(default: /mnt/scratch/gpufleet-data if /mnt/scratch exists, else $TMPDIR)"),
    "dropout": (_float(0.0, maximum=1.0), "dropout probability of the built-in model"),
    "profile_steps": (_int(0), "write a torch.profiler trace of N steps to --profile-dir"),
    "profile_dir": (_text, "directory for profiler traces"),
    "log_every": (_int(1), "progress line every N steps when stderr is not a terminal"),
    "parallel": (_choice(*PARALLELS), "ddp: a whole replica per GPU; fsdp: parameters, gradients and optimizer "
                                      "state sharded over the ranks (FSDP2 fully_shard per block)"),
    "reshard_after_forward": (_bool, "fsdp: free gathered parameters after forward (less memory, one more "
                                     "all-gather in backward)"),
    "activation_checkpointing": (_bool, "recompute each block's activations in backward instead of keeping them"),
    "compile": (_bool, "torch.compile each block (the first step's compile time is logged apart)"),
    "checkpoint_format": (_choice(*CHECKPOINT_FORMATS), "dcp: every rank writes its shard "
                                                        "(torch.distributed.checkpoint); full: rank 0 writes whole "
                                                        "files; auto: dcp under fsdp, full under ddp"),
    "async_checkpoint": (_bool, "dcp: stage to host memory, then write in the background while training goes on"),
}
BOOLEAN_FIELDS = ("pin_memory", "persistent_workers", "reshard_after_forward", "activation_checkpointing", "compile",
                  "async_checkpoint", "start_over")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="python -m trainer train", description="Train a model; resumes from --checkpoint-uri.")
    parser.add_argument("--config", metavar="FILE", help="JSON file of flag values (flags win)")
    for name, (convert, help_text) in FIELDS.items():
        default = getattr(TrainConfig, name)
        if name in BOOLEAN_FIELDS:
            parser.add_argument(_flag(name), action=argparse.BooleanOptionalAction, default=None,
                                help=f"{help_text} (default: {default})")
        else:
            parser.add_argument(_flag(name), default=None, metavar=name.upper(),
                                help=f"{help_text} (default: {default})")
    return parser


def _check(where: str, name: str, value: Any) -> Any:
    convert = FIELDS[name][0]
    try:
        return convert(value)
    except (ValueError, TypeError):
        raise UsageError(f"{where}: {value!r} is not allowed; expected {convert.allowed}") from None


def read_config_file(path: str) -> dict[str, Any]:
    """The checked values of a JSON config file, keyed by field name."""
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except OSError as exc:
        raise UsageError(f"--config {path}: cannot read: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"--config {path}: not valid JSON: {exc.msg} at line {exc.lineno}") from None
    if not isinstance(raw, dict):
        raise UsageError(f"--config {path}: expected a JSON object of flag values, got {type(raw).__name__}")
    values = {}
    for key, value in raw.items():
        name = key.replace("-", "_")
        if name not in FIELDS:
            raise UsageError(f"--config {path}: unknown key {key!r}; allowed: {', '.join(FIELDS)}")
        values[name] = _check(f"--config {path}: key {key!r}", name, value)
    return values


# On resume, a flag that differs from the checkpoint's config is refused when the checkpoint cannot serve
# it (what the weights are, the data order); applied when it changes the rest of the run (the LR schedule,
# clipping, dropout, precision, how each rank cuts its share of a step); any other flag is a setting of this
# process only. What a step means is guarded apart: its global batch (global_batch_change).
REFUSED_ON_RESUME = ("model", "dataset", "seed")
APPLIED_ON_RESUME = ("steps", "lr", "warmup_steps", "clip_grad", "dropout", "precision", "batch_size", "grad_accum")


def resume_changes(saved: dict[str, Any], cfg: TrainConfig) -> tuple[list[str], list[str]]:
    """(refused, applied): '--flag new (was old)' for each flag of cfg that differs from a checkpoint's config."""
    def changed(names):
        return [f"{_flag(n)} {getattr(cfg, n)} (was {saved[n]})" for n in names
                if n in saved and saved[n] != getattr(cfg, n)]

    return changed(REFUSED_ON_RESUME), changed(APPLIED_ON_RESUME)


def _step_samples(batch: int, accum: int, world: int) -> str:
    return f"{batch * accum * world} samples (--batch-size {batch} x --grad-accum {accum} x {world} ranks)"


def global_batch_change(saved: dict[str, Any], saved_world: int, cfg: TrainConfig, world: int,
                        where: str) -> str | None:
    """None when this run's step takes as many samples as the checkpoint's did (any per-rank batch, accumulation
    and rank count that multiply to it: the same samples per step, in the same order); else one line saying
    what differs and the flags that would keep it on this run's ranks. `where`: the checkpoint."""
    before, now = saved["batch_size"] * saved["grad_accum"] * saved_world, cfg.batch_size * cfg.grad_accum * world
    if before == now:
        return None
    if before % world:
        keep = f"no per-rank batch keeps it on {world} ranks: resume on a number of ranks that divides {before}"
    else:
        per_rank = before // world
        ways = [f"--batch-size {per_rank // k} --grad-accum {k}" for k in (cfg.grad_accum, 1) if per_rank % k == 0]
        if per_rank % cfg.batch_size == 0:
            ways.insert(0, f"--batch-size {cfg.batch_size} --grad-accum {per_rank // cfg.batch_size}")
        keep = "keep its step with " + " or ".join(dict.fromkeys(ways))
    return (f"--batch-size/--grad-accum: steps of {_step_samples(cfg.batch_size, cfg.grad_accum, world)}, but "
            f"{where} was trained with steps of {_step_samples(saved['batch_size'], saved['grad_accum'], saved_world)}"
            f"; {keep}, or give another --checkpoint-uri")


def parse_args(argv: list[str]) -> TrainConfig:
    """Flags (and the config file they name) -> TrainConfig; raises UsageError."""
    args = build_parser().parse_args(argv)
    values = read_config_file(args.config) if args.config else {}
    for name in FIELDS:
        value = getattr(args, name)
        if value is not None:
            values[name] = _check(_flag(name), name, value)
    cfg = TrainConfig(**values)
    if cfg.parallel == "fsdp" and cfg.precision == "fp16":
        raise UsageError("--precision fp16 with --parallel fsdp is not supported; use bf16 (or fp32)")
    if cfg.parallel == "fsdp" and cfg.checkpoint_format == "full":
        raise UsageError("--checkpoint-format full with --parallel fsdp is not supported; use dcp (or auto)")
    return cfg
