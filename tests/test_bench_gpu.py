"""bench/gpu.sh end to end on CPU (`--device cpu`: the same runs with gpt-tiny), since CI has no GPU."""
from __future__ import annotations

import json
import os
import sys
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_gpu_script_dry_run_on_cpu_writes_every_figure(tmp_path):
    out = tmp_path / "results-gpu.json"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1",
           "PYTHON": sys.executable}
    proc = subprocess.run(["bash", "bench/gpu.sh", "--device", "cpu", "--steps", "7", "--out", str(out)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert [r["name"] for r in report["runs"]] == ["ddp", "fsdp", "ddp-compile", "fsdp-compile"]
    for run in report["runs"]:
        assert run["steps"] == 7 and run["tokens_per_s_per_gpu"] > 0
        assert run["mfu"] is None and run["peak_mem_gib"] is None  # CPU: no peak to compare with, no GPU memory
        assert run["checkpoint_blocking_s"] >= 0  # background DCP saves at steps 3 and 6
    summary = report["summary"]
    assert {"tokens_per_s_per_gpu_fsdp-compile", "checkpoint_blocking_s"} <= set(summary)
    assert report["info"]["device"] == "cpu" and report["info"]["model"] == "gpt-tiny"
