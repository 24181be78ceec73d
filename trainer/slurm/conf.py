"""slurm.conf and gres.conf of a cluster, rendered by pure functions from a :class:`Cluster`.

A cluster is a controller and partitions of CLOUD nodes (one partition per node group). Nodes are named
``<partition>-<n>`` (n from 1) and powered up and down by Slurm's power saving through the three programs of
``trainer nodes`` (``ResumeProgram``, ``SuspendProgram``, ``ResumeFailProgram``); an idle cluster holds none
but a partition's ``always_on`` first nodes (``SuspendExcNodes``). A job that checkpointed and exited 75 is
requeued by Slurm itself (``RequeueExit=75``); ``KillWait`` is the time a stopping job has between SIGTERM and
SIGKILL, sized to the cloud's notice.

Who builds a Cluster: infra (a stack's config and the catalog, :mod:`infra.slurm`) and the box (local nodes on loopback, each with its own port). Nothing here reads a file or the environment.

A cloud cluster is configless: only the controller holds slurm.conf and gres.conf; slurmctld serves both
(``SlurmctldParameters=enable_configless``, Slurm 20.02 and later) to each node's slurmd, which is started with
``--conf-server ADDR:PORT`` and keeps them in its spool's conf-cache (client commands on the node find them
through /run/slurm/conf). A cloud cluster's text targets the Slurm the images bake (ami/versions.json, 26.05):
``cloud_reg_addrs`` and ``PrivateData=cloud`` are left out there, since 23.11 and 23.02 made them the default
(23.11 logs the first as defunct). The box runs Debian's Slurm 22.05 and keeps both, and reads its files
itself (every slurmd is started with ``-f``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from trainer.errors import UsageError

EXIT_REQUEUE = 75  # trainer.EXIT_PREEMPTED: checkpointed, run me again
PARTITION_NAME = re.compile(r"[a-z][a-z0-9]{0,14}\Z")
# Seconds from SIGTERM to SIGKILL for a job Slurm stops (requeue, cancel, timeout): what the cloud's spot notice
# leaves after the watcher saw it (AWS: 2 minutes ahead; Azure: Scheduled Events' Preempt, >= 30 s ahead).
MAX_ARRAY_SIZE = 10001  # a sweep of up to 10000 jobs (the job schema's array.count) is one array
KILL_WAIT_S = {"aws": 100, "azure": 20, "tencent": 100, "local": 30}
# The power saving programs the images install (ami/files/gpufleet-power.sh): what a cloud cluster's
# ResumeProgram, SuspendProgram and ResumeFailProgram name.
IMAGE_PROGRAMS = {"resume": "/usr/local/sbin/gpufleet-resume", "suspend": "/usr/local/sbin/gpufleet-suspend",
                  "resume_fail": "/usr/local/sbin/gpufleet-resume-fail"}
# The images' TaskProlog (ami/files/gpufleet-task-prolog.sh): every task of a job gets the node's NCCL/EFA settings,
# and the job's own credentials (trainer.node.jobcreds), which the Prolog grants and the Epilog revokes.
IMAGE_TASK_PROLOG = "/usr/local/sbin/gpufleet-task-prolog"
IMAGE_JOB_PROGRAMS = {"prolog": "/usr/local/sbin/gpufleet-prolog", "epilog": "/usr/local/sbin/gpufleet-epilog",
                      "task_prolog": IMAGE_TASK_PROLOG}
JOB_PROGRAM_KEYS = {"prolog": "Prolog", "epilog": "Epilog", "task_prolog": "TaskProlog"}


@dataclass(frozen=True)
class Partition:
    """One node group: ``count`` CLOUD nodes named ``<name>-1..<name>-<count>`` of one shape."""

    name: str
    count: int
    cpus: int
    memory_mb: int
    gpus: int = 0
    features: tuple[str, ...] = ()   # instance type(s), "efa", "infiniband", "spot", "gang"
    always_on: int = 0               # the first nodes never power down (nodes.min)
    default: bool = False
    max_time: str = "INFINITE"
    max_nodes: int | None = None     # nodes a job may span (1: nodes that cannot reach each other); None: all

    def __post_init__(self):
        if not PARTITION_NAME.match(self.name):
            raise UsageError(f"partition {self.name!r}: expected 1-15 lowercase letters and digits, starting with a "
                             "letter")
        if self.count < 1 or not 0 <= self.always_on <= self.count:
            raise UsageError(f"partition {self.name}: {self.count} node(s) with {self.always_on} always on is not "
                             "allowed; expected count >= 1 and 0 <= always_on <= count")

    def node_names(self) -> list[str]:
        return [f"{self.name}-{i}" for i in range(1, self.count + 1)]

    def hostlist(self, first: int = 1, last: int | None = None) -> str:
        last = self.count if last is None else last
        return f"{self.name}-{first}" if first == last else f"{self.name}-[{first}-{last}]"


@dataclass(frozen=True)
class LocalNode:
    """Where a node of the box listens: every node on one host, each slurmd on its own port."""

    addr: str = "127.0.0.1"
    hostname: str = "localhost"
    port: int = 0


@dataclass(frozen=True)
class Cluster:
    name: str
    controller: str                  # SlurmctldHost: the controller's host name
    partitions: tuple[Partition, ...]
    state_dir: str                   # StateSaveLocation (a volume a replacement controller takes over)
    spool_dir: str                   # SlurmdSpoolDir (%n: one per node)
    log_dir: str
    run_dir: str                     # pid files
    programs: dict[str, str]         # resume, suspend, resume_fail -> executable path
    cloud: str = "local"
    controller_addr: str | None = None
    slurmctld_port: int = 6817
    slurmd_port: int = 6818
    srun_ports: tuple[int, int] | None = None  # SrunPortRange: where srun listens (the network allows just these)
    slurm_user: str = "slurm"
    munge_socket: str | None = None
    cred_expire_s: int = 120         # a requeued job waits this long (Slurm's default 120)
    suspend_time_s: int = 300        # idle seconds before a node powers down
    suspend_timeout_s: int = 120     # seconds a node takes to power down
    resume_timeout_s: int = 900      # seconds a node may take from resume to registered
    slurmd_timeout_s: int = 300      # a node silent this long is DOWN (its jobs requeued)
    kill_wait_s: int | None = None   # None: KILL_WAIT_S[cloud]
    min_job_age_s: int = 600         # an ended job stays in squeue this long (then: accounting)
    fast_scheduling: bool = False    # short scheduler passes (the box)
    local_nodes: dict[str, LocalNode] = field(default_factory=dict)  # the box: node name -> its address and port
    accounting: str | None = None    # slurmdbd host, or None: completed jobs in a file (sacct -c), no teams
    accounting_port: int = 6819      # slurmdbd's DbdPort
    job_programs: dict[str, str] | None = None  # prolog, epilog, task_prolog -> path; None: the images' (the box: none)

    def nodes(self) -> list[str]:
        return [n for p in self.partitions for n in p.node_names()]


def _job_programs(cluster: Cluster) -> dict[str, str]:
    if cluster.job_programs is not None:
        return cluster.job_programs
    return {} if cluster.local_nodes else IMAGE_JOB_PROGRAMS


def _power_exclusions(cluster: Cluster) -> list[str]:
    return [p.hostlist(1, p.always_on) for p in cluster.partitions if p.always_on]


def _accounting(cluster: Cluster) -> list[str]:
    """slurmdbd keeps the accounting: each team an account (trainer.slurm.accounts) whose associations, GPU limit
    and fair share Slurm enforces; a job's priority weighs its team's fair share first (multifactor)."""
    return ["AccountingStorageType=accounting_storage/slurmdbd", f"AccountingStorageHost={cluster.accounting}",
            f"AccountingStoragePort={cluster.accounting_port}",
            # munge through the box's own socket (on a node, munged's default socket)
            *([f"AccountingStoragePass={cluster.munge_socket}"] if cluster.munge_socket else []),
            "AccountingStorageTRES=gres/gpu",
            "AccountingStorageEnforce=associations,limits,safe",
            "PriorityType=priority/multifactor",
            "PriorityWeightFairshare=10000",
            "PriorityWeightAge=1000"]


def render_slurm_conf(cluster: Cluster) -> str:
    """The cluster's slurm.conf: every line the controller and the nodes read."""
    if not cluster.partitions:
        raise UsageError(f"cluster {cluster.name}: no partitions; a cluster needs at least one node group")
    names = [p.name for p in cluster.partitions]
    if len(set(names)) != len(names):
        raise UsageError(f"cluster {cluster.name}: partition names repeat ({', '.join(names)})")
    kill_wait = cluster.kill_wait_s if cluster.kill_wait_s is not None else KILL_WAIT_S.get(cluster.cloud, 30)
    host = cluster.controller + (f"({cluster.controller_addr})" if cluster.controller_addr else "")
    auth = [f"cred_expire={cluster.cred_expire_s}"] + ([f"socket={cluster.munge_socket}"] if cluster.munge_socket
                                                      else [])
    lines = [
        "# Rendered by trainer.slurm.conf from the stack's config: edit the config, not this file.",
        f"ClusterName={cluster.name}",
        f"SlurmctldHost={host}",
        f"SlurmctldPort={cluster.slurmctld_port}",
        f"SlurmdPort={cluster.slurmd_port}",
        f"SlurmUser={cluster.slurm_user}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo={','.join(auth)}",
        f"StateSaveLocation={cluster.state_dir}",
        f"SlurmdSpoolDir={cluster.spool_dir}/%n",
        f"SlurmctldPidFile={cluster.run_dir}/slurmctld.pid",
        f"SlurmdPidFile={cluster.run_dir}/slurmd-%n.pid",
        f"SlurmctldLogFile={cluster.log_dir}/slurmctld.log",
        f"SlurmdLogFile={cluster.log_dir}/slurmd-%n.log",
        "CommunicationParameters=NoInAddrAny" if cluster.local_nodes else "",
        "MpiDefault=none",
        "ProctrackType=proctrack/linuxproc" if cluster.local_nodes else "ProctrackType=proctrack/cgroup",
        "TaskPlugin=task/none" if cluster.local_nodes else "TaskPlugin=task/cgroup,task/affinity",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        "GresTypes=gpu",
        "JobAcctGatherType=jobacct_gather/none",
        *(_accounting(cluster) if cluster.accounting else
          ["AccountingStorageType=accounting_storage/none", "JobCompType=jobcomp/filetxt",
           f"JobCompLoc={cluster.log_dir}/jobcomp.log"]),
        # Requeue: a job that checkpointed and exited 75 runs again; a node failure requeues its jobs; the output
        # of a requeued job is appended to, not truncated.
        "JobRequeue=1",
        f"RequeueExit={EXIT_REQUEUE}",
        "JobFileAppend=1",
        f"KillWait={kill_wait}",
        f"SlurmdTimeout={cluster.slurmd_timeout_s}",
        "ReturnToService=2",
        f"MinJobAge={cluster.min_job_age_s}",
        f"MaxArraySize={MAX_ARRAY_SIZE}",
        f"SrunPortRange={cluster.srun_ports[0]}-{cluster.srun_ports[1]}" if cluster.srun_ports else "",
        # No HealthCheckProgram: with one (even `sleep 0.5`), about one CLOUD node in three powered up here stayed
        # POWERING_UP after it registered, its job in CONFIGURING until ResumeTimeout (22.05, measured). The node's
        # watcher runs the preflight instead (trainer.slurm.nodes.health): it drains a bad node.
        # Power saving: CLOUD nodes started by ResumeProgram when a job needs them, stopped when idle.
        f"ResumeProgram={cluster.programs['resume']}",
        f"SuspendProgram={cluster.programs['suspend']}",
        f"ResumeFailProgram={cluster.programs['resume_fail']}",
        f"SuspendTime={cluster.suspend_time_s}",
        f"SuspendTimeout={cluster.suspend_timeout_s}",
        f"ResumeTimeout={cluster.resume_timeout_s}",
        "ResumeRate=0",
        "SuspendRate=0",
        *([f"SuspendExcNodes={','.join(_power_exclusions(cluster))}"] if _power_exclusions(cluster) else []),
        # idle_on_node_suspend: a node that failed is made available again once it is powered down. The box's
        # Slurm (22.05) needs cloud_reg_addrs (a node's address from its registration) and PrivateData=cloud
        # (powered-down nodes shown), the images' have both as defaults; a cloud cluster serves its config.
        "SlurmctldParameters=idle_on_node_suspend,cloud_reg_addrs" if cluster.local_nodes else
        "SlurmctldParameters=enable_configless,idle_on_node_suspend",
        "PrivateData=cloud" if cluster.local_nodes else "",
        # a job's own credentials on each of its nodes (granted, revoked), and every task gets them and the node's
        # NCCL/EFA settings
        *(f"{JOB_PROGRAM_KEYS[k]}={path}" for k, path in _job_programs(cluster).items()),
        "TreeWidth=65533",
        "SchedulerParameters=bf_interval=2,sched_interval=2,sched_min_interval=100000"
        if cluster.fast_scheduling else "SchedulerParameters=bf_interval=30",
    ]
    lines = [ln for ln in lines if ln]
    lines.append("")
    for p in cluster.partitions:
        shape = f"CPUs={p.cpus} RealMemory={p.memory_mb}" + (f" Gres=gpu:{p.gpus}" if p.gpus else "")
        features = f" Features={','.join(p.features)}" if p.features else ""
        if cluster.local_nodes:
            for n in p.node_names():
                at = cluster.local_nodes.get(n)
                if at is None:
                    raise UsageError(f"cluster {cluster.name}: node {n} has no local address and port")
                lines.append(f"NodeName={n} NodeAddr={at.addr} NodeHostname={at.hostname} Port={at.port} "
                             f"{shape}{features} State=CLOUD")
        else:
            lines.append(f"NodeName={p.hostlist()} {shape}{features} State=CLOUD")
    for p in cluster.partitions:
        span = f" MaxNodes={p.max_nodes}" if p.max_nodes else ""
        lines.append(f"PartitionName={p.name} Nodes={p.hostlist()} Default={'YES' if p.default else 'NO'} "
                     f"MaxTime={p.max_time}{span} State=UP OverSubscribe=NO")
    return "\n".join(lines) + "\n"


def render_gres_conf(cluster: Cluster) -> str:
    """gres.conf: each GPU node's GPUs (their device files, which the node image has). A box's node has one, a
    stand-in: /dev/null (Slurm's gpu plugin counts device files; it allocates and limits the stand-in all the
    same, and no job here uses a GPU)."""
    lines = ["# Rendered by trainer.slurm.conf: the GPUs of each partition's nodes."]
    for p in cluster.partitions:
        if p.gpus:
            last = p.gpus - 1
            files = "/dev/nvidia0" if last == 0 else f"/dev/nvidia[0-{last}]"
            if cluster.local_nodes and p.gpus > 1:
                raise UsageError(f"partition {p.name}: {p.gpus} GPUs on a local node; a box's node has at most one "
                                 "(/dev/null stands in for it)")
            lines.append(f"NodeName={p.hostlist()} Name=gpu File={'/dev/null' if cluster.local_nodes else files}")
    return "\n".join(lines) + "\n"
