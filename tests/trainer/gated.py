"""Test helpers for stop notices: a gpt-tiny that pauses at one forward call until a gate file exists,
so a notice lands at a known step however fast or slow this machine is; and a train runner."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from trainer.loop.checkpoint import Checkpointer, from_bytes
from trainer.loop.model import build_gpt
from trainer.loop.storage import open_store

GATE = "GPUFLEET_TEST_GATE"  # "<file>:<forward call>" (test-only)
ROOT = Path(__file__).resolve().parents[2]
TRAIN = ["--model", "tests.trainer.gated:factory", "--dataset", "synthetic", "--batch-size", "4",
         "--num-workers", "0", "--checkpoint-every", "0", "--lr", "1e-3", "--warmup-steps", "2"]


def factory():
    model = build_gpt("gpt-tiny")
    gate = os.environ.get(GATE)
    if not gate:
        return model
    path, at = gate.rsplit(":", 1)
    inner, calls = model.forward, [0]

    def forward(*batch):
        calls[0] += 1
        if calls[0] == int(at):
            deadline = time.monotonic() + 120
            while not os.path.exists(path) and time.monotonic() < deadline:
                time.sleep(0.02)
        return inner(*batch)

    model.forward = forward
    return model


def wait_for(predicate, timeout_s: float = 120, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def steps(metrics: Path) -> list[dict]:
    if not metrics.exists():
        return []
    return [json.loads(ln) for ln in metrics.read_text().splitlines() if ln.strip()]


def start_train(args: list[str], env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "trainer", "train", *TRAIN, *args], cwd=ROOT,
                            env={**os.environ, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def final_state(uri: str) -> tuple[int, dict[str, torch.Tensor]]:
    step, parts = Checkpointer(open_store(uri), keep=1).load_latest()
    return step, from_bytes(parts["model.pt"])
