"""`python -m trainer task`: one node's part of a job under Slurm (the batch script's srun starts one per node).

It runs the job's command (kind trainer: the built-in trainer; image: a container; code: the bundle with the
node's Python) with the job environment (trainer.node.runner.job_environment) derived from Slurm's:
GPUFLEET_NNODES (SLURM_JOB_NUM_NODES), GPUFLEET_NODE_RANK (SLURM_NODEID), GPUFLEET_RDZV_ENDPOINT (the first
node of the allocation through its NodeAddr, a port derived from the job id), GPUFLEET_ATTEMPT (the first
attempt of this submission plus Slurm's restart count); Slurm's SLURM_* stay too.

The stop contract is the same as ever: Slurm's SIGTERM (a requeue after a notice, a cancel, the time limit)
reaches this process through srun; it writes the stop file and passes the SIGTERM on; the job checkpoints and
exits 75, which Slurm requeues (RequeueExit=75). The output of each node's part is shipped to
``teams/<team>/jobs/<id>/logs/<attempt>/<node>/`` (the team: the job's Slurm account, --team; what `gpufleet jobs
logs` reads) and still goes to Slurm's output file; node rank 0 writes the job's progress into its record.
"""
from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path

from trainer import EXIT_OK, EXIT_PREEMPTED
from trainer.errors import ArgumentParser, UsageError
from trainer.jobs import bundle
from trainer.jobs.layout import DEFAULT_TEAM, job_uri
from trainer.jobs.records import RecordStore
from trainer.jobs.spec import Job, hidden_names, validate
from trainer.loop.config import TrainConfig, parse_args
from trainer.loop.storage import open_store
from trainer.node import container, emf, metric_names, node_schema
from trainer.node.platform import open_platform
from trainer.node.runner import (CONTROL_DIR, SCRATCH, STOP_FILE, ProcessGroupRun, Running, TrainerRun,
                                 code_environment, container_user, job_environment, job_scratch, stop_grace)
from trainer.node.tracking import Output, Tracking
from trainer.slurm import batch, client

log = logging.getLogger("gpufleet.task")

PORT_BASE, PORT_SPAN = 20000, 20000
EXIT_FAILED = 1
RDZV_TIMEOUT_S = 600  # a gang's other nodes wait this long for node rank 0's store
EMF_LOG = "/var/log/gpufleet/metrics.log"  # the CloudWatch agent ships /var/log/gpufleet/*.log


def rdzv_port(slurm_job_id: int) -> int:
    """A port per job, so that two jobs sharing a first node do not collide."""
    return PORT_BASE + slurm_job_id % PORT_SPAN


def trainer_args(job: Job, checkpoint_uri: str, metrics_path: str) -> tuple[list[str], str, str]:
    """The job's train flags with the node's defaults: (args, checkpoint URI, metrics file)."""
    cfg = parse_args(list(job.args))
    args = list(job.args)
    uri, metrics = cfg.checkpoint_uri, cfg.metrics_file
    if uri == TrainConfig.checkpoint_uri:  # not chosen by the job: its own prefix in the cluster bucket
        uri = checkpoint_uri
        args += ["--checkpoint-uri", uri]
    if metrics is None:
        metrics = metrics_path
        args += ["--metrics-file", metrics]
    return args, uri, metrics


def saved_step(uri: str) -> int | None:
    """The newest committed checkpoint's step at ``uri`` (steps done after it are done again on resume)."""
    from trainer.loop.checkpoint import Checkpointer  # lazy: torch, only for a stopped job's step

    saved = Checkpointer(open_store(uri), keep=1).steps()
    return saved[0] if saved else None


def open_emitter(path: str | None, node: dict, dimensions: dict[str, str]):
    """The EMF emitter of this task, appending to ``path`` (the CloudWatch agent ships /var/log/gpufleet/*.log to
    the stack's log group); None, with a warning, where the file cannot be written (the job runs without)."""
    if not path:
        return None
    try:
        out = open(path, "a", buffering=1)
    except OSError as exc:
        log.warning("metrics: %s cannot be written (%s); the job runs without EMF metrics", path, exc.strerror)
        return None
    namespace = node.get("metric_namespace") or metric_names.namespace(node.get("stack", "default"))
    return emf.Emitter(namespace, out, dimensions)


def trainer_command(args: list[str], nproc: int, nnodes: int, node_rank: int, rdzv: str, run_id: str) -> list[str]:
    """torchrun (through trainer.node.launch, which keeps exit 75) over this node's GPUs, its node rank in the
    job's static rendezvous (Slurm gave every node its rank; node rank 0 hosts the store); one plain process on a
    single node without GPUs."""
    if nproc == 0 and nnodes == 1:
        return [sys.executable, "-m", "trainer", "train", *args]
    rendezvous = ["--standalone"] if nnodes == 1 else [
        "--nnodes", str(nnodes), "--node-rank", str(node_rank), "--rdzv-backend", "static",
        "--rdzv-endpoint", rdzv, "--rdzv-id", run_id, "--rdzv-conf", f"timeout={RDZV_TIMEOUT_S}"]
    return [sys.executable, "-m", "trainer.node.launch", *rendezvous, "--nproc-per-node", str(max(1, nproc)),
            "-m", "trainer", "train", *args]


def slurm_facts(environ) -> dict:
    """What the task needs of Slurm's environment."""
    try:
        return {"job_id": int(environ.get("SLURM_ARRAY_JOB_ID") or environ["SLURM_JOB_ID"]),
                "own_id": int(environ["SLURM_JOB_ID"]),
                "index": int(environ.get("SLURM_ARRAY_TASK_ID") or 0),
                "nnodes": int(environ.get("SLURM_JOB_NUM_NODES") or environ.get("SLURM_NNODES") or 1),
                "node_rank": int(environ.get("SLURM_NODEID") or 0),
                "restarts": int(environ.get("SLURM_RESTART_COUNT") or 0),
                "nodelist": environ.get("SLURM_JOB_NODELIST") or "",
                "node": environ.get("SLURMD_NODENAME") or os.uname().nodename}
    except (KeyError, ValueError) as exc:
        raise UsageError(f"task: not inside a Slurm job (SLURM_JOB_ID missing or bad: {exc})") from None


class Task:
    """One node's part of one attempt."""

    def __init__(self, job: Job, attempt: int, slurm: dict, bucket: str, gpus: int, work_dir: Path,
                 node: dict | None = None, emf_log: str | None = None, emf_interval_s: float = 60.0,
                 platform=None, container_extra: tuple[str, ...] = (), team: str | None = None):
        self.job, self.attempt, self.slurm, self.bucket, self.gpus = job, attempt, slurm, bucket, gpus
        self.team = team  # the job's (its Slurm account, which the batch script names); None: the default team
        self.node = node or {}
        self.platform = platform  # trainer.node.platform's; None: this node's (open_platform)
        self.container_extra = tuple(container_extra)  # tests only: extra `docker run` flags (host mounts)
        self.dir = work_dir / "jobs" / job.job_id
        self.emf_log, self.emf_interval_s = emf_log, emf_interval_s
        self.uri = job_uri(bucket, team, job.job_id)  # s3://, an Azure container URL, cos://
        self.run: Running | None = None
        self.scratch: Path | None = None  # the attempt's own scratch directory (image and code jobs), removed after
        self.stop_asked = False

    @property
    def records(self) -> RecordStore:
        # the job's team's records; the bridge keeps the index (records.py)
        return RecordStore.of_bucket(self.bucket, self.team, index=False)

    def rdzv(self) -> str:
        first = client.hostnames(self.slurm["nodelist"])[0] if self.slurm["nnodes"] > 1 else "localhost"
        addr = client.node_addr(first) if self.slurm["nnodes"] > 1 else "127.0.0.1"
        return f"{addr}:{rdzv_port(self.slurm['own_id'])}"

    def stop(self, signum=None, frame=None) -> None:
        """Slurm's SIGTERM: the stop file and SIGTERM to the job, SIGKILL after the grace (Slurm's KillWait ends
        it anyway)."""
        self.stop_asked = True
        run = self.run
        if run is not None:
            run.stop(stop_grace(self.node.get("cloud")))

    def start(self, platform, output) -> Running:
        job, slurm = self.job, self.slurm
        control = self.dir / "control"
        control.mkdir(parents=True, exist_ok=True)
        (control / STOP_FILE).unlink(missing_ok=True)
        if hidden_names(job):  # the bridge fills them in before sbatch
            raise UsageError(f"task: env {', '.join(hidden_names(job))}: the values did not come with the job")
        values = {k: v for k, v in job.env.items() if isinstance(v, str)}
        secrets = {k: platform.secret(*next(iter(v.items()))) for k, v in job.env.items() if not isinstance(v, str)}
        # the job's own credentials (the TaskProlog's: trainer.node.jobcreds) go into its container, the token by name
        if job.kind == "image" and container.CREDENTIALS_TOKEN in os.environ:
            values[container.CREDENTIALS_URI] = os.environ[container.CREDENTIALS_URI]
            secrets[container.CREDENTIALS_TOKEN] = os.environ[container.CREDENTIALS_TOKEN]
        rdzv = self.rdzv()
        popen = output.popen_kw() if output else {}

        def spawn(cmd, **kw):
            proc = subprocess.Popen(cmd, start_new_session=True, **popen, **kw)
            if output:
                output.follow(proc)
            return proc

        if job.kind == "trainer":
            metrics = str(self.dir / f"metrics-{self.attempt}.jsonl")
            args, self.uri, self.metrics = trainer_args(job, self.uri, metrics)
            nproc = self.gpus if job.gpus_per_node is None else min(job.gpus_per_node, self.gpus)
            env = job_environment(job.job_id, self.attempt, self.uri, slurm["nnodes"], slurm["node_rank"],
                                  max(1, nproc), rdzv, str(control / STOP_FILE), values)
            cmd = trainer_command(args, nproc, slurm["nnodes"], slurm["node_rank"], rdzv,
                                  f"{slurm['own_id']}-{slurm['restarts']}")
            log.info("running %s", " ".join(cmd))
            return TrainerRun(spawn(cmd, env={**os.environ, **env, **secrets}), control / STOP_FILE,
                              workers=cmd[2] == "trainer.node.launch")
        self.metrics = None
        gpus = self.gpus if job.gpus_per_node is None else min(job.gpus_per_node, self.gpus)
        inside = CONTROL_DIR if job.kind == "image" else str(control)
        env = job_environment(job.job_id, self.attempt, self.uri, slurm["nnodes"], slurm["node_rank"], max(1, gpus),
                              rdzv, f"{inside}/{STOP_FILE}", values)
        user = container_user(os.getuid(), os.getgid()) if job.kind == "image" else (os.getuid(), os.getgid())
        shared = Path(SCRATCH) / "jobs"
        self.scratch = job_scratch(shared if shared.is_dir() else self.dir, self.attempt, user)
        env["GPUFLEET_SCRATCH"] = SCRATCH if job.kind == "image" else str(self.scratch)
        if job.kind == "image":
            if user != (os.getuid(), os.getgid()):  # the job writes its control directory (the task never follows
                os.chown(control, *user, follow_symlinks=False)  # a link in it: Running.signal_stop)
            # the launcher (trainer.node.container: this user is not in the docker group) starts it as this user
            request = container.make_request(
                f"{job.job_id}-{self.attempt}-{uuid.uuid4().hex[:6]}"[-120:].lstrip("-_."), job.image,
                list(job.command), {**env, **secrets}, tuple(secrets), job.gpus_per_node, self.gpus,
                stop_grace(self.node.get("cloud")), str(control), str(self.scratch),
                platform.registry_login(job.image), self.container_extra)
            return container.start(request, control / STOP_FILE, spawn)
        archive = bundle.fetch(job.code, self.dir.parent.parent / "bundles")
        code = bundle.unpack(archive, self.dir / "code")
        log.info("running %s in %s", " ".join(job.command), code)
        run_env = code_environment(dict(os.environ), {"TMPDIR": str(self.scratch), **env, **secrets},
                                   os.path.dirname(sys.executable))
        return ProcessGroupRun(spawn(list(job.command), env=run_env, cwd=code), control / STOP_FILE)

    def __call__(self) -> int:
        platform = self.platform or open_platform(self.node)
        output = None
        try:
            output = Output(self.records, self.job.job_id, self.attempt, self.slurm["node"],
                            self.dir / f"output-{self.attempt}-{self.slurm['node']}.log")
        except Exception as exc:
            log.warning("job %s: its output will not be shipped (%s)", self.job.job_id, exc)
        emitter = open_emitter(self.emf_log, self.node, platform.metric_dimensions())
        watchers = []  # EMF: this node's GPU utilisation; rank 0 summarises the train run's metrics file
        tail = None
        try:
            try:
                run = self.start(platform, output)
            except UsageError:
                raise
            except Exception as exc:  # a bundle, secret or command that cannot be had or started: the job fails
                log.error("job %s: cannot start: %s", self.job.job_id, exc)
                return EXIT_FAILED
            self.run = run
            if self.stop_asked:
                self.stop()
            rank0 = self.slurm["node_rank"] == 0
            if emitter:
                watchers.append(emf.GpuSampler(emitter, self.emf_interval_s).start())
                if rank0 and self.metrics:
                    tail = emf.MetricsTail(self.metrics, emitter, self.emf_interval_s).start()
                    watchers.append(tail)
            if rank0 and self.metrics:
                watchers.append(Tracking(self.records, self.job.job_id, self.metrics, _total_steps(self.job),
                                         gpu_util=emf.gpu_utilisation).start())
            rc = run.wait()
        finally:
            for w in reversed(watchers):
                w.close()
            if output:
                output.close()
            if self.scratch is not None:  # removed without following a link the job left in it
                shutil.rmtree(self.scratch, ignore_errors=True)
        if run.stop_requested and rc != EXIT_OK:
            log.warning("job %s: stopped (exit %d): requeued from its newest checkpoint", self.job.job_id, rc)
            if emitter and tail:
                saved = saved_step(self.uri)
                lost = max(0, (tail.last_step or 0) - (saved or 0))
                emitter.emit({metric_names.PREEMPTIONS: 1.0, metric_names.STEPS_LOST: float(lost)})
            return EXIT_PREEMPTED
        return 0 if rc == 0 else (rc if 0 < rc < 256 else EXIT_FAILED)


def _total_steps(job: Job) -> int | None:
    try:
        return parse_args(list(job.args)).steps
    except UsageError:
        return None


def parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m trainer task", description="One node's part of a job under Slurm (the "
                       "batch script runs it through srun).")
    p.add_argument("--bucket", required=True, help="the stack's bucket")
    p.add_argument("--team", help="the job's team, its Slurm account (default: the default team)")
    p.add_argument("--gpus", type=int, default=0, help="GPUs of this node the job gets")
    p.add_argument("--spec", required=True, help="the job's spec and first attempt, base64 JSON")
    p.add_argument("--work-dir", default=os.environ.get("GPUFLEET_WORK_DIR", "/var/lib/gpufleet"),
                   help="where the job's files live on this node, each team's in WORK_DIR/teams/<team>/ (default "
                        "GPUFLEET_WORK_DIR or %(default)s)")
    p.add_argument("--emf-log", default=os.environ.get("GPUFLEET_EMF_LOG", EMF_LOG),
                   help="the EMF metrics file the CloudWatch agent ships (default GPUFLEET_EMF_LOG or %(default)s)")
    return p


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    slurm = slurm_facts(os.environ)
    try:
        entry = batch.decode(args.spec)
        entry["spec"]
    except (ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"task: --spec: not a job's spec ({type(exc).__name__}: {exc})") from None
    job = validate(entry["spec"])
    attempt = int(entry.get("first_attempt") or 1) + slurm["restarts"]
    node = node_schema.load(node_schema.PATH) if Path(node_schema.PATH).exists() else {}
    # the team's own directory (its user's home, 0700: setup, or the box, makes it); a node of the box each its own
    work_dir = Path(args.work_dir) / "teams" / (args.team or DEFAULT_TEAM) / "nodes" / slurm["node"]
    log.info("job %s: attempt %d, node %s (rank %d of %d)", job.job_id, attempt, slurm["node"],
             slurm["node_rank"], slurm["nnodes"])
    task = Task(job, attempt, slurm, args.bucket, args.gpus, work_dir, node, args.emf_log, team=args.team)
    signal.signal(signal.SIGTERM, task.stop)  # Slurm's stop, forwarded by srun
    return task()
