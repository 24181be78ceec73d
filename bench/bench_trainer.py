"""Trainer benchmarks, each a ratio measured within one run, interleaved: A, B, A, B, ... over several rounds,
each round's ratio taken against the A runs either side of its B (their mean), so slow drifts in machine
load cancel. Each figure is the median of its rounds' ratios; `<name>_spread` is their max - min, so that
a change of a few percent can be told from noise.

- trainer_overhead_ratio: time of a whole `train` run (metrics file, progress lines, checkpoints at the
  default interval and at the end) over a bare PyTorch loop with the same model, data, batch,
  precision, optimizer, clipping and LR schedule, for the same number of steps. On CPU both run on one
  thread and are timed in process CPU time, which other tenants of a shared machine disturb far less
  than wall time; on a GPU, wall time.
- checkpoint_blocking_ratio: seconds an asynchronous sharded (DCP) save holds training up (staging to host
  memory) over the seconds of a synchronous save of the same state (gpt-base-sized weights and AdamW
  moments, >= 200 MB) to local disk, with torch's default intra-op threads; target <= 0.1.
- fsdp_step_ratio: median step time of FSDP over DDP, gpt-small, 2 CPU ranks under torchrun (gloo);
  information only (on CPU FSDP's extra all-gathers are not hidden by compute as on GPUs).
- checkpoint_dcp_s3_crt_speedup (information, the choice of the S3 DCP layer): seconds of a sharded save
  and load through the trainer's DCP writer over boto3 (its S3Store) over the same through
  s3torchconnector's S3StorageWriter / S3StorageReader (the AWS CRT), against moto on loopback.
- checkpoint_s3_save_ratio / checkpoint_s3_load_ratio: throughput of a checkpoint save (serialize,
  checksum, upload parts, commit manifest, prune) and of a load (list, read manifest, download, verify,
  deserialize) against a moto server on loopback, over raw boto3 upload_fileobj / download_fileobj of
  the same bytes (default TransferConfig); the median ratio of S3_REPEATS back-to-back rounds.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from trainer.loop.checkpoint import Checkpointer, from_bytes, to_bytes  # noqa: E402
from trainer.loop.config import TrainConfig  # noqa: E402
from trainer.loop.data import build_dataset  # noqa: E402
from trainer.loop.model import build_gpt  # noqa: E402
from trainer.loop.storage import open_store  # noqa: E402
from trainer.loop.optim import lr_factor  # noqa: E402
from trainer.loop.train import train  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # the device `train` picks
STEPS = 520  # past the default checkpoint interval (500), so one periodic and the final checkpoint are in
MODEL, BATCH = "gpt-tiny", 64
REPEATS = 5
S3_REPEATS = 5
BLOCKING_REPEATS = 5
FSDP_REPEATS = 2


def clock() -> float:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()
        return time.perf_counter()
    return time.process_time()


def bare_loop(steps: int) -> float:
    """nanoGPT-style loop: the same model, data, batch, optimizer, clipping and LR schedule; nothing else."""
    started = clock()
    torch.manual_seed(0)
    model = build_gpt(MODEL).to(DEVICE)
    dataset = build_dataset(TrainConfig(model=MODEL), model)
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, shuffle=True, drop_last=True)
    defaults = TrainConfig()
    optimizer = torch.optim.AdamW(model.parameters(), lr=defaults.lr, betas=(0.9, 0.95), weight_decay=0.1)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, defaults.warmup_steps, steps))
    batches = iter(loader)
    for _ in range(steps):
        x, y = (t.to(DEVICE) for t in next(batches))
        loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), defaults.clip_grad)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        schedule.step()
    return clock() - started


def trainer_run(steps: int, workdir: Path) -> float:
    cfg = TrainConfig(steps=steps, batch_size=BATCH, model=MODEL, checkpoint_uri=str(workdir / "ck"),
                      metrics_file=str(workdir / "metrics.jsonl"))
    started = clock()
    with open(workdir / "progress.log", "w") as log, contextlib.redirect_stderr(log):
        assert train(cfg) == 0
    return clock() - started


def interleaved(first, second, rounds: int) -> list[float]:
    """first(), second(), first(), second(), ..., first(): each round's second over the mean of the firsts
    either side of it."""
    a = [first()]
    ratios = []
    for _ in range(rounds):
        b = second()
        a.append(first())
        ratios.append(b / ((a[-2] + a[-1]) / 2))
    return ratios


def figure(name: str, ratios: list[float], target: str) -> dict[str, dict]:
    return {name: {"value": statistics.median(ratios), "unit": "ratio", "target": target},
            f"{name}_spread": {"value": max(ratios) - min(ratios), "unit": "ratio", "target": "info"}}


def overhead() -> list[float]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            runs = iter(range(1000))

            def ours() -> float:
                workdir = Path(tmp) / str(next(runs))
                workdir.mkdir()
                return trainer_run(STEPS, workdir)

            return interleaved(lambda: bare_loop(STEPS), ours, REPEATS)
    finally:
        torch.set_num_threads(threads)


def blocking_state() -> dict:
    """Weights and AdamW moments after one step of a 19M-parameter GPT: about 230 MB."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from trainer.loop.model import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=256, n_layer=6, n_head=8, n_embd=512))
    optimizer = torch.optim.AdamW(model.parameters())
    x = torch.randint(0, 256, (2, 16))
    model(x, x).backward()
    optimizer.step()
    model_state, optim_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optim": optim_state}


def checkpoint_blocking() -> tuple[list[float], float]:
    """(ratios, bytes of state): async blocking seconds over sync save seconds, interleaved; torch's default
    intra-op threads, as `train` runs."""
    from trainer.loop.dcp import ShardedCheckpoints

    state = blocking_state()
    size = sum(t.numel() * t.element_size() for part in (state["model"], state["optim"]["state"])
               for t in (part.values() if part is state["model"] else
                         (v for s in part.values() for v in s.values())) if isinstance(t, torch.Tensor))
    with tempfile.TemporaryDirectory() as tmp:
        checkpoints = Checkpointer(open_store(tmp), keep=2)
        sync = ShardedCheckpoints(checkpoints, torch.device("cpu"), background=False)
        background = ShardedCheckpoints(checkpoints, torch.device("cpu"), background=True)
        steps = iter(range(1, 1000))
        try:
            def synchronous() -> float:
                return sync.save(next(steps), state)

            def asynchronous() -> float:
                blocked = background.save(next(steps), state)
                background.wait()  # not counted: the write goes on while training would
                return blocked

            asynchronous()  # uncounted: the first stage allocates the host buffers that later saves reuse
            return interleaved(synchronous, asynchronous, BLOCKING_REPEATS), size
        finally:
            background.close()
            sync.close()


def median_step_time(parallel: str, workdir: Path) -> float:
    metrics = workdir / f"{parallel}.jsonl"
    metrics.unlink(missing_ok=True)
    shutil.rmtree(workdir / parallel, ignore_errors=True)  # a fresh run each round, not a resumed one
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "trainer",
           "train", "--model", "gpt-small", "--steps", "30", "--batch-size", "8", "--parallel", parallel,
           "--checkpoint-every", "0", "--checkpoint-uri", str(workdir / parallel), "--metrics-file", str(metrics)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, capture_output=True, timeout=600)
    times = [json.loads(line)["step_time_s"] for line in metrics.read_text().splitlines()][5:]
    return statistics.median(times)


def fsdp_step() -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        return interleaved(lambda: median_step_time("ddp", Path(tmp)), lambda: median_step_time("fsdp", Path(tmp)),
                           FSDP_REPEATS)


@contextlib.contextmanager
def moto_server():
    """`moto_server` on a free loopback port, in its own process; yields its URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{url}/moto-api/", timeout=1)
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("moto server did not start")
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


BENCH_AWS = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "eu-west-1",
             "AWS_EC2_METADATA_DISABLED": "true"}


@contextlib.contextmanager
def patched_environ(**values: str):
    """os.environ with ``values`` set while the block runs, as it was afterwards."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def moto_aws():
    """A moto server, and the bench's credentials and its endpoint in os.environ; yields its URL."""
    with moto_server() as url, patched_environ(**BENCH_AWS, AWS_ENDPOINT_URL=url):
        yield url


def checkpoint_state() -> dict[str, object]:
    """A real checkpoint's content: gpt-base weights and AdamW state after one step (about 130 MB)."""
    torch.manual_seed(0)
    model = build_gpt("gpt-base")
    optimizer = torch.optim.AdamW(model.parameters())
    x = torch.randint(0, 256, (2, 16))
    model(x, x).backward()
    optimizer.step()
    return {"model.pt": model.state_dict(), "optim.pt": {"optimizer": optimizer.state_dict()}}


def s3_ratios() -> tuple[float, float]:
    import boto3

    state = checkpoint_state()
    with moto_aws():
        s3 = boto3.client("s3")
        s3.create_bucket(Bucket="bench", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
        checkpoints = Checkpointer(open_store("s3://bench/ours"), keep=1)
        blobs = {name: to_bytes(obj) for name, obj in state.items()}
        raw_save, raw_load, save, load = [], [], [], []
        for step in range(1, S3_REPEATS + 1):
            started = time.perf_counter()
            for name, data in blobs.items():
                s3.upload_fileobj(io.BytesIO(data), "bench", f"raw/{name}")
            raw_save.append(time.perf_counter() - started)

            started = time.perf_counter()
            checkpoints.save(step, state)
            save.append(time.perf_counter() - started)

            started = time.perf_counter()
            for name in blobs:
                s3.download_fileobj("bench", f"raw/{name}", io.BytesIO())
            raw_load.append(time.perf_counter() - started)

            started = time.perf_counter()
            _, parts = checkpoints.load_latest()
            loaded = {name: from_bytes(data) for name, data in parts.items()}
            load.append(time.perf_counter() - started)
            assert torch.equal(loaded["model.pt"]["tok.weight"], state["model.pt"]["tok.weight"])
        return (statistics.median(r / o for r, o in zip(raw_save, save)),
                statistics.median(r / o for r, o in zip(raw_load, load)))


def s3_dcp_candidates() -> list[float]:
    """Per round: (boto3 DCP writer save + load seconds) / (s3torchconnector save + load seconds)."""
    import boto3
    import torch.distributed.checkpoint as dcp

    from trainer.loop.dcp import StoreReader, StoreWriter

    state = checkpoint_state()
    with moto_aws():
        boto3.client("s3").create_bucket(Bucket="bench",
                                         CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
        store = open_store("s3://bench/dcp")
        rounds = iter(range(1000))

        def through(writer, reader) -> float:
            started = time.perf_counter()
            dcp.save(state, storage_writer=writer, no_dist=True)
            dcp.load(state, storage_reader=reader, no_dist=True)
            return time.perf_counter() - started

        def crt() -> float:
            key = f"crt-{next(rounds)}"
            return through(store.dcp_writer(key), store.dcp_reader(key))

        def boto() -> float:
            key = f"boto-{next(rounds)}"
            return through(StoreWriter(store, key), StoreReader(store, key))

        return interleaved(crt, boto, S3_REPEATS)


def run() -> dict[str, dict]:
    os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")  # no metadata service to poll here
    save, load = s3_ratios()
    blocking, size = checkpoint_blocking()
    assert size >= 200e6, size
    return {
        **figure("trainer_overhead_ratio", overhead(), "<= 1.03"),
        "checkpoint_s3_save_ratio": {"value": save, "unit": "ratio", "target": ">= 0.9"},
        "checkpoint_s3_load_ratio": {"value": load, "unit": "ratio", "target": ">= 0.9"},
        **figure("checkpoint_blocking_ratio", blocking, "<= 0.1"),
        **figure("fsdp_step_ratio", fsdp_step(), "info"),
        **figure("checkpoint_dcp_s3_crt_speedup", s3_dcp_candidates(), "info"),
    }


if __name__ == "__main__":
    for name, fig in run().items():
        print(f"{name:32} {fig['value']:.4g} {fig['unit']} target {fig['target']}")
