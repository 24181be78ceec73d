"""Exact resume: a run stopped by SIGTERM and rerun logs the same losses as one that was never stopped."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import tests.trainer.trainer_hooks as hooks
from tests.trainer.trainer_hooks import one_torch_thread  # noqa: F401 (autouse fixture)
from trainer import EXIT_OK, EXIT_PREEMPTED
from trainer.__main__ import main
from trainer.loop.checkpoint import Checkpointer
from trainer.loop.storage import LocalStore

ROOT = Path(__file__).resolve().parents[3]
TINY = ["--model", "gpt-tiny", "--batch-size", "4", "--warmup-steps", "3", "--seed", "7"]


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_sigterm_then_rerun_logs_bitwise_the_same_losses(tmp_path, monkeypatch):
    # dropout on and 2 micro-batches: RNG state, accumulation and the data position all have to come back
    args = TINY + ["--steps", "12", "--grad-accum", "2", "--dropout", "0.1", "--checkpoint-every", "5",
                   "--dataset", "tests.trainer.trainer_hooks:signalling_text"]
    a = ["train", *args, "--checkpoint-uri", str(tmp_path / "a"), "--metrics-file", str(tmp_path / "a.jsonl")]
    assert main(a) == EXIT_OK
    whole = records(tmp_path / "a.jsonl")

    # 4 items per micro-batch, 2 micro-batches per step: fetch 59 is in step 8; the stop is agreed a step later
    monkeypatch.setattr(hooks, "SIGTERM_AT_FETCH", 59)
    b = ["train", *args, "--checkpoint-uri", str(tmp_path / "b"), "--metrics-file", str(tmp_path / "b.jsonl")]
    assert main(b) == EXIT_PREEMPTED
    stopped = records(tmp_path / "b.jsonl")
    assert [r["step"] for r in stopped] == list(range(1, 10))
    assert Checkpointer(LocalStore(tmp_path / "b"), 3).steps()[0] == 9  # a checkpoint of the stop step

    assert main(b) == EXIT_OK
    resumed = records(tmp_path / "b.jsonl")
    assert [r["step"] for r in resumed] == list(range(1, 13))  # no step lost or repeated
    assert [r["loss"] for r in resumed] == [r["loss"] for r in whole]  # bitwise: float equality
    assert [r["lr"] for r in resumed] == [r["lr"] for r in whole]
    assert Checkpointer(LocalStore(tmp_path / "b"), 3).steps() == [12, 10, 9]  # the last 3 kept


def test_rerun_of_a_finished_run_does_nothing(tmp_path):
    args = ["train", *TINY, "--steps", "3", "--checkpoint-uri", str(tmp_path / "ck"),
            "--metrics-file", str(tmp_path / "m.jsonl")]
    assert main(args) == EXIT_OK
    assert main(args) == EXIT_OK
    assert [r["step"] for r in records(tmp_path / "m.jsonl")] == [1, 2, 3]


@pytest.mark.slow
def test_external_sigterm_exits_75_and_the_rerun_continues_at_the_next_step(tmp_path):
    metrics = tmp_path / "m.jsonl"
    cmd = [sys.executable, "-m", "trainer", "train", *TINY, "--steps", "100000", "--checkpoint-every", "0",
           "--checkpoint-uri", str(tmp_path / "ck"), "--metrics-file", str(metrics)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == EXIT_PREEMPTED, err
    assert "stop requested (SIGTERM)" in err
    logged = [r["step"] for r in records(metrics)]
    stop_step = logged[-1]
    assert logged == list(range(1, stop_step + 1))
    assert Checkpointer(LocalStore(tmp_path / "ck"), 3).steps() == [stop_step]

    cmd[cmd.index("100000")] = str(stop_step + 2)
    rerun = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert rerun.returncode == EXIT_OK, rerun.stderr
    assert f"resuming from the checkpoint of step {stop_step}" in rerun.stderr
    assert [r["step"] for r in records(metrics)] == list(range(1, stop_step + 3))
