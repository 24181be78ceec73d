"""The bridge's sudoers rule (ami/files/sudoers-gpufleet-bridge): the bridge's user submits and cancels each team's
jobs as the team's user (trainer.slurm.users), a member of gpufleet-teams, and can do nothing else through it. Read
as text, checked by the real visudo, and tried with the real sudo: the rule itself, with the test's users and a
program of the test's standing in for the bridge's user and sbatch."""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from trainer.slurm import users

AMI = Path(__file__).resolve().parents[2] / "ami"
RULE = AMI / "files" / "sudoers-gpufleet-bridge"
BRIDGE, TEAM, OTHER = "gpufleet-test-bridge", "gpufleet-test-team", "gpufleet-test-other"


def test_the_rule_lets_the_bridge_run_sbatch_and_scancel_as_the_teams_users_only(manifest):
    rules = [line for line in RULE.read_text().splitlines() if line.strip() and not line.startswith("#")]
    prefix = manifest["slurm"]["prefix"]  # where the image installs Slurm's commands, which the bridge runs
    assert rules == ["Defaults:gpufleet !requiretty",
                     f"gpufleet ALL=(%{users.GROUP}) NOPASSWD:SETENV: {prefix}/bin/sbatch, {prefix}/bin/scancel"]
    script = (AMI / "scripts" / "45-slurm.sh").read_text()
    check = "visudo -cf /tmp/gpufleet-ami/files/sudoers-gpufleet-bridge"
    install = ("install -o root -g root -m 0440 /tmp/gpufleet-ami/files/sudoers-gpufleet-bridge "
               "/etc/sudoers.d/gpufleet-bridge")
    assert check in script and install in script and script.index(check) < script.index(install)
    assert f"groupadd --system {users.GROUP}" in script


def test_visudo_accepts_the_rule():
    done = subprocess.run([shutil.which("visudo") or "visudo", "-cf", str(RULE)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture
def sudo_users():
    """The test's stand-ins: a bridge user, a team user (in gpufleet-teams) and a user in no team; removed after
    (the group stays: the box makes it too)."""
    if os.geteuid() != 0 or not shutil.which("sudo"):
        pytest.fail("needs root and sudo (`make tools` installs sudo; CI runs as root)")
    subprocess.run(["groupadd", "--system", users.GROUP], capture_output=True)  # 9: there already
    for name, groups in ((BRIDGE, []), (TEAM, ["--groups", users.GROUP]), (OTHER, [])):
        made = subprocess.run(["useradd", "--system", "--user-group", "--no-create-home", "--shell", "/bin/sh",
                               *groups, name], capture_output=True, text=True)
        assert made.returncode in (0, 9), made.stderr
    yield
    for name in (BRIDGE, TEAM, OTHER):
        subprocess.run(["userdel", name], capture_output=True)


def test_with_the_real_sudo_the_bridge_runs_the_command_as_a_teams_user_and_nothing_else(sudo_users):
    where = Path(tempfile.mkdtemp(prefix="gpufleet-bridge-rule-", dir="/tmp"))
    rule = Path(f"/etc/sudoers.d/gpufleet-test-bridge-{os.getpid()}")
    try:
        where.chmod(0o755)
        sbatch = where / "sbatch"  # stands in for Slurm's: who it runs as, and the environment it was handed
        sbatch.write_text('#!/bin/sh\necho "$(id -un) $(id -Gn | tr " " ",") JOB_SETTING=${JOB_SETTING:-}"\n')
        sbatch.chmod(0o755)
        text = RULE.read_text().replace("gpufleet ", f"{BRIDGE} ").replace("Defaults:gpufleet ",
                                                                            f"Defaults:{BRIDGE} ")
        text = text.replace("/usr/local/bin/sbatch", str(sbatch)).replace("/usr/local/bin/scancel", "/bin/false")
        assert f"{BRIDGE} ALL=(%{users.GROUP}) NOPASSWD:SETENV: {sbatch}, /bin/false" in text
        rule.write_text(text)
        rule.chmod(0o440)
        assert subprocess.run(["visudo", "-cf", str(rule)], capture_output=True).returncode == 0

        def as_bridge(*argv: str) -> subprocess.CompletedProcess:
            return subprocess.run(["runuser", "-u", BRIDGE, "--", *argv], capture_output=True, text=True,
                                  env={"PATH": os.environ["PATH"], "JOB_SETTING": "eu-west-1"}, timeout=30)

        ran = as_bridge(*users.submit_argv(TEAM, [str(sbatch)], ["JOB_SETTING", "HOME"]))
        assert ran.returncode == 0, ran.stderr
        name, groups, setting = ran.stdout.split()
        assert name == TEAM and users.GROUP in groups.split(",") and setting == "JOB_SETTING=eu-west-1"
        for argv in (["sudo", "-n", "-u", OTHER, "--", str(sbatch)],   # a user in no team
                     ["sudo", "-n", "-u", "root", "--", str(sbatch)],  # root
                     ["sudo", "-n", "-u", TEAM, "--", "/bin/sh", "-c", "id"]):  # another program as the team
            refused = as_bridge(*argv)
            assert refused.returncode != 0 and TEAM not in refused.stdout, argv
    finally:
        rule.unlink(missing_ok=True)
        shutil.rmtree(where, ignore_errors=True)
