"""A stack's Slurm cluster, derived from its validated config and the instance catalog: pure functions.

Today's keys (``instanceTypes``, ``nodes``, ``spot``, ``mode``) make one partition, ``gpu``, of CLOUD nodes
``gpu-1..gpu-<nodes.max>``; its first ``nodes.min`` nodes never power down. A node's shape is the primary (first)
instance type's catalog row; its memory is the row's less a reserve for the OS and the daemons, so that slurmd's
RealMemory check passes on a node that reports a little less than the type's nominal size. Its features name
every instance type of the stack and what a job may ask for by ``--constraint``: ``spot``, ``efa``,
``infiniband`` and ``gang``.

The rendering itself (slurm.conf, gres.conf) is trainer.slurm.conf's; this module only builds its input.
"""
from __future__ import annotations

from infra import catalog
from infra.config import StackConfig
from trainer.slurm.conf import Cluster, Partition

PARTITION = "gpu"
MEMORY_RESERVE_PERCENT = 5  # of a node's nominal memory, left to the OS and daemons (not for RealMemory)

STATE_DIR = "/var/spool/slurmctld"
SPOOL_DIR = "/var/spool/slurmd"
LOG_DIR = "/var/log/slurm"
RUN_DIR = "/run/slurm"
SLURM_USER = "slurm"


def memory_mb(row: catalog.InstanceType) -> int:
    """RealMemory of a node of ``row``: its nominal MiB less the reserve, rounded down."""
    return row.memory_gib * 1024 * (100 - MEMORY_RESERVE_PERCENT) // 100


def features(cfg: StackConfig) -> tuple[str, ...]:
    """The node features of the stack's partition: every instance type, then spot, efa, infiniband, gang."""
    primary = cfg.primary
    gang = cfg.mode == "gang"
    flags = (("spot", cfg.spot), ("efa", gang and primary.max_efa > 0),
             ("infiniband", gang and primary.infiniband_gbps > 0), ("gang", gang))
    return tuple(cfg.instance_types) + tuple(name for name, on in flags if on)


def partitions(cfg: StackConfig) -> tuple[Partition, ...]:
    """The stack's partitions: one, ``gpu``, of nodes.max CLOUD nodes, nodes.min of them always on."""
    row = cfg.primary
    return (Partition(name=PARTITION, count=cfg.nodes.max, cpus=row.vcpus, memory_mb=memory_mb(row), gpus=row.gpus,
                      features=features(cfg), always_on=cfg.nodes.min, default=True),)


def cluster(cfg: StackConfig, controller: str, programs: dict[str, str]) -> Cluster:
    """The stack's Slurm cluster on its cloud: the controller's host name, the power-saving programs (resume,
    suspend, resume_fail -> executable path) and the cloud's standard paths."""
    return Cluster(name=cfg.stack, controller=controller, partitions=partitions(cfg), state_dir=STATE_DIR,
                   spool_dir=SPOOL_DIR, log_dir=LOG_DIR, run_dir=RUN_DIR, programs=dict(programs),
                   cloud=cfg.cloud, slurm_user=SLURM_USER)
