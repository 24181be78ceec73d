"""The training loop behind `python -m trainer train`.

`run()` reads top to bottom: build the model and spread it over the ranks (DDP or FSDP), resume from the
newest valid checkpoint, then

    while step < steps and not stopping:  train_step; record the step before; checkpoint when due
    checkpoint the last step trained

The parts: `Trainer.train_step` (one optimizer step: autocast or FSDP mixed precision, accumulation without
gradient sync, clipping, the LR schedule, the ranks' stop votes queued with the loss), `StepLog`
(trainer.loop.metrics: records a step late and decides the stop), `CheckpointManager` (trainer.loop.manager:
format, cadence, background saves, resume). Returns the exit status: 0 done, 75 stopped after a checkpoint of
the stop step.
"""
from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from trainer import EXIT_OK, EXIT_PREEMPTED
from trainer.errors import UsageError
from trainer.loop import parallel
from trainer.loop.config import TrainConfig
from trainer.loop.data import build_dataset, build_model, open_stream
from trainer.loop.manager import CheckpointManager, TrainState
from trainer.loop.metrics import StepLog, StepResult
from trainer.loop.notices import start_watchers
from trainer.loop.optim import build_optimizer, build_schedule
from trainer.loop.parallel import Ranks, agree, setup_ranks
from trainer.loop.stop import StopNotice, ignore_stop_signals, install_signal_handlers
from trainer.node import node_schema

log = logging.getLogger("trainer")
NODE_JSON = node_schema.PATH


def train(cfg: TrainConfig, notice: StopNotice | None = None, exiting: bool = False) -> int:
    """``exiting``: the process ends after this (the CLI): from the end of the run on, stop signals are
    ignored, so that a SIGTERM storm that outlasts the stop checkpoint cannot turn exit 75 into -15."""
    notice = notice or StopNotice()
    restore_signals = install_signal_handlers(notice)
    ranks = setup_ranks(sharded=cfg.parallel == "fsdp")
    try:
        if ranks.local_rank == 0:
            start_watchers(notice, node_schema.load(NODE_JSON, required=False))
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
    trainer = build_trainer(cfg, ranks)
    checkpoints = CheckpointManager(trainer)
    checkpoints.take_location()
    start = checkpoints.resume()
    if start >= cfg.steps:
        log.info("the checkpoint at %s is already at step %d of %d", cfg.checkpoint_uri, start, cfg.steps)
        checkpoints.close()
        return EXIT_OK
    steps = StepLog(cfg, ranks, start, trainer.model, reason=lambda: notice.reason)
    profiler = start_profiler(cfg, ranks)
    step = start
    try:
        while step < cfg.steps and not steps.stop:
            step += 1
            steps.push(trainer.train_step(step, notice))
            if profiler:
                profiler.step()
            if checkpoints.due(step) and not steps.stop:
                checkpoints.save(step, before_commit=steps.flush)
        if checkpoints.saved != step:  # the last step trained (a stop's too), waited for: the run ends committed
            checkpoints.save(step, before_commit=steps.flush, final=True)
    finally:
        checkpoints.close()
        if profiler:
            profiler.stop()
        steps.close()
    return EXIT_PREEMPTED if steps.stop and step < cfg.steps else EXIT_OK


@dataclass
class Trainer(TrainState):
    """The training state and one optimizer step over it."""

    net: torch.nn.Module | None = None  # what forward calls: the model, or its DDP wrapper
    amp_dtype: torch.dtype | None = None  # autocast's dtype; None: fp32, or FSDP's own mixed precision

    def train_step(self, step: int, notice: StopNotice) -> StepResult:
        """One optimizer step of grad_accum micro-batches, gradients reduced across ranks on the last. Its loss
        and this rank's stop vote are all-reduced in the background (read a step later by StepLog)."""
        cfg, device, k = self.cfg, self.ranks.device, self.cfg.grad_accum
        autocast = torch.autocast(device.type, dtype=self.amp_dtype) if self.amp_dtype else contextlib.nullcontext()
        lr = self.scheduler.get_last_lr()[0]
        losses, data_wait, tokens = [], 0.0, 0
        for micro in range(k):
            waited = time.perf_counter()
            batch = [t.to(device, non_blocking=True) for t in self.data.next()]
            data_wait += time.perf_counter() - waited
            tokens += token_count(batch[0]) * self.ranks.world
            with parallel.gradient_sync(self.net, sync=micro == k - 1):
                with autocast:
                    loss = self.net(*batch)
                self.scaler.scale(loss / k if k > 1 else loss).backward()
            losses.append(loss.detach())
        if cfg.clip_grad:
            self.scaler.unscale_(self.optimizer)
            parallel.clip_grad_norm(self.model, cfg.clip_grad)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        stats = agree(losses[0] if k == 1 else torch.stack(losses).float().mean(), notice)
        return StepResult(step, stats, lr, data_wait, time.perf_counter(), tokens)


def build_trainer(cfg: TrainConfig, ranks: Ranks) -> Trainer:
    """The model (the same initial weights on every rank) spread over the ranks, its data, optimizer, LR schedule
    and precision."""
    device = ranks.device
    torch.manual_seed(cfg.seed)
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
    net = parallel.parallelize(model, cfg, device, ranks.world)  # the model is sharded in place under FSDP
    optimizer = build_optimizer(model, cfg, device)
    return Trainer(
        cfg, ranks, model, optimizer, build_schedule(optimizer, cfg),
        scaler=torch.amp.GradScaler(device.type, enabled=use_scaler),
        data=open_stream(dataset, cfg, ranks.rank, ranks.world, device),
        net=net, amp_dtype=None if cfg.parallel == "fsdp" else amp_dtype,  # FSDP's MixedPrecisionPolicy casts
    )


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
