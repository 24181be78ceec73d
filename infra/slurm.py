"""A stack's Slurm cluster, derived from its validated config and the instance catalog: pure functions.

Each of the config's partitions (``gpufleet:partitions``, or one partition ``gpu`` made of today's keys
``instanceTypes``, ``nodes``, ``spot``, ``mode``) is a Slurm partition of CLOUD nodes ``<name>-1..<name>-<nodes.max>``
whose first ``nodes.min`` nodes never power down. A node's shape is the primary (first)
instance type's catalog row; its memory is the row's less a reserve for the OS and the daemons, so that slurmd's
RealMemory check passes on a node that reports a little less than the type's nominal size. Its features name
every instance type of the partition and what a job may ask for by ``--constraint``: ``spot``, ``efa``,
``infiniband`` and ``gang``.

The rendering itself (slurm.conf, gres.conf) is trainer.slurm.conf's; this module only builds its input.
"""
from __future__ import annotations

from infra import catalog, config
from infra.config import StackConfig
from trainer.slurm.conf import Cluster, Partition

MEMORY_RESERVE_PERCENT = 5  # of a node's nominal memory, left to the OS and daemons (not for RealMemory)

SLURMCTLD_PORT = 6817
SLURMD_PORT = 6818
SRUN_PORTS = (60001, 63000)  # SrunPortRange: where srun listens for its steps' connections (the network allows them)
STATE_DIR = "/var/spool/slurmctld"
# slurmdbd runs on the controller beside slurmctld, listening on loopback only (no node talks to it): the teams'
# accounts, fair share and GPU limits (trainer.slurm.accounts; `gpufleet-trainer setup controller` starts it)
ACCOUNTING_HOST = "127.0.0.1"
SPOOL_DIR = "/var/spool/slurmd"
LOG_DIR = "/var/log/slurm"
RUN_DIR = "/run/slurm"
SLURM_USER = "slurm"
# The slurm user's ids, the same on the controller and every node (the image makes the user with them): the
# controller's state directory on the shared file system belongs to them.
SLURM_UID = 401
SLURM_GID = 401


def memory_mb(row: catalog.InstanceType) -> int:
    """RealMemory of a node of ``row``: its nominal MiB less the reserve, rounded down."""
    return row.memory_gib * 1024 * (100 - MEMORY_RESERVE_PERCENT) // 100


def features(part: config.Partition) -> tuple[str, ...]:
    """A partition's node features: every instance type, then spot, efa, infiniband, gang (what a job may ask for
    with --constraint; efa and infiniband only where the nodes talk to each other)."""
    primary = part.primary
    flags = (("spot", part.spot), ("efa", part.gang and primary.max_efa > 0),
             ("infiniband", part.gang and primary.infiniband_gbps > 0), ("gang", part.gang))
    return tuple(part.instance_types) + tuple(name for name, on in flags if on)


def partitions(cfg: StackConfig) -> tuple[Partition, ...]:
    """The stack's partitions (the first is Slurm's default): nodes.max CLOUD nodes each, nodes.min of them always
    on. A job spans several nodes only in a gang partition: only its nodes may reach each other."""
    return tuple(Partition(name=p.name, count=p.nodes.max, cpus=p.primary.vcpus, memory_mb=memory_mb(p.primary),
                           gpus=p.primary.gpus, features=features(p), always_on=p.nodes.min,
                           default=i == 0, max_nodes=None if p.gang else 1)
                 for i, p in enumerate(cfg.partitions))


def cluster(cfg: StackConfig, controller: str, programs: dict[str, str], controller_addr: str | None = None
            ) -> Cluster:
    """The stack's Slurm cluster on its cloud: the controller's host name (and address, where its name does not
    resolve), the power-saving programs (resume, suspend, resume_fail -> executable path) and the cloud's standard
    paths."""
    return Cluster(name=cfg.stack, controller=controller, controller_addr=controller_addr,
                   partitions=partitions(cfg), state_dir=STATE_DIR, spool_dir=SPOOL_DIR, log_dir=LOG_DIR,
                   run_dir=RUN_DIR, programs=dict(programs), cloud=cfg.cloud, slurm_user=SLURM_USER,
                   slurmctld_port=SLURMCTLD_PORT, slurmd_port=SLURMD_PORT, srun_ports=SRUN_PORTS,
                   accounting=ACCOUNTING_HOST)
