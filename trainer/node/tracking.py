"""What a job's task (trainer.slurm.task) tells the outside world about a running attempt: each node's output,
shipped to the bucket (trainer.jobs.logs), and, from node rank 0, the job's progress in its record
(trainer.jobs.records) at a bounded rate.

Everything here is best-effort for the job: a record or log write that fails is logged and the job goes on
(its output stays in the local file and is shipped at the next try).
"""
from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import time
from pathlib import Path

from trainer.jobs.logs import LogShipper
from trainer.jobs.records import RecordStore, with_progress
from trainer.periodic import Periodic

log = logging.getLogger("gpufleet.tracking")

POLL_S = 2.0  # how often the metrics file is read (the record store writes progress at most every 30 s)


def last_metrics(path: str | Path) -> dict | None:
    """The newest complete record of a train metrics file (one JSON object a line), or None."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 64 * 1024))
            lines = f.read().splitlines()
    except FileNotFoundError:
        return None
    for line in reversed(lines):
        try:
            return json.loads(line)
        except ValueError:  # a half-written last line, or the cut first one
            continue
    return None


def progress_of(record: dict, total: int | None, gpu_util: float | None) -> dict:
    """A job record's progress from a train metrics record."""
    return {"step": record.get("step"), "total": total, "loss": record.get("loss"),
            "samples_per_s": record.get("samples_per_s"), "gpu_util": gpu_util}


class Output:
    """The attempt's stdout and stderr: each still goes where the task's own goes (Slurm's output file), and both
    are appended to one local file that a LogShipper sends to the bucket while the job runs."""

    def __init__(self, records: RecordStore, job_id: str, attempt: int, node: str, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "ab")
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self.shipper = LogShipper(records.store, job_id, attempt, node, path).start()

    def popen_kw(self) -> dict:
        return {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}

    def follow(self, proc: subprocess.Popen) -> None:
        """Copy the started process's two pipes (a thread each)."""
        for pipe, echo in ((proc.stdout, sys.stdout), (proc.stderr, sys.stderr)):
            t = threading.Thread(target=self._copy, args=(pipe, echo), name="job-output", daemon=True)
            t.start()
            self._threads.append(t)

    def _copy(self, pipe, echo) -> None:
        for line in iter(pipe.readline, b""):
            with self._lock:
                self._file.write(line)
                self._file.flush()
            try:
                echo.buffer.write(line)
                echo.flush()
            except (AttributeError, ValueError, OSError):  # a captured or closed stream: the file has it
                pass
        pipe.close()

    def close(self) -> None:
        """After the process exited: the rest of its output (a leftover child may hold a pipe: 5 s), shipped."""
        for t in self._threads:
            t.join(5)
        with self._lock:
            self._file.close()
        try:
            self.shipper.close()
        except Exception as exc:
            log.warning("job output not shipped (%s); it stays in %s", exc, self.path)


class Tracking(Periodic):
    """While the attempt runs: its progress (the metrics file, read every ``poll_s``) into the record at most every
    ``progress_every_s`` (the record store's limit); on close, its last progress."""

    def __init__(self, records: RecordStore, job_id: str, metrics: str | None, total: int | None,
                 poll_s: float = POLL_S, gpu_util=lambda: None):
        super().__init__(self._progress, poll_s, "job-record", final=self._last_progress, on_error=self._not_updated)
        self.records, self.job_id, self.metrics, self.total = records, job_id, metrics, total
        self.gpu_util = gpu_util

    def _progress(self) -> None:
        newest = last_metrics(self.metrics) if self.metrics else None
        if newest:
            self.records.progress(self.job_id, progress_of(newest, self.total, self.gpu_util()))

    def _not_updated(self, exc: Exception) -> None:  # the bucket away for a moment: the job goes on
        log.warning("job %s: its record could not be updated (%s)", self.job_id, exc)

    def _last_progress(self) -> None:
        """The attempt's last progress, written whatever the rate limit (the record's end)."""
        newest = last_metrics(self.metrics) if self.metrics else None
        if newest:
            progress = progress_of(newest, self.total, self.gpu_util())
            try:
                self.records.update(self.job_id, lambda rec: with_progress(rec, progress, time.time()))
            except Exception as exc:
                log.warning("job %s: its last progress could not be recorded (%s)", self.job_id, exc)
