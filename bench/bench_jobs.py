"""Job runtime figures, on a private Docker daemon (tests/trainer/dockerd.py: the example image from a local base,
the host's Python mounted into it) and a moto server on loopback.

- container_job_overhead_s: from a node's task (trainer.slurm.task, what srun starts on each node of a job) starting
  an attempt to the user's first line of output, for a container job minus the same for a code-bundle job (bundle
  downloaded once, unpacked every attempt), median of ROUNDS alternating pairs; the user program prints at once, so
  this is the runtime's own cost, not torch's import. container_first_line_s and code_first_line_s are the two
  medians.
- code_bundle_upload_s: `submit --workdir`'s pack and upload of a 50 MB directory (50 files of random bytes) to S3;
  code_bundle_resubmit_s: the same submit again, which finds the bundle by its SHA-256 and uploads nothing.
- jobs_list_s: reading 1,000 job records for `gpufleet jobs list` (through the records' index) against a moto server
  in a process of its own, median of ROUNDS; jobs_list_cli_s: the whole `gpufleet jobs list --format json`
  command (interpreter start included); jobs_scan_s: the same 1,000 records read one by one in parallel,
  without the index (what a bucket written before the index costs).
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

ROUNDS = 3
FIRST_LINE = "import sys; print('first line', flush=True)"
MB = 1000 * 1000
SLURM = {"job_id": 1, "own_id": 1, "index": 0, "nnodes": 1, "node_rank": 0, "restarts": 0, "nodelist": "bench-1",
         "node": "bench-1"}  # a one-node job's Slurm facts (trainer.slurm.task.slurm_facts)


class PipedOutput:
    """The task's output as the benchmark reads it: the job's stdout piped here (as the task's own Output pipes it)."""

    def popen_kw(self) -> dict:
        return {"stdout": subprocess.PIPE}

    def follow(self, proc) -> None:
        pass


def first_line_s(task) -> float:
    from trainer.node.platform import Platform

    started = time.perf_counter()
    run = task.start(Platform(), PipedOutput())
    line = run.proc.stdout.readline()
    elapsed = time.perf_counter() - started
    assert line.strip() == b"first line", line
    assert run.wait() == 0
    return elapsed


JOBS = 1000


def list_figures() -> dict[str, dict]:
    import boto3

    from bench.bench_trainer import moto_aws
    from trainer.jobs import records
    from trainer.jobs.records import RecordStore
    from trainer.jobs.spec import Job

    with moto_aws():
        boto3.client("s3").create_bucket(Bucket="bench-jobs",
                                         CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
        rs = RecordStore.of_bucket("bench-jobs", None)

        def submitted(i: int) -> None:  # a third of them running, as the bridge records a job Slurm started
            job_id = f"sweep.lr-{i:04d}"
            rs.create(Job(job_id, args=("--steps", "100", "--lr", str(i))).to_dict())
            if i % 3 == 0:
                attempt = {"nodes": [f"gpu-{i}"], "instance_type": "g5.xlarge", "gpus": 1}
                rs.update(job_id, lambda rec: records.claim(rec, attempt, time.time()))

        with ThreadPoolExecutor(4) as pool:
            list(pool.map(submitted, range(JOBS)))
        listed, scanned = [], []
        for _ in range(ROUNDS):
            started = time.perf_counter()
            assert len(RecordStore.of_bucket("bench-jobs", None).all()) == JOBS
            listed.append(time.perf_counter() - started)
        started = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "infra.cli", "jobs", "list", "--bucket", "bench-jobs",
                               "--format", "json"], cwd=ROOT, capture_output=True, text=True)
        cli_s = time.perf_counter() - started
        assert proc.returncode == 0 and proc.stdout.count('"job_id"') == JOBS, proc.stderr[-500:]
        started = time.perf_counter()
        assert len(RecordStore.of_bucket("bench-jobs", None).all(scan=True)) == JOBS
        scanned.append(time.perf_counter() - started)
    return {
        "jobs_list_s": {"value": statistics.median(listed), "unit": "s", "target": f"<= 2 ({JOBS} records)"},
        "jobs_list_cli_s": {"value": cli_s, "unit": "s", "target": ""},
        "jobs_scan_s": {"value": scanned[0], "unit": "s", "target": ""},
    }


def run() -> dict[str, dict]:
    import boto3

    from bench.bench_trainer import moto_aws, patched_environ
    from tests.trainer.dockerd import EXAMPLE_IMAGE, host_python_flags, running_dockerd
    from trainer.jobs import bundle
    from trainer.jobs.layout import team_base
    from trainer.jobs.spec import Job
    from trainer.node.platform import Platform
    from trainer.slurm.task import Task

    with moto_aws(), running_dockerd() as docker, tempfile.TemporaryDirectory() as tmp, \
            patched_environ(DOCKER_HOST=docker.host):
        boto3.client("s3").create_bucket(Bucket="bench",
                                         CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
        work = Path(tmp)
        big = work / "big"
        big.mkdir()
        for i in range(50):
            (big / f"part-{i:02d}.bin").write_bytes(os.urandom(MB))
        started = time.perf_counter()
        uri, sent = bundle.upload(bundle.pack(big), team_base("bench", None))
        upload_s = time.perf_counter() - started
        started = time.perf_counter()
        again, sent_again = bundle.upload(bundle.pack(big), team_base("bench", None))
        resubmit_s = time.perf_counter() - started
        assert sent and not sent_again and again == uri

        small = work / "small"
        small.mkdir()
        (small / "main.py").write_text(FIRST_LINE + "\n")
        code_uri, _ = bundle.upload(bundle.pack(small), team_base("bench", None))
        image_job = Job("bench-image", "image", image=EXAMPLE_IMAGE, command=("python", "-c", FIRST_LINE))
        code_job = Job("bench-code", "code", code=code_uri, command=("python", "main.py"))
        container, code = [], []
        for i in range(ROUNDS):
            for job, into in ((image_job, container), (code_job, code))[:: 1 if i % 2 == 0 else -1]:
                task = Task(job, i + 1, SLURM, "bench", 0, work / "node", platform=Platform(),
                            container_extra=host_python_flags())
                into.append(first_line_s(task))
    container_s, code_s = statistics.median(container), statistics.median(code)
    return {
        **list_figures(),
        "container_job_overhead_s": {"value": container_s - code_s, "unit": "s", "target": "< 1.5"},
        "container_first_line_s": {"value": container_s, "unit": "s", "target": ""},
        "code_first_line_s": {"value": code_s, "unit": "s", "target": ""},
        "code_bundle_upload_s": {"value": upload_s, "unit": "s", "target": "< 10 (50 MB)"},
        "code_bundle_resubmit_s": {"value": resubmit_s, "unit": "s", "target": "no upload"},
    }
