"""ShardedCheckpoints' background saves in one process on local disk: what is written is the state as save() found
it, whatever training does to the tensors afterwards, and the host buffers reused by the next save are not
copied into while a write still reads them."""
from __future__ import annotations

import threading

import torch

import trainer.loop.dcp as dcp_module
from trainer.loop.checkpoint import Checkpointer
from trainer.loop.dcp import ShardedCheckpoints
from trainer.loop.storage import LocalStore


def training_state() -> dict:
    torch.manual_seed(0)
    weight = torch.randn(512, 512)  # 1 MiB: a copy the intra-op threads would share
    return {"model": {"weight": weight, "tied": weight, "bias": torch.randn(512),
                      "half": torch.randn(64, 64).to(torch.bfloat16)},
            "optim": {"step": torch.tensor(3.0), "exp_avg": torch.randn(512, 512)},
            "trainer": b"rng and data positions"}


def tensors(state: dict) -> list[torch.Tensor]:
    return [state["model"]["weight"], state["model"]["bias"], state["model"]["half"], *state["optim"].values()]


def snapshot(state: dict) -> list[torch.Tensor]:
    return [t.clone() for t in tensors(state)]


def loaded(sharded: ShardedCheckpoints, step: int) -> dict:
    state = training_state()
    for t in tensors(state):
        t.zero_()
    state["trainer"] = b""
    sharded.load(step, state)
    assert state["trainer"] == b"rng and data positions"
    return state


def test_a_background_save_writes_the_state_as_it_was_when_save_returned(tmp_path, monkeypatch):
    # Step 1's write waits at a gate until training has changed every tensor in place (as an optimizer step
    # does); without a real copy at staging, the shard would hold the changed values.
    gate = threading.Event()
    real_writer_for = dcp_module.writer_for

    def gated_writer_for(store, key):
        writer = real_writer_for(store, key)
        write_data = writer.write_data

        def gated(plan, planner):
            assert gate.wait(60)
            return write_data(plan, planner)

        writer.write_data = gated
        return writer

    monkeypatch.setattr(dcp_module, "writer_for", gated_writer_for)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    checkpoints = Checkpointer(LocalStore(tmp_path), keep=3)
    sharded = ShardedCheckpoints(checkpoints, torch.device("cpu"), background=True)
    try:
        state = training_state()
        first = snapshot(state)
        blocked = sharded.save(1, state)
        assert blocked >= 0
        assert torch.get_num_threads() == 2  # staging's one thread is not left to training
        assert checkpoints.steps() == []  # still being written
        for t in tensors(state):
            t.add_(1)
        second = snapshot(state)
        gate.set()
        sharded.save(2, state)  # waits for step 1's write, then copies into the same host buffers
        for t in tensors(state):
            t.mul_(-1)
        sharded.wait()
        assert checkpoints.steps() == [2, 1]
        for step, expected in ((1, first), (2, second)):
            for got, want in zip(tensors(loaded(sharded, step)), expected):
                assert torch.equal(got, want), step
    finally:
        gate.set()
        sharded.close()
        torch.set_num_threads(threads)
