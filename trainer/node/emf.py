"""CloudWatch Embedded Metric Format: metrics as JSON log lines, no API call on the training path.

The CloudWatch agent ships the lines to the log group ``/gpufleet/<stack>``, where CloudWatch
extracts the metrics into the namespace ``gpufleet/<stack>`` (the one the node's IAM policy allows).
Names, units and dimensions come from :mod:`trainer.node.metric_names`, which the stack's dashboard and
alarms read too. A job's task (trainer.slurm.task) samples GPU utilisation once a minute while it runs,
summarises the train run's ``--metrics-file`` once a minute (throughput, step time, data-wait share, tokens/s
on all GPUs and per GPU, MFU, peak GPU memory, checkpoint seconds) and records events: preemptions, steps lost.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import TextIO

from trainer.node import metric_names as names
from trainer.periodic import Periodic


def record(namespace: str, dimensions: dict[str, str], metrics: dict[str, float],
           timestamp_ms: int | None = None) -> dict:
    """One EMF document: metric values at the top level, their definitions (units from metric_names)
    under ``_aws``, published under every dimension set the values allow."""
    return {
        "_aws": {
            "Timestamp": int(time.time() * 1000) if timestamp_ms is None else timestamp_ms,
            "CloudWatchMetrics": [{
                "Namespace": namespace,
                "Dimensions": names.dimension_sets(dimensions),
                "Metrics": [{"Name": name, "Unit": names.UNITS[name]} for name in metrics],
            }],
        },
        **dimensions,
        **metrics,
    }


def summarize(records: list[dict]) -> dict[str, float]:
    """Means over one interval of train's metrics-file lines: step records, and any with ``checkpoint_s`` (the
    seconds a save held training up: its blocking time). Peak memory and checkpoint seconds are maxima."""
    out = {}
    steps = [r for r in records if "samples_per_s" in r]
    if steps:
        def mean(key: str) -> float:
            return sum(float(s[key]) for s in steps) / len(steps)

        out = {
            names.THROUGHPUT: mean("samples_per_s"),
            names.STEP_TIME: mean("step_time_s"),
            names.DATA_WAIT_SHARE: 100.0 * mean("data_wait_frac"),
            names.STEPS: float(len(steps)),
        }
        optional = {"tokens_per_s": (names.TOKENS_PER_S, 1.0),
                    "tokens_per_s_per_gpu": (names.TOKENS_PER_S_PER_GPU, 1.0), "mfu": (names.MFU, 100.0)}
        for key, (name, scale) in optional.items():
            if all(key in s for s in steps):
                out[name] = scale * mean(key)
        peaks = [float(s["peak_mem_gib"]) for s in steps if "peak_mem_gib" in s]
        if peaks:
            out[names.PEAK_GPU_MEMORY] = max(peaks) * 1024
    saves = [float(r["checkpoint_s"]) for r in records if "checkpoint_s" in r]
    if saves:
        out[names.CHECKPOINT_SECONDS] = max(saves)
    return out


def gpu_utilisation() -> float | None:
    """Mean GPU utilisation in percent over this node's GPUs (NVML, else nvidia-smi); None without GPUs."""
    try:
        import pynvml  # lazy: optional (nvidia-ml-py)

        pynvml.nvmlInit()
        try:
            n = pynvml.nvmlDeviceGetCount()
            values = [pynvml.nvmlDeviceGetUtilizationRates(pynvml.nvmlDeviceGetHandleByIndex(i)).gpu
                      for i in range(n)]
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        if shutil.which("nvidia-smi") is None:
            return None
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.TimeoutExpired):
            return None
        values = [float(v) for v in out.split() if v.strip()]
    return sum(values) / len(values) if values else None


class Emitter:
    """Writes EMF lines to ``out``; one line per call, flushed, safe across threads."""

    def __init__(self, namespace: str, out: TextIO, dimensions: dict[str, str] | None = None):
        self.namespace, self.out = namespace, out
        self.dimensions = dimensions or {}
        self._lock = threading.Lock()

    def emit(self, metrics: dict[str, float]) -> None:
        if not metrics:
            return
        line = json.dumps(record(self.namespace, self.dimensions, metrics), separators=(",", ":"))
        with self._lock:
            self.out.write(line + "\n")
            self.out.flush()


class GpuSampler(Periodic):
    """Emits this node's GPU utilisation once per interval while it runs, busy or idle (nothing without GPUs), and
    once more on close."""

    def __init__(self, emitter: Emitter, interval_s: float = 60.0, gpu=None):
        super().__init__(self.flush, interval_s, "emf-gpu", final=self.flush)
        self.emitter = emitter
        self.gpu = gpu if gpu is not None else gpu_utilisation

    def flush(self) -> None:
        util = self.gpu()
        if util is not None:
            self.emitter.emit({names.GPU_UTILIZATION: util})


class MetricsTail(Periodic):
    """Follows a train metrics file and emits one summary per interval (plus a last one on close)."""

    def __init__(self, path: str | os.PathLike, emitter: Emitter, interval_s: float = 60.0):
        super().__init__(self.flush, interval_s, "emf-tail", final=self.flush)
        self.path, self.emitter = Path(path), emitter
        self.offset = 0
        self.last_step: int | None = None

    def read_new(self) -> list[dict]:
        """Complete lines appended since the last read (a half-written last line waits)."""
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        done = data.rfind(b"\n") + 1
        self.offset += done
        steps = [json.loads(ln) for ln in data[:done].splitlines() if ln.strip()]
        if steps:
            self.last_step = int(steps[-1]["step"])
        return steps

    def flush(self) -> None:
        self.emitter.emit(summarize(self.read_new()))
