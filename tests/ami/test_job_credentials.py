"""Each job's own credentials on a node (issue 23), as the image wires them: the metadata filter's and the
credentials daemon's units (by node.json's cloud, as the node's other settings), Slurm's Prolog and Epilog (always
exit 0, failures to syslog, nothing where node.json names no cloud) and where the image installs them. The
filter itself is run for real in tests/ami/test_imds_filter.py, the TaskProlog in tests/ami/test_task_prolog.py."""
from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.ami.conftest import AMI, require, unit

CREDENTIALS_UNITS = ("gpufleet-imds.service", "gpufleet-credentials.service")


def exec_condition(name: str) -> list[str]:
    return shlex.split(unit(name)["Service"]["ExecCondition"])


@pytest.mark.parametrize("name", CREDENTIALS_UNITS)
@pytest.mark.parametrize("cloud, runs", [("aws", True), ("azure", True), ("tencent", True), (None, False),
                                         ("gcp", False)])
def test_the_units_run_on_every_clouds_nodes_only(tmp_path, name, cloud, runs):
    """The condition, run for real on a node.json of each cloud: exit 0 runs the unit; 1 to 254 skips it (systemd's
    ExecCondition), never fails it. No node.json (the controller, a build machine): skipped by ConditionPathExists."""
    from trainer.node import node_schema

    require("jq")
    u = unit(name)
    assert u["Unit"]["ConditionPathExists"] == node_schema.PATH
    argv = exec_condition(name)
    assert argv == ["/usr/bin/jq", "-e", '.cloud == "aws" or .cloud == "azure" or .cloud == "tencent"',
                    node_schema.PATH]
    node_json = tmp_path / "node.json"
    node_json.write_text(json.dumps({"cloud": cloud, "region": "r"} if cloud else {"region": "r"}))
    status = subprocess.run([require("jq"), *argv[1:-1], str(node_json)], capture_output=True, timeout=30).returncode
    assert status == 0 if runs else 1 <= status <= 254
    node_json.write_text("{not json")
    assert 1 <= subprocess.run([require("jq"), *argv[1:-1], str(node_json)], capture_output=True,
                               timeout=30).returncode <= 254


def test_the_metadata_filter_is_in_place_before_any_job_or_container():
    imds = unit("gpufleet-imds.service")
    assert imds["Service"]["Type"] == "oneshot" and imds["Service"]["RemainAfterExit"] == "yes"
    assert {"slurmd.service", "docker.service", "gpufleet-node.service"} <= set(imds["Unit"]["Before"].split())
    slurmd = unit("slurmd.service")  # a filter that failed keeps slurmd (and so every job) off the node
    assert "gpufleet-imds.service" in slurmd["Unit"]["Requires"].split()
    assert "gpufleet-imds.service" in slurmd["Unit"]["After"].split()
    assert "cloud-init.service" in imds["Unit"]["After"].split()  # which writes node.json
    # root, and the notice watcher's user (it reads spot interruption notices there; no job runs as it)
    # (each cloud's own service: the cloud node.json names)
    assert imds["Service"]["ExecStart"].split() == ["/usr/local/sbin/gpufleet-imds-root-only", "--allow", "slurm",
                                                    "--cloud-of", "/etc/gpufleet/node.json"]
    assert unit("gpufleet-watch@.service")["Service"]["User"] == "slurm"
    assert imds["Install"]["WantedBy"] == "multi-user.target"


def test_the_credentials_daemon_runs_as_root_before_slurmd_and_comes_back():
    from trainer.node import jobcreds

    creds = unit("gpufleet-credentials.service")
    assert creds["Service"]["ExecStart"].split() == ["/opt/gpufleet/venv/bin/gpufleet-trainer", "credentials", "serve"]
    jobcreds.parser().parse_args(["serve"])
    assert "User" not in creds["Service"]  # root: it reads every job's grant and asks the metadata service
    assert creds["Service"]["Type"] == "simple" and creds["Service"]["Restart"] == "always"
    assert "network-online.target" in creds["Unit"]["After"].split()
    assert "network-online.target" in creds["Unit"]["Wants"].split()
    assert "slurmd.service" in creds["Unit"]["Before"].split()
    assert creds["Install"]["WantedBy"] == "multi-user.target"


def test_the_image_installs_and_enables_them():
    trainer = (AMI / "scripts" / "50-trainer.sh").read_text()
    assert ("install -m 0755 /tmp/gpufleet-ami/files/gpufleet-imds-root-only.sh /usr/local/sbin/gpufleet-imds-root-only"
            in trainer)
    assert "install -m 0644 /tmp/gpufleet-ami/systemd/gpufleet-*.service /etc/systemd/system/" in trainer
    assert "systemctl enable gpufleet-imds.service gpufleet-credentials.service" in trainer
    assert " iptables" in (AMI / "scripts" / "00-base.sh").read_text().split("apt_install ", 1)[1].splitlines()[0]


def test_the_prolog_and_epilog_are_installed_where_slurm_conf_names_them():
    from trainer.slurm.conf import IMAGE_JOB_PROGRAMS

    script = (AMI / "scripts" / "45-slurm.sh").read_text()
    assert "for program in prolog epilog; do" in script
    assert ('install -m 0755 /tmp/gpufleet-ami/files/gpufleet-job-credentials.sh "/usr/local/sbin/gpufleet-$program"'
            in script)
    assert IMAGE_JOB_PROGRAMS["prolog"] == "/usr/local/sbin/gpufleet-prolog"
    assert IMAGE_JOB_PROGRAMS["epilog"] == "/usr/local/sbin/gpufleet-epilog"
    assert (AMI / "files" / "gpufleet-job-credentials.sh").exists()


# --- Slurm's Prolog and Epilog ------------------------------------------------------------------------------------

class Node:
    """gpufleet-job-credentials.sh as slurmd runs it, named gpufleet-prolog or gpufleet-epilog (root, no PATH),
    with node.json, the trainer and logger the test's: the trainer records its arguments and exits with the status
    the test sets; logger records its arguments and what it read."""

    def __init__(self, tmp_path: Path, program: str):
        self.dir, self.program = tmp_path, program
        self.node_json = tmp_path / "node.json"
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        self.trainer = bin_dir / "gpufleet-trainer"
        self.trainer.write_text(f'#!/bin/sh\necho "$*" >>{tmp_path}/trainer\necho "trainer says: no record"\n'
                                f'echo "a second line" >&2\nexit "$(cat {tmp_path}/status)"\n')
        self.trainer.chmod(0o755)
        self.logger = bin_dir / "logger"
        self.logger.write_text(f'#!/bin/sh\necho "args: $*" >>{tmp_path}/syslog\ncat >>{tmp_path}/syslog\n'
                               f'exit "$(cat {tmp_path}/logger-status)"\n')
        self.logger.chmod(0o755)
        self.set(trainer=0, logger=0)
        text = (AMI / "files" / "gpufleet-job-credentials.sh").read_text()
        path_line = "export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n"
        for fixed in ("/etc/gpufleet/node.json", "/usr/local/bin/gpufleet-trainer", path_line):
            assert fixed in text
        text = (text.replace("/etc/gpufleet/node.json", str(self.node_json))
                .replace("/usr/local/bin/gpufleet-trainer", str(self.trainer))
                .replace(path_line, f"export PATH={bin_dir}:/usr/bin:/bin\n"))
        self.script = tmp_path / f"gpufleet-{program}"
        self.script.write_text(text)
        self.script.chmod(0o755)

    def set(self, trainer: int, logger: int) -> None:
        (self.dir / "status").write_text(str(trainer))
        (self.dir / "logger-status").write_text(str(logger))

    def cloud(self, name: str | None) -> None:
        if name is None:
            self.node_json.unlink(missing_ok=True)
        else:
            self.node_json.write_text(json.dumps({"cloud": name, "region": "eu-west-1"}))

    def run(self) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.script)], capture_output=True, text=True, timeout=30,
                              env={"SLURM_JOB_ID": "4242", "SLURM_JOB_UID": "2000", "SLURM_JOB_GID": "2000"})

    def calls(self) -> list[str]:
        path = self.dir / "trainer"
        return path.read_text().splitlines() if path.exists() else []

    def syslog(self) -> list[str]:
        path = self.dir / "syslog"
        return path.read_text().splitlines() if path.exists() else []


@pytest.mark.parametrize("program", ["prolog", "epilog"])
@pytest.mark.parametrize("cloud", ["aws", "azure", "tencent"])
def test_on_each_cloud_each_job_program_runs_the_trainers_and_logs_nothing_when_it_works(tmp_path, program, cloud):
    node = Node(tmp_path, program)
    node.cloud(cloud)
    result = node.run()
    assert result.returncode == 0 and result.stdout == "" and result.stderr == ""
    assert node.calls() == [f"credentials {program}"]
    assert node.syslog() == []


@pytest.mark.parametrize("program", ["prolog", "epilog"])
@pytest.mark.parametrize("logger", [0, 1])
def test_a_failure_goes_to_syslog_and_the_program_still_exits_0(tmp_path, program, logger):
    """A failing Prolog would drain the node (the job just has no credentials of its own); a failing Epilog too.
    Even a logger that fails (no syslog) changes nothing."""
    node = Node(tmp_path, program)
    node.cloud("aws")
    node.set(trainer=2, logger=logger)
    result = node.run()
    assert result.returncode == 0 and result.stdout == ""
    assert node.calls() == [f"credentials {program}"]
    log = node.syslog()
    assert log[0] == f"args: -t gpufleet-{program} -p daemon.err"
    assert log[1].startswith(f"Slurm job 4242: credentials {program} failed (exit status 2)")
    assert log[2:] == ["trainer says: no record", "a second line"]


@pytest.mark.parametrize("program", ["prolog", "epilog"])
@pytest.mark.parametrize("cloud", [None, "gcp", "{broken"])
def test_without_a_cloud_each_job_program_does_nothing(tmp_path, program, cloud):
    """A node.json that names no cloud we run on, none, or a broken one: nothing."""
    node = Node(tmp_path, program)
    if cloud == "{broken":
        node.node_json.write_text(cloud)
    else:
        node.cloud(cloud)
    node.set(trainer=1, logger=0)
    result = node.run()
    assert result.returncode == 0 and result.stdout == "" and result.stderr == ""
    assert node.calls() == [] and node.syslog() == []
