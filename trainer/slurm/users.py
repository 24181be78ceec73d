"""The Unix users jobs run as: one per team, ``gpufleet-<team>``, never root and never the bridge's user.

Slurm runs a job as the user who submitted it, so the bridge submits each team's jobs as the team's user
(``sudo -n -u gpufleet-<team> --preserve-env=... sbatch``: ami/files/sudoers-gpufleet-bridge lets the bridge's
user run sbatch and scancel as the members of GROUP, nothing else). Each team's user has an association with its
own Slurm account only (trainer.slurm.accounts), so a job cannot ``sbatch --account=<another team>`` nor
``scancel`` another team's job; its files on a node (work directory, bundle cache, output) are its own, 0700.

A team's uid (and its group's gid, the same number) is a stable hash of its name, so the controller and every
node, each making the users at boot from its settings' teams (trainer.slurm.setup), agree without a directory
service; two teams whose names hash to one uid are refused with the config (:func:`check_ids`).
"""
from __future__ import annotations

import grp
import hashlib
import logging
import pwd
from typing import Callable, Iterable

from trainer.errors import Fault, UsageError

log = logging.getLogger("gpufleet.users")

PREFIX = "gpufleet-"
GROUP = "gpufleet-teams"        # every team user's supplementary group: who the bridge may submit as (sudoers)
UID_BASE, UID_SPAN = 50000, 10000
HOME = "/var/lib/gpufleet/teams"  # a team user's home and work directory: HOME/<team> (made by setup, 0700)
SHELL = "/usr/sbin/nologin"


def name_of(team: str) -> str:
    """The Unix user (and group) of a team's jobs."""
    return PREFIX + team


def uid_of(team: str) -> int:
    """The team user's uid and its group's gid: the same on every machine of the cluster."""
    return UID_BASE + int.from_bytes(hashlib.sha256(team.encode()).digest()[:4], "big") % UID_SPAN


def home_of(team: str, base: str = HOME) -> str:
    return f"{base}/{team}"


def check_ids(teams: Iterable[str]) -> None:
    """UsageError (one line) when two teams would have one uid."""
    seen: dict[int, str] = {}
    for team in teams:
        other = seen.setdefault(uid_of(team), team)
        if other != team:
            raise UsageError(f"teams {other} and {team} would have one Unix uid ({uid_of(team)}); rename one")


def plan(teams: Iterable[str], users: dict[str, tuple[int, int, frozenset[str]]], groups: dict[str, int],
         home: str = HOME) -> list[list[str]]:
    """The commands (groupadd, useradd, usermod) that make each team's user and group, given the machine's
    ``users`` (name -> (uid, gid, supplementary group names)) and ``groups`` (name -> gid). Fault (one line) where
    a name is held with another id: a machine is never changed under a user it already has."""
    out: list[list[str]] = []
    if GROUP not in groups:
        out.append(["groupadd", "--system", GROUP])
    for team in teams:
        name, uid = name_of(team), uid_of(team)
        if name in groups and groups[name] != uid:
            raise Fault(f"users: group {name} has gid {groups[name]}; expected {uid}")
        if name not in groups:
            out.append(["groupadd", "--gid", str(uid), name])
        have = users.get(name)
        if have is None:
            out.append(["useradd", "--uid", str(uid), "--gid", str(uid), "--groups", GROUP, "--no-create-home",
                        "--home-dir", home_of(team, home), "--shell", SHELL, name])
        elif have[:2] != (uid, uid):
            raise Fault(f"users: user {name} is uid {have[0]} gid {have[1]}; expected {uid} {uid}")
        elif GROUP not in have[2]:
            out.append(["usermod", "--append", "--groups", GROUP, name])
    return out


def machine() -> tuple[dict[str, tuple[int, int, frozenset[str]]], dict[str, int]]:
    """This machine's users (with their supplementary groups) and groups, as :func:`plan` reads them."""
    members: dict[str, set[str]] = {}
    groups = {}
    for g in grp.getgrall():
        groups[g.gr_name] = g.gr_gid
        for member in g.gr_mem:
            members.setdefault(member, set()).add(g.gr_name)
    users = {p.pw_name: (p.pw_uid, p.pw_gid, frozenset(members.get(p.pw_name, ()))) for p in pwd.getpwall()}
    return users, groups


def ensure(teams: Iterable[str], command: Callable[[list[str]], object],
           accounts: Callable[[], tuple[dict, dict]] = machine) -> list[list[str]]:
    """Each team's user and group made where missing (:func:`plan` over ``accounts()``, each command run by
    ``command``, which raises where one fails); the commands run."""
    todo = plan(teams, *accounts())
    for argv in todo:
        command(argv)
        log.info("users: %s", " ".join(argv))
    return todo


def submit_argv(user: str | None, argv: list[str], env_names: Iterable[str]) -> list[str]:
    """``argv`` (a Slurm command, its full path first) as ``user`` through sudo, the names in ``env_names`` kept
    (sbatch hands its environment to the job); as it is when ``user`` is None. sudo sets HOME, PATH (its
    secure_path) and USER itself."""
    if user is None:
        return argv
    keep = sorted(n for n in env_names if n not in _SUDO_SETS and n.replace("_", "").isalnum())
    return ["sudo", "-n", "-u", user, *([f"--preserve-env={','.join(keep)}"] if keep else []), "--", *argv]


_SUDO_SETS = frozenset({"HOME", "PATH", "USER", "LOGNAME", "SHELL", "MAIL", "SUDO_USER", "SUDO_UID", "SUDO_GID",
                        "SUDO_COMMAND", "TERM", "PWD", "OLDPWD", "SHLVL", "_"})
