"""The box's layout (pure): every Unix socket a box makes fits Linux's 108 bytes, however deep its --dir; each node
has its own job credentials endpoint and grants; the box's launcher of jobs' containers and its sudoers rule, tried
with the real sudo."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from infra.box import layout as lay
from trainer.slurm import users

SUN_PATH = 108  # sizeof(sockaddr_un.sun_path), the terminating NUL included


def test_sockets_fit_a_socket_path_for_a_deep_dir():
    deep = Path("/tmp") / ("d" * 60) / ("e" * 60) / "box"
    L = lay.Layout(deep, nodes=16)
    longest_step = L.spool_dir / "gpu-16" / "gpu-16_99999999.4294967291"  # slurmstepd's, as slurmd names it
    for socket in (L.munge_socket, longest_step):
        assert len(str(socket)) < SUN_PATH, socket
    assert L.sockets != lay.Layout(deep.parent / "other").sockets  # one per box
    assert lay.cluster(L).spool_dir == str(L.spool_dir)


def test_each_node_hands_its_tasks_its_own_credentials_endpoint_and_token(tmp_path):
    """Two nodes of a box share one host: each has its own grants and endpoint (a two-node job's Prologs would
    otherwise overwrite each other's grant, and one node's token would be refused)."""
    L = lay.Layout(tmp_path / "box", nodes=2, slurmctld_port=7000)
    ports = L.ports()
    assert sorted(ports.values()) == list(range(7000, 7000 + len(ports))) and len(ports) == 8
    scripts = lay.job_program_scripts(L, "python3", {"AWS_DEFAULT_REGION": "us-east-1"}, "me", "bucket")
    program = tmp_path / "task_prolog"
    program.write_text(scripts["task_prolog"])
    for node in ("gpu-1", "gpu-2"):
        tokens = L.credentials_dir(node) / "tokens"
        tokens.mkdir(parents=True)
        (tokens / "7").write_text(f"7.{node[-1] * 43}")
    for node in ("gpu-1", "gpu-2"):
        env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "7", "SLURMD_NODENAME": node}
        out = subprocess.run(["sh", str(program)], env=env, capture_output=True, text=True, check=True).stdout
        port = ports[f"credentials {node}"]
        assert f"export AWS_CONTAINER_CREDENTIALS_FULL_URI=http://127.0.0.1:{port}/v1/credentials\n" in out
        assert f"export AWS_CONTAINER_AUTHORIZATION_TOKEN=7.{node[-1] * 43}\n" in out
    stranger = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "7", "SLURMD_NODENAME": "gpu-9"}
    assert subprocess.run(["sh", str(program)], env=stranger, capture_output=True, text=True).stdout == ""
    for action in ("prolog", "epilog"):
        assert '--dir "$directory"' in scripts[action] and "gpu-2) directory=" in scripts[action]



def test_a_power_saving_program_runs_the_checkout_of_the_box_in_slurmctlds_empty_environment(tmp_path):
    """slurmctld runs the programs with an environment of its own (no PYTHONPATH): the trainer they import is the
    box's checkout (a worktree's, say), not the one the python's editable install points at."""
    seen = tmp_path / "seen"
    python = tmp_path / "python"  # a stand-in: the path `-m trainer` would import from, and its arguments
    python.write_text(f'#!/bin/sh\necho "$PYTHONPATH" "$@" >{seen}\n')
    python.chmod(0o755)
    program = tmp_path / "resume"
    program.write_text(lay.program_script(str(python), "resume", tmp_path / "nodes.json", tmp_path / "slurm.conf",
                                          tmp_path / "power.log"))
    program.chmod(0o755)
    subprocess.run([str(program), "gpu-[1-2]"], env={}, cwd=tmp_path, check=True)
    assert seen.read_text() == f"{lay.REPO} -m trainer nodes resume gpu-[1-2] --config {tmp_path / 'nodes.json'}\n"
    assert (lay.REPO / "trainer" / "__init__.py").is_file()


def test_the_prolog_names_the_bridges_user_only_where_the_bridge_submits_as_itself(tmp_path):
    """A box of root runs each team's jobs as the team's user: its Prolog takes a job as a team's only when that
    team's user submitted it (no --bridge-user); a box of another user names itself."""
    L = lay.Layout(tmp_path / "box", nodes=1, slurmctld_port=7000)
    env = {"AWS_DEFAULT_REGION": "us-east-1"}
    assert "--bridge-user" not in lay.job_program_scripts(L, "python3", env, None, "bucket")["prolog"]
    assert " --bridge-user alice " in lay.job_program_scripts(L, "python3", env, "alice", "bucket")["prolog"]


TEAM_USER, STRANGER = "gpufleet-test-boxteam", "gpufleet-test-nobody"


def test_the_boxs_launcher_runs_for_the_teams_users_through_sudo_and_nothing_else(tmp_path):
    """The box's own launcher of jobs' containers and its sudoers rule, installed for real (as the box does, run by
    root): a member of gpufleet-teams runs the launcher as root and nothing else; a user in no team runs nothing;
    the launcher run directly refuses anyone but root."""
    if os.geteuid() != 0 or not shutil.which("sudo"):
        pytest.fail("needs root and sudo (`make tools` installs sudo; CI runs as root)")
    L = lay.Layout(Path(f"/tmp/gpufleet-launcher-test-{os.getpid()}"))
    subprocess.run(["groupadd", "--system", users.GROUP], capture_output=True)
    for name, groups in ((TEAM_USER, ["--groups", users.GROUP]), (STRANGER, [])):
        made = subprocess.run(["useradd", "--system", "--user-group", "--no-create-home", "--shell", "/bin/sh",
                               *groups, name], capture_output=True, text=True)
        assert made.returncode in (0, 9), made.stderr
    try:
        L.launcher.parent.mkdir(mode=0o755)
        L.launcher.write_text(lay.launcher_script(sys.executable, None))
        L.launcher.chmod(0o755)
        L.sudoers_rule.write_text(lay.launcher_rule(L.launcher))
        L.sudoers_rule.chmod(0o440)
        assert subprocess.run(["visudo", "-cf", str(L.sudoers_rule)], capture_output=True).returncode == 0

        def run(user: str, *argv: str) -> subprocess.CompletedProcess:
            return subprocess.run(["runuser", "-u", user, "--", *argv], capture_output=True, text=True, timeout=60,
                                  cwd="/")

        ran = run(TEAM_USER, "sudo", "-n", str(L.launcher), "--help")
        assert ran.returncode == 0 and "python -m trainer container" in ran.stdout, ran.stderr
        assert run(TEAM_USER, "sudo", "-n", "/bin/sh", "-c", "id").returncode != 0
        assert run(STRANGER, "sudo", "-n", str(L.launcher), "--help").returncode != 0
        direct = run(TEAM_USER, str(L.launcher), "--help")
        assert direct.returncode == 2 and direct.stderr.strip() == \
            "gpufleet-container: must run as root (through sudo)"
    finally:
        L.sudoers_rule.unlink(missing_ok=True)
        shutil.rmtree(L.launcher.parent, ignore_errors=True)
        for name in (TEAM_USER, STRANGER):
            subprocess.run(["userdel", name], capture_output=True)
