"""`python -m trainer agent`: run training jobs from the queue on this node, or on the group (gang mode).

Queue mode, one job at a time: receive a message, check it, protect the instance from scale-in, keep
the message hidden with a heartbeat, run the job through torchrun over all local GPUs (one process
without GPUs), then: done -> delete the message; preempted (exit 75, checkpoint safe) -> hand the
message back at once and complete the terminate lifecycle action; failed -> leave the message to
redelivery and the dead-letter queue. An invalid job is logged and left for the dead-letter queue.

Gang mode (node.json "mode": "gang"; every node of the group runs the agent): the nodes form the gang
from the autoscaling group (trainer.node.rendezvous: head = lowest private IP). Only the head receives; it
publishes the job as s3://<bucket>/gang/assignment.json and runs node rank 0; the others poll that
object and run their node rank, torchrun's store on the head. The head heartbeats, deletes or hands
back the message and clears the assignment; a node that got a stop notice completes its own
terminate hook. Every node is protected from scale-in while its part runs.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from trainer import EXIT_OK, EXIT_PREEMPTED
from trainer.errors import ArgumentParser, UsageError
from trainer.jobs.queue import Job, JobQueue, Message, open_queue, parse_job
from trainer.node import metric_names
from trainer.node.platform import Platform, open_platform
from trainer.node.rendezvous import C10D_PORT, Assignment, Board, Gang, RendezvousError, wait_for_head

log = logging.getLogger("gpufleet.agent")

NODE_JSON = "/etc/gpufleet/node.json"
EXIT_FAILED = 1
CAP_MARGIN_S = 300  # hand the message back this long before SQS's in-flight limit
RETRY_S = 10
GANG_POLL_S = 2.0  # how often a gang node looks at the assignment object


def default_checkpoint_uri(bucket: str, job_id: str) -> str:
    """s3://<bucket>/jobs/<job_id>/; on Azure the bucket is a blob container URL, on Tencent a cos:// URI."""
    if "://" in bucket:
        return f"{bucket.rstrip('/')}/jobs/{job_id}/"
    return f"s3://{bucket}/jobs/{job_id}/"


def job_args(job: Job, bucket: str, metrics_path: str) -> tuple[list[str], str, str]:
    """The job's train flags with the agent's defaults: (args, checkpoint URI, metrics file)."""
    from trainer.loop.config import TrainConfig, parse_args

    cfg = parse_args(job.args)
    args = list(job.args)
    uri, metrics = cfg.checkpoint_uri, cfg.metrics_file
    if uri == TrainConfig.checkpoint_uri:  # not chosen by the job: its own prefix in the cluster bucket
        uri = default_checkpoint_uri(bucket, job.job_id)
        args += ["--checkpoint-uri", uri]
    if metrics is None:
        metrics = metrics_path
        args += ["--metrics-file", metrics]
    return args, uri, metrics


def command(args: list[str], nproc: int) -> list[str]:
    """torchrun (through trainer.node.launch, which keeps exit 75) over nproc GPUs; one plain process for 0."""
    if nproc == 0:
        return [sys.executable, "-m", "trainer", "train", *args]
    return [sys.executable, "-m", "trainer.node.launch", "--standalone", "--nproc-per-node", str(nproc),
            "-m", "trainer", "train", *args]


def gang_command(args: list[str], gang: Gang, run_id: str, port: int, nproc: int, timeout_s: float) -> list[str]:
    """This node's part of a gang job: torchrun (through trainer.node.launch) with its node rank."""
    return [sys.executable, "-m", "trainer.node.launch", *gang.launch_args(run_id, port, timeout_s),
            "--nproc-per-node", str(nproc), "-m", "trainer", "train", *args]


def visibility_extension(now: float, received_at: float, visibility_s: int, max_in_flight_s: float) -> int:
    """Seconds to extend the message by now: the window, cut to what the in-flight limit leaves (0: none)."""
    left = received_at + max_in_flight_s - CAP_MARGIN_S - now
    return max(0, min(visibility_s, int(left)))


def outcome(rc: int, stop_requested: bool) -> int:
    """The job's exit status as the agent reads it: a SIGTERM death the agent asked for is a preemption.

    The job died before train's handler was in place, so no step ran: the newest checkpoint stands.
    """
    if stop_requested and rc in (-signal.SIGTERM, 128 + signal.SIGTERM):
        return EXIT_PREEMPTED
    return rc


def children(pid: int) -> list[int]:
    """Direct child processes (Linux /proc)."""
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            found += [int(c) for c in task.read_text().split()]
        except OSError:
            pass
    return found


def _die_with_parent() -> None:
    """In the child: get SIGTERM if the agent dies (even by SIGKILL), so the job checkpoints and stops."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Heartbeat:
    """Keeps a message hidden while its job runs; near SQS's in-flight limit it calls ``on_limit`` once."""

    def __init__(self, queue: JobQueue, msg: Message, visibility_s: int, on_limit):
        self.queue, self.msg, self.visibility_s, self.on_limit = queue, msg, visibility_s, on_limit
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)

    def beat(self) -> bool:
        """Extend once; False once the in-flight limit leaves no more time."""
        seconds = visibility_extension(time.time(), self.msg.received_at, self.visibility_s,
                                       self.queue.max_in_flight_s)
        if seconds == 0:
            return False
        try:
            self.queue.extend(self.msg, seconds)
        except Exception as exc:  # a missed beat is retried; the job must not die of it
            log.warning("heartbeat for message %s failed: %s", self.msg.id, exc)
        return True

    def _run(self) -> None:
        while not self._stop.wait(max(1.0, self.visibility_s / 3)):
            if not self.beat():
                self.on_limit()
                return

    def start(self) -> "Heartbeat":
        self.beat()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


class Agent:
    def __init__(self, queue: JobQueue, bucket: str, node: dict, work_dir: str | os.PathLike,
                 visibility_s: int = 600, wait_s: int = 20, nproc: int | None = None,
                 platform: Platform | None = None, emitter=None, emf_interval_s: float = 60.0):
        from trainer.node.emf import Emitter

        self.queue, self.bucket, self.node = queue, bucket, node
        self.work_dir = Path(work_dir)
        self.visibility_s, self.wait_s = visibility_s, wait_s
        if nproc is None:
            from trainer.node.preflight import HostProbe

            nproc = HostProbe().gpu_count()
        self.nproc = nproc
        self.platform = platform or open_platform(node)
        namespace = node.get("metric_namespace") or metric_names.namespace(node.get("stack", "default"))
        self.emitter = emitter or Emitter(namespace, sys.stdout, self.platform.metric_dimensions())
        self.emf_interval_s = emf_interval_s
        self.stopping: str | None = None
        self.idle = "no job in the queue"  # logged when --once finds nothing to do
        self._proc: subprocess.Popen | None = None
        self._stop_requested = False

    def serve(self, once: bool = False) -> int:
        """Handle messages until stopped (or one with ``once``); returns the last job's exit status."""
        from trainer.node.emf import GpuSampler

        restore = self._install_signals()
        gpus = GpuSampler(self.emitter, self.emf_interval_s).start()
        status = EXIT_OK
        try:
            while not self.stopping:
                try:
                    work = self.next_work()
                except RendezvousError:
                    raise
                except Exception as exc:  # the queue unreachable for a while: retry, do not die
                    if once:
                        raise
                    log.warning("receiving from the queue failed: %s; retrying in %d s", exc, RETRY_S)
                    time.sleep(RETRY_S)
                    continue
                if work is None:
                    if once:
                        log.info(self.idle)
                        return EXIT_OK
                    continue
                if self.stopping:  # the signal came during the long poll
                    if isinstance(work, Message):
                        self.queue.release(work)
                    break
                status = self.handle(work)
                if once:
                    return status
                reason = self.going_away() if status == EXIT_PREEMPTED else None
                if reason:
                    log.info("this instance is going away (%s): taking no more jobs", reason)
                    return status
            return EXIT_PREEMPTED if self.stopping else status
        finally:
            gpus.close()
            restore()

    def next_work(self) -> Message | None:
        """The next message to handle, or None after a long poll without one."""
        return self.queue.receive(self.wait_s)

    def handle(self, msg: Message) -> int:
        try:
            job = parse_job(msg.body)
        except UsageError as exc:
            log.error("message %s (receive %d): invalid job, left for the dead-letter queue: %s",
                      msg.id, msg.receive_count, exc)
            self.queue.fail(msg)
            return EXIT_FAILED
        log.info("job %s: claimed (message %s, receive %d)", job.job_id, msg.id, msg.receive_count)
        metrics_path = str(self.work_dir / "jobs" / job.job_id / "metrics.jsonl")
        args, uri, metrics = job_args(job, self.bucket, metrics_path)
        self.platform.protect(True)
        heartbeat = Heartbeat(self.queue, msg, self.visibility_s, self._in_flight_limit).start()
        tail = self._tail(metrics)
        try:
            rc = self.launch(job, args)
        finally:
            heartbeat.stop()
            tail.close()
        rc = outcome(rc, self._stop_requested)
        if rc == EXIT_OK:
            self.queue.delete(msg)
            self.platform.protect(False)
            log.info("job %s: done; message deleted", job.job_id)
            return EXIT_OK
        if rc == EXIT_PREEMPTED:
            self.queue.release(msg)  # checkpoint safe: another node may resume it now
            lost = self._steps_lost(uri, tail.last_step)
            self.emitter.emit({metric_names.PREEMPTIONS: 1.0, metric_names.STEPS_LOST: float(lost)})
            log.info("job %s: stopped after a checkpoint; message handed back (%d steps lost)", job.job_id, lost)
            self.settle(preempted=True)
            return EXIT_PREEMPTED
        self.platform.protect(False)
        log.error("job %s: failed with exit status %d (receive %d); left for redelivery and the dead-letter queue",
                  job.job_id, rc, msg.receive_count)
        self.queue.fail(msg)
        return EXIT_FAILED

    def going_away(self) -> str | None:
        """Why this node is about to stop (AWS: IMDS; Azure: Scheduled Events), or None."""
        return self.platform.going_away()

    def settle(self, preempted: bool) -> None:
        """After a job: a preempted node that is going away lets the platform stop it; otherwise drop protection."""
        if preempted and self.going_away():
            self.platform.let_go()
        else:
            self.platform.protect(False)

    def launch(self, job: Job, args: list[str]) -> int:
        return self.run(command(args, self.nproc))

    def run(self, cmd: list[str]) -> int:
        log.info("running %s", " ".join(cmd))
        self._stop_requested = False
        self._proc = subprocess.Popen(cmd, start_new_session=True, preexec_fn=_die_with_parent)
        try:
            return self._proc.wait()
        finally:
            self._proc = None

    def stop_job(self) -> None:
        """SIGTERM the training processes: they agree on a step, checkpoint it and exit 75."""
        proc = self._proc
        if proc is None:
            return
        self._stop_requested = True
        targets = children(proc.pid) if self.nproc else []
        for pid in targets or [proc.pid]:  # torchrun's workers directly, so that torchrun sees their 75
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def _in_flight_limit(self) -> None:
        log.warning("the job's message nears the queue's in-flight limit: checkpointing and handing it back")
        self.stop_job()

    def _install_signals(self):
        if threading.current_thread() is not threading.main_thread():
            return lambda: None

        def handle(signum, frame):
            self.stopping = signal.Signals(signum).name
            log.info("%s: stopping the job at a checkpoint", self.stopping)
            self.stop_job()

        previous = {s: signal.signal(s, handle) for s in (signal.SIGTERM, signal.SIGINT)}
        return lambda: [signal.signal(s, h) for s, h in previous.items()]

    def _tail(self, metrics: str):
        from trainer.node.emf import MetricsTail

        tail = MetricsTail(metrics, self.emitter, self.emf_interval_s)
        path = Path(metrics)
        tail.offset = path.stat().st_size if path.exists() else 0  # only this run's steps
        return tail.start()

    def _steps_lost(self, uri: str, last_step: int | None) -> int:
        """Steps done after the newest checkpoint: they are done again on resume."""
        from trainer.loop.checkpoint import Checkpointer
        from trainer.loop.storage import open_store

        saved = Checkpointer(open_store(uri), keep=1).steps()
        return max(0, (last_step or 0) - (saved[0] if saved else 0))


class GangAgent(Agent):
    """Gang mode: every node runs this; the head takes jobs from the queue, the others follow its assignment."""

    def __init__(self, queue: JobQueue, bucket: str, node: dict, work_dir: str | os.PathLike, board: Board,
                 port: int = C10D_PORT, gang_timeout_s: float = 600.0, poll_s: float = GANG_POLL_S, **kw):
        super().__init__(queue, bucket, node, work_dir, **kw)
        self.nproc = max(1, self.nproc)  # always torchrun: one CPU process without GPUs
        self.board, self.port, self.gang_timeout_s, self.poll_s = board, port, gang_timeout_s, poll_s
        self.gang: Gang | None = None
        self._seen: set[str] = set()  # generations this node has run or ignored
        self._led = False  # whether this agent has acted as the head yet

    def discover(self) -> Gang:
        """This node's gang: waits (up to the gang timeout) until node_count instances are in service."""
        return self.platform.form_gang(int(self.node["node_count"]), self.gang_timeout_s)

    def next_work(self) -> Message | Assignment | None:
        """Head: a message from the queue. Others: a new assignment for this gang within the wait."""
        self.gang = self.discover()
        if self.gang.node_rank == 0:
            if not self._led:  # an assignment left by an agent that died: no part of it runs any more
                self.board.clear()
                self._led = True
            self.idle = "no job in the queue"
            return self.queue.receive(self.wait_s)
        self.idle = f"no gang assignment within {self.wait_s}s"
        deadline = time.monotonic() + self.wait_s
        while not self.stopping:
            a = self.board.read()
            if a and a.generation not in self._seen:
                if (a.head, a.nnodes) == (self.gang.head, self.gang.nnodes):
                    return a
                self._seen.add(a.generation)
                log.warning("gang assignment %s names head %s of %d nodes, not this gang's %s of %d: ignored",
                            a.run_id, a.head, a.nnodes, self.gang.head, self.gang.nnodes)
            if time.monotonic() >= deadline:
                return None
            time.sleep(min(self.poll_s, max(0.0, deadline - time.monotonic())))
        return None

    def handle(self, work: Message | Assignment) -> int:
        return super().handle(work) if isinstance(work, Message) else self.follow(work)

    def launch(self, job: Job, args: list[str]) -> int:
        """The head's part: publish the assignment, run node rank 0, clear the assignment."""
        gang = self.gang
        a = Assignment(job.job_id, job.args, gang.nnodes, gang.head, self.port, uuid.uuid4().hex[:12])
        self.board.publish(a)
        log.info("job %s: assigned to the gang of %d nodes (run %s)", job.job_id, gang.nnodes, a.run_id)
        try:
            return self.run(gang_command(args, gang, a.run_id, self.port, self.nproc, self.gang_timeout_s))
        finally:
            self.board.clear()

    def follow(self, a: Assignment) -> int:
        """A non-head node's part of the assigned job; the head owns the message."""
        self._seen.add(a.generation)
        log.info("job %s: joining run %s as node %d of %d (head %s)", a.job_id, a.run_id, self.gang.node_rank,
                 a.nnodes, a.head)
        wait_for_head(a.head, a.port, timeout_s=self.gang_timeout_s)
        metrics_path = str(self.work_dir / "jobs" / a.job_id / "metrics.jsonl")
        args, _, _ = job_args(Job(a.job_id, a.args), self.bucket, metrics_path)
        self.platform.protect(True)
        rc = outcome(self.run(gang_command(args, self.gang, a.run_id, a.port, self.nproc, self.gang_timeout_s)),
                     self._stop_requested)
        self.settle(preempted=rc == EXIT_PREEMPTED)
        if rc in (EXIT_OK, EXIT_PREEMPTED):
            log.info("job %s: this node's part %s", a.job_id, "done" if rc == EXIT_OK else "stopped after a checkpoint")
            return rc
        log.error("job %s: this node's part failed with exit status %d", a.job_id, rc)
        return EXIT_FAILED


def load_node(path: str, required: bool) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        if required:
            raise UsageError(f"--node-json: {path} does not exist; give --queue-url and --bucket") from None
        return {}
    except ValueError as exc:
        raise UsageError(f"--node-json: {path} is not valid JSON ({exc})") from None


def main(argv: list[str]) -> int:
    p = ArgumentParser(prog="python -m trainer agent", description=__doc__.strip(),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--queue-url", help="job queue (default: queue_url in --node-json)")
    p.add_argument("--bucket", help="bucket for job checkpoints (default: bucket in --node-json)")
    p.add_argument("--node-json", default=NODE_JSON, help="node settings written by user-data (default %(default)s)")
    p.add_argument("--once", action="store_true",
                   help="handle one message (gang, not the head: one assignment within --wait), then exit "
                        "with its job's status")
    p.add_argument("--visibility", type=int, default=600, metavar="S",
                   help="seconds a claimed message stays hidden per heartbeat (default %(default)s)")
    p.add_argument("--wait", type=int, default=20, metavar="S", help="long-poll seconds, 0-20 (default %(default)s)")
    p.add_argument("--work-dir", default="/var/lib/gpufleet", help="metrics files of jobs (default %(default)s)")
    p.add_argument("--rdzv-port", type=int, default=C10D_PORT, metavar="PORT",
                   help="gang mode: the head's torchrun store port (default %(default)s)")
    p.add_argument("--gang-timeout", type=float, default=600.0, metavar="S",
                   help="gang mode: seconds to wait for the nodes in service and for the head (default %(default)s)")
    args = p.parse_args(argv)
    node = load_node(args.node_json, required=not (args.queue_url and args.bucket))
    queue_url, bucket = args.queue_url or node.get("queue_url"), args.bucket or node.get("bucket")
    if not queue_url or not bucket:
        raise UsageError(f"--queue-url/--bucket: missing, and {args.node_json} has no queue_url/bucket")
    if not 1 <= args.visibility <= 43200:
        raise UsageError(f"--visibility: {args.visibility} is not allowed; expected 1 to 43200 seconds")
    if not 0 <= args.wait <= 20:
        raise UsageError(f"--wait: {args.wait} is not allowed; expected 0 to 20 seconds")
    if node.get("mode", "queue") == "queue":
        return Agent(open_queue(queue_url, node.get("region")), bucket, node, args.work_dir,
                     visibility_s=args.visibility, wait_s=args.wait).serve(once=args.once)
    check_gang(node, args.node_json, bucket, args.rdzv_port, args.gang_timeout)
    queue = open_queue(queue_url, node.get("region"))
    platform = open_platform(node)
    agent = GangAgent(queue, bucket, node, args.work_dir, platform.board(bucket), port=args.rdzv_port,
                      gang_timeout_s=args.gang_timeout, visibility_s=args.visibility, wait_s=args.wait,
                      platform=platform)
    try:
        return agent.serve(once=args.once)
    except RendezvousError as exc:  # the gang cannot form or the head is out of reach: one line, exit 1
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED


def check_gang(node: dict, path: str, bucket: str, port: int, timeout_s: float) -> None:
    """Gang mode's settings, each refused in one line."""
    if node.get("mode") != "gang":
        raise UsageError(f"{path}: mode {node.get('mode')!r} is not allowed; expected 'queue' or 'gang'")
    if node.get("cloud", "aws") != "aws":
        raise UsageError(f"{path}: mode 'gang' with cloud {node.get('cloud')!r} is not run by this agent; "
                         "gang mode forms the gang from an AWS autoscaling group")
    count = node.get("node_count")
    if not node.get("asg_name") or isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise UsageError(f"{path}: mode 'gang' needs asg_name and node_count (an integer >= 1), "
                         f"got asg_name={node.get('asg_name')!r} node_count={count!r}")
    if bucket.startswith(("https://", "s3://")) or "/" in bucket:
        raise UsageError(f"--bucket: {bucket!r} is not allowed in gang mode; expected an S3 bucket name")
    if not 1 <= port <= 65535:
        raise UsageError(f"--rdzv-port: {port} is not allowed; expected 1 to 65535")
    if not timeout_s > 0:
        raise UsageError(f"--gang-timeout: {timeout_s:g} is not allowed; expected a number of seconds > 0")
