"""`python -m trainer setup node|controller`: a machine of a cloud stack becomes part of its Slurm cluster at boot.

Run as root by a oneshot unit of the image (gpufleet-node.service, gpufleet-controller.service), after user-data
wrote the settings (/etc/gpufleet/node.json on a GPU node, /etc/gpufleet/controller.json on the controller).

node: this machine's Slurm name (the ``gpufleet-slurm-node`` tag the node provider set, through the cloud's
``node_name``) and the stack's munge key (the cloud's ``munge_key``: read from the stack's secret with the
machine's identity) become /etc/munge/munge.key and /etc/default/slurmd (``SLURMD_OPTIONS="-N NAME --conf-server
ADDR:PORT"``: slurmd fetches slurm.conf and gres.conf from slurmctld, configless); each team of node.json's
``teams`` gets its Unix user (trainer.slurm.users: its jobs run as it), its work directory (the user's home,
/var/lib/gpufleet/teams/<team>) and its job output directory (/var/log/gpufleet/jobs/<team>), both its own and
0700; then munge, slurmd and the node's notice watcher (gpufleet-watch@NAME) are started.

controller: the munge key (generated and stored in the secret at the stack's first boot, ``create=True``), the
Slurm state directory (StateSaveLocation, on the shared file system; owned by the slurm user, 0700), the
bridge's settings (/etc/gpufleet/bridge.env, read by gpufleet-bridge.service) and the teams' Unix users (the
bridge submits each team's jobs as its user); then munge, Slurm's accounting
(MariaDB, and slurmdbd over it, both on loopback; slurmdbd's database password is made at each boot and lives
only in slurmdbd.conf, 0600 for the slurm user), slurmctld, the teams' accounts (trainer.slurm.accounts, from
controller.json's teams: each with its team's user only), the bridge and the healer are started.

A privileged process never writes where a link can be planted: the key and every file here are written to a
temporary file in their directory (any link at that name is removed, never followed) and renamed over the
target (a link there is replaced, never followed); directories are walked with O_NOFOLLOW from the root down.
The key is never logged.
"""
from __future__ import annotations

import errno
import grp
import logging
import os
import pwd
import re
import secrets
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Callable

from trainer.clouds import node_adapter
from trainer.errors import ArgumentParser, Fault, UsageError
from trainer.node import node_schema
from trainer.slurm import accounts, users

log = logging.getLogger("gpufleet.setup")

MUNGE_KEY = "/etc/munge/munge.key"
SLURMD_DEFAULTS = "/etc/default/slurmd"
BRIDGE_ENV = "/etc/gpufleet/bridge.env"
SLURM_CONF = "/etc/slurm/slurm.conf"
SLURMDBD_CONF = "/etc/slurm/slurmdbd.conf"
DBD_PORT = 6819       # trainer.slurm.conf's accounting_port
DATABASE_PORT = 3306  # the image's MariaDB (bound to loopback)
READY_S = 120.0       # how long slurmdbd and slurmctld may take to answer sacctmgr
MUNGE_USER = "munge"
SLURM_USER = "slurm"
JOB_USER = "gpufleet"                            # the image's job user (ami/scripts/45-slurm.sh)
JOB_METRICS = "/var/log/gpufleet/metrics.log"    # trainer.slurm.task.EMF_LOG
JOB_OUTPUT = "/var/log/gpufleet/jobs"            # the bridge's --output-dir: Slurm writes OUTPUT/<team>/ there
MIN_KEY_BYTES = 32  # munged refuses a shorter key
NODE_NAME = re.compile(r"[a-z][a-z0-9]{0,14}-[1-9][0-9]{0,5}\Z")  # <partition>-<n>, trainer.slurm.conf's names
# What the controller's bridge reads besides its flags: the standard variables of each cloud's SDK.
REGION_VARIABLE = {"aws": "AWS_DEFAULT_REGION", "tencent": "TENCENTCLOUD_REGION"}


def _systemctl(args: list[str]) -> None:
    done = subprocess.run(["systemctl", *args], capture_output=True, text=True)
    if done.returncode != 0:
        why = next((ln.strip() for ln in done.stderr.splitlines() if ln.strip()), f"exit status {done.returncode}")
        raise Fault(f"setup: systemctl {' '.join(args)}: {why}")


def _user(name: str) -> tuple[int, int]:
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise Fault(f"setup: no user {name!r} on this machine; the image creates it (ami/scripts/45-slurm.sh)") \
            from None
    return entry.pw_uid, entry.pw_gid


def _group(name: str) -> int:
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        raise Fault(f"setup: no group {name!r} on this machine") from None


def _command(argv: list[str], input: str | None = None) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, input=input)
    if done.returncode != 0:
        why = next((ln.strip() for ln in (done.stderr + done.stdout).splitlines() if ln.strip()),
                   f"exit status {done.returncode}")
        raise Fault(f"{argv[0]}: {why}")
    return done.stdout


def _adapter(cloud: str):
    return node_adapter(cloud)


@dataclass
class System:
    """What setup does to the machine, injectable: ``root`` prefixes every path it writes; ``systemctl(args)``,
    ``chown(fd, uid, gid)``, ``user(name) -> (uid, gid)``, ``group(name) -> gid``, ``accounts() -> (users,
    groups)`` (as trainer.slurm.users.plan reads them), ``adapter(cloud)`` (the cloud's Slurm module with
    ``node_name`` and ``munge_key``), ``command(argv, input) -> stdout`` (MariaDB's client, sacctmgr; Fault when
    it fails) and ``sleep``."""

    root: Path = Path("/")
    systemctl: Callable[[list[str]], None] = _systemctl
    chown: Callable[[int, int, int], None] = os.fchown
    user: Callable[[str], tuple[int, int]] = _user
    group: Callable[[str], int] = _group
    accounts: Callable[[], tuple[dict, dict]] = users.machine
    adapter: Callable[[str], object] = _adapter
    command: Callable[..., str] = _command
    sleep: Callable[[float], None] = time.sleep
    started: list[str] = field(default_factory=list)

    def path(self, absolute: str) -> Path:
        return self.root / absolute.lstrip("/")

    def start(self, unit: str, restart: bool = False) -> None:
        """Start a unit (restart: one whose configuration was just written, in case it already runs)."""
        self.systemctl(["restart" if restart else "start", unit])
        self.started.append(unit)


# --- writing without following links ------------------------------------------------------------------------------

def _parts(system: System, absolute: str) -> list[str]:
    parts = [p for p in PurePosixPath(absolute).parts if p not in ("/", "")]
    if ".." in parts:
        raise UsageError(f"setup: {absolute}: '..' is not allowed in a path")
    return parts


def open_dir(system: System, absolute: str, mode: int = 0o755) -> int:
    """A descriptor of directory ``absolute`` under the root, made with ``mode`` where missing (its missing parents
    0755); no component may be a symbolic link (O_NOFOLLOW at every step). The caller closes it."""
    fd = os.open(system.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    parts = _parts(system, absolute)
    try:
        for i, part in enumerate(parts):
            try:
                os.mkdir(part, mode if i == len(parts) - 1 else 0o755, dir_fd=fd)
            except FileExistsError:
                pass
            try:
                child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise Fault(f"setup: {absolute}: {part} is a symbolic link or not a directory; refusing to "
                                "follow it") from None
                raise
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_file(system: System, absolute: str, data: bytes, mode: int, owner: tuple[int, int] | None = None,
               dir_mode: int = 0o755) -> None:
    """Write ``data`` to ``absolute`` (under the root) with ``mode`` and ``owner`` (default: left as created, root):
    through ``<name>.tmp`` beside it, created exclusively without following a link (a link planted at that name
    is removed first, its target untouched), then renamed over the target (a link there is replaced, not
    followed)."""
    name = PurePosixPath(absolute).name
    tmp = f".{name}.tmp"
    dfd = open_dir(system, str(PurePosixPath(absolute).parent), dir_mode)
    try:
        try:
            os.unlink(tmp, dir_fd=dfd)  # unlink removes a link itself, never what it points at
        except FileNotFoundError:
            pass
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
        try:
            if owner is not None:
                system.chown(fd, *owner)
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        os.fsync(dfd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dfd)
        except OSError:
            pass
        raise
    finally:
        os.close(dfd)


def make_private_dir(system: System, absolute: str, owner: tuple[int, int]) -> None:
    """Directory ``absolute`` (parents made 0755 where missing) owned by ``owner``, 0700; no component may be a
    link (it is on the shared file system, where a link could otherwise send root's chown elsewhere)."""
    fd = open_dir(system, absolute, 0o700)
    try:
        system.chown(fd, *owner)
        os.fchmod(fd, 0o700)
    finally:
        os.close(fd)


def write_munge_key(system: System, key: bytes) -> None:
    if not isinstance(key, (bytes, bytearray)) or len(key) < MIN_KEY_BYTES:
        size = len(key) if isinstance(key, (bytes, bytearray)) else type(key).__name__
        raise Fault(f"setup: the munge key from the stack's secret is {size} bytes; munged needs at least "
                    f"{MIN_KEY_BYTES}")
    owner = system.user(MUNGE_USER)
    make_private_dir(system, str(PurePosixPath(MUNGE_KEY).parent), owner)  # munged wants it its own, 0700
    write_file(system, MUNGE_KEY, bytes(key), 0o400, owner, dir_mode=0o700)
    log.info("munge key written to %s (%d bytes)", MUNGE_KEY, len(key))


# --- the two roles ------------------------------------------------------------------------------------------------

def conf_server(slurm: dict) -> str:
    """slurmd's --conf-server value: ADDR:PORT ([ADDR]:PORT for an IPv6 address)."""
    addr = slurm["controller_addr"]
    return f"[{addr}]:{slurm['controller_port']}" if ":" in addr else f"{addr}:{slurm['controller_port']}"


def slurmd_defaults(name: str, slurm: dict) -> str:
    """/etc/default/slurmd: the EnvironmentFile of the image's slurmd.service (and of Debian's)."""
    return ("# Written at boot by `gpufleet-trainer setup node` from /etc/gpufleet/node.json: this node's Slurm\n"
            "# name and the slurmctld it fetches slurm.conf and gres.conf from (configless).\n"
            f'SLURMD_OPTIONS="-N {name} --conf-server {conf_server(slurm)}"\n')


def _env_value(value: str) -> str:
    if any(c in value for c in "\n\r\0"):
        raise UsageError(f"setup: {value!r}: a setting may not span lines")
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$") + '"'


def controller_dbd(password: str) -> accounts.Dbd:
    """The controller's slurmdbd: on loopback, its database in the controller's MariaDB."""
    return accounts.Dbd(port=DBD_PORT, storage_port=DATABASE_PORT, storage_user="slurm", storage_pass=password,
                        slurm_user=SLURM_USER, log_file="/var/log/slurm/slurmdbd.log",
                        pid_file="/run/slurmdbd/slurmdbd.pid")  # slurmdbd.service's RuntimeDirectory


def _until_answered(system: System, what: str, action: Callable[[], object]) -> None:
    """``action`` until it no longer fails (a daemon just started), READY_S at most; then its Fault."""
    deadline = time.monotonic() + READY_S
    while True:
        try:
            action()
            return
        except Fault as exc:
            if time.monotonic() > deadline:
                raise Fault(f"setup: {what} did not answer in {READY_S:.0f} s ({exc})") from None
            system.sleep(1.0)


def start_accounting(system: System, cluster: str, slurm_owner: tuple[int, int]) -> None:
    """MariaDB, slurmdbd's database user with a password made now, slurmdbd.conf (0600, the slurm user's), slurmdbd,
    and the cluster registered in it (before slurmctld starts)."""
    dbd = controller_dbd(secrets.token_hex(16))
    system.start("mariadb.service")
    _until_answered(system, "MariaDB", lambda: system.command(["mariadb", "-u", "root"],
                                                              accounts.database_grants(dbd)))
    write_file(system, SLURMDBD_CONF, accounts.render_slurmdbd_conf(dbd).encode(), 0o600, owner=slurm_owner)
    system.start("slurmdbd.service", restart=True)
    _until_answered(system, "slurmdbd", lambda: accounts.register_cluster(cluster, run=_runner(system)))


def _runner(system: System) -> Callable[..., subprocess.CompletedProcess]:
    """subprocess.run's shape over system.command (what trainer.slurm.accounts calls)."""
    def run(argv: list[str], **_) -> subprocess.CompletedProcess:
        return subprocess.CompletedProcess(argv, 0, system.command(argv), "")
    return run


def bridge_env(settings: dict) -> str:
    """/etc/gpufleet/bridge.env: gpufleet-bridge.service's EnvironmentFile (its flags and the SDKs' standard
    variables), from controller.json: with a queue for each team (``teams[].queue_url``), GPUFLEET_TEAM_QUEUES
    (the bridge's --team-queue), else the one queue and the first team's account. Nothing secret: the bridge
    reaches the queues and bucket with the machine's identity."""
    values = {
        "GPUFLEET_QUEUE_URL": settings["queue_url"], "GPUFLEET_BUCKET": settings["bucket"],
        "GPUFLEET_PARTITION": settings["partition"], "GPUFLEET_GPUS": str(settings["gpus"]),
        "GPUFLEET_INSTANCE_TYPE": settings["instance_type"], "SLURM_CONF": SLURM_CONF,
        "GPUFLEET_ACCOUNT": accounts.teams_of(settings.get("teams") or [])[0].name,
    }
    team_queues = [(t["name"], t.get("queue_url")) for t in settings.get("teams") or []]
    if team_queues and all(url for _, url in team_queues):  # each team its queue: a job's account is its queue's
        values["GPUFLEET_TEAM_QUEUES"] = " ".join(f"{name}={url}" for name, url in team_queues)
    cloud = settings["cloud"]
    if cloud in REGION_VARIABLE:
        values[REGION_VARIABLE[cloud]] = settings["region"]
    client_id = (settings.get("azure") or {}).get("client_id") if cloud == "azure" else None
    if client_id:
        values["AZURE_CLIENT_ID"] = client_id  # azure-identity's: selects the machine's user-assigned identity
    lines = ["# Written at boot by `gpufleet-trainer setup controller` from /etc/gpufleet/controller.json."]
    lines += [f"{k}={_env_value(v)}" for k, v in values.items()]
    return "\n".join(lines) + "\n"


def setup_node(settings: dict, system: System) -> str:
    """A GPU node joins the cluster: munge key, slurmd's options, then munge, slurmd and the watcher. Its name."""
    slurm = settings.get("slurm")
    if slurm is None:
        raise UsageError("setup node: node.json has no \"slurm\" object (controller_addr, controller_port, munge); "
                         "the stack's user-data writes it")
    cloud = settings.get("cloud")
    if cloud is None:
        raise UsageError("setup node: node.json names no cloud")
    system.user(MUNGE_USER)  # before asking the cloud anything: an image without munge fails at once
    module = system.adapter(cloud)
    name = module.node_name(settings)
    if not (isinstance(name, str) and NODE_NAME.match(name)):
        raise Fault(f"setup node: this machine's Slurm name {name!r} is not <partition>-<n>; check its "
                    "gpufleet-slurm-node tag")
    write_munge_key(system, module.munge_key(settings))
    write_file(system, SLURMD_DEFAULTS, slurmd_defaults(name, slurm).encode(), 0o644)
    teams = settings.get("teams") or [accounts.DEFAULT_TEAM]
    users.ensure(teams, system.command, system.accounts)
    for team in teams:  # each team's work directory (its user's home) and job output, its user's only
        owner = (users.uid_of(team), users.uid_of(team))
        make_private_dir(system, users.home_of(team), owner)
        make_private_dir(system, f"{JOB_OUTPUT}/{team}", owner)
    # the jobs' metrics file (the CloudWatch agent, as root, ships it): the teams' users append, none reads it
    write_file(system, JOB_METRICS, b"", 0o620, owner=(0, system.group(users.GROUP)))
    for unit, restart in (("munge.service", True), ("slurmd.service", True), (f"gpufleet-watch@{name}.service", False)):
        system.start(unit, restart)
    log.info("node %s: munge, slurmd (config from %s) and its watcher started", name, conf_server(slurm))
    return name


def setup_controller(settings: dict, system: System) -> None:
    """The controller: munge key (made at the stack's first boot), state directory, the bridge's settings, then
    munge, the accounting (MariaDB, slurmdbd), slurmctld, the teams' accounts, the bridge and the heal daemon
    (trainer.slurm.nodes heal, as the slurm user)."""
    teams = accounts.teams_of(settings.get("teams") or [])  # a bad team: one line, before anything is done
    system.user(MUNGE_USER)  # all looked up first: an image without them fails before the secret is touched
    slurm_owner = system.user(SLURM_USER)
    system.user(JOB_USER)  # the bridge's user, which submits each team's jobs as the team's user
    module = system.adapter(settings["cloud"])
    write_munge_key(system, module.munge_key(settings, create=True))
    make_private_dir(system, settings["state_dir"], slurm_owner)
    write_file(system, BRIDGE_ENV, bridge_env(settings).encode(), 0o644)
    users.ensure([t.name for t in teams], system.command, system.accounts)  # slurmctld maps users' names to uids
    system.start("munge.service", restart=True)
    start_accounting(system, settings["stack"], slurm_owner)
    system.start("slurmctld.service", restart=True)
    # gres/gpu is known to the accounting once slurmctld registered: until then sacctmgr refuses a GPU limit
    _until_answered(system, "the teams' accounts", lambda: accounts.apply(teams, [], run=_runner(system)))
    for unit in ("gpufleet-bridge.service", "gpufleet-heal.service"):
        system.start(unit, restart=True)
    log.info("controller: munge, slurmdbd, slurmctld (state in %s), teams %s, the bridge and heal started",
             settings["state_dir"], ", ".join(t.name for t in teams))


# --- the command --------------------------------------------------------------------------------------------------

def parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m trainer setup", description="At boot (as root, from the image's oneshot "
                       "units): a GPU node or the controller of a cloud stack joins its Slurm cluster.")
    p.add_argument("role", choices=("node", "controller"))
    p.add_argument("--root", default="/", help="the file system root every path written is under (tests)")
    p.add_argument("--node-json", help=f"node settings (default {node_schema.PATH} under --root)")
    p.add_argument("--controller-json", help=f"controller settings (default {node_schema.CONTROLLER_PATH} under "
                   "--root)")
    return p


def main(argv: list[str], system: System | None = None) -> int:
    args = parser().parse_args(argv)
    system = system or System()
    system.root = Path(args.root)
    if not system.root.is_dir():
        raise UsageError(f"setup: --root {args.root}: not a directory")
    if args.role == "node":
        settings = node_schema.load(args.node_json or system.path(node_schema.PATH))
        setup_node(settings, system)
    else:
        settings = node_schema.load_controller(args.controller_json or system.path(node_schema.CONTROLLER_PATH))
        setup_controller(settings, system)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
