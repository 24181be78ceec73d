"""The box's layout (pure): every Unix socket a box makes fits Linux's 108 bytes, however deep its --dir; each node
has its own job credentials endpoint and grants."""
from __future__ import annotations

import subprocess
from pathlib import Path

from infra.box import layout as lay

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
