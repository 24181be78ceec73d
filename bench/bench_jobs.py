"""Job runtime figures, on a private Docker daemon (tests/trainer/dockerd.py: the example image from a local base,
the host's Python mounted into it) and a moto server on loopback.

- container_job_overhead_s: from the agent starting an attempt to the user's first line of output, for a container
  job minus the same for a code-bundle job (bundle downloaded once, unpacked every attempt), median of ROUNDS
  alternating pairs; the user program prints at once, so this is the runtime's own cost, not torch's import.
  container_first_line_s and code_first_line_s are the two medians.
- code_bundle_upload_s: `submit --workdir`'s pack and upload of a 50 MB directory (50 files of random bytes) to S3;
  code_bundle_resubmit_s: the same submit again, which finds the bundle by its SHA-256 and uploads nothing.
- jobs_list_s: reading 1,000 job records for `gpufleet jobs list` (through the records' index) against a moto server
  in a process of its own, median of ROUNDS; jobs_list_cli_s: the whole `gpufleet jobs list --format json`
  command (interpreter start included); jobs_scan_s: the same 1,000 records read one by one in parallel,
  without the index (what a bucket written before the index costs).
- cancel_to_stopped_s: a running built-in trainer job (real train process, moto server) cancelled as `gpufleet jobs
  cancel` does (its record's cancel_requested): from the record write to the agent done with it (stopped at a
  checkpoint, message deleted, record cancelled). Target: the stop grace (DEFAULT_GRACE_S) + 5 s.
- gang_fail_fast_s: a 2-node gang (two agents, each with its fake IMDS, real 2-node torchrun on CPU) whose node-1
  rank exits 3 while the head's rank waits (as a rank in a collective with a dead peer does): from node 1's agent
  seeing its part fail to the head's part stopped, from the agents' log times.
"""
from __future__ import annotations

import datetime
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


def first_line_s(agent, job) -> float:
    started = time.perf_counter()
    run = agent.start(job, 1, 1, 0, "127.0.0.1:29400", None)
    line = run.proc.stdout.readline()
    elapsed = time.perf_counter() - started
    assert line.strip() == b"first line", line
    assert run.wait() == 0
    return elapsed


JOBS = 1000


def list_figures() -> dict[str, dict]:
    import boto3

    from bench.bench_trainer import moto_aws
    from trainer.jobs.records import RecordStore
    from trainer.jobs.spec import Job

    with moto_aws():
        boto3.client("s3").create_bucket(Bucket="bench-jobs",
                                         CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
        rs = RecordStore.of_bucket("bench-jobs")

        def submitted(i: int) -> None:  # a third of them running
            job_id = f"sweep.lr-{i:04d}"
            rs.create(Job(job_id, args=("--steps", "100", "--lr", str(i))).to_dict())
            if i % 3 == 0:
                rs.claimed(job_id, {"node": f"i-{i:04x}", "instance_type": "g5.xlarge", "gpus": 1})

        with ThreadPoolExecutor(4) as pool:
            list(pool.map(submitted, range(JOBS)))
        listed, scanned = [], []
        for _ in range(ROUNDS):
            started = time.perf_counter()
            assert len(RecordStore.of_bucket("bench-jobs").all()) == JOBS
            listed.append(time.perf_counter() - started)
        started = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "infra.cli", "jobs", "list", "--bucket", "bench-jobs",
                               "--format", "json"], cwd=ROOT, capture_output=True, text=True)
        cli_s = time.perf_counter() - started
        assert proc.returncode == 0 and proc.stdout.count('"job_id"') == JOBS, proc.stderr[-500:]
        started = time.perf_counter()
        assert len(RecordStore.of_bucket("bench-jobs").all(scan=True)) == JOBS
        scanned.append(time.perf_counter() - started)
    return {
        "jobs_list_s": {"value": statistics.median(listed), "unit": "s", "target": f"<= 2 ({JOBS} records)"},
        "jobs_list_cli_s": {"value": cli_s, "unit": "s", "target": ""},
        "jobs_scan_s": {"value": scanned[0], "unit": "s", "target": ""},
    }


def cancel_to_stopped_s(work: Path) -> float:
    import threading

    import boto3

    from tests.trainer.gated import TRAIN, steps
    from trainer.clouds.aws import SqsJobQueue
    from trainer.jobs import records
    from trainer.jobs.records import RecordStore
    from trainer.jobs.spec import Job
    from trainer.node.agent import Agent
    from trainer.node.emf import Emitter

    boto3.client("s3").create_bucket(Bucket="bench-cancel",
                                     CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    url = boto3.client("sqs").create_queue(QueueName="bench-cancel")["QueueUrl"]
    rs = RecordStore.of_bucket("bench-cancel")
    job = Job("long", args=(*TRAIN, "--steps", "100000"))
    rs.create(job.to_dict())
    SqsJobQueue(url).send(job.to_json())
    agent = Agent(SqsJobQueue(url), "bench-cancel", {}, work / "cancel", wait_s=0, nproc=0,
                  emitter=Emitter("gpufleet/bench", open(os.devnull, "w")), job_stdout=subprocess.DEVNULL)
    result = []
    thread = threading.Thread(target=lambda: result.append(agent.serve(once=True)))
    thread.start()
    metrics = work / "cancel" / "jobs" / "long" / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not steps(metrics) and time.monotonic() < deadline:
        time.sleep(0.05)
    started = time.perf_counter()
    rs.update("long", lambda rec: records.cancel(rec, time.time())[0])
    thread.join(300)
    stopped = time.perf_counter() - started
    assert result == [0] and rs.get("long")["state"] == "cancelled", (result, rs.get("long")["state"])
    return stopped


def _log_time(err: str, text: str) -> float:
    """The time of the agent's first log line containing ``text`` (`%(asctime)s`: 2026-12-01 12:51:37,251)."""
    line = next(ln for ln in err.splitlines() if text in ln)
    return datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()


def gang_fail_fast_s() -> float:
    from bench.bench_trainer import moto_aws
    from infra.demo.imds import FakeImds
    from tests.conftest import free_port
    from tests.trainer.aws import send
    from tests.trainer.gated import DIE, GATE, TRAIN
    from tests.trainer.test_agent_gang import finish, gang_cluster, start_agent

    with moto_aws(), tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        sqs, queue, ((head_id, head_ip), (worker_id, worker_ip)), node_json = gang_cluster(work)
        send(sqs, queue, "bench-gang", [*TRAIN, "--steps", "1000"])
        flags = ["--rdzv-port", str(free_port()), "--gang-timeout", "60"]
        env = {GATE: f"{work / 'never'}:1", DIE: "1:1:3"}
        with FakeImds(instance_id=head_id, private_ip=head_ip) as head_imds, \
                FakeImds(instance_id=worker_id, private_ip=worker_ip) as worker_imds:
            worker = start_agent(node_json, worker_imds, work / "w", *flags, env=env)
            head = start_agent(node_json, head_imds, work / "h", *flags, env=env)
            (head_rc, head_err), (worker_rc, worker_err) = finish(head), finish(worker)
        assert (head_rc, worker_rc) == (1, 1), head_err + worker_err
        failed = _log_time(worker_err, "this node's part failed with exit status")
        stopped = _log_time(head_err, "this node's part stopped")
        return stopped - failed


def run() -> dict[str, dict]:
    import boto3

    from trainer.node.runner import DEFAULT_GRACE_S

    from bench.bench_trainer import moto_aws, patched_environ
    from tests.trainer.dockerd import EXAMPLE_IMAGE, host_python_flags, running_dockerd
    from trainer.jobs import bundle
    from trainer.jobs.spec import Job
    from trainer.node.agent import Agent

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
        uri, sent = bundle.upload(bundle.pack(big), "bench")
        upload_s = time.perf_counter() - started
        started = time.perf_counter()
        again, sent_again = bundle.upload(bundle.pack(big), "bench")
        resubmit_s = time.perf_counter() - started
        assert sent and not sent_again and again == uri

        small = work / "small"
        small.mkdir()
        (small / "main.py").write_text(FIRST_LINE + "\n")
        code_uri, _ = bundle.upload(bundle.pack(small), "bench")
        agent = Agent(None, "bench", {}, work / "agent", nproc=0, container_extra=host_python_flags(),
                      job_stdout=subprocess.PIPE)
        image_job = Job("bench-image", "image", image=EXAMPLE_IMAGE, command=("python", "-c", FIRST_LINE))
        code_job = Job("bench-code", "code", code=code_uri, command=("python", "main.py"))
        container, code = [], []
        for i in range(ROUNDS):
            for job, into in ((image_job, container), (code_job, code))[:: 1 if i % 2 == 0 else -1]:
                into.append(first_line_s(agent, job))
    with moto_aws(), tempfile.TemporaryDirectory() as tmp:
        cancel_s = cancel_to_stopped_s(Path(tmp))
    fail_fast_s = gang_fail_fast_s()
    container_s, code_s = statistics.median(container), statistics.median(code)
    return {
        **list_figures(),
        "gang_fail_fast_s": {"value": fail_fast_s, "unit": "s", "target": "<= 60"},
        "cancel_to_stopped_s": {"value": cancel_s, "unit": "s", "target": f"<= {DEFAULT_GRACE_S + 5} (grace + 5)"},
        "container_job_overhead_s": {"value": container_s - code_s, "unit": "s", "target": "< 1.5"},
        "container_first_line_s": {"value": container_s, "unit": "s", "target": ""},
        "code_first_line_s": {"value": code_s, "unit": "s", "target": ""},
        "code_bundle_upload_s": {"value": upload_s, "unit": "s", "target": "< 10 (50 MB)"},
        "code_bundle_resubmit_s": {"value": resubmit_s, "unit": "s", "target": "no upload"},
    }
