"""How a job runs on a node: its environment, the docker argv of a container job, the process of a code bundle
or the built-in trainer, and the stop contract.

The environment of every job (DESIGN.md): GPUFLEET_JOB_ID, GPUFLEET_ATTEMPT, GPUFLEET_CHECKPOINT_URI (the job's
own prefix), GPUFLEET_NNODES, GPUFLEET_NODE_RANK, GPUFLEET_NPROC_PER_NODE, GPUFLEET_RDZV_ENDPOINT (head:port)
and GPUFLEET_STOP_FILE, plus the job's own env and the node's NCCL settings (/etc/gpufleet/container.env in a
container; the task's environment, which slurmd passes on, for a code bundle).

The stop contract: on a stop notice (a requeue), a cancel or the time limit, the job gets SIGTERM
(a container through ``docker stop`` with a grace that fits the notice, then SIGKILL; a code bundle's process
group, SIGKILL after the same grace) and the stop file appears (in a container ``/gpufleet/stop``). Exit 75
means "checkpointed, requeue me now"; 0 done; anything else a failure.

The derivations (:func:`node_facts`, :func:`job_environment`, :func:`docker_argv`, :func:`stop_grace`) are pure.
"""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("gpufleet.runner")

CONTROL_DIR = "/gpufleet"            # in a container: the job's control directory (the stop file lives there)
STOP_FILE = "stop"
CONTAINER_ENV_FILE = "/etc/gpufleet/container.env"
SCRATCH = "/mnt/scratch"
# Seconds from SIGTERM to SIGKILL. A spot notice comes 2 minutes ahead on AWS (the watcher polls every 2 s) and
# at least 30 s ahead on Azure (Scheduled Events Preempt); otherwise DEFAULT_GRACE_S.
NOTICE_GRACE_S = {"aws": 100, "azure": 20}
DEFAULT_GRACE_S = 240


@dataclass(frozen=True)
class NodeFacts:
    """What the argv needs to know of the node: its cloud, GPUs and fabric devices."""

    cloud: str | None
    gpus: int
    efa: int = 0               # EFA devices (/dev/infiniband/uverbs0..efa-1)
    infiniband: bool = False   # Azure InfiniBand (all of /dev/infiniband)


def node_facts(node: dict, instance_type: str | None, gpus_found: int) -> NodeFacts:
    """The node's facts from node.json's instance_types entry of its type (the only entry when the type is not
    known); GPUs as found on the machine (preflight checked them against the entry)."""
    types = node.get("instance_types") or {}
    row = types.get(instance_type) if instance_type else None
    if row is None and len(types) == 1:
        row = next(iter(types.values()))
    row = row or {}
    return NodeFacts(node.get("cloud"), gpus_found, int(row.get("efa", 0)), int(row.get("infiniband_gbps", 0)) > 0)


def stop_grace(cloud: str | None) -> int:
    """Seconds a stopping job has from SIGTERM to SIGKILL: what the cloud's notice leaves, else the default (a stop
    may be a notice's requeue: Slurm's SIGTERM does not say)."""
    return NOTICE_GRACE_S.get(cloud, DEFAULT_GRACE_S)


def job_environment(job_id: str, attempt: int, checkpoint_uri: str, nnodes: int, node_rank: int, nproc: int,
                    rdzv_endpoint: str, stop_file: str, env: dict[str, str]) -> dict[str, str]:
    """The job's own env (secrets already resolved) and the GPUFLEET_* variables, which win."""
    return {**env,
            "GPUFLEET_JOB_ID": job_id, "GPUFLEET_ATTEMPT": str(attempt), "GPUFLEET_CHECKPOINT_URI": checkpoint_uri,
            "GPUFLEET_NNODES": str(nnodes), "GPUFLEET_NODE_RANK": str(node_rank),
            "GPUFLEET_NPROC_PER_NODE": str(nproc), "GPUFLEET_RDZV_ENDPOINT": rdzv_endpoint,
            "GPUFLEET_STOP_FILE": stop_file}


NOBODY = (65534, 65534)  # nobody:nogroup


def container_user(uid: int, gid: int) -> tuple[int, int]:
    """Who a container job runs as: the task's own user (Slurm runs the task as the job's user), or nobody where
    the task runs as root (a box or a test run by root): never root."""
    return NOBODY if uid == 0 else (uid, gid)


def job_scratch(root: Path, attempt: int, owner: tuple[int, int]) -> Path:
    """A new scratch directory of the attempt's own in ``root`` (mode 0700, owned by ``owner``; the caller removes
    it when the attempt ends). On a node ``root`` is /mnt/scratch/jobs (root's, mode 1733: every job makes its own
    there and none can list or remove another's)."""
    path = Path(tempfile.mkdtemp(prefix=f"scratch-{attempt}-", dir=root))
    if (os.getuid(), os.getgid()) != owner:
        os.chown(path, *owner, follow_symlinks=False)
    return path


def docker_argv(name: str, image: str, command: list[str], env: dict[str, str], facts: NodeFacts,
                gpus: int | None, control_dir: str | None, grace_s: int, user: str, scratch_dir: str,
                secret_names: tuple[str, ...] = (), container_env_file: bool = True,
                extra: tuple[str, ...] = (), memlock: str = "-1:-1") -> list[str]:
    """`docker run` of a container job: as ``user`` ("UID:GID", never root), with every capability dropped (but
    IPC_LOCK where InfiniBand wants it), no new privileges and Docker's default seccomp profile; the job's GPUs,
    every EFA/InfiniBand device, host network (where the job's own credentials are served on loopback; the
    metadata service answers only root) and IPC, memlock unlimited (``memlock``: a host's own limit where it allows
    no more), the job's own scratch directory at /mnt/scratch (also its HOME and TMPDIR unless its env names them),
    the node's NCCL settings, the job's environment and its control directory (if any). GPU flags only on a node
    with GPUs.

    ``secret_names`` are passed by name only (docker reads their values from its own environment), so no secret
    shows in the argv. ``extra`` is for tests (mounts of the host's Python); production passes none.
    """
    if user.split(":")[0] in ("0", "root"):
        raise ValueError("docker_argv: a job's container never runs as root")
    argv = ["docker", "run", "--rm", "--name", name, "--label", "gpufleet.job", "--init",
            "--user", user, "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
            "--network", "host", "--ipc", "host", "--ulimit", f"memlock={memlock}",
            "--ulimit", "stack=67108864:67108864",
            "--stop-signal", "SIGTERM", "--stop-timeout", str(grace_s)]
    want = facts.gpus if gpus is None else min(gpus, facts.gpus)
    if facts.gpus > 0 and want > 0:
        devices = "all" if want == facts.gpus else '"device=' + ",".join(str(i) for i in range(want)) + '"'
        argv += ["--runtime", "nvidia", "--gpus", devices]
    for i in range(facts.efa):
        argv += ["--device", f"/dev/infiniband/uverbs{i}"]
    if facts.infiniband:
        argv += ["--device", "/dev/infiniband", "--cap-add", "IPC_LOCK"]
    argv += ["--volume", f"{scratch_dir}:{SCRATCH}"]
    if control_dir is not None:
        argv += ["--volume", f"{control_dir}:{CONTROL_DIR}"]
    if container_env_file:
        argv += ["--env-file", CONTAINER_ENV_FILE]
    env = {"HOME": SCRATCH, "TMPDIR": SCRATCH, **env}
    for key in sorted(env):
        argv += ["--env", key if key in secret_names else f"{key}={env[key]}"]
    return [*argv, *extra, image, *command]


def loggable(argv: list[str], command: list[str]) -> list[str]:
    """A docker argv (of ``command``) as logs may show it: each ``--env KEY=VALUE`` of docker's options as its name
    alone, the job's command as it is. A value may be a secret under a name the denylist does not know (DB_PASS,
    OPENAI_KEY, DATABASE_URL), and the log is shipped off the node."""
    options = len(argv) - len(command)
    return [a.split("=", 1)[0] if 0 < i < options and argv[i - 1] == "--env" else a for i, a in enumerate(argv)]


def code_environment(base: dict[str, str], job_env: dict[str, str], python_bin: str) -> dict[str, str]:
    """A code bundle's environment: the task's (the node's NCCL settings included), the node image's Python first
    on PATH (so `python` and `torchrun` are the image's), then the job's."""
    path = os.pathsep.join(filter(None, [python_bin, base.get("PATH", os.defpath)]))
    return {**base, "PATH": path, **job_env}


class Running:
    """One attempt's process: ``wait()`` its exit status, ``stop(grace_s)`` from any thread."""

    def __init__(self, proc: subprocess.Popen, stop_file: Path | None = None):
        self.proc, self.stop_file = proc, stop_file
        self.stop_requested = False

    def wait(self) -> int:
        return self.proc.wait()

    def signal_stop(self) -> None:
        """The stop file, for code that polls. The job can write its control directory: whatever it left at the
        stop file's name (a link to a file of someone else's, say) is removed, and neither the directory nor the
        file is opened through a link."""
        if self.stop_file is None:
            return
        try:
            self.stop_file.parent.mkdir(parents=True, exist_ok=True)
            parent = os.open(self.stop_file.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            try:
                try:
                    os.unlink(self.stop_file.name, dir_fd=parent)
                except FileNotFoundError:
                    pass
                fd = os.open(self.stop_file.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644,
                             dir_fd=parent)
                with os.fdopen(fd, "w") as f:
                    f.write("stop\n")
            finally:
                os.close(parent)
        except OSError as exc:  # a link for a directory, a directory for the file, a file made in between
            log.warning("stop file %s not written: %s; the job gets its signal", self.stop_file, exc.strerror)

    def stop(self, grace_s: int) -> None:
        raise NotImplementedError


class TrainerRun(Running):
    """The built-in trainer (torchrun through trainer.node.launch, or one process): its own handler checkpoints."""

    def __init__(self, proc: subprocess.Popen, stop_file: Path, workers: bool):
        super().__init__(proc, stop_file)
        self.workers = workers

    def stop(self, grace_s: int) -> None:
        self.stop_requested = True
        self.signal_stop()
        targets = children(self.proc.pid) if self.workers else []
        for pid in targets or [self.proc.pid]:  # torchrun's workers directly, so that torchrun sees their 75
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass


class ProcessGroupRun(Running):
    """A code bundle's command in its own session: SIGTERM to the group, SIGKILL after the grace. When the
    command exits, what it left running in its group is killed (the group id stays taken while any member lives)."""

    def __init__(self, proc: subprocess.Popen, stop_file: Path):
        super().__init__(proc, stop_file)
        self._timer: threading.Timer | None = None

    def wait(self) -> int:
        rc = self.proc.wait()
        if self._timer:
            self._timer.cancel()
        self._kill(signal.SIGKILL)
        return rc

    def stop(self, grace_s: int) -> None:
        self.stop_requested = True
        self.signal_stop()
        self._kill(signal.SIGTERM)
        self._timer = threading.Timer(grace_s, self._kill, (signal.SIGKILL,))
        self._timer.daemon = True
        self._timer.start()

    def _kill(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def children(pid: int) -> list[int]:
    """Direct child processes (Linux /proc)."""
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            found += [int(c) for c in task.read_text().split()]
        except OSError:
            pass
    return found
