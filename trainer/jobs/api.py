"""The user API: what your own training script needs from the cluster. Small and stable.

    from trainer.jobs import api

    ckpt = api.Checkpointer()                  # the job's own checkpoint prefix (GPUFLEET_CHECKPOINT_URI)
    step, state = ckpt.restore()               # (0, None) on a fresh start
    if state:
        model.load_state_dict(state["model"]); opt.load_state_dict(state["optim"])
    for step in range(step + 1, total + 1):
        ...one optimizer step...
        if api.stop_requested():               # SIGTERM or the stop file: the node is going away
            ckpt.save(step, {"model": model.state_dict(), "optim": opt.state_dict()})
            raise SystemExit(api.EXIT_REQUEUE)  # 75: checkpointed, requeue me now
    ckpt.save(total, {...})

Off the cluster the same script runs as it is: the checkpoints go to ./checkpoints and only SIGTERM or SIGINT
stop it. The checkpointer is the trainer's own commit protocol (trainer.loop.checkpoint: parts first, then a
manifest with their sizes and SHA-256; a corrupt newest checkpoint is skipped), on a local path, S3 or Azure
Blob, so a resumed job continues at the step after the one it saved. In a multi-process job, save from one
rank (``info().rank == 0``) and let the ranks agree on stopping (any rank's request stops all).
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path

from trainer import EXIT_PREEMPTED
from trainer.loop.checkpoint import Checkpointer as Commits, from_bytes
from trainer.loop.stop import StopNotice, install_signal_handlers
from trainer.loop.storage import open_store

EXIT_REQUEUE = EXIT_PREEMPTED
DEFAULT_CHECKPOINT_URI = "checkpoints"

_notice = StopNotice()
_installed = False
_lock = threading.Lock()


@dataclass(frozen=True)
class JobInfo:
    job_id: str
    attempt: int
    checkpoint_uri: str
    nnodes: int
    node_rank: int
    nproc_per_node: int
    rdzv_endpoint: str | None
    stop_file: str | None
    rank: int          # torchrun's RANK (0 outside torchrun)
    world_size: int


def info(environ=os.environ) -> JobInfo:
    """This job as its node describes it (GPUFLEET_* variables); defaults for a run off the cluster."""
    get = environ.get
    return JobInfo(job_id=get("GPUFLEET_JOB_ID", "local"), attempt=int(get("GPUFLEET_ATTEMPT", "1")),
                   checkpoint_uri=get("GPUFLEET_CHECKPOINT_URI", DEFAULT_CHECKPOINT_URI),
                   nnodes=int(get("GPUFLEET_NNODES", "1")), node_rank=int(get("GPUFLEET_NODE_RANK", "0")),
                   nproc_per_node=int(get("GPUFLEET_NPROC_PER_NODE", "1")), rdzv_endpoint=get("GPUFLEET_RDZV_ENDPOINT"),
                   stop_file=get("GPUFLEET_STOP_FILE"), rank=int(get("RANK", "0")),
                   world_size=int(get("WORLD_SIZE", "1")))


def checkpoint_uri() -> str:
    """The job's own checkpoint prefix: ``<bucket>/teams/<team>/jobs/<job_id>/`` on the cluster, ./checkpoints
    elsewhere."""
    return info().checkpoint_uri


def watch_signals() -> None:
    """Turn SIGTERM and SIGINT into a stop request from now on (main thread; done once, by the first
    :func:`stop_requested` or :class:`Checkpointer`)."""
    global _installed
    with _lock:
        if not _installed and threading.current_thread() is threading.main_thread():
            install_signal_handlers(_notice)
            _installed = True


def stop_requested() -> bool:
    """Whether the job should checkpoint and exit 75 now: a SIGTERM/SIGINT came, or the stop file exists."""
    watch_signals()
    if _notice.is_set():
        return True
    stop_file = info().stop_file
    return bool(stop_file) and Path(stop_file).exists()


class Checkpointer:
    """Commit-protocol checkpoints of any state dicts at the job's checkpoint location (or ``uri``)."""

    def __init__(self, uri: str | None = None, keep: int = 2):
        watch_signals()
        self.uri = uri or checkpoint_uri()
        self._commits = Commits(open_store(self.uri), keep)

    def save(self, step: int, state: dict[str, object]) -> None:
        """Save ``{name: state dict or any torch-serializable object}`` as the checkpoint of ``step``."""
        self._commits.save(step, {f"{name}.pt": value for name, value in state.items()})

    def restore(self) -> tuple[int, dict | None]:
        """(step, {name: state}) of the newest valid checkpoint, or (0, None) when there is none."""
        found = self._commits.load_latest()
        if found is None:
            return 0, None
        step, parts = found
        return step, {name.removesuffix(".pt"): from_bytes(data) for name, data in parts.items()}

    def steps(self) -> list[int]:
        """Committed steps, newest first."""
        return self._commits.steps()
