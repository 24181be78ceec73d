"""The Unix users jobs run as, one per team (trainer.slurm.users): stable ids, what a machine must be told to make
them, and how a Slurm command is run as one. The box's tests run jobs as them on a real Slurm (tests/infra/box);
tests/ami tries the bridge's sudoers rule with the real sudo."""
from __future__ import annotations

import subprocess

import pytest

from trainer.errors import Fault, UsageError
from trainer.slurm import users

NONE_YET: tuple[dict, dict] = ({"root": (0, 0, frozenset())}, {"root": 0})


def test_a_teams_user_is_named_for_it_and_its_uid_is_the_same_on_every_machine():
    assert users.name_of("vision") == "gpufleet-vision" and users.home_of("vision") == "/var/lib/gpufleet/teams/vision"
    uid = users.uid_of("vision")
    assert uid == 53348 and users.UID_BASE <= uid < users.UID_BASE + users.UID_SPAN  # a hash: no machine's counter
    assert len(users.name_of("a" * 15)) <= 32  # useradd's longest name


def test_a_new_machine_gets_the_group_then_each_teams_group_and_user():
    vision = str(users.uid_of("vision"))
    assert users.plan(["vision"], *NONE_YET) == [
        ["groupadd", "--system", "gpufleet-teams"],
        ["groupadd", "--gid", vision, "gpufleet-vision"],
        ["useradd", "--uid", vision, "--gid", vision, "--groups", "gpufleet-teams", "--no-create-home",
         "--home-dir", "/var/lib/gpufleet/teams/vision", "--shell", "/usr/sbin/nologin", "gpufleet-vision"]]


def test_what_a_machine_has_is_not_made_again_and_a_missing_membership_is_added():
    uid = users.uid_of("vision")
    have = ({"gpufleet-vision": (uid, uid, frozenset({"gpufleet-teams"}))},
            {"gpufleet-teams": 995, "gpufleet-vision": uid})
    assert users.plan(["vision"], *have) == []
    outside = ({"gpufleet-vision": (uid, uid, frozenset())}, have[1])
    assert users.plan(["vision"], *outside) == [["usermod", "--append", "--groups", "gpufleet-teams",
                                                 "gpufleet-vision"]]


@pytest.mark.parametrize("machine, message", [
    (({"gpufleet-vision": (1001, 1001, frozenset())}, {"gpufleet-teams": 9}),
     "users: user gpufleet-vision is uid 1001 gid 1001; expected 53348 53348"),
    (({}, {"gpufleet-teams": 9, "gpufleet-vision": 1001}), "users: group gpufleet-vision has gid 1001; expected 53348"),
])
def test_a_name_held_with_another_id_is_one_line_and_nothing_is_changed(machine, message):
    with pytest.raises(Fault) as err:
        users.plan(["vision"], *machine)
    assert str(err.value) == message


def colliding_names() -> tuple[str, str]:
    """Two team names whose users' uids hash alike (found by search: the uid space is 10,000)."""
    seen: dict[int, str] = {}
    for i in range(100000):
        name = f"t{i}"
        if users.uid_of(name) in seen:
            return seen[users.uid_of(name)], name
        seen[users.uid_of(name)] = name
    raise AssertionError("no collision")


def test_two_teams_of_one_uid_are_refused():
    a, b = colliding_names()
    users.check_ids(["vision", "nlp", a])
    with pytest.raises(UsageError) as err:
        users.check_ids([a, "vision", b])
    assert str(err.value) == f"teams {a} and {b} would have one Unix uid ({users.uid_of(a)}); rename one"


def test_a_command_as_a_teams_user_goes_through_sudo_keeping_the_environment_it_names():
    argv = users.submit_argv("gpufleet-vision", ["/usr/local/bin/sbatch", "--parsable"],
                             ["SLURM_CONF", "AWS_DEFAULT_REGION", "HOME", "PATH", "SUDO_UID", "BASH_FUNC_x%%", "A-B"])
    assert argv == ["sudo", "-n", "-u", "gpufleet-vision", "--preserve-env=AWS_DEFAULT_REGION,SLURM_CONF", "--",
                    "/usr/local/bin/sbatch", "--parsable"]  # sudo sets HOME, PATH, SUDO_*; odd names are dropped
    assert users.submit_argv(None, ["/usr/bin/scancel", "7"], ["X"]) == ["/usr/bin/scancel", "7"]


def test_the_client_submits_as_a_user_through_sudo_and_a_refusal_names_the_user(monkeypatch):
    from trainer.slurm import client

    seen = []

    def run(argv, **kw):
        seen.append((argv, kw.get("input")))
        if argv[0] == "sudo" and argv[3] == "gpufleet-nlp":
            return subprocess.CompletedProcess(argv, 1, "", "sudo: a password is required\n")
        return subprocess.CompletedProcess(argv, 0, "42;box\n", "")

    monkeypatch.setattr(client.subprocess, "run", run)
    monkeypatch.setenv("SLURM_CONF", "/etc/slurm/slurm.conf")
    assert client.sbatch("#!/bin/sh\n", user="gpufleet-vision") == "42"
    argv, given = seen[-1]
    assert argv[:4] == ["sudo", "-n", "-u", "gpufleet-vision"] and given == "#!/bin/sh\n"
    assert "SLURM_CONF" in argv[4].removeprefix("--preserve-env=").split(",")
    assert argv[argv.index("--") + 1:] == [client.exe("sbatch"), "--parsable"]
    with pytest.raises(client.SlurmError) as err:
        client.scancel("7", user="gpufleet-nlp")
    assert str(err.value) == "scancel as gpufleet-nlp: sudo: a password is required"
    client.scancel("7")
    assert seen[-1][0] == [client.exe("scancel"), "7"]  # as the bridge itself
