"""The same global batch gives the same training, however it is split: micro-batches, ranks (real torchrun)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import TensorDataset

from tests.trainer.trainer_hooks import one_torch_thread  # noqa: F401 (autouse fixture)
from trainer.__main__ import main
from trainer.loop.config import TrainConfig
from trainer.loop.data import DataStream

ROOT = Path(__file__).resolve().parents[3]
COMMON = ["--model", "gpt-tiny", "--steps", "4", "--warmup-steps", "1", "--lr", "1e-3", "--seed", "3"]


def losses(path: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in path.read_text().splitlines()]


def run_in_process(tmp_path: Path, name: str, *flags: str) -> list[float]:
    metrics = tmp_path / f"{name}.jsonl"
    assert main(["train", *COMMON, *flags, "--checkpoint-uri", str(tmp_path / name),
                 "--metrics-file", str(metrics)]) == 0
    return losses(metrics)


def stream_batches(n: int, batch: int, accum: int, world: int, rank: int, count: int, position=None) -> list[list[int]]:
    cfg = TrainConfig(batch_size=batch, grad_accum=accum, seed=5, num_workers=0)
    stream = DataStream(TensorDataset(torch.arange(n)), cfg, rank, world, torch.device("cpu"))
    if position:
        stream.load_state(position)
    return [stream.next()[0].tolist() for _ in range(count)]


def test_two_ranks_of_batch_b_take_the_samples_of_one_rank_of_batch_2b():
    n = 103  # not a multiple of anything: 12 steps of 8 per epoch, 7 samples left out
    one = stream_batches(n, 8, 1, 1, 0, 30)  # 30 steps: across two epoch boundaries
    r0, r1 = stream_batches(n, 4, 1, 2, 0, 30), stream_batches(n, 4, 1, 2, 1, 30)
    for step in range(30):
        assert sorted(r0[step] + r1[step]) == sorted(one[step])
        assert not set(r0[step]) & set(r1[step])
    epoch0 = [i for b in one[:12] for i in b]
    assert len(set(epoch0)) == 96  # each sample at most once per epoch
    assert [i for b in one[12:24] for i in b] != epoch0  # reshuffled next epoch


def test_accumulation_takes_the_samples_of_the_big_batch():
    big = stream_batches(103, 8, 1, 1, 0, 14)
    small = stream_batches(103, 4, 2, 1, 0, 28)
    assert [small[2 * i] + small[2 * i + 1] for i in range(14)] == big


def test_a_stream_resumed_mid_epoch_continues_exactly():
    whole = stream_batches(103, 4, 1, 2, 1, 40)
    cfg = TrainConfig(batch_size=4, seed=5, num_workers=0)
    stream = DataStream(TensorDataset(torch.arange(103)), cfg, 1, 2, torch.device("cpu"))
    for _ in range(17):
        stream.next()
    assert stream.state() == {"epoch": 1, "samples": 40}  # 12 steps of 8 in epoch 0, then 5 more
    assert stream_batches(103, 4, 1, 2, 1, 23, stream.state()) == whole[17:]


def test_batch_b_with_accumulation_k_matches_batch_b_times_k(tmp_path):
    big = run_in_process(tmp_path, "big", "--batch-size", "8", "--grad-accum", "1")
    accumulated = run_in_process(tmp_path, "acc", "--batch-size", "2", "--grad-accum", "4")
    assert accumulated == pytest.approx(big, rel=1e-5)
    assert big[-1] < big[0]  # it does learn


@pytest.mark.slow
def test_two_rank_torchrun_matches_one_rank_with_the_same_global_batch(tmp_path):
    single = run_in_process(tmp_path, "one", "--batch-size", "8", "--grad-accum", "2")
    metrics = tmp_path / "two.jsonl"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "trainer", "train", *COMMON, "--batch-size", "4", "--grad-accum", "2",
           "--checkpoint-uri", str(tmp_path / "two"), "--metrics-file", str(metrics)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert losses(metrics) == pytest.approx(single, rel=1e-5)  # only rank 0 writes: 4 records
    state = torch.load(tmp_path / "two" / "step-000000004" / "trainer.pt", weights_only=True)
    assert state["world"] == 2 and len(state["rng"]) == 2  # both ranks' RNG states in the checkpoint
    assert not torch.equal(state["rng"][0]["torch"], state["rng"][1]["torch"])


@pytest.mark.slow
def test_a_stop_on_one_rank_stops_every_rank_at_the_same_step(tmp_path):
    metrics = tmp_path / "m.jsonl"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "trainer", "train", *COMMON, "--steps", "8", "--batch-size", "4",
           "--dataset", "tests.trainer.trainer_hooks:signalling_text",
           "--checkpoint-uri", str(tmp_path / "ck"), "--metrics-file", str(metrics)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    # rank 1 alone gets SIGTERM during step 3 (fetch 9 of 4 per step); the vote is read after step 4
    stopped = subprocess.run(cmd, cwd=ROOT, env={**env, "TEST_SIGTERM_AT": "1:9"}, capture_output=True, text=True,
                             timeout=240)
    assert stopped.returncode == 1, stopped.stderr[-3000:]  # torchrun turns its workers' 75 into 1
    assert "stop requested (SIGTERM): saving a checkpoint of step 4" in stopped.stderr
    assert "stop requested (by another rank): saving a checkpoint of step 4" in stopped.stderr
    assert "exitcode  : 75" in stopped.stderr  # torchrun reports the workers' status 75
    assert [json.loads(line)["step"] for line in metrics.read_text().splitlines()] == [1, 2, 3, 4]
    state = torch.load(tmp_path / "ck" / "step-000000004" / "trainer.pt", weights_only=True)
    assert state["step"] == 4 and len(state["rng"]) == 2

    resumed = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [json.loads(line)["step"] for line in metrics.read_text().splitlines()] == list(range(1, 9))


def drop_newest(ck: Path, step: int) -> None:
    """Leave the checkpoint of `step` uncommitted (its manifest gone): a resume takes the one before."""
    (ck / f"step-{step:09d}.json").unlink()


def test_a_resume_may_cut_the_global_batch_otherwise_but_not_change_it(tmp_path, capsys, caplog):
    ck, metrics = tmp_path / "ck", tmp_path / "m.jsonl"
    train_flags = ["train", *COMMON, "--checkpoint-every", "2", "--checkpoint-uri", str(ck), "--metrics-file",
                   str(metrics)]
    assert main([*train_flags, "--batch-size", "2", "--grad-accum", "2"]) == 0
    whole = losses(metrics)
    drop_newest(ck, 4)
    capsys.readouterr()
    # Half the global batch: refused in one line that names the flags keeping it.
    assert main([*train_flags, "--batch-size", "2"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"error: --batch-size/--grad-accum: steps of 2 samples (--batch-size 2 x --grad-accum 1 x 1 ranks), but the "
        f"checkpoint of step 2 at {ck} was trained with steps of 4 samples (--batch-size 2 x --grad-accum 2 x 1 "
        "ranks); keep its step with --batch-size 2 --grad-accum 2 or --batch-size 4 --grad-accum 1, or give "
        "another --checkpoint-uri")
    # The same global batch in one micro-batch: the same samples per step, so the same training.
    assert main([*train_flags, "--batch-size", "4"]) == 0
    assert losses(metrics)[4:] == pytest.approx(whole[2:], rel=1e-5)
    assert "applied from step 3 on: --batch-size 4 (was 2), --grad-accum 1 (was 2)" in caplog.text


@pytest.mark.slow
def test_two_ranks_resumed_on_one_keep_their_global_batch_or_are_refused(tmp_path, capsys, caplog):
    ck, metrics = tmp_path / "ck", tmp_path / "m.jsonl"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "trainer", "train", *COMMON, "--batch-size", "4", "--checkpoint-every", "2",
           "--checkpoint-uri", str(ck), "--metrics-file", str(metrics)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    two_ranks = losses(metrics)
    drop_newest(ck, 4)
    capsys.readouterr()
    one_rank = ["train", *COMMON, "--checkpoint-uri", str(ck), "--metrics-file", str(metrics)]
    assert main([*one_rank, "--batch-size", "4"]) == 2  # was: half the global batch, silently
    assert "keep its step with --batch-size 4 --grad-accum 2 or --batch-size 8 --grad-accum 1" in \
        capsys.readouterr().err
    assert main([*one_rank, "--batch-size", "4", "--grad-accum", "2"]) == 0
    assert losses(metrics)[4:] == pytest.approx(two_ranks[2:], rel=1e-5)
    assert "checkpoint written by 2 ranks, now 1: RNG streams restart" in caplog.text
