"""`module:factory` hooks the trainer tests pass as --model / --dataset, and their thread fixture."""
from __future__ import annotations

import os
import signal

import pytest
import torch

from trainer.loop.data import ByteChunks, stdlib_sources

SIGTERM_AT_FETCH: int | None = None


@pytest.fixture(autouse=True)
def one_torch_thread():
    """In-process training on one thread: on a shared 2-core machine more threads only contend."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
  # set by a test: the process sends itself SIGTERM on this item fetch


class SignallingChunks(ByteChunks):
    """Standard-library text chunks; sends this process SIGTERM on the SIGTERM_AT_FETCH-th fetch (once)."""

    fetches = 0  # per dataset, so per run

    def __getitem__(self, i: int):
        global SIGTERM_AT_FETCH
        self.fetches += 1
        if SIGTERM_AT_FETCH is not None and self.fetches == SIGTERM_AT_FETCH:
            SIGTERM_AT_FETCH = None
            os.kill(os.getpid(), signal.SIGTERM)
        return super().__getitem__(i)


def signalling_text(model):
    """In a subprocess, TEST_SIGTERM_AT="<rank>:<fetch>" arms the signal on that rank only."""
    global SIGTERM_AT_FETCH
    rank, _, fetch = os.environ.get("TEST_SIGTERM_AT", "").partition(":")
    if fetch and rank == os.environ.get("RANK", "0"):
        SIGTERM_AT_FETCH = int(fetch)
    return SignallingChunks(torch.frombuffer(bytearray(stdlib_sources(1 << 20)), dtype=torch.uint8), model.block_size)


class Regression(torch.nn.Module):
    """A user model: forward(x, y) -> loss."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)

    def forward(self, x, y):
        return torch.nn.functional.mse_loss(self.linear(x).squeeze(-1), y)


def regression_model():
    return Regression()


def regression_data(model):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(256, 4, generator=g)
    y = x @ torch.tensor([1.0, -2.0, 0.5, 3.0]) + 0.25
    return torch.utils.data.TensorDataset(x, y)
