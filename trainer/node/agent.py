"""`python -m trainer agent`: run training jobs from the queue on this node, or on the group (gang mode).

Queue mode, one job at a time: receive a message, check it against the job spec (trainer.jobs.spec),
protect the instance from scale-in, keep the message hidden with a heartbeat, run the job (kind trainer:
torchrun over all local GPUs, one process without GPUs; kind image: a container under the node's Docker;
kind code: the bundle unpacked into the job's work directory, run with the node's Python; see
trainer.node.runner for the environment and the stop contract), then: done -> delete the message; preempted
(exit 75, checkpoint safe) -> hand the job back at once and complete the terminate lifecycle action; failed
(or stopped at its timeout) -> queued again like a hand-back (outcome "failed"/"timeout") while the job's
``retries`` allow (trainer.jobs.spec.retry_decision: on_error counts the failures in its attempt history, an
exit status in on_exit_codes always retries), else moved to the dead-letter queue at once (JobQueue.dead_letter).
An invalid job is dead-lettered at once with one log line. No exception escapes the handling of a message, and
scale-in protection is always released.

A hand-back never counts against the queue's failure budget (SQS's maxReceiveCount counts receives, and a
message made visible again keeps its count): it sends a fresh message, the same body with one more entry in
its "attempts" history (trainer.jobs.spec.with_attempt), then marks the old message superseded in the job's
checkpoint location (``agent/superseded/<message id>``), then deletes it. A fault between two of these leaves
a duplicate at worst: a copy marked superseded is deleted when it is next received, and an unmarked one
resumes from the same checkpoint (the trainer's lease on the location fences the older runner). When
heartbeats keep failing, the job is stopped at a checkpoint while its message is still hidden.

Gang mode (node.json "mode": "gang"; every node of the group runs the agent): the nodes form the gang
from the autoscaling group (trainer.node.rendezvous: head = lowest private IP). Only the head receives; it
publishes the job as s3://<bucket>/gang/assignment.json and runs node rank 0; the others poll that
object and run their node rank, torchrun's store on the head. The head heartbeats, deletes or hands
back the message and clears the assignment; a node that got a stop notice completes its own
terminate hook. Every node is protected from scale-in while its part runs. The first part to end otherwise
than 0 marks the run on the board (trainer.node.rendezvous.Board.mark); the others see the mark within a poll.
A part that stopped at a checkpoint (75: a notice, a cancel, the in-flight limit on the head) stops the others
at one too, with the stop grace, and the head hands the job back: user code is not left waiting in a collective
for a peer that left. Any other exit status is a failure (fail-fast): the others stop (SIGTERM, SIGKILL after
FAIL_FAST_GRACE_S) and report a failure, so the head fails the job as a whole.
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

from trainer import EXIT_INTERRUPTED, EXIT_OK, EXIT_PREEMPTED
from trainer.clouds import explain
from trainer.errors import ArgumentParser, UsageError
from trainer.jobs.queue import JobQueue, Message, open_queue
from trainer.jobs.records import RecordStore
from trainer.jobs.spec import Job, parse_job, retry_decision, validate
from trainer.node import metric_names, node_schema
from trainer.node.platform import Platform, open_platform
from trainer.node.registry import login_env
from trainer.node.rendezvous import C10D_PORT, Assignment, Board, Gang, RendezvousError, wait_for_head
from trainer.node.runner import (CONTROL_DIR, STOP_FILE, ContainerRun, ProcessGroupRun, Running, TrainerRun,
                                 code_environment, docker_argv, job_environment, node_facts, stop_grace)
from trainer.node.tracking import Output, Tracking
from trainer.slurm.task import default_checkpoint_uri, saved_step, trainer_args

log = logging.getLogger("gpufleet.agent")

NODE_JSON = node_schema.PATH
EXIT_FAILED = 1
CAP_MARGIN_S = 300  # hand the message back this long before SQS's in-flight limit
LAPSE_MARGIN = 0.5  # heartbeats failing: stop the job once less than this share of the visibility is left
SUPERSEDED = "agent/superseded/"  # under a job's checkpoint URI: messages a hand-back replaced
RETRY_S = 10
GANG_POLL_S = 2.0  # how often a gang node looks at the assignment object
FAIL_FAST_GRACE_S = 30  # a gang part stopped because another part failed: SIGTERM, SIGKILL after this


def job_args(job: Job, bucket: str, metrics_path: str) -> tuple[list[str], str, str]:
    """The job's train flags with the agent's defaults: (args, checkpoint URI, metrics file)."""
    return trainer_args(job, default_checkpoint_uri(bucket, job.job_id), metrics_path)


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


def outcome(rc: int, stop_requested: bool, kind: str = "trainer", timed_out: bool = False) -> int:
    """The job's exit status as the agent reads it.

    A stop the agent asked for (a notice, a cancel, the in-flight limit) is a preemption, never a failure: the
    built-in trainer dying of that SIGTERM before its handler was in place ran no step, so the newest checkpoint
    stands; user code that exits otherwise than 75 after the stop is handed back the same way, its newest
    checkpoint standing. A job stopped at its timeout has failed whatever it exits with.
    """
    if timed_out:
        return EXIT_FAILED if rc in (EXIT_OK, EXIT_PREEMPTED) else rc
    if stop_requested and rc in (-signal.SIGTERM, 128 + signal.SIGTERM):
        return EXIT_PREEMPTED
    if stop_requested and kind != "trainer" and rc != EXIT_OK:
        return EXIT_PREEMPTED
    return rc


def _die_with_parent() -> None:
    """In the child: get SIGTERM if the agent dies (even by SIGKILL), so the job checkpoints and stops."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Heartbeat:
    """Keeps a message hidden while its job runs. Near SQS's in-flight limit it calls ``on_limit`` once; when
    failed beats leave less than LAPSE_MARGIN of the visibility, it calls ``on_lapse`` once, so that the job
    stops at a checkpoint before another agent can receive the message."""

    def __init__(self, queue: JobQueue, msg: Message, visibility_s: int, on_limit, on_lapse=None):
        self.queue, self.msg, self.visibility_s, self.on_limit = queue, msg, visibility_s, on_limit
        self.on_lapse = on_lapse or on_limit
        self.hidden_until = time.monotonic() + visibility_s  # the receive hid it at least this long
        self.lapsing = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)

    def beat(self) -> bool:
        """Extend once; False once the in-flight limit leaves no more time."""
        seconds = visibility_extension(time.time(), self.msg.received_at, self.visibility_s,
                                       self.queue.max_in_flight_s)
        if seconds == 0:
            return False
        now = time.monotonic()
        try:
            self.queue.extend(self.msg, seconds)
            self.hidden_until = now + seconds
        except Exception as exc:  # a missed beat is retried while the message stays hidden long enough
            log.warning("heartbeat for message %s failed: %s", self.msg.id, exc)
            left = self.hidden_until - time.monotonic()
            if left < LAPSE_MARGIN * self.visibility_s and not self.lapsing:
                self.lapsing = True
                log.error("message %s: heartbeats failing, %.0f s of its visibility left: stopping the job at a "
                          "checkpoint before another agent can receive it", self.msg.id, max(0.0, left))
                self.on_lapse()
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
                 platform: Platform | None = None, emitter=None, emf_interval_s: float = 60.0,
                 container_extra: tuple[str, ...] = (), watch_s: float = 2.0, stop_grace_s: int | None = None,
                 job_stdout=None):
        from trainer.node.emf import Emitter

        self.queue, self.bucket, self.node = queue, bucket, node
        self.work_dir = Path(work_dir)
        self.visibility_s, self.wait_s = visibility_s, wait_s
        if nproc is None:
            from trainer.node.preflight import HostProbe

            nproc = HostProbe().gpu_count()
        self.gpus = nproc  # the GPUs of this node (the trainer's process count, which gang mode raises to 1)
        self.nproc = nproc
        self.platform = platform or open_platform(node)
        namespace = node.get("metric_namespace") or metric_names.namespace(node.get("stack", "default"))
        self.emitter = emitter or Emitter(namespace, sys.stdout, self.platform.metric_dimensions())
        self.emf_interval_s = emf_interval_s
        self.container_extra = tuple(container_extra)  # tests only: extra `docker run` flags (host mounts)
        self.watch_s = watch_s  # how often a user job's stop notices are polled
        self.stop_grace_s = stop_grace_s  # SIGTERM to SIGKILL of user code; None: what the notice leaves
        self.job_stdout = job_stdout  # where jobs write (None: the agent's own output)
        self.stopping: str | None = None
        self.idle = "no job in the queue"  # logged when --once finds nothing to do
        self._running: Running | None = None
        self._stop_asked = False  # a stop (cancel, heartbeat lapse, ...) asked for during this message's attempt
        self._timed_out = False
        self._output: Output | None = None  # the running attempt's output, shipped to the bucket
        self._records: RecordStore | None = None

    @property
    def records(self) -> RecordStore:
        """The job records in the cluster's bucket (trainer.jobs.records), opened on first use."""
        if self._records is None:
            self._records = RecordStore.of_bucket(self.bucket)
        return self._records

    @property
    def max_nodes(self) -> int:
        return 1

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
                    if once or isinstance(explain(exc), UsageError):  # the user's setup: retrying cannot help
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
            if self.stopping == "SIGINT":  # Ctrl-C: the job (if any) checkpointed and went back to the queue
                return EXIT_INTERRUPTED
            return EXIT_PREEMPTED if self.stopping else status
        finally:
            gpus.close()
            restore()

    def next_work(self) -> Message | None:
        """The next message to handle, or None after a long poll without one."""
        return self.queue.receive(self.wait_s)

    def check(self, msg: Message) -> Job:
        """The message's job if it is valid and fits this node; UsageError (one line) otherwise."""
        job = parse_job(msg.body, max_nodes=self.max_nodes)
        if job.gpus_per_node and job.gpus_per_node > self.gpus:
            raise UsageError(f"job {job.job_id}: gpus_per_node: {job.gpus_per_node} is more than this node's "
                             f"{self.gpus} GPU(s)")
        return job

    def handle(self, msg: Message) -> int:
        """One message, whatever happens: no exception escapes, and scale-in protection is released (or left to
        the platform's terminate hook)."""
        try:
            return self._handle(msg)
        except Exception as exc:
            log.error("message %s (receive %d): the agent could not handle it (%s: %s); left for redelivery",
                      msg.id, msg.receive_count, type(exc).__name__, exc)
            try:
                self.platform.protect(False)
            except Exception as inner:
                log.error("releasing scale-in protection failed: %s", inner)
            return EXIT_FAILED

    def _handle(self, msg: Message) -> int:
        try:
            job = self.check(msg)
        except UsageError as exc:
            log.error("message %s (receive %d): invalid job, moved to the dead-letter queue: %s",
                      msg.id, msg.receive_count, exc)
            self.queue.dead_letter(msg, f"invalid job: {exc}")
            return EXIT_FAILED
        metrics = self.metrics_path(job.job_id) if job.kind == "trainer" else None
        uri = self.job_uri(job)
        if self._superseded(msg, uri):
            self.queue.delete(msg)
            log.info("job %s: message %s is a copy a hand-back superseded; deleted", job.job_id, msg.id)
            return EXIT_OK
        attempt = self._claim(job, len(job.attempts) + msg.receive_count)  # every run so far
        if not attempt:
            self.queue.delete(msg)
            log.info("job %s: cancelled or finished before this attempt; message %s deleted, nothing run",
                     job.job_id, msg.id)
            return EXIT_OK
        log.info("job %s: claimed (message %s, receive %d, attempt %d, kind %s)", job.job_id, msg.id,
                 msg.receive_count, attempt, job.kind)
        self._stop_asked = False
        started = time.time()
        self.platform.protect(True)
        heartbeat = Heartbeat(self.queue, msg, self.visibility_s, self._in_flight_limit, self._lapsing).start()
        metrics_file = job_args(job, self.bucket, metrics)[2] if metrics else None
        tracking = Tracking(self.records, job.job_id, metrics_file, self._total_steps(job), self.stop_job,
                            gpu_util=self._gpu_util).start()
        try:
            tail = self._tail(metrics_file) if metrics_file else None
            try:
                rc = self.launch(job, attempt)
            finally:
                if tail:
                    tail.close()
        finally:
            tracking.close()
            heartbeat.stop()
        if rc == EXIT_OK:
            self.queue.delete(msg)
            self.platform.protect(False)
            self._ended(job, "succeeded", rc)
            log.info("job %s: done; message deleted", job.job_id)
            return EXIT_OK
        if tracking.cancelled:
            self.queue.delete(msg)
            self.platform.protect(False)
            self._ended(job, "cancelled", rc, "cancel")
            log.info("job %s: cancelled; stopped (exit %d), message deleted", job.job_id, rc)
            return EXIT_OK
        if rc == EXIT_PREEMPTED:
            saved = saved_step(uri) if tail else None
            reason = "preempted" if self.stopping or self.going_away() else "handed back"
            self.hand_back(msg, uri, {"outcome": reason, "exit_status": rc, "node": self._node_name(),
                                      "message_id": msg.id, "started": started, "ended": time.time(),
                                      "step": saved})
            self._ended(job, "preempted" if reason == "preempted" else "queued", rc,
                        "preemption" if reason == "preempted" else "hand-back")
            lost = max(0, (tail.last_step or 0) - (saved or 0)) if tail else 0
            self.emitter.emit({metric_names.PREEMPTIONS: 1.0, metric_names.STEPS_LOST: float(lost)})
            log.info("job %s: stopped after a checkpoint; message handed back as a fresh one (%d steps lost)",
                     job.job_id, lost)
            self.settle(preempted=True)
            return EXIT_PREEMPTED
        self.platform.protect(False)
        what = "timeout" if self._timed_out else "failed"
        retry, why = retry_decision(job.retries, job.attempts, rc)
        if retry:
            self.hand_back(msg, uri, {"outcome": what, "exit_status": rc, "node": self._node_name(),
                                      "message_id": msg.id, "started": started, "ended": time.time(),
                                      "step": saved_step(uri) if tail else None})
            log.error("job %s: %s with exit status %d (attempt %d); queued again: %s", job.job_id, what, rc,
                      attempt, why)
        else:
            log.error("job %s: %s with exit status %d (attempt %d); moved to the dead-letter queue: %s",
                      job.job_id, what, rc, attempt, why)
            self.queue.dead_letter(msg, f"job {job.job_id}: {what} with exit status {rc}; {why}")
        self._ended(job, "queued" if retry else "failed", rc, "timeout" if self._timed_out else "failure")
        return EXIT_FAILED

    # --- the job's record (trainer.jobs.records), best-effort but for the claim ------------------------------

    def _claim(self, job: Job, attempt: int) -> int | None:
        """Mark the job running with this attempt (the message's count: hand-backs and redeliveries; the record
        goes on counting across a `retry`); its number, or None when its record says cancelled or finished. A
        record that cannot be written does not stop the job (it runs, and says so)."""
        try:
            return self.records.claimed(job.job_id, {"nodes": self._nodes(), "instance_type": self._instance_type(),
                                                     "gpus": self.gpus, "n": attempt}, spec=job.to_dict())
        except Exception as exc:
            log.warning("job %s: its record could not be updated (%s); running it", job.job_id, exc)
            return attempt

    def _ended(self, job: Job, state: str, rc: int, reason: str | None = None) -> None:
        try:
            self.records.ended(job.job_id, state, rc, reason)
        except Exception as exc:
            log.warning("job %s: its record could not be marked %s (%s)", job.job_id, state, exc)

    def _nodes(self) -> list[str]:
        return [self._node_name()]

    def _instance_type(self) -> str | None:
        try:
            return self.platform.instance_type() or self.node.get("instance_type")
        except Exception:
            return self.node.get("instance_type")

    @staticmethod
    def _total_steps(job: Job) -> int | None:
        if job.kind != "trainer":
            return None
        from trainer.loop.config import parse_args

        return parse_args(list(job.args)).steps

    @staticmethod
    def _gpu_util() -> float | None:
        from trainer.node.emf import gpu_utilisation

        return gpu_utilisation()

    def hand_back(self, msg: Message, uri: str, attempt: dict) -> None:
        """Requeue the job as a fresh message carrying its attempt history, then retire the old one.

        Send first, then mark the old message superseded, then delete it: a fault between two of these leaves
        two copies, never none; the marked copy is dropped when it is received (see _superseded).
        """
        from trainer.jobs.spec import with_attempt
        from trainer.loop.storage import open_store

        self.queue.send(with_attempt(msg.body, attempt))
        steps = ((lambda: open_store(uri).write_bytes(f"{SUPERSEDED}{msg.id}", json.dumps(attempt).encode()),
                  "marking it superseded"), (lambda: self.queue.delete(msg), "deleting it"))
        for step, what in steps:
            try:
                step()
            except Exception as exc:  # the fresh message is out: the job is not lost whatever fails here
                log.warning("message %s: %s after the hand-back failed (%s); a copy may come back once and is "
                            "dropped or resumes from the same checkpoint", msg.id, what, exc)

    def _superseded(self, msg: Message, uri: str) -> bool:
        from trainer.loop.storage import open_store

        try:
            return open_store(uri).exists(f"{SUPERSEDED}{msg.id}")
        except Exception as exc:  # the location unreachable: run it (its own checkpoint reads tell)
            log.warning("message %s: cannot look for a superseded mark at %s: %s", msg.id, uri, exc)
            return False

    def job_uri(self, job: Job) -> str:
        """The job's checkpoint location (a trainer job's own --checkpoint-uri, else its default prefix)."""
        if job.kind == "trainer":
            return job_args(job, self.bucket, self.metrics_path(job.job_id))[1]
        return self.checkpoint_uri(job)

    def _node_name(self) -> str:
        import socket

        return self.node.get("instance_id") or socket.gethostname()

    def _lapsing(self) -> None:
        self.stop_job()

    def going_away(self) -> str | None:
        """Why this node is about to stop (AWS: IMDS; Azure: Scheduled Events), or None."""
        return self.platform.going_away()

    def settle(self, preempted: bool) -> None:
        """After a job: a preempted node that is going away lets the platform stop it; otherwise drop protection."""
        if preempted and self.going_away():
            self.platform.let_go()
        else:
            self.platform.protect(False)

    def metrics_path(self, job_id: str) -> str:
        return str(self.work_dir / "jobs" / job_id / "metrics.jsonl")

    def checkpoint_uri(self, job: Job) -> str:
        return default_checkpoint_uri(self.bucket, job.job_id)

    def launch(self, job: Job, attempt: int) -> int:
        """This node's part of one attempt of the job (queue mode: all of it); its outcome."""
        return self.execute(job, attempt, nnodes=1, node_rank=0, rdzv=f"127.0.0.1:{C10D_PORT}")

    def execute(self, job: Job, attempt: int, nnodes: int, node_rank: int, rdzv: str,
                trainer_cmd: list[str] | None = None) -> int:
        """Start the attempt, stop it on a notice or its timeout, wait for it; the outcome (see :func:`outcome`)."""
        self._timed_out = False
        if self.job_stdout is None:
            self._output = self._open_output(job, attempt)
        try:
            try:
                run = self.start(job, attempt, nnodes, node_rank, rdzv, trainer_cmd)
            except Exception as exc:  # a bundle, secret or command that cannot be had or started: the job fails
                log.error("job %s: cannot start: %s", job.job_id, exc)
                return EXIT_FAILED
            return self._wait(job, run)
        finally:
            output, self._output = self._output, None
            if output:
                output.close()

    def _open_output(self, job: Job, attempt: int) -> Output | None:
        """The attempt's output file, shipped to jobs/<id>/logs/<attempt>/<node>/ while it runs."""
        path = self.work_dir / "jobs" / job.job_id / f"output-{attempt}.log"
        try:
            return Output(self.records, job.job_id, attempt, self._node_name(), path)
        except Exception as exc:
            log.warning("job %s: its output will not be shipped (%s)", job.job_id, exc)
            return None

    def _wait(self, job: Job, run: Running) -> int:
        """Stop the started attempt on a notice or its timeout, wait for it; the outcome."""
        self._running = run
        if self.stopping or self._stop_asked:  # told to stop (or cancelled) while the job was being set up
            self.stop_job()
        done = threading.Event()
        watchers = []
        if job.kind != "trainer":  # the trainer watches its own notices; user code gets them from the agent
            watchers.append(threading.Thread(target=self._watch, args=(done,), name="notice-watch", daemon=True))
        if job.timeout:
            watchers.append(threading.Thread(target=self._time_out, args=(done, job.timeout), daemon=True))
        for w in watchers:
            w.start()
        try:
            rc = run.wait()
        finally:
            done.set()
            self._running = None
        if job.kind != "trainer" and run.stop_requested and rc not in (EXIT_OK, EXIT_PREEMPTED):
            log.warning("job %s: exited %d after the stop, not 75; handed back, its newest checkpoint stands",
                        job.job_id, rc)
        if self._timed_out:
            log.error("job %s: stopped at its timeout of %d s", job.job_id, job.timeout)
        return outcome(rc, run.stop_requested, job.kind, self._timed_out)

    def start(self, job: Job, attempt: int, nnodes: int, node_rank: int, rdzv: str,
              trainer_cmd: list[str] | None) -> Running:
        """Start the attempt's process: every kind gets the job environment (trainer.node.runner)."""
        job_dir = self.work_dir / "jobs" / job.job_id
        control = job_dir / "control"
        control.mkdir(parents=True, exist_ok=True)
        (control / STOP_FILE).unlink(missing_ok=True)
        values, secrets = self._job_env(job)
        if job.kind == "trainer":
            args, uri, _ = job_args(job, self.bucket, self.metrics_path(job.job_id))
            env = job_environment(job.job_id, attempt, uri, nnodes, node_rank, max(1, self.nproc), rdzv,
                                  str(control / STOP_FILE), values)
            cmd = trainer_cmd or command(args, self.nproc)
            log.info("running %s", " ".join(cmd))
            return TrainerRun(self._popen(cmd, env={**os.environ, **env, **secrets}), control / STOP_FILE,
                              workers=self.nproc > 0 or trainer_cmd is not None)
        gpus = self.gpus if job.gpus_per_node is None else job.gpus_per_node
        inside = CONTROL_DIR if job.kind == "image" else str(control)
        env = job_environment(job.job_id, attempt, self.checkpoint_uri(job), nnodes, node_rank, max(1, gpus), rdzv,
                              f"{inside}/{STOP_FILE}", values)
        if job.kind == "image":
            facts = node_facts(self.node, self.platform.instance_type() if self.node.get("instance_types") else None,
                               self.gpus)
            name = f"gpufleet-{job.job_id}-{attempt}-{uuid.uuid4().hex[:6]}"
            argv = docker_argv(name, job.image, list(job.command), env, facts, job.gpus_per_node, str(control),
                               self.grace(notice=False), tuple(secrets),
                               scratch=Path("/mnt/scratch").is_dir(),
                               container_env_file=Path("/etc/gpufleet/container.env").exists(),
                               extra=self.container_extra)
            docker_env, config = login_env(self.platform, job.image, job_dir, {**os.environ, **secrets})
            log.info("running %s", " ".join(argv))
            return ContainerRun(self._popen(argv, env=docker_env), name, control / STOP_FILE, docker_env, config)
        from trainer.jobs import bundle

        archive = bundle.fetch(job.code, self.work_dir / "bundles")
        code = bundle.unpack(archive, job_dir / "code")
        log.info("running %s in %s", " ".join(job.command), code)
        run_env = code_environment(dict(os.environ), {**env, **secrets}, os.path.dirname(sys.executable))
        return ProcessGroupRun(self._popen(list(job.command), env=run_env, cwd=code), control / STOP_FILE)

    def _popen(self, cmd: list[str], **kw) -> subprocess.Popen:
        output = self._output
        streams = output.popen_kw() if output else {"stdout": self.job_stdout}
        proc = subprocess.Popen(cmd, start_new_session=True, preexec_fn=_die_with_parent, **streams, **kw)
        if output:
            output.follow(proc)
        return proc

    def _job_env(self, job: Job) -> tuple[dict[str, str], dict[str, str]]:
        """The job's env: (plain values, secrets read through the node's identity)."""
        values = {k: v for k, v in job.env.items() if isinstance(v, str)}
        secrets = {k: self.platform.secret(*next(iter(v.items()))) for k, v in job.env.items()
                   if not isinstance(v, str)}
        return values, secrets

    def _watch(self, done: threading.Event) -> None:
        """While a user job runs: poll this node's stop notices; on one, stop the job within the notice's grace."""
        while not done.wait(self.watch_s):
            try:
                reason = self.going_away()
            except Exception as exc:  # a missed poll is retried
                log.warning("polling for stop notices failed: %s", exc)
                continue
            if reason:
                log.warning("stop notice: %s; stopping the job", reason)
                self.stop_job(notice=True)
                return

    def _time_out(self, done: threading.Event, seconds: int) -> None:
        if not done.wait(seconds):
            self._timed_out = True
            self.stop_job()

    def stop_job(self, notice: bool = False) -> None:
        """SIGTERM the job (and its stop file): the built-in trainer agrees on a step, checkpoints it and
        exits 75; user code gets the grace that fits the notice (or the default) before SIGKILL."""
        self._stop_asked = True  # applied when the attempt starts, if it has not yet
        run = self._running
        if run is not None:
            run.stop(self.grace(notice))

    def grace(self, notice: bool) -> int:
        return self.stop_grace_s or stop_grace(self.node.get("cloud"), notice)

    def _in_flight_limit(self) -> None:
        log.warning("the job's message nears the queue's in-flight limit: checkpointing and handing it back")
        self.stop_job()

    def _install_signals(self):
        if threading.current_thread() is not threading.main_thread():
            return lambda: None

        def handle(signum, frame):
            self.stopping = signal.Signals(signum).name
            if signum == signal.SIGINT and self._running is None:  # Ctrl-C, no job running: quit now (exit 130)
                raise KeyboardInterrupt
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


class GangAgent(Agent):
    """Gang mode: every node runs this; the head takes jobs from the queue, the others follow its assignment.
    Every job runs over the whole gang (a job asking for more nodes than the gang has is refused)."""

    def __init__(self, queue: JobQueue, bucket: str, node: dict, work_dir: str | os.PathLike, board: Board,
                 port: int = C10D_PORT, gang_timeout_s: float = 600.0, poll_s: float = GANG_POLL_S, **kw):
        super().__init__(queue, bucket, node, work_dir, **kw)
        self.nproc = max(1, self.nproc)  # always torchrun: one CPU process without GPUs
        self.board, self.port, self.gang_timeout_s, self.poll_s = board, port, gang_timeout_s, poll_s
        self.gang: Gang | None = None
        self._seen: set[str] = set()  # generations this node has run or ignored
        self._led = False  # whether this agent has acted as the head yet
        self._peer_mark: dict | None = None  # the end mark of another node's part of the current run
        self._run: Assignment | None = None  # the run this node's part is in

    @property
    def max_nodes(self) -> int:
        return int(self.node["node_count"])

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

    def _nodes(self) -> list[str]:
        return list(self.gang.members)

    def launch(self, job: Job, attempt: int) -> int:
        """The head's part: publish the assignment, run node rank 0, clear the assignment."""
        gang = self.gang
        a = Assignment(job.job_id, list(job.args), gang.nnodes, gang.head, self.port, uuid.uuid4().hex[:12],
                       spec=job.to_dict(), attempt=attempt)
        self.board.publish(a)
        log.info("job %s: assigned to the gang of %d nodes (run %s)", job.job_id, gang.nnodes, a.run_id)
        try:
            return self.part(job, a)
        finally:
            self.board.clear()  # the run's end mark stays for the parts still running (Board.publish clears it)

    def part(self, job: Job, a: Assignment) -> int:
        """This node's part of the assigned job: the trainer through torchrun with its node rank; user code with
        GPUFLEET_NODE_RANK and the head's endpoint in its environment."""
        trainer_cmd = None
        if job.kind == "trainer":
            args = job_args(job, self.bucket, self.metrics_path(job.job_id))[0]
            trainer_cmd = gang_command(args, self.gang, a.run_id, a.port, self.nproc, self.gang_timeout_s)
        self._peer_mark, self._run = None, a
        done = threading.Event()
        watcher = threading.Thread(target=self._watch_gang, args=(a, done), name="gang-watch", daemon=True)
        watcher.start()
        try:
            rc = self.execute(job, a.attempt, self.gang.nnodes, self.gang.node_rank, f"{a.head}:{a.port}",
                              trainer_cmd)
        finally:
            self._run = None
            done.set()
            watcher.join()
        mark = self._peer_mark
        if mark is None and rc != EXIT_OK:
            mark = self._end_mark(a, rc)
        if mark is not None and mark["exit_status"] == EXIT_PREEMPTED:  # another part stopped at a checkpoint
            log.warning("job %s: node %d's part stopped at a checkpoint; this node's part stopped too (exit %d)",
                        job.job_id, mark["node_rank"], rc)
            return EXIT_OK if rc == EXIT_OK else EXIT_PREEMPTED
        if mark is not None:  # stopped because another part died: the attempt failed as a whole
            log.error("job %s: node %d's part failed with exit status %d; this node's part stopped (exit %d)",
                      job.job_id, mark["node_rank"], mark["exit_status"], rc)
            return EXIT_FAILED
        return rc

    def _end_mark(self, a: Assignment, rc: int) -> dict | None:
        """Mark the run as ended by this part with ``rc``; the mark of another part that stood first, or None."""
        try:
            if self.board.mark(a.generation, self.gang.node_rank, rc):
                return None
            mark = self.board.mark_of(a.generation)
        except Exception as exc:  # the others then stop at their collective's timeout
            log.warning("job %s: could not mark how run %s ended: %s", a.job_id, a.run_id, exc)
            return None
        return mark if mark and mark["node_rank"] != self.gang.node_rank else None

    def stop_job(self, notice: bool = False) -> None:
        """Stop this node's part (a notice, a cancel, the timeout, the in-flight limit), having first marked the
        run as stopped: the other parts stop at a checkpoint too, and a peer that fails because this part left
        is not taken for the cause."""
        a = self._run
        if a is not None:
            try:
                self.board.mark(a.generation, self.gang.node_rank, EXIT_PREEMPTED)
            except Exception as exc:
                log.warning("job %s: could not mark run %s as stopping: %s", a.job_id, a.run_id, exc)
        super().stop_job(notice)

    def _watch_gang(self, a: Assignment, done: threading.Event) -> None:
        """While this node's part runs: poll the run's end mark. When another node's part stopped at a
        checkpoint, stop this part the same way (SIGTERM and the stop file, the stop grace); when it failed,
        stop this part within FAIL_FAST_GRACE_S. Either way SIGKILL if it has not ended by then: a collective
        with a dead peer never returns."""
        while not done.wait(self.watch_s):
            try:
                mark = self.board.mark_of(a.generation)
            except Exception as exc:  # a missed poll is retried
                log.warning("polling the gang's end mark failed: %s", exc)
                continue
            if not mark or mark["node_rank"] == self.gang.node_rank:
                continue
            self._peer_mark = mark
            stopped = mark["exit_status"] == EXIT_PREEMPTED
            if stopped:
                log.warning("job %s: node %d's part stopped at a checkpoint: stopping this node's part at one",
                            a.job_id, mark["node_rank"])
            else:
                log.warning("job %s: node %d's part failed (exit status %d): stopping this node's part",
                            a.job_id, mark["node_rank"], mark["exit_status"])
            while self._running is None and not done.wait(0.1):
                pass
            run = self._running
            if run is None:
                return
            grace = self.grace(notice=False) if stopped else min(FAIL_FAST_GRACE_S, self.grace(notice=False))
            run.stop(grace)
            limit = grace + FAIL_FAST_GRACE_S if stopped else FAIL_FAST_GRACE_S
            if not done.wait(limit):
                log.warning("job %s: this node's part did not stop within %d s: killed", a.job_id, limit)
                run.kill()
            return

    def follow(self, a: Assignment) -> int:
        """A non-head node's part of the assigned job; the head owns the message."""
        self._seen.add(a.generation)
        self._stop_asked = False
        log.info("job %s: joining run %s as node %d of %d (head %s)", a.job_id, a.run_id, self.gang.node_rank,
                 a.nnodes, a.head)
        try:
            job = validate(a.spec) if a.spec else Job(a.job_id, args=tuple(a.args))
        except UsageError as exc:
            log.error("gang assignment %s: invalid job: %s", a.run_id, exc)
            return EXIT_FAILED
        if job.kind == "trainer":  # the trainer's store is on the head's torchrun; user code finds the head itself
            wait_for_head(a.head, a.port, timeout_s=self.gang_timeout_s)
        self.platform.protect(True)
        rc = self.part(job, a)
        self.settle(preempted=rc == EXIT_PREEMPTED)
        if rc in (EXIT_OK, EXIT_PREEMPTED):
            log.info("job %s: this node's part %s", a.job_id, "done" if rc == EXIT_OK else "stopped after a checkpoint")
            return rc
        log.error("job %s: this node's part failed with exit status %d", a.job_id, rc)
        return EXIT_FAILED


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
    p.add_argument("--stop-grace", type=int, metavar="S",
                   help="seconds from SIGTERM to SIGKILL of a container or code-bundle job (default: what the "
                        "cloud's stop notice leaves, else 240)")
    args = p.parse_args(argv)
    if args.stop_grace is not None and args.stop_grace < 1:
        raise UsageError(f"--stop-grace: {args.stop_grace} is not allowed; expected seconds >= 1")
    node = node_schema.load(args.node_json, required=not (args.queue_url and args.bucket),
                            hint="give --queue-url and --bucket")
    queue_url, bucket = args.queue_url or node.get("queue_url"), args.bucket or node.get("bucket")
    if not queue_url or not bucket:
        raise UsageError(f"--queue-url/--bucket: missing, and {args.node_json} has no queue_url/bucket")
    if not 1 <= args.visibility <= 43200:
        raise UsageError(f"--visibility: {args.visibility} is not allowed; expected 1 to 43200 seconds")
    if not 0 <= args.wait <= 20:
        raise UsageError(f"--wait: {args.wait} is not allowed; expected 0 to 20 seconds")
    if node.get("mode", "queue") == "queue":
        return Agent(open_queue(queue_url, node.get("region")), bucket, node, args.work_dir,
                     visibility_s=args.visibility, wait_s=args.wait, stop_grace_s=args.stop_grace).serve(once=args.once)
    check_gang(node, args.node_json, bucket, args.rdzv_port, args.gang_timeout)
    queue = open_queue(queue_url, node.get("region"))
    platform = open_platform(node)
    agent = GangAgent(queue, bucket, node, args.work_dir, platform.board(bucket), port=args.rdzv_port,
                      gang_timeout_s=args.gang_timeout, visibility_s=args.visibility, wait_s=args.wait,
                      platform=platform, stop_grace_s=args.stop_grace)
    try:
        return agent.serve(once=args.once)
    except RendezvousError as exc:  # the gang cannot form or the head is out of reach: one line, exit 1
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED


def check_gang(node: dict, path: str, bucket: str, port: int, timeout_s: float) -> None:
    """Gang mode's settings, each refused in one line."""
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
