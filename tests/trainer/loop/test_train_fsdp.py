"""FSDP2 and sharded (DCP) checkpoints with real torchrun on CPU (gloo): the same training as DDP and as one rank,
exact resume on local disk and on moto S3, resharding W -> W', background saves, conversion for inference."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.trainer.trainer_hooks import one_torch_thread  # noqa: F401 (autouse fixture)
from trainer import EXIT_OK, EXIT_PREEMPTED
from trainer.__main__ import main
from trainer.loop.checkpoint import SHARDED_FORMAT, Checkpointer, from_bytes
from trainer.loop.model import build_gpt
from trainer.loop.storage import LocalStore, open_store

ROOT = Path(__file__).resolve().parents[3]
COMMON = ["--model", "gpt-tiny", "--steps", "4", "--warmup-steps", "1", "--lr", "1e-3", "--seed", "3"]
ENV = {"OMP_NUM_THREADS": "1"}


def losses(path: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in path.read_text().splitlines()]


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def torchrun(nproc: int, *args: str, env: dict | None = None, module: str = "trainer",
             check: bool = True) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
           "-m", module, *args]
    proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), os.environ.get("PYTHONPATH", "")]), **ENV, **(env or {})},
        capture_output=True, text=True, timeout=300)
    if check:
        assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def train_in_process(tmp_path: Path, name: str, *flags: str) -> list[float]:
    metrics = tmp_path / f"{name}.jsonl"
    assert main(["train", *COMMON, *flags, "--checkpoint-uri", str(tmp_path / name),
                 "--metrics-file", str(metrics)]) == 0
    return losses(metrics)


def test_fsdp_on_one_process_accumulates_like_one_big_batch(tmp_path):
    big = train_in_process(tmp_path, "big", "--parallel", "fsdp", "--batch-size", "8")
    accumulated = train_in_process(tmp_path, "acc", "--parallel", "fsdp", "--batch-size", "2", "--grad-accum", "4")
    plain = train_in_process(tmp_path, "plain", "--batch-size", "8")
    assert accumulated == pytest.approx(big, rel=1e-5)
    assert big == pytest.approx(plain, rel=1e-5)
    assert big[-1] < big[0]
    manifest = Checkpointer(LocalStore(tmp_path / "big"), 3).manifest(4)
    assert manifest["format"] == SHARDED_FORMAT and manifest["world"] == 1
    assert set(manifest["parts"]) == {".metadata", "__0_0.distcp"}
    for r in records(tmp_path / "big.jsonl"):  # tokens counted from the batches: 8 samples of 32 tokens
        assert r["tokens_per_s"] * r["step_time_s"] == pytest.approx(8 * 32)
        assert r["tokens_per_s_per_gpu"] == r["tokens_per_s"]
        assert "mfu" not in r and "peak_mem_gib" not in r  # no peak to compare with, no GPU memory on CPU


def test_activation_checkpointing_recomputes_without_changing_the_training(tmp_path):
    plain = train_in_process(tmp_path, "plain", "--parallel", "fsdp", "--batch-size", "4")
    recomputed = train_in_process(tmp_path, "ac", "--parallel", "fsdp", "--batch-size", "4",
                                  "--activation-checkpointing", "--no-reshard-after-forward")
    assert recomputed == pytest.approx(plain, rel=1e-6)


@pytest.mark.slow
def test_compile_per_block_trains_the_same_and_logs_the_first_step_apart(tmp_path):
    eager = train_in_process(tmp_path, "eager", "--parallel", "fsdp", "--batch-size", "4")
    compiled = train_in_process(tmp_path, "compiled", "--parallel", "fsdp", "--batch-size", "4", "--compile")
    assert compiled == pytest.approx(eager, rel=1e-4)
    first = records(tmp_path / "compiled.jsonl")[0]
    assert first["step"] == 1 and first["compile_s"] == first["step_time_s"]


@pytest.mark.slow
def test_fsdp_on_two_ranks_trains_like_ddp_on_two_and_like_one_rank(tmp_path):
    single = train_in_process(tmp_path, "one", "--batch-size", "8", "--grad-accum", "2")
    runs = {}
    for mode in ("ddp", "fsdp"):
        metrics = tmp_path / f"{mode}.jsonl"
        torchrun(2, "train", *COMMON, "--parallel", mode, "--batch-size", "4", "--grad-accum", "2",
                 "--checkpoint-uri", str(tmp_path / mode), "--metrics-file", str(metrics))
        runs[mode] = losses(metrics)
    assert runs["fsdp"] == pytest.approx(runs["ddp"], rel=1e-5, abs=1e-5)
    assert runs["fsdp"] == pytest.approx(single, rel=1e-5, abs=1e-5)
    manifest = Checkpointer(LocalStore(tmp_path / "fsdp"), 3).manifest(4)
    assert manifest["world"] == 2 and {"__0_0.distcp", "__1_0.distcp"} <= set(manifest["parts"])


RESUME = [*COMMON, "--steps", "10", "--grad-accum", "2", "--batch-size", "2", "--dropout", "0.1",
          "--checkpoint-every", "3", "--parallel", "fsdp", "--dataset", "tests.trainer.trainer_hooks:signalling_text"]


@pytest.fixture(scope="module")
def fsdp_uninterrupted(tmp_path_factory) -> list[dict]:
    tmp = tmp_path_factory.mktemp("whole")
    torchrun(2, "train", *RESUME, "--checkpoint-uri", str(tmp / "ck"), "--metrics-file", str(tmp / "m.jsonl"))
    return records(tmp / "m.jsonl")


def stop_and_resume(uri: str, metrics: Path) -> list[dict]:
    # rank 1 gets SIGTERM at its 26th item fetch (step 7 of 2 x 2 items); the stop is agreed a step later
    stopped = torchrun(2, "train", *RESUME, "--checkpoint-uri", uri, "--metrics-file", str(metrics),
                       env={"TEST_SIGTERM_AT": "1:26"}, check=False)
    assert "exitcode  : 75" in stopped.stderr, stopped.stderr[-4000:]
    assert [r["step"] for r in records(metrics)] == list(range(1, 9))
    assert Checkpointer(open_store(uri), 3).steps() == [8, 6, 3]
    torchrun(2, "train", *RESUME, "--checkpoint-uri", uri, "--metrics-file", str(metrics))
    return records(metrics)


@pytest.mark.slow
def test_fsdp_stopped_and_resumed_from_local_dcp_logs_bitwise_the_same_losses(tmp_path, fsdp_uninterrupted):
    resumed = stop_and_resume(str(tmp_path / "ck"), tmp_path / "m.jsonl")
    assert [r["step"] for r in resumed] == list(range(1, 11))
    assert [r["loss"] for r in resumed] == [r["loss"] for r in fsdp_uninterrupted]  # bitwise
    assert [r["lr"] for r in resumed] == [r["lr"] for r in fsdp_uninterrupted]


@pytest.mark.slow
def test_fsdp_stopped_and_resumed_from_dcp_on_s3_logs_bitwise_the_same_losses(tmp_path, moto_endpoint,
                                                                              fsdp_uninterrupted):
    import boto3

    boto3.client("s3").create_bucket(Bucket="ckpt", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    resumed = stop_and_resume("s3://ckpt/run", tmp_path / "m.jsonl")
    assert [r["loss"] for r in resumed] == [r["loss"] for r in fsdp_uninterrupted]  # bitwise
    keys = {o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket="ckpt", Prefix="run/")["Contents"]}
    assert {"run/step-000000010.json", "run/step-000000010/.metadata", "run/step-000000010/__0_0.distcp",
            "run/step-000000010/__1_0.distcp"} <= keys  # each rank wrote its own shard


def full_checkpoint(path: Path, step: int) -> dict:
    """A local DCP checkpoint as one state dict, read without any process group (DCP's own converter)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = path.parent / f"{path.name}-{step}.pt"
    dcp_to_torch_save(path / f"step-{step:09d}", out)
    return torch.load(out, weights_only=False)


def assert_same(a, b, where: str = "") -> None:
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert set(a) == set(b), where
        for key in a:
            assert_same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


RESHARD = [*COMMON, "--steps", "3", "--parallel", "fsdp", "--checkpoint-every", "0"]


@pytest.mark.slow
@pytest.mark.parametrize("writers,readers", [(2, 1), (1, 2), (2, 4)])
def test_a_checkpoint_of_w_ranks_resumes_exactly_on_other_world_sizes(tmp_path, writers, readers):
    ck = tmp_path / "ck"
    torchrun(writers, "train", *RESHARD, "--batch-size", "2", "--checkpoint-uri", str(ck))
    saved = full_checkpoint(ck, 3)
    probe = tmp_path / "probe.pt"
    same_global_batch = str(2 * writers // readers)
    torchrun(readers, *RESHARD, "--batch-size", same_global_batch, "--checkpoint-uri", str(ck),
             module="tests.trainer.reshard_probe", env={"PROBE_OUT": str(probe)})
    loaded = torch.load(probe, weights_only=False)
    assert loaded["step"] == 3
    assert_same(loaded["model"], saved["model"], "model")
    assert_same(loaded["optim"]["state"], saved["optim"]["state"], "optim")  # Adam moments and step counts
    trainer_state = from_bytes(saved["trainer"])
    assert trainer_state["world"] == writers
    assert loaded["data"] == trainer_state["data"] == {"epoch": 0, "samples": 3 * 2 * writers}


@pytest.mark.slow
def test_training_goes_on_during_a_background_save_and_a_kill_leaves_the_previous_checkpoint(tmp_path):
    ck, metrics = tmp_path / "ck", tmp_path / "m.jsonl"
    args = [*COMMON, "--steps", "40", "--batch-size", "2", "--parallel", "fsdp", "--checkpoint-every", "3",
            "--checkpoint-uri", str(ck), "--metrics-file", str(metrics)]
    # The shard of step 6 is a FIFO: its background write blocks at open() until someone reads it, as an
    # upload that takes forever would. Steps 7 and 8 still train; step 9's save waits for the one in flight.
    (ck / "step-000000006").mkdir(parents=True)
    os.mkfifo(ck / "step-000000006" / "__0_0.distcp")
    proc = subprocess.Popen([sys.executable, "-m", "trainer", "train", *args], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT), **ENV},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 8):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
            time.sleep(0.05)
        logged = records(metrics)
        assert [r["step"] for r in logged] == list(range(1, 9))  # trained on while step 6 was being written
        assert Checkpointer(LocalStore(ck), 3).steps() == [3]  # step 6 not committed
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        proc.kill()
        proc.communicate()
    (ck / "step-000000006" / "__0_0.distcp").unlink()
    (ck / "step-000000006" / "__0_0.distcp").write_bytes(b"half a shard")  # what a killed upload leaves
    assert Checkpointer(LocalStore(ck), 3).steps() == [3]

    rerun = subprocess.run([sys.executable, "-m", "trainer", "train", *args], cwd=ROOT,
                           env={**os.environ, "PYTHONPATH": str(ROOT), **ENV}, capture_output=True, text=True,
                           timeout=120)
    assert rerun.returncode == EXIT_OK, rerun.stderr[-3000:]
    assert "resuming from the checkpoint of step 3" in rerun.stderr
    steps = [r["step"] for r in records(metrics)]
    assert steps == list(range(1, 9)) + list(range(4, 41))
    assert [r["loss"] for r in records(metrics)][8:13] == [r["loss"] for r in logged][3:8]  # the same steps again
    assert Checkpointer(LocalStore(ck), 3).steps() == [40, 39, 36]


def test_a_stop_waits_for_the_save_in_flight_then_saves_the_stop_step(tmp_path, monkeypatch):
    import tests.trainer.trainer_hooks as hooks

    ck, metrics = tmp_path / "ck", tmp_path / "m.jsonl"
    monkeypatch.setattr(hooks, "SIGTERM_AT_FETCH", 6 * 2 + 1)  # in step 7, the save of 6 maybe in flight
    args = ["train", *COMMON, "--steps", "20", "--batch-size", "2", "--parallel", "fsdp", "--checkpoint-every", "6",
            "--dataset", "tests.trainer.trainer_hooks:signalling_text", "--checkpoint-uri", str(ck),
            "--metrics-file", str(metrics)]
    assert main(args) == EXIT_PREEMPTED
    assert Checkpointer(LocalStore(ck), 3).steps() == [8, 6]  # the background save of 6 committed, then 8
    assert [r["step"] for r in records(metrics)] == list(range(1, 9))  # read a step late: 7's votes after 8
    assert all(r["checkpoint_s"] >= 0 for r in records(metrics) if r["step"] in (6, 8))


def test_convert_writes_a_state_dict_that_loads_into_the_model(tmp_path):
    train_in_process(tmp_path, "sharded", "--parallel", "fsdp", "--batch-size", "4")
    train_in_process(tmp_path, "whole", "--batch-size", "4")  # the same run, whole-state files
    out = tmp_path / "model.pt"
    assert main(["convert", "--checkpoint-uri", str(tmp_path / "sharded"), "--out", str(out)]) == 0
    model = build_gpt("gpt-tiny")
    model.load_state_dict(torch.load(out, weights_only=True))  # strict: every key, no extra
    _, parts = Checkpointer(LocalStore(tmp_path / "whole"), 3).load_latest()
    reference = from_bytes(parts["model.pt"])
    for name, tensor in model.state_dict().items():
        assert torch.allclose(tensor, reference[name], rtol=1e-5, atol=1e-6), name


def test_convert_of_a_missing_checkpoint_is_one_line(tmp_path, capsys):
    assert main(["convert", "--checkpoint-uri", str(tmp_path / "none"), "--out", str(tmp_path / "m.pt")]) == 2
    assert capsys.readouterr().err.strip().startswith("error: --checkpoint-uri")


def test_a_checkpoint_missing_a_shard_is_never_loaded(tmp_path, caplog):
    train_in_process(tmp_path, "ck", "--parallel", "fsdp", "--batch-size", "4", "--checkpoint-every", "2")
    (tmp_path / "ck" / "step-000000004" / "__0_0.distcp").unlink()
    checkpoints = Checkpointer(LocalStore(tmp_path / "ck"), 3)
    step, manifest, _ = checkpoints.latest()
    assert step == 2 and manifest["format"] == SHARDED_FORMAT
    assert "missing shard(s) __0_0.distcp" in caplog.text


def test_units_are_the_models_own_else_its_module_lists_else_none():
    from trainer.errors import UsageError
    from trainer.loop.parallel import shard_units

    gpt = build_gpt("gpt-tiny")
    assert shard_units(gpt) == list(gpt.blocks)

    class Stack(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList(torch.nn.Linear(2, 2) for _ in range(3))
            self.head = torch.nn.Linear(2, 1)

    stack = Stack()
    assert shard_units(stack) == list(stack.layers)
    stack.shard_units = [stack.head]
    assert shard_units(stack) == [stack.head]
    stack.shard_units = ["head"]
    with pytest.raises(UsageError):
        shard_units(stack)
    assert shard_units(torch.nn.Linear(2, 2)) == []


def test_a_user_model_without_units_trains_under_fsdp_sharded_at_the_root(tmp_path):
    def run(name: str, *flags: str) -> list[dict]:
        metrics = tmp_path / f"{name}.jsonl"
        assert main(["train", "--model", "tests.trainer.trainer_hooks:regression_model", "--dataset",
                     "tests.trainer.trainer_hooks:regression_data", "--steps", "30", "--batch-size", "32", "--lr",
                     "0.2", "--warmup-steps", "0", "--clip-grad", "0", "--checkpoint-uri", str(tmp_path / name),
                     "--metrics-file", str(metrics), *flags]) == EXIT_OK
        return records(metrics)

    sharded, plain = run("fsdp", "--parallel", "fsdp"), run("plain")
    assert [r["loss"] for r in sharded] == pytest.approx([r["loss"] for r in plain], rel=1e-5)
    assert sharded[-1]["loss"] < 0.2 * sharded[0]["loss"]
    assert sharded[0]["tokens_per_s"] * sharded[0]["step_time_s"] == pytest.approx(32)  # float inputs: samples
