"""Per-step records: a JSON-lines file and a progress display (a bar on a terminal, plain lines in logs), and
the step log that writes them a step late and carries the ranks' stop votes."""
from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import torch

from trainer.loop import flops

log = logging.getLogger("trainer")


class MetricsFile:
    """Appends one JSON object per line; a resumed run continues the same file."""

    def __init__(self, path: str | None) -> None:
        self._file = None
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "a", encoding="utf-8", buffering=1)  # line-buffered: followers see each step

    def write(self, record: dict) -> None:
        if self._file:
            self._file.write(json.dumps(record) + "\n")

    def close(self) -> None:
        if self._file:
            self._file.close()


class Progress:
    """A redrawn bar (at most 10 times a second) on a terminal; otherwise a line every `every` steps."""

    def __init__(self, total: int, every: int, stream: TextIO | None = None) -> None:
        self.total = total
        self.every = every
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self._drawn = 0.0

    def update(self, record: dict) -> None:
        step = record["step"]
        if self.tty:
            now = time.monotonic()
            if now - self._drawn >= 0.1 or step == self.total:
                self._drawn = now
                filled = 30 * step // self.total
                self.stream.write(f"\r[{'#' * filled}{'.' * (30 - filled)}] {self._text(record)}\033[K")
                self.stream.flush()
        elif step % self.every == 0 or step == self.total:
            self.stream.write(self._text(record) + "\n")
            self.stream.flush()

    def _text(self, record: dict) -> str:
        return (f"step {record['step']}/{self.total} loss {record['loss']:.4f} lr {record['lr']:.2e} "
                f"{record['step_time_s'] * 1000:.0f} ms/step {record['samples_per_s']:.0f} samples/s")

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


@dataclass
class StepResult:
    """One optimizer step, as train_step leaves it: its all-reduced stats are still on their way."""

    step: int
    stats: torch.Tensor  # [loss summed over ranks, ranks asked to stop], all-reduced asynchronously
    lr: float
    data_wait_s: float
    ended: float  # time.perf_counter() once the step was queued
    tokens: int  # on every rank together


class StepLog:
    """Each step's record, written a step late: a step's stats are read once the next step is queued, so the
    device never waits for them (a checkpoint writes its step's record at once, before its commit).

    ``stop`` is where the run's stop is decided: whether any rank asked to stop at a step read so far. Rank 0
    writes the records (metrics file and progress); every rank reads the same stats, so every rank stops after
    the same step.
    """

    def __init__(self, cfg, ranks, start: int, model: torch.nn.Module, reason) -> None:
        self.cfg, self.ranks, self.start = cfg, ranks, start
        self.reason = reason  # () -> why this rank was asked to stop, or None
        self.global_batch = cfg.batch_size * cfg.grad_accum * ranks.world
        self.flops_per_token = flops.flops_per_token(model, getattr(model, "block_size", 0) or 0)
        cuda = ranks.device.type == "cuda"
        self.peak = flops.peak_flops(torch.cuda.get_device_name(ranks.device) if cuda else None)
        primary = ranks.rank == 0
        self.metrics = MetricsFile(cfg.metrics_file if primary else None)
        self.progress = Progress(cfg.steps, cfg.log_every) if primary else None
        self.pending: StepResult | None = None
        self.last_end = time.perf_counter()
        self.stop = False

    def push(self, result: StepResult) -> None:
        """Hold `result` and write the step before it (whose stats have arrived by now)."""
        if self.pending is not None:
            self._write(self.pending, result.step)
        self.pending = result

    def flush(self, checkpoint_s: float | None = None) -> None:
        """Write the held step now (a checkpoint of it is being saved: `checkpoint_s` it took so far)."""
        if self.pending is not None:
            self._write(self.pending, self.pending.step, checkpoint_s)
            self.pending = None

    def _write(self, result: StepResult, trained: int, checkpoint_s: float | None = None) -> None:
        """Read `result`'s stats: record them (rank 0) and take its stop votes. `trained`: the last step done."""
        loss_sum, stop_votes = result.stats.tolist()
        time_s, self.last_end = result.ended - self.last_end, result.ended
        if self.ranks.rank == 0:
            self._record(result, loss_sum, time_s, checkpoint_s)
        if stop_votes > 0 and not self.stop:
            self.stop = True
            if trained < self.cfg.steps:
                log.warning("stop requested (%s): saving a checkpoint of step %d", self.reason() or "by another rank",
                            trained)

    def _record(self, result: StepResult, loss_sum: float, time_s: float, checkpoint_s: float | None) -> None:
        world = self.ranks.world
        per_gpu = result.tokens / world / time_s
        record = {
            "step": result.step, "loss": loss_sum / world, "lr": result.lr,
            "step_time_s": time_s, "samples_per_s": self.global_batch / time_s,
            "tokens_per_s": result.tokens / time_s, "tokens_per_s_per_gpu": per_gpu,
            "data_wait_frac": result.data_wait_s / time_s, "time": time.time(),
        }
        utilisation = flops.mfu(per_gpu, self.flops_per_token, self.peak)
        if utilisation is not None:
            record["mfu"] = utilisation
        if self.ranks.device.type == "cuda":
            record["peak_mem_gib"] = torch.cuda.max_memory_allocated(self.ranks.device) / 2**30
        if checkpoint_s is not None:
            record["checkpoint_s"] = checkpoint_s
        if self.cfg.compile and result.step == self.start + 1:
            record["compile_s"] = time_s
            log.info("first step (with compile) took %.1fs", time_s)
        self.metrics.write(record)
        self.progress.update(record)

    def close(self) -> None:
        if self.progress:
            self.progress.close()
        self.metrics.close()
