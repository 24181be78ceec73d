"""Checkpoints under faults: malformed manifests, short and failed reads through a fault proxy over moto server,
every checkpoint corrupt, leftovers of killed writers, and a full disk (a small tmpfs)."""
from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import boto3
import pytest
import torch

from tests.trainer.fault_proxy import Fault as ProxyFault, FaultProxy
from tests.trainer.trainer_hooks import one_torch_thread  # noqa: F401 (autouse fixture)
from trainer.errors import Fault
from trainer.loop.checkpoint import Checkpointer, CorruptCheckpoint
from trainer.loop.storage import LocalStore, open_store

ROOT = Path(__file__).resolve().parents[3]
TINY = ["--model", "gpt-tiny", "--dataset", "synthetic", "--batch-size", "2", "--num-workers", "0",
        "--warmup-steps", "1"]


def two_checkpoints(store) -> Checkpointer:
    ckpt = Checkpointer(store, keep=3)
    ckpt.save(1, {"a.pt": b"first"})
    ckpt.save(2, {"a.pt": b"second", "b.pt": b"more"})
    return ckpt


def manifest(store, step=2) -> dict:
    return json.loads(store.read_bytes(f"step-{step:09d}.json"))


MALFORMED = {
    "parts as a list": lambda m, root: {**m, "parts": list(m["parts"].values())},
    "a null part entry": lambda m, root: {**m, "parts": {**m["parts"], "a.pt": None}},
    "an incomplete part entry": lambda m, root: {**m, "parts": {**m["parts"], "a.pt": {"bytes": 6}}},
    "a boolean size": lambda m, root: {**m, "parts": {"a.pt": {**m["parts"]["a.pt"], "bytes": True}}},
    "empty parts": lambda m, root: {**m, "parts": {}},
    "no parts": lambda m, root: {k: v for k, v in m.items() if k != "parts"},
    "a ../ part name": lambda m, root: {**m, "parts": {"../step-000000001/a.pt": m["parts"]["a.pt"]}},
    "an absolute part name": lambda m, root: {**m, "parts": {"/etc/hostname": m["parts"]["a.pt"]}},
    "a list manifest": lambda m, root: [m],
    "a null manifest": lambda m, root: None,
    "another step": lambda m, root: {**m, "step": 1},
    "another format": lambda m, root: {**m, "format": 99},
}


@pytest.mark.parametrize("shape", MALFORMED)
def test_every_malformed_manifest_is_corrupt_with_a_warning_and_resume_falls_back(tmp_path, caplog, shape):
    store = LocalStore(tmp_path)
    ckpt = two_checkpoints(store)
    store.write_bytes("step-000000002.json", json.dumps(MALFORMED[shape](manifest(store), tmp_path)).encode())
    with pytest.raises(CorruptCheckpoint):
        ckpt.load(2)
    with caplog.at_level(logging.WARNING, logger="trainer"):
        assert ckpt.load_latest() == (1, {"a.pt": b"first"})
    assert "step-000000002 is corrupt" in caplog.text


def test_a_part_that_is_a_directory_is_corrupt(tmp_path, caplog):
    store = LocalStore(tmp_path)
    ckpt = two_checkpoints(store)
    (tmp_path / "step-000000002" / "a.pt").unlink()
    (tmp_path / "step-000000002" / "a.pt").mkdir()
    with caplog.at_level(logging.WARNING, logger="trainer"):
        assert ckpt.load_latest() == (1, {"a.pt": b"first"})
    assert "step-000000002/a.pt: missing" in caplog.text


class FlakyStore(LocalStore):
    """Answers the first ``short`` reads of a key (under ``prefix``) with half its bytes, as a lying transfer would."""

    def __init__(self, root, short: int, prefix: str = ""):
        super().__init__(root)
        self.short, self.prefix, self.reads = short, prefix, {}

    def read_bytes(self, key):
        data = super().read_bytes(key)
        self.reads[key] = self.reads.get(key, 0) + 1
        return data[: len(data) // 2] if key.startswith(self.prefix) and self.reads[key] <= self.short else data


def test_a_part_read_short_is_read_again_before_it_is_called_corrupt(tmp_path, caplog):
    two_checkpoints(LocalStore(tmp_path))
    with caplog.at_level(logging.WARNING, logger="trainer"):
        assert Checkpointer(FlakyStore(tmp_path, short=2), keep=3).load_latest()[0] == 2
    assert "reading it again" in caplog.text and "is corrupt" not in caplog.text
    always = FlakyStore(tmp_path, short=99, prefix="step-000000002/a.pt")  # short every time: corrupt
    assert Checkpointer(always, keep=3).load_latest()[0] == 1
    assert always.reads["step-000000002/a.pt"] == 3


@pytest.fixture
def bucket(moto_endpoint):
    boto3.client("s3").create_bucket(Bucket="fleet", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    return "fleet"


@pytest.mark.parametrize("size, fault", [
    (1000, "truncate"),            # under the multipart threshold: one GET
    (17 << 20, "truncate"),        # over it: ranged GETs, no response checksum
    (1000, "error"),               # a 500 (past botocore's own retries it is a transfer fault, not corruption)
])
def test_s3_short_reads_and_errors_through_a_fault_proxy_are_retried(bucket, monkeypatch, caplog, size, fault):
    data = os.urandom(size)
    uri = "s3://fleet/jobs/j/"
    ckpt = Checkpointer(open_store(uri), keep=3)
    ckpt.save(1, {"a.pt": b"first"})
    ckpt.save(2, {"model.pt": data})
    with FaultProxy(os.environ["AWS_ENDPOINT_URL"]) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        injected = proxy.add(ProxyFault(fault, method="GET", path="/fleet/jobs/j/step-000000002/model.pt",
                                   times=12 if fault == "error" else 1))
        with caplog.at_level(logging.WARNING, logger="trainer"):
            step, parts = Checkpointer(open_store(uri), keep=3).load_latest()
    assert injected.hits == injected.times
    assert (step, parts["model.pt"] == data) == (2, True)
    assert "reading it again" in caplog.text and "is corrupt" not in caplog.text


def train(args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainer", "train", *TINY, *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, **kw)


FORMATS = {"full": ([], lambda ck: [p.write_bytes(b"garbage") for p in ck.glob("step-*/model.pt")]),
           "dcp": (["--checkpoint-format", "dcp"], lambda ck: [p.unlink() for p in ck.glob("step-*/*.distcp")])}


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_checkpoint_corrupt_stops_with_one_line_unless_start_over(tmp_path, fmt):
    flags, corrupt = FORMATS[fmt]
    ck = tmp_path / "ck"
    assert train([*flags, "--steps", "4", "--checkpoint-every", "2", "--checkpoint-uri", str(ck)]).returncode == 0
    assert corrupt(ck)
    refused = train([*flags, "--steps", "6", "--checkpoint-uri", str(ck)])
    assert refused.returncode == 2
    (line,) = [ln for ln in refused.stderr.splitlines() if ln.startswith("error:")]
    assert "every checkpoint at" in line and "is corrupt (steps 4, 2)" in line and "--start-over" in line
    assert "Traceback" not in refused.stderr
    again = train([*flags, "--steps", "6", "--checkpoint-uri", str(ck), "--start-over", "--metrics-file",
                   str(tmp_path / "m.jsonl")])
    assert again.returncode == 0, again.stderr
    assert "starting over from step 0 (--start-over)" in again.stderr
    assert [json.loads(ln)["step"] for ln in (tmp_path / "m.jsonl").read_text().splitlines()] == list(range(1, 7))


def _format_2_over_files(newest: Path) -> None:
    m = json.loads(newest.read_text())
    newest.write_text(json.dumps({**m, "format": 2}))


def _a_directory(path: Path) -> None:
    path.unlink()
    path.mkdir()


# Tried by hand on a run's newest checkpoint (step 4 of 4); each crashed the resume or the save after it.
CORRUPTED = {
    "a format-2 manifest over whole-state files": lambda ck: _format_2_over_files(ck / "step-000000004.json"),
    "a manifest that is a directory": lambda ck: _a_directory(ck / "step-000000004.json"),
    "a part that is a directory": lambda ck: _a_directory(ck / "step-000000004" / "model.pt"),
}


@pytest.mark.slow
@pytest.mark.parametrize("shape", CORRUPTED)
def test_a_corrupted_newest_checkpoint_is_passed_over_and_the_run_completes(tmp_path, shape):
    ck = tmp_path / "ck"
    assert train(["--steps", "4", "--checkpoint-every", "2", "--checkpoint-uri", str(ck)]).returncode == 0
    CORRUPTED[shape](ck)
    resumed = train(["--steps", "6", "--checkpoint-every", "2", "--checkpoint-uri", str(ck), "--metrics-file",
                     str(tmp_path / "m.jsonl")])
    assert resumed.returncode == 0 and "Traceback" not in resumed.stderr, resumed.stderr
    if shape != "a manifest that is a directory":  # that one is no manifest: step 4 is not listed at all
        assert "step-000000004 is corrupt" in resumed.stderr  # one warning, then the previous one
    assert [json.loads(ln)["step"] for ln in (tmp_path / "m.jsonl").read_text().splitlines()] == [3, 4, 5, 6]
    assert Checkpointer(LocalStore(ck), keep=3).load_latest()[0] == 6


def test_leftovers_of_killed_writes_are_cleaned_but_not_a_write_in_progress(tmp_path):
    store = LocalStore(tmp_path)
    ckpt = Checkpointer(store, keep=3)
    ckpt.save(1, {"a.pt": b"one"})
    ckpt.save(3, {"a.pt": b"three"})
    store.write_bytes("step-000000002/a.pt", b"parts of a save killed before its commit")
    old = time.time() - 3600
    killed = tmp_path / "step-000000003" / ".b.pt.abc.tmp"
    killed.write_bytes(b"half")
    os.utime(killed, (old, old))
    live = tmp_path / ".step-000000004.json.def.tmp"
    live.write_bytes(b"being written")
    os.utime(live, (old, old))
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl,sys,time; f=open(sys.argv[1],'rb'); "
                               "fcntl.flock(f, fcntl.LOCK_EX); print('locked', flush=True); time.sleep(60)",
                               str(live)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        removed = ckpt.clean_leftovers()
    finally:
        holder.kill()
        holder.wait()
    assert sorted(removed) == ["step-000000002/a.pt", "step-000000003/.b.pt.abc.tmp"]
    assert live.exists() and not killed.exists()
    assert ckpt.load_latest() == (3, {"a.pt": b"three"})


def test_orphan_s3_parts_of_a_killed_prune_are_cleaned_on_the_next_start(bucket):
    store = open_store("s3://fleet/run/")
    ckpt = Checkpointer(store, keep=1)
    ckpt.save(1, {"a.pt": b"one"})
    ckpt.save(2, {"a.pt": b"two"})
    store.write_bytes("step-000000001/a.pt", b"a prune killed after the manifest went")
    assert Checkpointer(store, keep=1).clean_leftovers() == ["step-000000001/a.pt"]
    assert store.list() == ["step-000000002.json", "step-000000002/a.pt"]


@contextlib.contextmanager
def mounted(tmp_path: Path, kind: str):
    """A small disk (the tests run as root in CI): an 8 MiB tmpfs, or a 16 MiB loop-mounted ext4 (DCP's writer
    fails on tmpfs whatever the room). Skipped, saying why, where mounting is refused."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if kind == "tmpfs":
        cmd = ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)]
    else:
        image = tmp_path / "disk.img"
        with open(image, "wb") as f:
            f.truncate(16 << 20)
        made = subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], capture_output=True, text=True)
        if made.returncode != 0:
            pytest.skip(f"cannot make an ext4 image for the full-disk test: {made.stderr.strip()}")
        cmd = ["mount", "-o", "loop", str(image), str(mnt)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a {kind} for the full-disk test: {proc.stderr.strip() or proc.returncode}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.fixture
def small_disk(tmp_path):
    with mounted(tmp_path, "tmpfs") as mnt:
        yield mnt


def fill(disk: Path, leave: int) -> None:
    """Fill the disk up to ``leave`` free bytes."""
    free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
    with open(disk / "filler", "wb") as f:
        f.write(b"\0" * max(0, free - leave))


def test_a_full_disk_mid_save_is_one_fault_and_the_older_checkpoint_stays(small_disk):
    ckpt = Checkpointer(LocalStore(small_disk / "ck"), keep=1)
    ckpt.save(1, {"a.pt": b"x" * 100_000})
    fill(small_disk, leave=300_000)
    with pytest.raises(Fault, match=r"checkpoint of step 2: no space left at .*/ck \(needs about"):
        ckpt.save(2, {"a.pt": b"y" * 1_000_000})
    assert ckpt.load_latest() == (1, {"a.pt": b"x" * 100_000})
    assert LocalStore(small_disk / "ck").list() == ["step-000000001.json", "step-000000001/a.pt"]
    assert not list((small_disk / "ck").rglob("*.tmp"))


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
def test_train_on_a_full_disk_says_where_and_how_much_in_one_line_and_keeps_the_older_checkpoint(tmp_path, fmt):
    flags = FORMATS[fmt][0]
    with mounted(tmp_path, "ext4" if fmt == "dcp" else "tmpfs") as small_disk:
        full_disk_run(small_disk, flags)


def full_disk_run(small_disk: Path, flags: list[str]) -> None:
    ck = small_disk / "ck"
    assert train([*flags, "--steps", "2", "--checkpoint-every", "0", "--checkpoint-uri", str(ck),
                  "--keep-checkpoints", "1"]).returncode == 0
    size = sum(p.stat().st_size for p in ck.rglob("*") if p.is_file())
    fill(small_disk, leave=size // 2)
    proc = train([*flags, "--steps", "4", "--checkpoint-uri", str(ck), "--keep-checkpoints", "1"])
    assert proc.returncode == 1, proc.stderr
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert f"checkpoint location {ck}: a save needs about" in line and "MiB free" in line
    assert "Traceback" not in proc.stderr
    assert Checkpointer(LocalStore(ck), keep=1).latest()[0] == 2
    (small_disk / "filler").unlink()
    assert train([*flags, "--steps", "4", "--checkpoint-uri", str(ck), "--keep-checkpoints", "1"]).returncode == 0
    assert Checkpointer(LocalStore(ck), keep=1).steps() == [4]


def test_the_data_cache_keeps_to_its_disk_evicting_old_blocks_and_cleans_half_written_ones(bucket, small_disk):
    from trainer.loop.shards import ShardDataset

    import torch

    s3 = boto3.client("s3")
    payload = os.urandom(12 << 20)  # more than the 8 MiB disk holds
    s3.put_object(Bucket="fleet", Key="data/shard-000.bin", Body=payload)
    cache = small_disk / "cache"
    half = cache / "shards" / "0123" / "262144-9.999999.tmp"  # a block a killed process left half-written
    half.parent.mkdir(parents=True)
    half.write_bytes(b"x" * 1000)
    ds = ShardDataset("s3://fleet/data/", 1 << 16, torch.uint8, cache_dir=cache, block_bytes=1 << 18)
    got = b"".join(bytes(ds[i].tolist()) for i in range(0, len(ds), 4))  # one 64 KiB record per block
    assert got == b"".join(payload[i << 16:(i + 1) << 16] for i in range(0, len(ds), 4))
    held = sum(p.stat().st_size for p in cache.rglob("*") if p.is_file())
    assert 0 < held <= 0.8 * (8 << 20)
    assert not half.exists()
