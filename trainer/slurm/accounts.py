"""Teams as Slurm accounts: each team of a stack (``gpufleet:teams``) is an account of the cluster's accounting
(slurmdbd, over MariaDB) with its fair share (``Fairshare``, which Slurm's multifactor priority weighs) and its GPU
limit (``GrpTRES=gres/gpu=N``: the GPUs all of the team's running jobs may hold together; a job past it waits,
Reason=AssocGrpGRES). Slurm enforces both (``AccountingStorageEnforce=associations,limits,safe``); this module
only says what the accounting must hold, and ``apply`` makes it so with ``sacctmgr``.

What the accounting holds is read (``sacctmgr show assoc``) and compared with the teams, so applying is
idempotent: an account missing is added, one whose share or limit differs is modified, a submitter missing from a
team's account is added to it. An account no longer in the config is left as it is (its jobs may still run, and
its usage stays in the accounting); ``sacctmgr remove account NAME`` removes it by hand.

The gres/gpu resource exists in the accounting once slurmctld registered with ``AccountingStorageTRES=gres/gpu``,
so a cluster's accounts are applied after slurmctld started (before that, sacctmgr refuses a GPU limit).
"""
from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from typing import Callable, Iterable

from trainer.errors import Fault, UsageError
from trainer.slurm import users

TEAM_NAME = re.compile(r"[a-z][a-z0-9]{0,14}\Z")  # a Slurm account and the tail of a Unix user's name
DEFAULT_TEAM = "default"
SHOW = ["show", "associations", "format=account,user,fairshare,grptres"]  # sacctmgr -n -P ...


@dataclass(frozen=True)
class Team:
    """One team: a Slurm account with its fair share and GPU limit (None: no limit)."""

    name: str
    fair_share: int = 1
    gpu_limit: int | None = None

    def __post_init__(self):
        if not TEAM_NAME.match(self.name):
            raise UsageError(f"team {self.name!r}: expected 1-15 lowercase letters and digits, starting with a letter")
        if self.fair_share < 1:
            raise UsageError(f"team {self.name}: fair share {self.fair_share}; expected a whole number >= 1")
        if self.gpu_limit is not None and self.gpu_limit < 0:
            raise UsageError(f"team {self.name}: GPU limit {self.gpu_limit}; expected a whole number >= 0")

    @property
    def grp_tres(self) -> str:
        """What ``sacctmgr show`` prints for the limit (nothing when there is none)."""
        return "" if self.gpu_limit is None else f"gres/gpu={self.gpu_limit}"

    def settings(self) -> list[str]:
        """sacctmgr's settings of the account (-1 clears a limit)."""
        return [f"Fairshare={self.fair_share}",
                f"GrpTRES=gres/gpu={-1 if self.gpu_limit is None else self.gpu_limit}"]


def teams_of(entries: Iterable[dict]) -> tuple[Team, ...]:
    """Teams from their JSON form (``{name, fair_share, gpu_limit}``, as controller.json and the box carry them),
    at least one and each name once; none given: the one team ``default``."""
    teams = tuple(Team(e["name"], e.get("fair_share", 1), e.get("gpu_limit")) for e in entries) or \
        (Team(DEFAULT_TEAM),)
    names = [t.name for t in teams]
    if len(set(names)) != len(names):
        raise UsageError(f"teams: names repeat ({', '.join(names)}); expected each team once")
    users.check_ids(names)
    return teams


@dataclass(frozen=True)
class Association:
    """One row of ``sacctmgr show assoc``: an account's own (user "") or a user's in it."""

    account: str
    user: str
    fair_share: str
    grp_tres: str


def parse_associations(text: str) -> list[Association]:
    """``sacctmgr -n -P show assoc format=account,user,fairshare,grptres`` as rows."""
    rows = []
    for line in text.splitlines():
        fields = line.split("|")
        if len(fields) == 4:
            rows.append(Association(*fields))
    return rows


def changes(existing: list[Association], teams: Iterable[Team], submitters: Iterable[str]) -> list[list[str]]:
    """The sacctmgr commands (arguments after ``sacctmgr -i``) that make the accounting hold ``teams``, each with
    its own user (trainer.slurm.users: the bridge submits the team's jobs as it, and it is in no other account)
    and ``submitters`` (users that may submit under every team's account: a box's own user) in its account.
    Nothing when it holds them already."""
    own = {a.account: a for a in existing if not a.user}
    members = {(a.account, a.user) for a in existing if a.user}
    out: list[list[str]] = []
    for team in teams:
        have = own.get(team.name)
        if have is None:
            out.append(["add", "account", team.name, f"Description=gpufleet team {team.name}", *team.settings()])
        elif (have.fair_share, have.grp_tres) != (str(team.fair_share), team.grp_tres):
            out.append(["modify", "account", "where", f"name={team.name}", "set", *team.settings()])
        for user in [users.name_of(team.name), *submitters]:
            if (team.name, user) not in members:
                out.append(["add", "user", user, f"account={team.name}"])
    return out


def apply(teams: Iterable[Team], submitters: Iterable[str], env: dict | None = None,
          run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> list[list[str]]:
    """Make the cluster's accounting hold the teams (see :func:`changes`); returns the commands it ran."""
    teams, submitters = list(teams), list(submitters)
    shown = _sacctmgr(["-n", "-P", *SHOW], env, run)
    todo = changes(parse_associations(shown), teams, submitters)
    for args in todo:
        _sacctmgr(["-i", *args], env, run)
    return todo


def register_cluster(name: str, env: dict | None = None,
                     run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> bool:
    """The cluster in the accounting (slurmctld's ClusterName), before slurmctld starts; True when added now."""
    if name in _sacctmgr(["-n", "-P", "show", "clusters", "format=cluster"], env, run).split():
        return False
    _sacctmgr(["-i", "add", "cluster", name], env, run)
    return True


def _sacctmgr(args: list[str], env: dict | None, run: Callable[..., subprocess.CompletedProcess]) -> str:
    done = run(["sacctmgr", *args], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        why = next((ln.strip() for ln in (done.stderr + done.stdout).splitlines() if ln.strip()),
                   f"exit status {done.returncode}")
        raise Fault(f"accounts: sacctmgr {' '.join(args)}: {why}")
    return done.stdout


@dataclass(frozen=True)
class Dbd:
    """slurmdbd's settings: where it listens, and the MariaDB database it keeps the accounting in."""

    port: int                      # DbdPort (Slurm's default 6819)
    storage_port: int              # MariaDB's TCP port
    storage_user: str
    storage_pass: str              # a secret: slurmdbd.conf is 0600, owned by SlurmUser
    slurm_user: str
    log_file: str
    pid_file: str
    storage_host: str = "127.0.0.1"
    storage_loc: str = "slurm_acct_db"
    addr: str = "127.0.0.1"
    munge_socket: str | None = None


def render_slurmdbd_conf(dbd: Dbd) -> str:
    """slurmdbd.conf (it holds the database password: written 0600 for SlurmUser)."""
    lines = ["# Rendered by trainer.slurm.accounts: the cluster's accounting (teams' accounts, fair share, limits).",
             "AuthType=auth/munge",
             *([f"AuthInfo=socket={dbd.munge_socket}"] if dbd.munge_socket else []),
             "DbdHost=localhost",
             f"DbdAddr={dbd.addr}",
             f"DbdPort={dbd.port}",
             f"SlurmUser={dbd.slurm_user}",
             "StorageType=accounting_storage/mysql",
             f"StorageHost={dbd.storage_host}",
             f"StoragePort={dbd.storage_port}",
             f"StorageUser={dbd.storage_user}",
             f"StoragePass={dbd.storage_pass}",
             f"StorageLoc={dbd.storage_loc}",
             f"LogFile={dbd.log_file}",
             f"PidFile={dbd.pid_file}"]
    return "\n".join(lines) + "\n"


def database_grants(dbd: Dbd) -> str:
    """The SQL that gives slurmdbd its database (run once by MariaDB's root, over its socket)."""
    if not re.fullmatch(r"[A-Za-z0-9_]{1,32}", dbd.storage_user) or \
            not re.fullmatch(r"[A-Za-z0-9_]{1,64}", dbd.storage_loc) or not re.fullmatch(r"[A-Za-z0-9]{16,}",
                                                                                          dbd.storage_pass):
        raise UsageError("slurmdbd: database user, name and password must be letters and digits (the password "
                         "at least 16)")
    who = f"'{dbd.storage_user}'@'{dbd.storage_host}'"
    return (f"CREATE USER IF NOT EXISTS {who} IDENTIFIED BY '{dbd.storage_pass}';\n"
            f"ALTER USER {who} IDENTIFIED BY '{dbd.storage_pass}';\n"
            f"GRANT ALL ON {dbd.storage_loc}.* TO {who};\n")
