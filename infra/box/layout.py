"""Where everything of a box lives, and what it runs: pure functions of the box's directory, ports and nodes.

One directory holds it all (default ``~/.gpufleet/box``, or GPUFLEET_BOX_DIR) but its Unix sockets, which live
in ``/tmp/gpufleet-box-<digest of the directory>/`` (munge's socket, slurmd's spool with slurmstepd's):

    state.json         written once the box is up: pids, the account's endpoint, bucket, queues, nodes
    account/           moto's files
    munge/             the box's munge key, pid and log (munged of its own)
    accounting/        Slurm's accounting: MariaDB's files (db/) and slurmdbd's settings, pid and log; the teams'
                       accounts, fair share and GPU limits live there
    slurm/             slurm.conf, gres.conf, nodes.json, the power saving programs (bin/), state, logs,
                       job output
    credentials/<name>/ each node's job credentials: grants and tokens (trainer.node.jobcreds; the Prolog writes them)
    nodes/<name>/      each node's notice file (``gpufleet box notice``) and its jobs' files
    bridge/env/        the env values of the jobs the bridge submitted (records show names only)
"""
from __future__ import annotations

import hashlib
import json
import os
import pwd
import shlex
from dataclasses import dataclass
from pathlib import Path

from trainer.jobs.commands import box_dir as default_dir  # noqa: F401 (the one default)
from trainer.slurm.accounts import Dbd
from trainer.slurm.users import GROUP
from trainer.slurm.conf import Cluster, LocalNode, Partition

PARTITION = "gpu"
DEFAULT_NODES = 2
CPUS_PER_NODE = 1          # the box's nodes share this machine: one job each, like a GPU node
GPUS_PER_NODE = 1          # a stand-in (gres.conf's /dev/null) that Slurm allocates and limits as a GPU
MEMORY_MB = 2048
SUSPEND_TIME_S = 60        # idle nodes power down after a minute
CRED_EXPIRE_S = 10         # a requeued job waits this long (Slurm's default 120 s)
KILL_WAIT_S = 30
SLURMD_TIMEOUT_S = 20      # a node silent this long is DOWN and its jobs requeued
REPO = Path(__file__).resolve().parents[2]  # the checkout this box runs
REPO_AMI = REPO / "ami"  # the images' files the box runs as they are
MIN_JOB_AGE_S = 60         # an ended job leaves squeue after this (the bridge then reads accounting)


@dataclass(frozen=True)
class Layout:
    root: Path
    nodes: int = DEFAULT_NODES
    slurmctld_port: int = 0
    instance_type: str = "g6.xlarge"

    @property
    def state_file(self) -> Path:
        return self.root / "state.json"

    @property
    def bridge_env(self) -> Path:
        return self.root / "bridge" / "env"

    @property
    def slurm(self) -> Path:
        return self.root / "slurm"

    @property
    def slurm_conf(self) -> Path:
        return self.slurm / "slurm.conf"

    @property
    def nodes_config(self) -> Path:
        return self.slurm / "nodes.json"

    @property
    def sockets(self) -> Path:
        """Where the box's Unix sockets live: /tmp, named after the box. munged wants every directory above its
        socket searchable by all, which a home directory (0700 on Debian 12) or pytest's temporary directory is
        not; slurmstepd's sockets in the spool directory must fit a socket path's 108 bytes, which a deep
        --dir does not."""
        return Path("/tmp") / f"gpufleet-box-{self.digest}"

    @property
    def digest(self) -> str:
        return hashlib.sha256(str(self.root).encode()).hexdigest()[:12]

    @property
    def launcher(self) -> Path:
        """The box's launcher of jobs' containers, as /usr/local/sbin/gpufleet-container on a node: in /run, where
        only root writes, as the sudoers rule that names it (:attr:`sudoers_rule`) requires."""
        return Path("/run") / f"gpufleet-box-{self.digest}" / "gpufleet-container"

    @property
    def sudoers_rule(self) -> Path:
        return Path("/etc/sudoers.d") / f"gpufleet-box-{self.digest}"

    @property
    def munge_socket(self) -> Path:
        return self.sockets / "munge.socket"

    @property
    def spool_dir(self) -> Path:
        """slurmd's spool (a directory per node), with slurmstepd's sockets."""
        return self.sockets / "spool"

    @property
    def munge_key(self) -> Path:
        return self.root / "munge" / "munge.key"

    @property
    def output_dir(self) -> Path:
        return self.slurm / "output"

    @property
    def log_dir(self) -> Path:
        return self.slurm / "log"

    @property
    def run_dir(self) -> Path:
        return self.slurm / "run"

    @property
    def work_dir(self) -> Path:
        return self.root / "work"

    def team_work_dir(self, team: str) -> Path:
        """A team's work directory (the task's WORK_DIR/teams/<team>: its jobs' files and bundle cache)."""
        return self.work_dir / "teams" / team

    def team_output_dir(self, team: str) -> Path:
        """Where Slurm writes a team's job output (the bridge's --output-dir/<team>)."""
        return self.output_dir / team

    def node_names(self) -> list[str]:
        return [f"{PARTITION}-{i}" for i in range(1, self.nodes + 1)]

    def notice_file(self, node: str) -> Path:
        return self.root / "nodes" / node / "notice"

    def ports(self) -> dict[str, int]:
        """slurmctld's port, slurmd's default, one per node, one per node's job credentials endpoint
        (``credentials <node>``), slurmdbd's and MariaDB's, consecutive from slurmctld's."""
        base, names = self.slurmctld_port, self.node_names()
        last = base + 2 + 2 * len(names)
        return {"slurmctld": base, "slurmd": base + 1, **{n: base + 2 + i for i, n in enumerate(names)},
                **{f"credentials {n}": base + 2 + len(names) + i for i, n in enumerate(names)},
                "slurmdbd": last, "mariadb": last + 1}

    @property
    def accounting(self) -> Path:
        return self.root / "accounting"

    @property
    def database_dir(self) -> Path:
        return self.accounting / "db"

    @property
    def database_socket(self) -> Path:
        """MariaDB's socket (its root logs in through it; slurmdbd uses TCP on loopback)."""
        return self.sockets / "mariadb.socket"

    @property
    def slurmdbd_conf(self) -> Path:
        """Where slurmdbd reads it: beside slurm.conf (SLURM_CONF's directory)."""
        return self.slurm / "slurmdbd.conf"

    def credentials_dir(self, node: str) -> Path:
        """A node's job credentials' grants and tokens (trainer.node.jobcreds), as /run/gpufleet/credentials on a
        node: each node has its own, as each has its own endpoint."""
        return self.root / "credentials" / node

    @property
    def stand_ins(self) -> Path:
        """The nodes' stand-ins for hardware tools (nvidia-smi: the one stand-in GPU of gres.conf)."""
        return self.slurm / "stand-ins"

    def program(self, name: str) -> Path:
        return self.slurm / "bin" / name


def cluster(layout: Layout) -> Cluster:
    """The box's Slurm cluster: one partition of CLOUD nodes, each a local slurmd on its own port."""
    ports = layout.ports()
    s = layout.slurm
    return Cluster(
        name="box", controller="localhost", controller_addr="127.0.0.1",
        partitions=(Partition(PARTITION, layout.nodes, CPUS_PER_NODE, MEMORY_MB, GPUS_PER_NODE,
                              features=(layout.instance_type, "spot"), default=True),),
        state_dir=str(s / "state"), spool_dir=str(layout.spool_dir), log_dir=str(layout.log_dir),
        run_dir=str(layout.run_dir),
        programs={p: str(layout.program(p)) for p in ("resume", "suspend", "resume_fail")},
        cloud="local", slurmctld_port=ports["slurmctld"], slurmd_port=ports["slurmd"],
        slurm_user=box_user(), munge_socket=str(layout.munge_socket), cred_expire_s=CRED_EXPIRE_S,
        suspend_time_s=SUSPEND_TIME_S, suspend_timeout_s=10, resume_timeout_s=120,
        slurmd_timeout_s=SLURMD_TIMEOUT_S, kill_wait_s=KILL_WAIT_S, min_job_age_s=MIN_JOB_AGE_S, fast_scheduling=True,
        local_nodes={n: LocalNode(port=ports[n]) for n in layout.node_names()}, job_programs=job_programs(layout),
        accounting="127.0.0.1", accounting_port=ports["slurmdbd"])


def dbd(layout: Layout, password: str) -> Dbd:
    """The box's slurmdbd: on loopback, its database in the box's own MariaDB."""
    ports = layout.ports()
    return Dbd(port=ports["slurmdbd"], storage_port=ports["mariadb"], storage_user="slurm", storage_pass=password,
               slurm_user=box_user(), log_file=str(layout.log_dir / "slurmdbd.log"),
               pid_file=str(layout.run_dir / "slurmdbd.pid"), munge_socket=str(layout.munge_socket))


def box_user() -> str:
    return pwd.getpwuid(os.getuid()).pw_name


def team_users() -> bool:
    """Whether the box runs each team's jobs as the team's Unix user (trainer.slurm.users), as a cluster does: only
    root can make those users and have slurmd run jobs as them; a box of another user runs every job as it."""
    return os.geteuid() == 0


def program_script(python: str, action: str, nodes_config: Path, slurm_conf: Path, log: Path) -> str:
    """A power saving program: slurmctld runs it with a hostlist and an environment of its own (no PATH, no
    PYTHONPATH), so it names the checkout the box runs: the one a python's editable install points at may be
    another."""
    return ("#!/bin/sh\n"
            f"# slurmctld's {action} program for the box\n"
            f"PYTHONPATH={shlex.quote(str(REPO))} SLURM_CONF={shlex.quote(str(slurm_conf))} "
            f"exec {shlex.quote(python)} -m trainer nodes {action} \"$1\" "
            f"--config {shlex.quote(str(nodes_config))} >>{shlex.quote(str(log))} 2>&1\n")


def job_programs(layout: Layout) -> dict[str, str]:
    """The box's Prolog, Epilog and TaskProlog (trainer.slurm.conf's job_programs)."""
    return {p: str(layout.program(p)) for p in ("prolog", "epilog", "task_prolog")}


def job_program_scripts(layout: Layout, python: str, env: dict[str, str], bridge_user: str | None,
                        bucket: str) -> dict[str, str]:
    """What the box's job programs run: ``trainer credentials prolog|epilog`` with the node's own credentials (the
    account's: the environment ``env`` names, since slurmd gives a Prolog none), and the images' TaskProlog
    with the node's directory and endpoint (slurmd names the node: SLURMD_NODENAME). ``bridge_user``: who the
    bridge submits as, None where it submits as each team's user. A Prolog that fails is logged and ends 0: Slurm
    would drain the node."""
    keep = {k: v for k, v in env.items() if k.startswith("AWS_") or k in ("SLURM_CONF", "PYTHONPATH", "PATH")}
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted(keep.items()))
    log = shlex.quote(str(layout.log_dir / "credentials.log"))
    cred = f"{shlex.quote(python)} -m trainer credentials"
    task_prolog = shlex.quote(str(REPO_AMI / "files" / "gpufleet-task-prolog.sh"))
    nodes = "".join(
        f"  {shlex.quote(n)}) directory={shlex.quote(str(layout.credentials_dir(n)))}; "
        f"endpoint=http://127.0.0.1:{layout.ports()[f'credentials {n}']}/v1/credentials ;;\n"
        for n in layout.node_names())
    node = f'case "${{SLURMD_NODENAME:-}}" in\n{nodes}  *) exit 0 ;;\nesac\n'
    bridge = f" --bridge-user {shlex.quote(bridge_user)}" if bridge_user else ""  # else: each team's user
    return {
        "prolog": (f"#!/bin/sh\n# Slurm's Prolog for the box: the job's own credentials on this node\n{node}{exports}"
                   f'{cred} prolog --dir "$directory"{bridge} --bucket '
                   f"{shlex.quote(bucket)} --region {shlex.quote(env['AWS_DEFAULT_REGION'])} >>{log} 2>&1\nexit 0\n"),
        "epilog": f'#!/bin/sh\n{node}{exports}{cred} epilog --dir "$directory" >>{log} 2>&1\nexit 0\n',
        "task_prolog": ("#!/bin/sh\n# Slurm's TaskProlog for the box: the images' own, with this node's directory and "
                        f'endpoint\n{node}exec /bin/bash {task_prolog} /nonexistent "$directory" "$endpoint"\n'),
    }


def launcher_script(python: str, docker_host: str | None) -> str:
    """The box's launcher (root's, 0755): the images' gpufleet-container with the box's Python and Docker daemon.
    Nothing of the caller's reaches the module but sudo's SUDO_UID and SUDO_GID (``env -i``, ``python -I``)."""
    keep = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8",
            *([f"DOCKER_HOST={docker_host}"] if docker_host else [])]
    return ("#!/bin/sh\n# the box's launcher of jobs' containers (ami/files/gpufleet-container.sh on a node)\n"
            '[ "$(id -u)" = 0 ] || { echo "gpufleet-container: must run as root (through sudo)" >&2; exit 2; }\n'
            "cd /\n"
            f"exec env -i {' '.join(shlex.quote(k) for k in keep)} "
            '${SUDO_UID:+SUDO_UID="$SUDO_UID"} ${SUDO_GID:+SUDO_GID="$SUDO_GID"} '
            f'{shlex.quote(python)} -I -m trainer container "$@"\n')


def launcher_rule(launcher: Path) -> str:
    """The box's sudoers rule: the teams' users may run the box's launcher as root, nothing else (the images' rule
    for their own launcher, ami/files/sudoers-gpufleet-container, is every user's)."""
    return (f"# the box's launcher of jobs' containers (infra.box); removed when the box stops\n"
            f"Defaults!{launcher} env_reset, !env_keep, !env_check, !requiretty\n"
            f"%{GROUP} ALL=(root) NOPASSWD: {launcher}\n")


# The box's nvidia-smi: what the health check asks (the index of each GPU) for the node's one stand-in GPU.
NVIDIA_SMI = ("#!/bin/sh\n# the box's stand-in: one GPU (gres.conf's /dev/null), index 0\n"
              f"i=0; while [ $i -lt {GPUS_PER_NODE} ]; do echo $i; i=$((i + 1)); done\n")


def nodes_config(layout: Layout, python: str, imds: dict[str, str]) -> dict:
    """trainer.slurm.nodes.LocalProvider's config."""
    return {"provider": "local", "cloud": "aws", "slurm_conf": str(layout.slurm_conf),
            "run_dir": str(layout.run_dir), "spool_dir": str(layout.spool_dir), "log_dir": str(layout.log_dir),
            "python": python, "stand_ins": str(layout.stand_ins),
            "nodes": {n: {"imds": imds[n], "notice_file": str(layout.notice_file(n))} for n in layout.node_names()}}


def exports(state: dict) -> list[str]:
    """The shell lines that point Slurm's commands and `gpufleet jobs --stack box` at a running box."""
    return [f"export SLURM_CONF={shlex.quote(state['slurm_conf'])}",
            f"export GPUFLEET_BOX_DIR={shlex.quote(state['dir'])}"]


def read_state(root: Path) -> dict | None:
    try:
        return json.loads((root / "state.json").read_text())
    except (OSError, ValueError):
        return None
