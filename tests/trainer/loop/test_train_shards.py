"""`train --dataset s3://bucket/prefix | DIR`: shards written by trainer.loop.shards, streamed per rank, exact resume."""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
import torch
from torch.utils.data import DataLoader

from tests.trainer.trainer_hooks import one_torch_thread  # noqa: F401 (autouse fixture)
from trainer import EXIT_OK, EXIT_PREEMPTED
from trainer.__main__ import main
from trainer.loop.config import parse_args
from trainer.loop.data import stdlib_sources
from trainer.errors import UsageError
from trainer.loop.shards import ShardStream, main as shards_main, write_shards
from trainer.loop.stop import StopNotice
from trainer.loop.train import train

ROOT = Path(__file__).resolve().parents[3]
RECORD = 33  # gpt-tiny: block_size 32 + 1
TINY = ["--model", "gpt-tiny", "--batch-size", "4", "--warmup-steps", "2", "--lr", "1e-3", "--seed", "5"]


@pytest.fixture
def text(tmp_path) -> Path:
    """Two text files (a directory) of standard-library source: 40 KB."""
    src = tmp_path / "src"
    src.mkdir()
    data = stdlib_sources(40_000)
    (src / "a.py").write_bytes(data[:25_000])
    (src / "b.py").write_bytes(data[25_000:])
    return src


@pytest.fixture
def bucket(moto_endpoint):
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="data", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    return s3


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_write_shards_cuts_whole_records(text, tmp_path):
    keys = write_shards([str(text)], str(tmp_path / "shards"), RECORD, shard_bytes=10_000)
    shards = [(tmp_path / "shards" / k).read_bytes() for k in keys]
    assert keys == [f"shard-{i:05d}.bin" for i in range(4)]  # 4 x 303 records; 4 bytes left over
    assert all(len(s) % RECORD == 0 and len(s) <= 10_000 for s in shards)
    whole = stdlib_sources(40_000)
    assert b"".join(shards) == whole[:len(whole) // RECORD * RECORD]  # in order; the incomplete record dropped
    manifest = json.loads((tmp_path / "shards" / ".shards.json").read_text())
    assert manifest == {"format": 2, "record_bytes": RECORD, "shards": keys, "chunk_bytes": 1 << 20,
                        "digests": {k: {"bytes": len(s), "sha256": [hashlib.sha256(s).hexdigest()]}
                                    for k, s in zip(keys, shards)}}  # shards under 1 MiB: one chunk each


def test_write_shards_cli(text, tmp_path, capsys, bucket):
    assert shards_main([str(text), "--out", "s3://data/train", "--record-bytes", "33", "--shard-bytes", "9000"]) == 0
    assert capsys.readouterr().out == "wrote 5 shards of 33-byte records to s3://data/train\n"
    listed = bucket.list_objects_v2(Bucket="data", Prefix="train/")["Contents"]
    assert [o["Key"] for o in listed] == ["train/.shards.json"] + [f"train/shard-{i:05d}.bin" for i in range(5)]
    assert shards_main([str(tmp_path / "nope"), "--out", str(tmp_path / "o"), "--record-bytes", "33"]) == 2
    assert capsys.readouterr().err == f"error: source {str(tmp_path / 'nope')!r}: no such file or directory\n"


def batches(stream: ShardStream, workers: int) -> list[list[list[int]]]:
    return [b.tolist() for b in DataLoader(stream, batch_size=stream.batch_size, num_workers=workers)]


@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")  # more than this machine's cores
def test_stream_order_is_the_same_for_any_worker_count_and_resumes_at_a_batch(tmp_path):
    # record i starts with i (4 bytes, big-endian): 420 records in 14 shards of 30
    (tmp_path / "numbered").write_bytes(b"".join(i.to_bytes(4, "big") + bytes(RECORD - 4) for i in range(420)))
    write_shards([str(tmp_path / "numbered")], str(tmp_path / "shards"), RECORD, shard_bytes=30 * RECORD)

    def stream(rank: int, start: int = 0) -> ShardStream:
        s = ShardStream(str(tmp_path / "shards"), RECORD, rank=rank, world_size=2, batch_size=5, epochs=2, seed=3)
        s.start = start
        return s

    def numbers(batches: list[list[list[int]]]) -> list[list[int]]:
        return [[int.from_bytes(bytes(r[:4]), "big") for r in b] for b in batches]

    serial = batches(stream(0), 0)
    assert batches(stream(0, start=7), 2) == serial[7:]
    assert batches(stream(0), 3) == serial  # three workers take turns; the loader yields the same sequence
    epoch = stream(0).batches_per_epoch
    assert len(serial) == 2 * epoch == 2 * 7 * 30 // 5
    first, second = numbers(serial[:epoch]), numbers(serial[epoch:])
    assert first != second and sorted(sum(first, [])) == sorted(sum(second, []))  # reshuffled shard order
    assert all(len({i // 30 for i in b}) <= 2 for b in first)  # a batch: one shard's run of records, or two
    mine = set(sum(first, []))
    assert mine == {i for i in range(420) if i // 30 % 2 == 0}  # rank 0: shards 0, 2, ..., 12, nothing else
    assert set(sum(numbers(batches(stream(1), 2)), [])) == {i for i in range(420) if i // 30 % 2 == 1}


def test_too_few_records_for_a_rank_is_refused_on_every_rank(text, tmp_path):
    write_shards([str(text)], str(tmp_path / "one"), RECORD, shard_bytes=50_000)  # one shard
    for rank in (0, 1):
        with pytest.raises(UsageError, match=r"rank 1 of 2 gets 0 records from its shards .*1 shards"):
            ShardStream(str(tmp_path / "one"), RECORD, rank=rank, world_size=2, batch_size=4)


def run_train(tmp_path: Path, name: str, dataset: str, *flags: str, notice: StopNotice | None = None) -> int:
    cfg = parse_args([*TINY, "--dataset", dataset, "--checkpoint-uri", str(tmp_path / name),
                      "--metrics-file", str(tmp_path / f"{name}.jsonl"), "--data-cache", str(tmp_path / "cache"),
                      *flags])
    return train(cfg, notice)


def test_s3_shards_train_like_the_same_shards_on_disk(text, tmp_path, bucket):
    write_shards([str(text)], "s3://data/train", RECORD, shard_bytes=4000)
    write_shards([str(text)], str(tmp_path / "shards"), RECORD, shard_bytes=4000)
    assert run_train(tmp_path, "s3", "s3://data/train", "--steps", "6") == EXIT_OK
    assert run_train(tmp_path, "local", str(tmp_path / "shards"), "--steps", "6") == EXIT_OK
    from_s3 = [r["loss"] for r in records(tmp_path / "s3.jsonl")]
    assert from_s3 == [r["loss"] for r in records(tmp_path / "local.jsonl")]
    assert from_s3[-1] < from_s3[0]
    assert list((tmp_path / "cache" / "shards").rglob("8388608-0"))  # S3 blocks went through the cache


class StopAtStep(StopNotice):
    """Set at the loop's n-th per-step check, as a spot notice during that step would be."""

    def __init__(self, step: int) -> None:
        super().__init__()
        self.step, self.checks = step, 0

    def is_set(self) -> bool:
        self.checks += 1
        if self.checks == self.step:
            self.set("test notice")
        return super().is_set()


def test_a_stopped_and_resumed_shard_run_equals_an_uninterrupted_one(tmp_path, monkeypatch):
    monkeypatch.setattr("trainer.loop.train.start_watchers", lambda notice, settings: [])  # only the loop reads it
    (tmp_path / "small.py").write_bytes(stdlib_sources(100 * RECORD))
    write_shards([str(tmp_path / "small.py")], str(tmp_path / "shards"), RECORD, shard_bytes=20 * RECORD)
    # 5 shards of 20 records: an epoch is 25 steps of 4, so 30 steps cross into a reshuffled second epoch
    flags = ["--steps", "30", "--num-workers", "2", "--checkpoint-every", "7"]
    assert run_train(tmp_path, "whole", str(tmp_path / "shards"), *flags) == EXIT_OK
    assert run_train(tmp_path, "cut", str(tmp_path / "shards"), *flags, notice=StopAtStep(11)) == EXIT_PREEMPTED
    assert [r["step"] for r in records(tmp_path / "cut.jsonl")][-1] == 12  # the vote is read a step later
    assert run_train(tmp_path, "cut", str(tmp_path / "shards"), *flags) == EXIT_OK
    whole, cut = records(tmp_path / "whole.jsonl"), records(tmp_path / "cut.jsonl")
    assert [r["step"] for r in cut] == list(range(1, 31))
    assert [r["loss"] for r in cut] == [r["loss"] for r in whole]  # bitwise: the same batches in the same order


def one_line_error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1, err
    return err[0]


def test_bad_dataset_locations_are_one_line(capsys, tmp_path, bucket, text):
    ck = ["--checkpoint-uri", str(tmp_path / "ck")]
    assert one_line_error(capsys, ["train", *TINY, "--dataset", "s3://", *ck]) == (
        "error: --dataset: 's3://' is not an s3://bucket/prefix URI")
    assert one_line_error(capsys, ["train", *TINY, "--dataset", "s3://no-bucket/x", *ck]) == (
        "error: --dataset: cannot list s3://no-bucket/x/: NoSuchBucket")
    assert one_line_error(capsys, ["train", *TINY, "--dataset", "s3://data/empty", *ck]) == (
        "error: --dataset: no shards under s3://data/empty/")
    assert one_line_error(capsys, ["train", *TINY, "--dataset", "gs://data/x", *ck]) == (
        "error: --dataset: 'gs://data/x' has the unsupported scheme 'gs'; expected s3://bucket/prefix or a local "
        "directory")
    assert one_line_error(capsys, ["train", *TINY, "--dataset", str(tmp_path / "none"), *ck]) == (
        f"error: --dataset: {str(tmp_path / 'none')!r} is not a directory of shards (or an s3://bucket/prefix URI)")
    write_shards([str(text)], str(tmp_path / "small"), 129, shard_bytes=20_000)  # gpt-small records
    line = one_line_error(capsys, ["train", *TINY, "--dataset", str(tmp_path / "small"), *ck])
    assert line == (f"error: --dataset: {tmp_path / 'small'} holds shards of 129-byte records; the model needs "
                    "33-byte records (block_size + 1); make them with python -m trainer shards --out LOCATION "
                    "--record-bytes 33 SOURCE...")


def test_a_shard_changed_since_its_manifest_stops_training_with_one_line_from_a_dataloader_worker(capsys, tmp_path,
                                                                                                   bucket, text):
    keys = write_shards([str(text)], "s3://data/train", RECORD, shard_bytes=4000)
    for key in keys:  # every shard rewritten with the same length: the listing agrees, the digests do not
        body = bucket.get_object(Bucket="data", Key=f"train/{key}")["Body"].read()
        bucket.put_object(Bucket="data", Key=f"train/{key}", Body=body[::-1])
    assert main(["train", *TINY, "--steps", "2", "--dataset", "s3://data/train", "--num-workers", "1",
                 "--checkpoint-uri", str(tmp_path / "ck"), "--data-cache", str(tmp_path / "cache")]) == 1
    (line,) = capsys.readouterr().err.splitlines()  # not the worker's traceback torch wraps it in
    assert re.fullmatch(r"error: shard s3://data/train/shard-\d{5}.bin changed since its manifest was written: "
                        r"bytes 0-\d+ do not hash to the digests in s3://data/train/.shards.json; write the shards "
                        r"again with python -m trainer shards", line), line
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_file() and not p.name.startswith(".")]


def test_resuming_with_the_other_kind_of_dataset_is_one_line(capsys, tmp_path, text):
    write_shards([str(text)], str(tmp_path / "shards"), RECORD, shard_bytes=4000)
    shards = ["train", *TINY, "--steps", "2", "--dataset", str(tmp_path / "shards"),
              "--data-cache", str(tmp_path / "cache")]
    builtin = ["train", *TINY, "--steps", "4", "--dataset", "text"]
    # Refused by the comparison of the checkpoint's config, before its data position is read.
    for first, second, written in ((shards, builtin, "--dataset text (was "), (builtin, shards, "(was text)")):
        ck = ["--checkpoint-uri", str(tmp_path / f"ck-{len(written)}")]
        assert main([*first, *ck]) == 0
        capsys.readouterr()
        assert written in one_line_error(capsys, [*second, *ck, "--steps", "6"])


@pytest.mark.slow
def test_two_ranks_read_disjoint_s3_shards_and_learn(text, tmp_path, bucket):
    keys = write_shards([str(text)], "s3://data/train", RECORD, shard_bytes=4000)
    metrics = tmp_path / "m.jsonl"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "trainer", "train", *TINY, "--steps", "8", "--dataset", "s3://data/train",
           "--data-cache", str(tmp_path / "cache"), "--checkpoint-uri", str(tmp_path / "ck"),
           "--metrics-file", str(metrics)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    read = {}
    for line in proc.stderr.splitlines():
        if "data: rank" in line:
            rank = int(line.split("data: rank ")[1].split()[0])
            read[rank] = line.split(": ")[-1].split()
    every = [f"s3://data/train/{k}" for k in keys]
    assert read == {0: every[0::2], 1: every[1::2]}  # disjoint, together every shard
    losses = [r["loss"] for r in records(metrics)]
    assert len(losses) == 8 and losses[-1] < losses[0]
    state = torch.load(tmp_path / "ck" / "step-000000008" / "trainer.pt", weights_only=True)
    assert state["data"] == {"batches": 8, "world": 2, "batch_size": 4}


def test_a_shard_run_resumes_only_with_its_ranks_and_per_rank_batch(tmp_path, capsys, text):
    write_shards([str(text)], str(tmp_path / "shards"), RECORD, shard_bytes=20 * RECORD)
    ck = str(tmp_path / "ck")
    argv = ["train", *TINY, "--steps", "2", "--dataset", str(tmp_path / "shards"), "--checkpoint-uri", ck]
    assert main(argv) == EXIT_OK
    capsys.readouterr()
    # The same global batch in two micro-batches: but a rank's shards are cut into batches of its own size.
    line = one_line_error(capsys, [*argv[:-2], "--steps", "3", "--batch-size", "2", "--grad-accum", "2",
                                   "--checkpoint-uri", ck])
    assert line == ("error: --dataset: each rank reads its own shards in batches, so the data order follows the "
                    "ranks and the per-rank batch: the checkpoint read on 1 ranks with --batch-size 4, this run has "
                    "1 with 2; resume with those or give another --checkpoint-uri")
