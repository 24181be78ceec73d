"""The training loop behind `python -m trainer train`.

Read top to bottom: set up (ranks, model spread over them by DDP or FSDP, data, optimizer), resume from
the newest valid checkpoint, run optimizer steps (autocast or FSDP mixed precision, accumulation without
gradient sync, clipping, warmup + cosine LR), agree across ranks once per step whether to stop, and
checkpoint periodically (in the background for sharded checkpoints), at the end and on a stop.
Returns the exit status: 0 done, 75 stopped after a checkpoint of the stop step.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from trainer import EXIT_OK, EXIT_PREEMPTED
from trainer.errors import Fault, UsageError
from trainer.loop import flops, parallel
from trainer.loop.checkpoint import FORMAT, Checkpointer, NoValidCheckpoint, from_bytes, to_bytes
from trainer.loop.config import TrainConfig, resume_changes
from trainer.loop.data import DataStream, StreamBatches, build_dataset, build_model, open_stream
from trainer.loop.metrics import MetricsFile, Progress
from trainer.loop.notices import start_watchers
from trainer.loop.stop import StopNotice, agree, ignore_stop_signals, install_signal_handlers
from trainer.loop.storage import open_store
from trainer.node import node_schema

if TYPE_CHECKING:
    from trainer.loop.dcp import ShardedCheckpoints

log = logging.getLogger("trainer")
NODE_JSON = node_schema.PATH


@dataclass(frozen=True)
class Ranks:
    rank: int
    world: int
    local_rank: int
    device: torch.device


def setup_ranks(sharded: bool = False) -> Ranks:
    """One process per device; under torchrun (or for FSDP), join the process group (NCCL and gloo on GPUs,
    gloo on CPU)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if world > 1 or sharded:
        parallel.init_process_group(device, world)
    return Ranks(rank, world, local_rank, device)


def precision_plan(precision: str, device_type: str, bf16_supported: bool) -> tuple[torch.dtype | None, bool]:
    """(autocast dtype or None for fp32, whether to use a GradScaler)."""
    if precision == "fp32":
        return None, False
    if precision == "bf16" and (device_type == "cpu" or bf16_supported):
        return torch.bfloat16, False
    return torch.float16, True


def native_bf16(device: torch.device) -> bool:
    """Whether the GPU computes bf16 in hardware (Ampere or newer). torch's default check also says yes where
    bf16 tensors merely exist by emulation (a V100): that is not bf16 support for training."""
    return device.type == "cuda" and torch.cuda.is_bf16_supported(including_emulation=False)


def lr_factor(step: int, warmup: int, total: int, floor: float = 0.1) -> float:
    """Multiplier of the peak LR for 0-based step: linear warmup, then cosine decay to `floor`."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only; fused kernels on GPU."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), fused=device.type == "cuda")


def rng_state(device: torch.device) -> dict:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, device: torch.device) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)


def all_gather_bytes(data: bytes, ranks: Ranks) -> list[bytes]:
    """Every rank's bytes, on every rank (tensor collectives only: no pickling through numpy)."""
    if ranks.world == 1:
        return [data]
    size = torch.tensor([len(data)], device=ranks.device)
    sizes = [torch.zeros_like(size) for _ in range(ranks.world)]
    dist.all_gather(sizes, size)
    longest = max(int(s.item()) for s in sizes)
    mine = torch.zeros(longest, dtype=torch.uint8, device=ranks.device)
    mine[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    gathered = [torch.empty_like(mine) for _ in range(ranks.world)]
    dist.all_gather(gathered, mine)
    return [bytes(t[: int(s.item())].tolist()) for t, s in zip(gathered, sizes)]


@dataclass
class Trainer:
    """What a checkpoint holds and the loop updates."""

    cfg: TrainConfig
    ranks: Ranks
    model: torch.nn.Module  # the model itself (sharded in place under FSDP), not its DDP wrapper
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    scaler: torch.amp.GradScaler
    data: DataStream | StreamBatches
    checkpoints: Checkpointer
    sharded: ShardedCheckpoints | None = None  # DCP checkpoints (trainer.loop.dcp), else whole files

    def save(self, step: int, background: bool = False, before_commit=None) -> float:
        """Checkpoint step `step`; every rank takes part. All ranks' RNG states are gathered into it.

        Whole files: rank 0 writes them and every rank waits for the commit. Sharded: every rank writes its
        shard, in the background if asked (after any save in flight). Returns the seconds training was held up.
        ``before_commit`` runs once on every rank; on rank 0 after the parts (or every rank's shards) are
        written, before the commit (a background save runs it once staged). A save the store has no room for
        stops on every rank before anything is written.
        """
        began = time.perf_counter()
        rngs = [from_bytes(b) for b in all_gather_bytes(to_bytes(rng_state(self.ranks.device)), self.ranks)]
        state = {"step": step, "data": self.data.state(), "rng": rngs, "world": self.ranks.world,
                 "config": dataclasses.asdict(self.cfg)}
        optim = {"scheduler": self.scheduler.state_dict(), "scaler": self.scaler.state_dict()}
        if self.sharded is not None:
            from torch.distributed.checkpoint.state_dict import get_state_dict

            model_state, optim_state = get_state_dict(self.model, self.optimizer)
            estimate = self.ranks.world * parallel_bytes(model_state, optim_state)
            self.check_before_save(lambda: self.checkpoints.check_room(estimate=estimate))
            coordinator = before_commit if self.ranks.rank == 0 and not background else None
            blocked = self.sharded.save(step, {"model": model_state, "optim": optim_state,
                                               "trainer": to_bytes({**state, **optim})}, background, coordinator)
            log.info("checkpoint of step %d %s in %.2fs", step,
                     "staged, writing in the background" if background else "saved", blocked)
            if before_commit and coordinator is None:
                before_commit()
            return time.perf_counter() - began
        parts = {}
        if self.ranks.rank == 0:
            parts = {
                "model.pt": self.model.state_dict(),
                "optim.pt": {"optimizer": self.optimizer.state_dict(), **optim},
                "trainer.pt": state,
            }
        self.check_before_save(lambda: self.checkpoints.check_room(parts))  # one line, older checkpoints intact
        if self.ranks.rank != 0 and before_commit:
            before_commit()
        if self.ranks.rank == 0:
            started = time.perf_counter()
            self.checkpoints.save(step, parts, before_commit=before_commit)
            log.info("checkpoint of step %d saved in %.2fs", step, time.perf_counter() - started)
        if self.ranks.world > 1:
            dist.barrier()
        return time.perf_counter() - began

    def check_before_save(self, room) -> None:
        """On rank 0, which writes the location: ``room()`` (whether the save fits). Every rank learns the answer,
        so every rank stops with the same one line (Fault) before anything is written."""
        problem = None
        if self.ranks.rank == 0:
            try:
                room()
            except Fault as exc:
                problem = exc
        if self.ranks.world > 1:
            flag = torch.tensor([1 if problem else 0], device=self.ranks.device)
            dist.broadcast(flag, src=0)
            if flag.item() and problem is None:
                problem = Fault(f"checkpoint location {self.checkpoints.store.uri}: rank 0 stopped the save "
                                "(its log says why)")
        if problem is not None:
            raise problem

    def check_resume(self, state: dict, step: int) -> list[str]:
        """Refuse a resume whose checkpoint was written with other values of the flags that shape the run (one
        line); return the changed flags that apply from the next step on."""
        refused, applied = resume_changes(state.get("config") or {}, self.cfg)
        if refused:
            raise UsageError(f"{', '.join(refused)}: the checkpoint of step {step} at {self.checkpoints.store.uri} "
                             "was written with other values; resume with them or give another --checkpoint-uri")
        return applied

    def resume(self) -> tuple[int, dict | None]:
        """Load the newest valid checkpoint (rank 0 picks it); returns (its step, this rank's RNG state).

        Every checkpoint corrupt: UsageError on every rank, unless --start-over says to start from step 0.
        """
        found, refused = None, None
        if self.ranks.rank == 0:
            try:
                found = self.checkpoints.latest()
            except NoValidCheckpoint as exc:
                if not self.cfg.start_over:
                    refused = str(exc)
                else:
                    log.warning("%s: starting over from step 0 (--start-over)", exc)
        step, fmt = (found[0], found[1]["format"]) if found else (None, None)
        if self.ranks.world > 1:
            box = torch.tensor([-2 if refused else -1 if step is None else step, fmt or 0], device=self.ranks.device)
            dist.broadcast(box, src=0)
            if box[0].item() == -2:
                refused = refused or "every checkpoint is corrupt (rank 0 says which)"
            step, fmt = (None, None) if box[0].item() < 0 else (int(box[0].item()), int(box[1].item()))
        if refused:
            raise UsageError(f"{refused}; nothing to resume from: rerun with --start-over to train from step 0, "
                             "or give another --checkpoint-uri")
        if step is None:
            return 0, None
        if fmt == FORMAT:
            if parallel.is_sharded(self.model):
                raise UsageError(f"--parallel fsdp: the checkpoint of step {step} at {self.checkpoints.store.uri} "
                                 "holds whole-state files; resume it with --parallel ddp")
            parts = found[2] if self.ranks.rank == 0 else self.checkpoints.load(step)
            parts = {name: from_bytes(data) for name, data in parts.items()}
            optim, state = parts["optim.pt"], parts["trainer.pt"]
            applied = self.check_resume(state, step)
            try:
                self.model.load_state_dict(parts["model.pt"])
            except RuntimeError as exc:  # missing or unexpected keys, size mismatches: another model
                detail = next((line.strip() for line in str(exc).splitlines()[1:] if line.strip()), str(exc))
                raise UsageError(f"--model {self.cfg.model}: the checkpoint of step {step} at "
                                 f"{self.checkpoints.store.uri} holds the weights of another model ({detail[:200]}); "
                                 "resume with that model or give another --checkpoint-uri") from None
            self.optimizer.load_state_dict(optim["optimizer"])
        else:
            from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

            from trainer.loop.dcp import ShardedCheckpoints

            sharded = self.sharded or ShardedCheckpoints(self.checkpoints, self.ranks.device, background=False)
            model_state, optim_state = get_state_dict(self.model, self.optimizer)
            loaded = {"model": model_state, "optim": optim_state, "trainer": b""}
            sharded.load(step, loaded)  # resharded to this run's ranks as needed
            set_state_dict(self.model, self.optimizer, model_state_dict=loaded["model"],
                           optim_state_dict=loaded["optim"])
            optim = state = from_bytes(loaded["trainer"])
            applied = self.check_resume(state, step)
        self.scheduler.load_state_dict(optim["scheduler"])
        self.apply_schedule()
        if applied:
            log.warning("resuming with changed flags, applied from step %d on: %s", step + 1, ", ".join(applied))
        if self.scaler.is_enabled() and optim["scaler"]:
            self.scaler.load_state_dict(optim["scaler"])
        self.data.load_state(state["data"])
        log.info("resuming from the checkpoint of step %d at %s", step, self.checkpoints.store.uri)
        if state["world"] != self.ranks.world:
            log.warning("checkpoint written by %d ranks, now %d: RNG streams restart", state["world"], self.ranks.world)
            return state["step"], None
        return state["step"], state["rng"][self.ranks.rank]


    def apply_schedule(self) -> None:
        """The LR schedule of this run's flags (--lr, --warmup-steps, --steps) at the resumed step: the
        scheduler's state holds the base LR it was made with, which would otherwise win over --lr."""
        lr = self.cfg.lr * lr_factor(self.scheduler.last_epoch, self.cfg.warmup_steps, self.cfg.steps)
        self.scheduler.base_lrs = [self.cfg.lr for _ in self.optimizer.param_groups]
        for group in self.optimizer.param_groups:
            group["initial_lr"], group["lr"] = self.cfg.lr, lr
        self.scheduler._last_lr = [lr for _ in self.optimizer.param_groups]


@dataclass
class StepResult:
    """One optimizer step whose all-reduced stats are read a step later, so the device never waits for them."""

    step: int
    stats: torch.Tensor
    lr: float
    data_wait_s: float
    time_s: float
    tokens: int  # on every rank together
    checkpoint_s: float | None = None  # seconds a checkpoint of this step held training up, when one was saved


def build_trainer(cfg: TrainConfig, ranks: Ranks, model: torch.nn.Module, dataset, use_scaler: bool) -> Trainer:
    """The optimizer, schedule, data stream and checkpoints of a model already spread over the ranks."""
    optimizer = build_optimizer(model, cfg, ranks.device)
    checkpoints = Checkpointer(open_store(cfg.checkpoint_uri), cfg.keep_checkpoints)
    sharded = None
    if cfg.dcp:
        from trainer.loop.dcp import ShardedCheckpoints

        sharded = ShardedCheckpoints(checkpoints, ranks.device, background=cfg.async_checkpoint)
    return Trainer(
        cfg, ranks, model, optimizer,
        scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, cfg.warmup_steps, cfg.steps)),
        scaler=torch.amp.GradScaler(ranks.device.type, enabled=use_scaler),
        data=open_stream(dataset, cfg, ranks.rank, ranks.world, ranks.device),
        checkpoints=checkpoints, sharded=sharded,
    )


def node_settings() -> dict:
    return node_schema.load(NODE_JSON, required=False)


def train(cfg: TrainConfig, notice: StopNotice | None = None, exiting: bool = False) -> int:
    """``exiting``: the process ends after this (the CLI): from the end of the run on, stop signals are
    ignored, so that a SIGTERM storm that outlasts the stop checkpoint cannot turn exit 75 into -15."""
    notice = notice or StopNotice()
    restore_signals = install_signal_handlers(notice)
    ranks = setup_ranks(sharded=cfg.parallel == "fsdp")
    try:
        if ranks.local_rank == 0:
            start_watchers(notice, node_settings())
        status = run(cfg, ranks, notice)
        if ranks.world > 1:
            dist.barrier()  # no rank tears its process group down while a peer is still in a collective
        return status
    finally:
        if exiting:
            ignore_stop_signals()
        else:
            restore_signals()
        if dist.is_initialized():
            dist.destroy_process_group()


def run(cfg: TrainConfig, ranks: Ranks, notice: StopNotice) -> int:
    device = ranks.device
    torch.manual_seed(cfg.seed)  # the same initial weights on every rank
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    model = build_model(cfg)
    dataset = build_dataset(cfg, model)
    amp_dtype, use_scaler = precision_plan(cfg.precision, device.type, native_bf16(device))
    if cfg.precision == "bf16" and amp_dtype != torch.bfloat16:
        if cfg.parallel == "fsdp":
            raise UsageError("--precision bf16: this GPU has no bf16, and --parallel fsdp does not do fp16; "
                             "use --precision fp32 or --parallel ddp")
        log.warning("bf16 is not supported on this GPU; using fp16 with a GradScaler")
    if cfg.parallel == "fsdp":
        amp_dtype = None  # FSDP's MixedPrecisionPolicy casts parameters and compute instead
    flops_per_token = flops.flops_per_token(model, getattr(model, "block_size", 0) or 0)
    peak = flops.peak_flops(torch.cuda.get_device_name(device) if device.type == "cuda" else None)
    net = parallel.parallelize(model, cfg, device, ranks.world)  # what forward calls; model is sharded in place
    trainer = build_trainer(cfg, ranks, model, dataset, use_scaler)
    optimizer = trainer.optimizer
    if ranks.rank == 0:
        trainer.checkpoints.probe()
        take_location(trainer.checkpoints, model)
    start, rng = trainer.resume()
    if start >= cfg.steps:
        log.info("the checkpoint at %s is already at step %d of %d", cfg.checkpoint_uri, start, cfg.steps)
        return EXIT_OK
    if rng is not None:
        set_rng_state(rng, device)
    else:
        torch.manual_seed(cfg.seed + ranks.rank)  # per-rank streams (dropout) from here on

    primary = ranks.rank == 0
    metrics = MetricsFile(cfg.metrics_file if primary else None)
    progress = Progress(cfg.steps, cfg.log_every) if primary else None
    profiler = start_profiler(cfg, ranks)
    global_batch = cfg.batch_size * cfg.grad_accum * ranks.world
    k = cfg.grad_accum
    autocast = torch.autocast(device.type, dtype=amp_dtype) if amp_dtype else contextlib.nullcontext()

    def publish(result: StepResult) -> bool:
        """Read a step's all-reduced [loss sum, stop votes]; rank 0 records it. True if any rank must stop."""
        loss_sum, stop_votes = result.stats.tolist()
        if primary:
            per_gpu = result.tokens / ranks.world / result.time_s
            record = {
                "step": result.step, "loss": loss_sum / ranks.world, "lr": result.lr,
                "step_time_s": result.time_s, "samples_per_s": global_batch / result.time_s,
                "tokens_per_s": result.tokens / result.time_s, "tokens_per_s_per_gpu": per_gpu,
                "data_wait_frac": result.data_wait_s / result.time_s, "time": time.time(),
            }
            utilisation = flops.mfu(per_gpu, flops_per_token, peak)
            if utilisation is not None:
                record["mfu"] = utilisation
            if device.type == "cuda":
                record["peak_mem_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
            if result.checkpoint_s is not None:
                record["checkpoint_s"] = result.checkpoint_s
            if cfg.compile and result.step == start + 1:
                record["compile_s"] = result.time_s
                log.info("first step (with compile) took %.1fs", result.time_s)
            metrics.write(record)
            progress.update(record)
        return stop_votes > 0

    def save_with_record(result: StepResult, background: bool = False) -> bool:
        """Checkpoint result.step; its record is written before the commit (a background save: once staged),
        so that a kill after the commit cannot lose it. True if any rank must stop."""
        began, votes = time.perf_counter(), []

        def record() -> None:
            result.checkpoint_s = time.perf_counter() - began
            votes.append(publish(result))

        trainer.save(result.step, background=background, before_commit=record)
        return votes[0]

    stop = False
    done = start
    pending: StepResult | None = None
    last_time = time.perf_counter()
    try:
        for step in range(start + 1, cfg.steps + 1):
            lr = trainer.scheduler.get_last_lr()[0]
            losses = []
            data_wait = 0.0
            tokens = 0
            for micro in range(k):
                waited = time.perf_counter()
                batch = [t.to(device, non_blocking=True) for t in trainer.data.next()]
                data_wait += time.perf_counter() - waited
                tokens += token_count(batch[0]) * ranks.world
                # Only the last micro-batch reduces gradients across ranks.
                with parallel.gradient_sync(net, sync=micro == k - 1):
                    with autocast:
                        loss = net(*batch)
                    trainer.scaler.scale(loss / k if k > 1 else loss).backward()
                losses.append(loss.detach())
            if cfg.clip_grad:
                trainer.scaler.unscale_(optimizer)
                parallel.clip_grad_norm(model, cfg.clip_grad)
            trainer.scaler.step(optimizer)
            trainer.scaler.update()
            optimizer.zero_grad(set_to_none=True)
            trainer.scheduler.step()
            done = step
            stats = agree(losses[0] if k == 1 else torch.stack(losses).float().mean(), notice)
            if profiler:
                profiler.step()
            now = time.perf_counter()
            result, last_time = StepResult(step, stats, lr, data_wait, now - last_time, tokens), now
            if pending is not None:
                stop = publish(pending)
            pending = result
            if stop:
                break
            if cfg.checkpoint_every and step % cfg.checkpoint_every == 0 and step < cfg.steps:
                stop, pending = save_with_record(pending, background=cfg.dcp and cfg.async_checkpoint), None
                if stop:
                    log.warning("stop requested (%s): the checkpoint of step %d stands", notice.reason or
                                "by another rank", done)
                    break
        if pending is not None:
            stop = stop or pending.stats[1].item() > 0  # the last step's votes; its record waits for the final save
            if stop and done < cfg.steps:
                log.warning("stop requested (%s): saving a checkpoint of step %d", notice.reason or "by another rank",
                            done)
            # in the foreground: a save in flight is waited for first, and the run ends only once this one commits
            save_with_record(pending)
    finally:
        if trainer.sharded is not None:
            trainer.sharded.close()
        if profiler:
            profiler.stop()
        if progress:
            progress.close()
        metrics.close()
    return EXIT_PREEMPTED if stop and done < cfg.steps else EXIT_OK


def take_location(checkpoints: Checkpointer, model: torch.nn.Module) -> None:
    """Rank 0 owns the checkpoint location: clean what killed writers left, and check before step 1 that a save
    will have room (about the model and AdamW's two moments when there is no checkpoint yet)."""
    checkpoints.clean_leftovers()
    checkpoints.check_room(estimate=3 * sum(t.numel() * t.element_size() for t in model.state_dict().values()))


def parallel_bytes(*states) -> int:
    """Tensor bytes of this rank's shards of (nested) state dicts: about its share of a sharded save."""
    total = 0
    for state in states:
        for value in (state.values() if isinstance(state, dict) else state):
            if isinstance(value, dict):
                total += parallel_bytes(value)
            elif isinstance(value, torch.Tensor):
                local = value.to_local() if hasattr(value, "to_local") else value
                total += local.numel() * local.element_size()
    return total


def token_count(inputs: torch.Tensor) -> int:
    """Tokens in a micro-batch: every element of integer (token id) inputs, else one per sample."""
    if inputs.dtype.is_floating_point or inputs.dim() == 0:
        return int(inputs.shape[0]) if inputs.dim() else 1
    return inputs.numel()


def start_profiler(cfg: TrainConfig, ranks: Ranks):
    """A torch.profiler session recording cfg.profile_steps steps after one warmup step, or None."""
    if not cfg.profile_steps:
        return None
    path = Path(cfg.profile_dir) / f"trace-rank{ranks.rank}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if ranks.device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    profiler = torch.profiler.profile(
        activities=activities,
        schedule=torch.profiler.schedule(wait=0, warmup=1, active=cfg.profile_steps, repeat=1),
        on_trace_ready=lambda prof: prof.export_chrome_trace(str(path)),
    )
    profiler.start()
    return profiler
