"""Provisioning scripts: shellcheck-clean, and their helpers behave (verified downloads, manifest, accounts, scratch,
Slurm's power saving programs); the units start what the image installs and what `python -m trainer` has."""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.ami.conftest import AMI, downloads, image_commands, require, unit

SCRIPTS = sorted(AMI.glob("scripts/*.sh")) + sorted(AMI.glob("files/*.sh"))
LIB = AMI / "scripts" / "lib.sh"


def bash(code: str, env: dict | None = None, stdin: str | None = None, path_prefix: str = "") -> subprocess.CompletedProcess:
    require("bash")
    environ = {"PATH": f"{path_prefix}/usr/bin:/bin", "GPUFLEET_MANIFEST": str(AMI / "versions.json"), **(env or {})}
    return subprocess.run(["bash", "-c", code], capture_output=True, text=True, env=environ, input=stdin, timeout=30)


def lib(code: str, **kwargs) -> subprocess.CompletedProcess:
    require("jq")
    require("curl")
    return bash(f"set -euo pipefail; . {LIB}; {code}", **kwargs)


def test_shellcheck_finds_nothing_at_warning_level():
    result = subprocess.run([require("shellcheck"), "-S", "warning", "-x", *map(str, SCRIPTS)],
                            capture_output=True, text=True, cwd=AMI / "scripts")
    assert result.returncode == 0, result.stdout
    assert len(SCRIPTS) >= 20


@pytest.mark.parametrize("script", [s for s in SCRIPTS if s.name != "lib.sh"], ids=lambda p: p.name)
def test_every_script_is_strict_and_executable(script):
    lines = script.read_text().splitlines()
    assert lines[0] == "#!/usr/bin/env bash"
    code = [line for line in lines if line.strip() and not line.startswith("#")]
    assert code[0] == "set -euo pipefail"
    assert os.access(script, os.X_OK)


def test_lib_is_sourced_not_run():
    assert not os.access(LIB, os.X_OK)
    assert LIB.read_text().startswith("# shellcheck shell=bash")


@pytest.fixture
def payload(tmp_path) -> tuple[str, str]:
    blob = tmp_path / "payload.tar.gz"
    blob.write_bytes(b"vendor bytes\n")
    return blob.as_uri(), hashlib.sha256(blob.read_bytes()).hexdigest()


def test_verified_download_with_the_right_sha256(payload, tmp_path):
    url, sha = payload
    result = lib(f"fetch_verified {url} {sha} {tmp_path}/out")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out").read_bytes() == b"vendor bytes\n"


def test_wrong_sha256_is_refused_and_nothing_is_left(payload, tmp_path):
    url, _ = payload
    result = lib(f"fetch_verified {url} {'0' * 64} {tmp_path}/out")
    assert result.returncode == 1
    assert "sha256 mismatch" in result.stderr
    assert not list(tmp_path.glob("out*"))


@pytest.mark.parametrize("sha", ["null", "''", "abc123"])
def test_absent_sha256_is_refused_before_downloading(payload, tmp_path, sha):
    url, _ = payload
    result = lib(f"fetch_verified {url} {sha} {tmp_path}/out")
    assert result.returncode == 1
    assert "no sha256" in result.stderr
    assert not list(tmp_path.glob("out*"))


MANIFEST_DOWNLOADS = [path for path, _ in downloads(json.loads((AMI / "versions.json").read_text()))]


def test_every_download_the_scripts_make_is_checked_here():
    fetched = set()
    for script in AMI.glob("scripts/[0-9]*.sh"):
        fetched |= set(re.findall(r"fetch_component (\w+(?:\.\w+)?)", script.read_text()))
    assert fetched == set(MANIFEST_DOWNLOADS)  # each through fetch_component, so through its sha256 gate
    assert len(fetched) >= 9


@pytest.mark.parametrize("component", MANIFEST_DOWNLOADS)
def test_manifest_downloads_without_checksum_are_refused(manifest, component, tmp_path):
    node = manifest
    for key in component.split("."):
        node = node[key]
    result = lib(f"fetch_component {component} {tmp_path}/out")
    if node["sha256"] is None:
        assert result.returncode == 1 and f"no sha256 for {node['url']}" in result.stderr
    else:  # a real checksum: the (offline) download itself fails, never the checksum gate
        assert "no sha256" not in result.stderr


def test_manifest_lookup(manifest):
    assert lib("manifest .nvidia_driver.version").stdout.strip() == manifest["nvidia_driver"]["version"]
    missing = lib("manifest .nvidia_driver.nope")
    assert missing.returncode != 0 and "missing in manifest: .nvidia_driver.nope" in missing.stderr


@pytest.mark.parametrize("cloud, component, shipped", [
    ("azure", "nvidia_driver", True), ("azure", "nccl", True), ("azure", "trainer", False),
    ("aws", "nvidia_driver", False),
])
def test_azure_hpc_base_components_are_not_reinstalled(cloud, component, shipped):
    result = lib(f"ships_with_base {component}", env={"GPUFLEET_CLOUD": cloud})
    assert (result.returncode == 0) is shipped


def lsblk(*disks: dict) -> str:
    return json.dumps({"blockdevices": list(disks)})


ROOT_EBS = {"name": "nvme0n1", "type": "disk", "model": "Amazon Elastic Block Store", "mountpoint": None,
            "children": [{"name": "nvme0n1p1", "type": "part", "mountpoint": "/"}]}


def store(name: str, model: str = "Amazon EC2 NVMe Instance Storage        ", **extra) -> dict:
    return {"name": name, "type": "disk", "model": model, "mountpoint": None, **extra}


def scratch_plan(devices: str) -> list[str]:
    require("jq")
    result = bash(f"{AMI / 'files' / 'gpufleet-scratch.sh'} --plan", stdin=devices)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_scratch_raid0_over_all_instance_store_disks():
    plan = scratch_plan(lsblk(ROOT_EBS, *(store(f"nvme{i}n1") for i in range(1, 9))))
    disks = " ".join(f"/dev/nvme{i}n1" for i in range(1, 9))
    assert plan[0] == f"mdadm --create /dev/md/gpufleet-scratch --run --level=0 --raid-devices=8 {disks}"
    assert plan[1] == "mkfs.xfs -f -L gpufleet-scratch /dev/md/gpufleet-scratch"
    assert "mount -o noatime /dev/md/gpufleet-scratch /mnt/scratch" in plan
    assert plan[-1] == "mount --bind /mnt/scratch/data-cache /var/cache/gpufleet/data"


def test_scratch_single_disk_is_used_plain():
    plan = scratch_plan(lsblk(ROOT_EBS, store("nvme1n1", "Microsoft NVMe Direct Disk")))
    assert not any(line.startswith("mdadm") for line in plan)
    assert plan[0] == "mkfs.xfs -f -L gpufleet-scratch /dev/nvme1n1"
    assert "mount -o noatime /dev/nvme1n1 /mnt/scratch" in plan


def test_scratch_skips_used_disks_and_works_without_any():
    used = [store("nvme1n1", mountpoint="/data"), store("nvme2n1", children=[{"name": "nvme2n1p1"}])]
    plan = scratch_plan(lsblk(ROOT_EBS, *used))
    assert not any(line.startswith(("mdadm", "mkfs", "mount -o")) for line in plan)
    assert "mkdir -p /mnt/scratch/data-cache /mnt/scratch/tmp /mnt/scratch/jobs /var/cache/gpufleet/data" in plan
    assert "chmod 1733 /mnt/scratch/jobs" in plan  # each job's scratch: its own, unlisted by the others


# --- containers: no job in the docker group; the launcher, its sudoers rule, gpufleet-docker-run ---------------------

LAUNCHER = AMI / "files" / "gpufleet-container.sh"
SUDOERS = AMI / "files" / "sudoers-gpufleet-container"
DOCKER_RUN = AMI / "files" / "gpufleet-docker-run.sh"
# prints its argv one a line, the directory it runs in and its environment (the trainer's Python stands in for it)
FAKE_PYTHON = '#!/bin/sh\nprintf "%s\\n" "$@"\necho "--- $(pwd)"\nenv\n'


@pytest.fixture
def public_dir():
    """A folder every user can reach (nobody runs scripts from it), removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="gpufleet-container-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder)


def with_fake_venv(script: Path, folder: Path, manifest: dict) -> Path:
    """SCRIPT copied into FOLDER with the trainer's virtualenv moved to FOLDER/venv, whose python is FAKE_PYTHON."""
    venv = manifest["trainer"]["venv"]
    text = script.read_text()
    assert f"python={venv}/bin/python " in text  # the one path of it, fixed: the manifest's virtualenv
    (folder / "venv" / "bin").mkdir(parents=True, exist_ok=True)
    for d in (folder / "venv", folder / "venv" / "bin"):
        d.chmod(0o755)
    python = folder / "venv" / "bin" / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    copy = folder / script.name
    copy.write_text(text.replace(f"python={venv}/bin/python ", f"python={folder}/venv/bin/python "))
    copy.chmod(0o755)
    return copy


def ran(result: subprocess.CompletedProcess) -> tuple[list[str], str, dict[str, str]]:
    """FAKE_PYTHON's argv, working directory and environment."""
    out = result.stdout.splitlines()
    split = next(i for i, line in enumerate(out) if line.startswith("--- "))
    env = dict(line.split("=", 1) for line in out[split + 1:] if "=" in line)
    return out[:split], out[split][4:], env


def test_the_container_programs_are_installed_where_the_trainer_calls_them():
    from trainer.node import container

    assert container.LAUNCHER == "/usr/local/sbin/gpufleet-container"
    trainer = (AMI / "scripts" / "50-trainer.sh").read_text()
    assert ("install -o root -g root -m 0755 /tmp/gpufleet-ami/files/gpufleet-container.sh "
            "/usr/local/sbin/gpufleet-container") in trainer
    assert ("install -o root -g root -m 0440 /tmp/gpufleet-ami/files/sudoers-gpufleet-container "
            "/etc/sudoers.d/gpufleet-container") in trainer
    assert ("install -m 0755 /tmp/gpufleet-ami/files/gpufleet-docker-run.sh /usr/local/bin/gpufleet-docker-run"
            in (AMI / "scripts" / "40-docker.sh").read_text())
    base = (AMI / "scripts" / "00-base.sh").read_text()
    packages = base.split("apt_install ", 1)[1].split("\n\n", 1)[0].replace("\\\n", " ").split()
    assert "sudo" in packages  # the base image's list is explicit


def test_the_sudoers_rule_lets_every_user_run_the_launcher_and_nothing_else():
    rules = [line for line in SUDOERS.read_text().splitlines() if line.strip() and not line.startswith("#")]
    assert rules == ["Defaults!/usr/local/sbin/gpufleet-container env_reset, !env_keep, !env_check, !requiretty",
                     "ALL ALL=(root) NOPASSWD: /usr/local/sbin/gpufleet-container"]


def test_visudo_accepts_the_sudoers_rule():
    result = subprocess.run([require("visudo"), "-cf", str(SUDOERS)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_launcher_refuses_anyone_but_root(public_dir, manifest):
    """As nobody (runuser, where the tests run as root; else as the tests' own user): one line, exit 2, and the
    trainer's Python never runs."""
    script = with_fake_venv(LAUNCHER, public_dir, manifest)
    as_nobody = [require("runuser"), "-u", "nobody", "--"] if os.geteuid() == 0 else []
    result = subprocess.run([*as_nobody, "bash", str(script), "run"], capture_output=True, text=True, timeout=30,
                            cwd="/", env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [
        "gpufleet-container: must run as root (through sudo: sudo -n /usr/local/sbin/gpufleet-container ...)"]


@pytest.mark.parametrize("args", [["run"], ["stop", "gpufleet-4321-sbatch-7-99", "--time", "30"]])
def test_the_launcher_runs_the_trainers_python_isolated_with_an_environment_of_its_own(public_dir, manifest, args):
    """As root (what sudo makes it): the virtualenv's python -I -m trainer container ARGS, from /, with PATH, LANG and
    sudo's SUDO_UID/SUDO_GID only; nothing else of the caller's environment (PYTHONPATH, DOCKER_HOST, HOME, ...)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the launcher refuses any other user")
    script = with_fake_venv(LAUNCHER, public_dir, manifest)
    work = public_dir / "work"
    (work / "trainer").mkdir(parents=True)  # a caller's trainer/ folder: never imported (-I, and the launcher cd's /)
    caller = {"PATH": f"{work}:/usr/bin:/bin", "PYTHONPATH": str(work), "PYTHONSTARTUP": str(work / "x.py"),
              "DOCKER_HOST": "tcp://192.0.2.1:2375", "HOME": str(work), "LD_LIBRARY_PATH": str(work),
              "SUDO_UID": "4321", "SUDO_GID": "4322"}
    result = subprocess.run(["bash", str(script), *args], capture_output=True, text=True, timeout=30, cwd=work,
                            env=caller)
    assert result.returncode == 0, result.stderr
    argv, cwd, env = ran(result)
    assert argv == ["-I", "-m", "trainer", "container", *args]
    assert cwd == "/"
    assert env["PATH"] == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    assert (env["SUDO_UID"], env["SUDO_GID"], env["LANG"]) == ("4321", "4322", "C.UTF-8")
    assert set(env) <= {"PATH", "LANG", "SUDO_UID", "SUDO_GID", "PWD", "OLDPWD", "SHLVL", "_"}  # the shell's own

    result = subprocess.run(["bash", str(script), "run"], capture_output=True, text=True, timeout=30, cwd="/",
                            env={"PATH": "/usr/bin:/bin"})  # root itself, not through sudo: its own ids
    assert result.returncode == 0 and not {"SUDO_UID", "SUDO_GID"} & set(ran(result)[2])


def test_docker_run_hands_the_image_and_its_command_to_the_launchers_client(public_dir, manifest):
    """gpufleet-docker-run IMAGE [CMD...] is `python -I -m trainer container job IMAGE CMD...`: the command's own
    flags are the command's; the caller's environment (the job's credentials, GPUFLEET_*, CUDA_VISIBLE_DEVICES) is
    what the client reads."""
    script = with_fake_venv(DOCKER_RUN, public_dir, manifest)
    token = "4242." + "t" * 43
    env = {"PATH": "/usr/bin:/bin", "AWS_CONTAINER_AUTHORIZATION_TOKEN": token, "CUDA_VISIBLE_DEVICES": "0,1"}
    result = subprocess.run(["bash", str(script), "img:1", "python", "-m", "trainer", "train", "--steps", "5"],
                            capture_output=True, text=True, timeout=30, cwd=public_dir, env=env)
    assert result.returncode == 0, result.stderr
    argv, cwd, seen = ran(result)
    assert argv == ["-I", "-m", "trainer", "container", "job", "img:1", "python", "-m", "trainer", "train",
                    "--steps", "5"]
    assert cwd == str(public_dir)
    assert seen["AWS_CONTAINER_AUTHORIZATION_TOKEN"] == token and seen["CUDA_VISIBLE_DEVICES"] == "0,1"


@pytest.mark.parametrize("args", [["--privileged", "img:1"], ["-v", "/:/host", "img:1", "sh"], ["--user=0", "img:1"],
                                  ["-it", "img:1"]])
def test_docker_run_refuses_docker_options(public_dir, manifest, args):
    script = with_fake_venv(DOCKER_RUN, public_dir, manifest)
    result = subprocess.run(["bash", str(script), *args], capture_output=True, text=True, timeout=30, cwd="/",
                            env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == 2 and result.stdout == ""  # the trainer's Python never ran
    assert result.stderr.splitlines() == [f"gpufleet-docker-run: docker options are not accepted ({args[0]}); "
                                          "usage: gpufleet-docker-run IMAGE [CMD...]"]


def test_docker_run_without_an_image_says_how_it_is_used(public_dir, manifest):
    script = with_fake_venv(DOCKER_RUN, public_dir, manifest)
    result = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=30, cwd="/",
                            env={"PATH": "/usr/bin:/bin"})
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.splitlines() == ["gpufleet-docker-run: no image; usage: gpufleet-docker-run IMAGE [CMD...]"]


class TrainerInstall:
    """50-trainer.sh off the build machine: /tmp/gpufleet-ami moved under the test's folder, the virtualenv a fake
    one, and every command that would change the machine (install, ln, systemctl, gpasswd, usermod, visudo) a stub
    that records its call; getent answers the docker group this test gives."""

    def __init__(self, tmp_path: Path, manifest: dict, docker_group: str | None, visudo_ok: bool = True,
                 dns_user: bool = False):
        from tests.ami.staging import manifest_copy, stage, stub

        self.tmp, self.calls = tmp_path, tmp_path / "calls"
        self.stubs, self.venv = tmp_path / "bin", tmp_path / "venv"
        self.staged = tmp_path / "root" / "tmp" / "gpufleet-ami"
        self.script = stage(tmp_path, "50-trainer.sh", ["/tmp/gpufleet-ami"])
        (self.staged / "files").mkdir(parents=True)
        (self.staged / manifest["trainer"]["wheel"]).write_text("")
        for name in ("install", "ln", "systemctl", "gpasswd", "usermod", "useradd", "python3"):
            stub(self.stubs, name, f'echo "{name} $*" >>{self.calls}\n')
        stub(self.stubs, "visudo", f'echo "visudo $*" >>{self.calls}\nexit {0 if visudo_ok else 1}\n')
        group = "exit 2" if docker_group is None else f"echo '{docker_group}'"
        stub(self.stubs, "getent", f'[ "$1 $2" = "group docker" ] || exit 2\n{group}\n')
        stub(self.stubs, "id", f'[ "$1 $2" = "-u gpufleet" ] && echo {manifest["accounts"]["gpufleet"]["uid"]}\n'
                               f'[ "$1 $2" = "-u gpufleet-dns-guard" ] && {{ echo 998; exit {int(not dns_user)}; }}\n')
        stub(self.venv / "bin", "python", f'echo {manifest["trainer"]["version"]}\n')
        stub(self.venv / "bin", "pip", "exit 0\n")
        self.manifest = manifest_copy(tmp_path, trainer={"venv": str(self.venv)})

    def run(self) -> subprocess.CompletedProcess:
        from tests.ami.staging import run

        return run(self.script, "aws", self.manifest, self.stubs)

    def lines(self) -> list[str]:
        return self.calls.read_text().splitlines() if self.calls.exists() else []


@pytest.mark.parametrize("docker_group, removed", [
    ("docker:x:998:ubuntu,gpufleet", True), ("docker:x:998:gpufleet", True), ("docker:x:998:ubuntu", False),
    ("docker:x:998:gpufleet2,xgpufleet", False), (None, False)])
def test_the_trainer_script_keeps_gpufleet_out_of_the_docker_group(tmp_path, manifest, docker_group, removed):
    """Never added (an image before the launcher did add it): removed where it is a member, left alone elsewhere."""
    build = TrainerInstall(tmp_path, manifest, docker_group)
    result = build.run()
    assert result.returncode == 0, result.stderr
    calls = build.lines()
    assert not [c for c in calls if c.startswith("usermod")]
    assert [c for c in calls if c.startswith("gpasswd")] == (["gpasswd -d gpufleet docker"] if removed else [])
    assert ("gpufleet removed from the docker group" in result.stderr) is removed


def test_the_trainer_script_installs_the_launcher_and_its_checked_sudoers_rule(tmp_path, manifest):
    build = TrainerInstall(tmp_path, manifest, "docker:x:998:")
    result = build.run()
    assert result.returncode == 0, result.stderr
    calls, files = build.lines(), build.staged / "files"
    check = f"visudo -cf {files}/sudoers-gpufleet-container"
    launcher = f"install -o root -g root -m 0755 {files}/gpufleet-container.sh /usr/local/sbin/gpufleet-container"
    rule = f"install -o root -g root -m 0440 {files}/sudoers-gpufleet-container /etc/sudoers.d/gpufleet-container"
    assert check in calls and launcher in calls and rule in calls
    assert calls.index(check) < calls.index(rule)  # checked before sudo ever reads it


@pytest.mark.parametrize("exists", [False, True])
def test_the_trainer_script_makes_the_dns_guards_user_once(tmp_path, manifest, exists):
    """A system user of its own, no home, no shell: the DNS rules exempt it (Tencent: tests/ami/test_dns_guard.py)."""
    build = TrainerInstall(tmp_path, manifest, "docker:x:998:", dns_user=exists)
    result = build.run()
    assert result.returncode == 0, result.stderr
    assert [c for c in build.lines() if c.startswith("useradd")] == ([] if exists else [
        "useradd --system --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "
        "gpufleet-dns-guard"])
    assert "systemctl enable gpufleet-dns-rules.service gpufleet-dns-guard.service" in build.lines()
    rules = build.staged / "files" / "gpufleet-dns-guard-rules.sh"
    assert f"install -m 0755 {rules} /usr/local/sbin/gpufleet-dns-guard-rules" in build.lines()


def test_a_sudoers_rule_visudo_refuses_stops_the_build_before_it_is_installed(tmp_path, manifest):
    """A file in /etc/sudoers.d that sudo cannot parse stops sudo for every user: it never gets there."""
    build = TrainerInstall(tmp_path, manifest, "docker:x:998:", visudo_ok=False)
    result = build.run()
    assert result.returncode == 1 and "error: visudo refuses files/sudoers-gpufleet-container" in result.stderr
    assert not [c for c in build.lines() if "/etc/sudoers.d" in c]


def test_scratch_is_assembled_before_a_node_joins_slurm():
    """Jobs use /mnt/scratch (data cache, TMPDIR, a container's scratch volume): the node's setup waits for it."""
    scratch, node = unit("gpufleet-scratch.service"), unit("gpufleet-node.service")
    assert scratch["Service"]["Type"] == "oneshot" and scratch["Service"]["RemainAfterExit"] == "yes"
    assert scratch["Service"]["ExecStart"] == "/usr/local/sbin/gpufleet-scratch"
    assert {"gpufleet-node.service", "slurmd.service", "docker.service"} <= set(scratch["Unit"]["Before"].split())
    assert "gpufleet-scratch.service" in node["Unit"]["Wants"].split()
    assert "gpufleet-scratch.service" in node["Unit"]["After"].split()
    assert "systemctl enable gpufleet-scratch.service" in (AMI / "scripts" / "50-trainer.sh").read_text()


def test_the_node_and_controller_units_configure_the_machine_first():
    for name, settings in (("gpufleet-node.service", "/etc/gpufleet/node.json"),
                           ("gpufleet-controller.service", "/etc/gpufleet/controller.json")):
        # "-": the CloudWatch agent's setup failing does not keep the machine out of the cluster
        assert unit(name)["Service"]["ExecStartPre"] == f"-/usr/local/sbin/gpufleet-node-config {settings}"
    assert ("install -m 0755 /tmp/gpufleet-ami/files/gpufleet-node-config.sh /usr/local/sbin/gpufleet-node-config"
            in (AMI / "scripts" / "50-trainer.sh").read_text())


def test_the_queue_agents_units_are_gone_from_the_image():
    """The per-node queue agent and its preflight unit went with the move to Slurm: nothing in the image installs,
    enables, orders after or documents them, and no unit names a gpufleet unit the image does not have."""
    units = {p.name for p in AMI.glob("systemd/*")}
    assert not {"gpufleet-agent.service", "gpufleet-preflight.service"} & units
    for path in (p for p in AMI.rglob("*") if p.is_file()):
        text = path.read_text()
        for gone in ("gpufleet-agent", "gpufleet-preflight", "trainer agent", "trainer preflight", "agent.log",
                     "preflight.log"):
            assert gone not in text, f"{path.relative_to(AMI)} still names {gone}"
    for name in units:
        for key in ("Wants", "Requires", "After", "Before", "BindsTo", "PartOf"):
            for other in unit(name)["Unit"].get(key, "").split() if unit(name).has_section("Unit") else []:
                if other.startswith("gpufleet-"):
                    assert other in units or re.sub(r"@[^.]+\.", "@.", other) in units, f"{name}: {key}={other}"


def test_units_run_only_what_the_image_installs():
    installer = (AMI / "scripts" / "50-trainer.sh").read_text() + (AMI / "scripts" / "45-slurm.sh").read_text()
    for name in ("gpufleet-scratch", "gpufleet-node-config"):
        assert f"/tmp/gpufleet-ami/files/{name}.sh /usr/local/sbin/{name}" in installer
    for path in AMI.glob("systemd/*.service"):
        for line in path.read_text().splitlines():
            if line.startswith(("ExecStart=", "ExecStartPre=")) and "/usr/local/sbin/" in line:
                assert line.split("=", 1)[1].split()[0].rsplit("/", 1)[1] in installer


def test_systemd_accepts_the_units():
    result = subprocess.run([require("systemd-analyze"), "verify", *map(str, AMI.glob("systemd/*.service"))],
                            capture_output=True, text=True)
    problems = [line for line in (result.stdout + result.stderr).splitlines()
                if line.strip() and "is not executable: No such file or directory" not in line]
    assert problems == []


ONE_CLOUDS = {"20-efa.sh": ("aws", "efa"), "22-aws-ofi-nccl.sh": ("aws", "aws-ofi-nccl"),
              "31-cloudwatch-agent.sh": ("aws", "cloudwatch agent"), "32-efs-utils.sh": ("aws", "efs-utils"),
              "34-aznfs.sh": ("azure", "aznfs")}


@pytest.mark.parametrize("script, cloud", [(s, c) for s, (own, _) in ONE_CLOUDS.items()
                                           for c in ("aws", "azure", "tencent") if c != own])
def test_one_clouds_components_are_skipped_elsewhere(script, cloud):
    require("jq")
    result = bash(str(AMI / "scripts" / script), env={"GPUFLEET_CLOUD": cloud})
    assert result.returncode == 0 and f"{ONE_CLOUDS[script][1]}: not on {cloud}" in result.stderr, result.stderr


def test_only_the_one_cloud_scripts_skip_themselves():
    """A script that tests GPUFLEET_CLOUD for a skip is one of ONE_CLOUDS (and the templates' comment names them)."""
    skipping = {p.name for p in AMI.glob("scripts/[0-9]*.sh")
                if re.search(r'if \[ "\$GPUFLEET_CLOUD" != \w+ \]; then\n  log "[^"]*: not on', p.read_text())}
    assert skipping == set(ONE_CLOUDS)
    comment = (AMI / "variables.pkr.hcl").read_text()
    assert all(name in comment for name in ONE_CLOUDS) and "33-nfs-common.sh on all" in comment


def test_tencent_nccl_settings_use_sockets_without_rdma(tmp_path):
    """60-nccl-env.sh on a tencent build, with dpkg-query stubbed and /etc/gpufleet redirected."""
    require("jq")
    stubs = tmp_path / "bin"
    stubs.mkdir()
    (stubs / "dpkg-query").write_text("#!/bin/sh\necho 2.26.2-1+cuda12.8\n")
    (stubs / "dpkg-query").chmod(0o755)
    etc = tmp_path / "etc"
    script = (AMI / "scripts" / "60-nccl-env.sh").read_text().replace("/etc/gpufleet", str(etc))
    copy = tmp_path / "60-nccl-env.sh"
    copy.write_text(script)
    (tmp_path / "lib.sh").write_text(LIB.read_text())
    result = bash(f"bash {copy}", env={"GPUFLEET_CLOUD": "tencent"}, path_prefix=f"{stubs}:")
    assert result.returncode == 0, result.stderr
    settings = (etc / "container.env").read_text().splitlines()[1:]
    assert settings == ["NCCL_IB_DISABLE=1", "NCCL_SOCKET_IFNAME=eth0"]
    assert "LD_LIBRARY_PATH=/usr/local/cuda/lib64" in (etc / "nccl.env").read_text()


# --- Slurm: accounts, the build script, power saving programs, units ------------------------------------------------

def _stub(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


@pytest.fixture
def passwd(tmp_path) -> tuple[Path, Path]:
    """getent, id, groupadd and useradd over two files of the test's, recording what was added."""
    state, stubs = tmp_path / "state", tmp_path / "bin"
    state.mkdir()
    stubs.mkdir()
    (state / "group").write_text("")
    (state / "passwd").write_text("")
    _stub(stubs, "getent", f'grep "^$2:" {state}/$1\n')
    _stub(stubs, "id", f'[ "$1" = -u ] && grep "^$2:" {state}/passwd | cut -d: -f3\n')
    _stub(stubs, "groupadd", f'echo "groupadd $*" >>{state}/log\n')
    _stub(stubs, "useradd", f'echo "useradd $*" >>{state}/log\n')
    return state, stubs


def test_an_account_is_made_with_the_manifests_ids(passwd):
    state, stubs = passwd
    result = lib("account slurm 64030 64030 /var/lib/slurm", path_prefix=f"{stubs}:")
    assert result.returncode == 0, result.stderr
    assert (state / "log").read_text().splitlines() == [
        "groupadd --system --gid 64030 slurm",
        "useradd --system --uid 64030 --gid 64030 --home-dir /var/lib/slurm --no-create-home --shell "
        "/usr/sbin/nologin slurm"]


def test_an_account_that_exists_with_the_same_ids_is_kept(passwd):
    state, stubs = passwd
    (state / "group").write_text("slurm:x:64030:\n")
    (state / "passwd").write_text("slurm:x:64030:64030::/var/lib/slurm:/usr/sbin/nologin\n")
    result = lib("account slurm 64030 64030 /var/lib/slurm", path_prefix=f"{stubs}:")
    assert result.returncode == 0, result.stderr
    assert not (state / "log").exists()


@pytest.mark.parametrize("group, user, message", [
    ("slurm:x:998:\n", "", "group slurm exists with gid 998, not 64030"),
    ("slurm:x:64030:\n", "slurm:x:999:64030::/:/bin/sh\n", "user slurm exists with uid 999, not 64030"),
])
def test_an_account_with_other_ids_stops_the_build(passwd, group, user, message):
    state, stubs = passwd
    (state / "group").write_text(group)
    (state / "passwd").write_text(user)
    result = lib("account slurm 64030 64030 /var/lib/slurm", path_prefix=f"{stubs}:")
    assert result.returncode == 1 and f"error: {message}" in result.stderr


def test_the_slurm_script_builds_verified_releases_and_enables_no_daemon():
    script = (AMI / "scripts" / "45-slurm.sh").read_text()
    assert "fetch_component munge " in script and "fetch_component slurm " in script  # sha256-checked, never null
    assert "verify_signature \"$work/munge.tar.xz\" \"$(manifest .munge.sig_url)\"" in script
    for name in ("munge", "slurm", "gpufleet"):
        assert f"account {name} \"$(manifest .accounts.{name}.uid)\" \"$(manifest .accounts.{name}.gid)\"" in script
    assert "systemctl enable" not in script  # setup starts munge, slurmd or slurmctld at boot, with their settings
    assert "--with-munge=\"$munge_prefix\"" in script and "--sysconfdir=\"$slurm_etc\"" in script


def test_the_power_saving_programs_are_installed_where_slurm_conf_names_them():
    from trainer.slurm.conf import IMAGE_PROGRAMS

    script = (AMI / "scripts" / "45-slurm.sh").read_text()
    assert 'for action in resume suspend resume-fail; do' in script
    assert 'install -m 0755 /tmp/gpufleet-ami/files/gpufleet-power.sh "/usr/local/sbin/gpufleet-$action"' in script
    assert sorted(IMAGE_PROGRAMS.values()) == sorted(f"/usr/local/sbin/gpufleet-{a}"
                                                     for a in ("resume", "suspend", "resume-fail"))


@pytest.fixture
def power(tmp_path) -> tuple[Path, Path, Path]:
    """gpufleet-power.sh installed under its three names, with the trainer a stub and the log in the test's dir."""
    calls, log = tmp_path / "calls", tmp_path / "power.log"
    trainer = tmp_path / "gpufleet-trainer"
    trainer.write_text(f'#!/bin/sh\necho "$*" >>{calls}\necho "provider says hello"\nexit "$(cat {tmp_path}/status)"\n')
    trainer.chmod(0o755)
    (tmp_path / "status").write_text("0")
    text = (AMI / "files" / "gpufleet-power.sh").read_text()
    assert "/usr/local/bin/gpufleet-trainer nodes" in text and ">>/var/log/slurm/power.log" in text
    text = text.replace("/usr/local/bin/gpufleet-trainer", str(trainer)).replace("/var/log/slurm/power.log", str(log))
    sbin = tmp_path / "sbin"
    sbin.mkdir()
    for name in ("gpufleet-resume", "gpufleet-suspend", "gpufleet-resume-fail", "gpufleet-power"):
        (sbin / name).write_text(text)
        (sbin / name).chmod(0o755)
    return sbin, calls, log


@pytest.mark.parametrize("action", ["resume", "suspend", "resume-fail"])
def test_a_power_saving_program_hands_the_hostlist_to_the_node_provider_and_logs(power, action):
    sbin, calls, log = power
    result = subprocess.run([str(sbin / f"gpufleet-{action}"), "gpu-[1-3]"], capture_output=True, text=True,
                            env={}, timeout=30)  # slurmctld runs it without PATH
    assert result.returncode == 0, result.stderr
    assert calls.read_text().splitlines() == [f"nodes {action} gpu-[1-3]"]
    lines = log.read_text().splitlines()
    assert lines[0].endswith(f"Z {action} gpu-[1-3]") and lines[1] == "provider says hello"
    assert lines[2].endswith(f"Z {action} gpu-[1-3]: exit status 0")


def test_a_failed_power_saving_call_fails_the_program(power, tmp_path):
    sbin, _, log = power
    (tmp_path / "status").write_text("1")
    result = subprocess.run([str(sbin / "gpufleet-resume"), "gpu-1"], capture_output=True, text=True, env={},
                            timeout=30)
    assert result.returncode == 1
    assert log.read_text().splitlines()[-1].endswith("resume gpu-1: exit status 1")


@pytest.mark.parametrize("name, args, message", [
    ("gpufleet-power", ["gpu-1"], "gpufleet-power: run as gpufleet-resume, gpufleet-suspend or gpufleet-resume-fail"),
    ("gpufleet-resume", [], "gpufleet-resume: expected one argument, the hostlist of the nodes"),
    ("gpufleet-suspend", ["gpu-1", "gpu-2"], "gpufleet-suspend: expected one argument"),
])
def test_a_power_saving_program_called_wrongly_says_so(power, name, args, message):
    sbin, calls, _ = power
    result = subprocess.run([str(sbin / name), *args], capture_output=True, text=True, env={}, timeout=30)
    assert result.returncode == 2 and message in result.stderr
    assert not calls.exists()


def _exec_start(name: str) -> list[str]:
    return unit(name)["Service"]["ExecStart"].split()


def test_what_the_image_starts_is_a_command_python_m_trainer_has():
    """trainer/__main__.py's COMMANDS is the one list of commands: every unit, installed program and batch script
    of the image names one of them (the queue agent and preflight's launch hook are gone from it)."""
    from trainer.__main__ import COMMANDS

    started = image_commands()
    assert {"setup", "controller", "nodes", "task"} <= set(started)
    for command, where in started.items():
        assert command in COMMANDS, f"{where}: python -m trainer has no {command!r}"
    assert "agent" not in started and "preflight" not in started


def test_the_validation_starts_every_command_the_image_starts():
    text = (AMI / "scripts" / "99-validate.sh").read_text()
    loop = re.search(r"for command in ([\w ]+); do\n  \"\$trainer_python\" -m trainer \"\$command\" --help", text)
    assert loop and sorted(loop[1].split()) == sorted(image_commands())


def test_units_start_commands_that_python_m_trainer_has_with_flags_it_takes():
    import importlib
    import shlex

    from trainer.__main__ import COMMANDS
    from trainer.slurm import setup

    env = {k: shlex.quote(v.strip('"')) for k, v in (line.split("=", 1) for line in setup.bridge_env({
        "cloud": "aws", "region": "eu-west-1", "queue_url": "https://sqs.eu-west-1.amazonaws.com/1/q",
        "bucket": "b", "partition": "gpu", "gpus": 8, "instance_type": "p5.48xlarge"}).splitlines()
        if not line.startswith("#"))}
    checked = 0
    for path in sorted(AMI.glob("systemd/*.service")):
        argv = unit(path.name)["Service"]["ExecStart"].split()
        if not argv[0].endswith("/gpufleet-trainer"):
            continue
        command, args = argv[1], [a.replace("%i", "gpu-1") for a in argv[2:]]
        assert command in COMMANDS, f"{path.name}: python -m trainer has no {command!r}"
        for i, arg in enumerate(args):
            if arg.startswith("${"):
                assert arg[2:-1] in env, f"{path.name}: {arg} is not in what setup writes to bridge.env"
                args[i] = env[arg[2:-1]]
        module = importlib.import_module(COMMANDS[command])
        if hasattr(module, "parser"):
            module.parser().parse_args(args)  # a flag or choice it does not have raises UsageError
            checked += 1
    assert checked >= 4  # setup node, setup controller, controller (the bridge), nodes watch


def test_slurm_units_read_what_setup_writes():
    from infra.userdata import CONTROLLER_UNIT, NODE_UNIT
    from trainer.node import node_schema
    from trainer.slurm import setup

    slurmd, slurmctld, munge = unit("slurmd.service"), unit("slurmctld.service"), unit("munge.service")
    assert slurmd["Service"]["EnvironmentFile"] == setup.SLURMD_DEFAULTS
    assert _exec_start("slurmd.service") == ["/usr/local/sbin/slurmd", "--systemd", "$SLURMD_OPTIONS"]
    assert "ConditionPathExists" not in slurmd["Unit"]  # configless: a node has no slurm.conf
    assert slurmd["Service"]["Delegate"] == "yes" and slurmd["Service"]["RuntimeDirectory"] == "slurm"
    assert slurmctld["Unit"]["ConditionPathExists"] == setup.SLURM_CONF
    assert slurmctld["Service"]["User"] == "slurm" and slurmctld["Service"]["RuntimeDirectory"] == "slurm"
    assert munge["Unit"]["ConditionPathExists"] == setup.MUNGE_KEY and munge["Service"]["User"] == "munge"

    node, controller = unit(NODE_UNIT), unit(CONTROLLER_UNIT)
    assert _exec_start(NODE_UNIT)[1:] == ["setup", "node"]
    assert _exec_start(CONTROLLER_UNIT)[1:] == ["setup", "controller"]
    for u, settings in ((node, node_schema.PATH), (controller, node_schema.CONTROLLER_PATH)):
        assert u["Service"]["Type"] == "oneshot" and u["Service"]["RemainAfterExit"] == "yes"
        assert u["Unit"]["ConditionPathExists"] == settings
        assert "User" not in u["Service"]  # root: it writes the munge key and starts daemons

    bridge = unit("gpufleet-bridge.service")
    assert bridge["Service"]["User"] == "gpufleet" and bridge["Service"]["EnvironmentFile"] == setup.BRIDGE_ENV
    watch = unit("gpufleet-watch@.service")
    assert _exec_start("gpufleet-watch@.service")[1:] == ["nodes", "watch", "%i", "--config", node_schema.PATH]
    assert watch["Service"]["User"] == "slurm"  # Slurm's administrator: drain, requeue, power down


def test_every_unit_setup_starts_is_in_the_image():
    units = {p.name for p in AMI.glob("systemd/*.service")}
    assert {"munge.service", "slurmd.service", "gpufleet-watch@.service", "slurmctld.service",
            "gpufleet-bridge.service"} <= units
    installers = (AMI / "scripts" / "45-slurm.sh").read_text() + (AMI / "scripts" / "50-trainer.sh").read_text()
    for name in units:
        assert name.startswith("gpufleet-") or f"/tmp/gpufleet-ami/systemd/{name}" in installers
    assert "install -m 0644 /tmp/gpufleet-ami/systemd/gpufleet-*.service /etc/systemd/system/" in installers


# --- efs-utils: mount.efs for the AWS stacks' EFS mounts ----------------------------------------------------------

EFS_SCRIPT = AMI / "scripts" / "32-efs-utils.sh"


@pytest.fixture
def efs_build(tmp_path) -> tuple[Path, Path, Path]:
    """32-efs-utils.sh on an AWS build with apt-get recording its calls, dpkg-query knowing no package, and the
    script's scratch folder under the test's TMPDIR."""
    stubs, state, scratch = tmp_path / "bin", tmp_path / "state", tmp_path / "tmp"
    for d in (stubs, state, scratch):
        d.mkdir()
    _stub(stubs, "apt-get", f'echo "apt-get $*" >>{state}/apt\n')
    _stub(stubs, "dpkg-query", "exit 1\n")
    return stubs, state, scratch


def run_efs(efs_build, manifest_path: Path) -> subprocess.CompletedProcess:
    require("jq")
    require("git")
    stubs, _, scratch = efs_build
    return bash(f"bash {EFS_SCRIPT}", path_prefix=f"{stubs}:",
                env={"GPUFLEET_CLOUD": "aws", "GPUFLEET_MANIFEST": str(manifest_path), "TMPDIR": str(scratch)})


def release_archive(tmp_path: Path, version: str) -> tuple[str, str, str]:
    """A tag archive as GitHub serves one (`git archive`, which records the commit): its file URL, sha256, commit."""
    repo = tmp_path / "efs-utils"
    repo.mkdir()
    (repo / "build-deb.sh").write_text(f"#!/bin/sh\nVERSION={version}\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "release"], check=True)
    commit = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    archive = tmp_path / f"v{version}.tar.gz"
    subprocess.run([*git, "archive", "--format=tar.gz", f"--prefix=efs-utils-{version}/", "-o", str(archive), "HEAD"],
                   check=True)
    return archive.as_uri(), hashlib.sha256(archive.read_bytes()).hexdigest(), commit


def test_efs_utils_refuses_the_unpinned_release_before_building(efs_build, manifest):
    stubs, state, scratch = efs_build
    result = run_efs(efs_build, AMI / "versions.json")
    efs = manifest["efs_utils"]
    assert efs["sha256"] is None  # null until the first bake: refused, like every other download
    assert result.returncode == 1 and f"no sha256 for {efs['url']}" in result.stderr, result.stderr
    apt = (state / "apt").read_text().splitlines()
    assert apt[0] == "apt-get install -y -q --no-install-recommends stunnel4 nfs-common openssl"  # Ubuntu's archive
    assert not any(".deb" in line for line in apt)  # nothing built, nothing installed from a build
    assert list(scratch.iterdir()) == []  # the scratch folder is removed


@pytest.mark.parametrize("same_commit", [True, False])
def test_efs_utils_archive_must_be_the_release_commit(efs_build, manifest, tmp_path, same_commit):
    """A checksum filled in at the first bake pins whatever was downloaded then: the archive's own record of its
    commit must also be the release tag's, or nothing is built. Past that check the Rust toolchain's own (still
    null) checksum stops this run: nothing else is fetched unverified."""
    url, sha, commit = release_archive(tmp_path, manifest["efs_utils"]["version"])
    pinned = json.loads((AMI / "versions.json").read_text())
    pinned["efs_utils"].update(url=url, sha256=sha, commit=commit if same_commit else "0" * 40)
    path = tmp_path / "versions.json"
    path.write_text(json.dumps(pinned))
    result = run_efs(efs_build, path)
    assert result.returncode == 1
    if same_commit:
        assert "the efs-utils archive is commit" not in result.stderr
        assert f"no sha256 for {manifest['efs_utils']['rust']['url']}" in result.stderr, result.stderr
    else:
        assert f"the efs-utils archive is commit '{commit}', not the release's {'0' * 40}" in result.stderr
        assert "no sha256 for https://static.rust-lang.org" not in result.stderr
    assert list(efs_build[2].iterdir()) == []


def test_efs_utils_already_installed_is_kept(efs_build, manifest):
    stubs, state, _ = efs_build
    efs = manifest["efs_utils"]
    _stub(stubs, "dpkg-query", f'echo "{efs["version"]}-{efs["release"]}"\n')
    result = run_efs(efs_build, AMI / "versions.json")
    assert result.returncode == 0 and f"efs-utils {efs['version']} already installed" in result.stderr
    assert not (state / "apt").exists()


def test_efs_utils_is_built_as_upstream_documents_with_the_pinned_tools_only():
    script = EFS_SCRIPT.read_text()
    for download in ("efs_utils", "efs_utils.rust", "efs_utils.go"):
        assert f"fetch_component {download} " in script  # sha256-checked, never null
    assert ('verify_signature "$work/rust.tar.xz" "$(manifest .efs_utils.rust.sig_url)" '
            '"$(manifest .efs_utils.rust.gpg_key_url)"') in script
    assert "cargo fetch --locked --manifest-path src/proxy/Cargo.toml" in script
    assert "CARGO_NET_OFFLINE=true ./build-deb.sh" in script  # upstream's INSTALL.md for Debian/Ubuntu
    assert "GOTOOLCHAIN=local" in script and 'CARGO_HOME="$work/cargo"' in script
    assert "sh.rustup.rs" not in script and "| sh" not in script and "| bash" not in script
    assert "apt_install stunnel4 " in script  # stunnel from Ubuntu's archive
    assert 'apt_install "$deb"' in script


def test_the_aws_validation_checks_mount_efs_is_the_pinned_version():
    text = (AMI / "scripts" / "99-validate.sh").read_text()
    aws = text[text.index('elif [ "$GPUFLEET_CLOUD" = aws ]; then'):text.index("\nelse\n")]
    assert "for helper in /sbin/mount.efs /usr/bin/efs-proxy /usr/bin/stunnel; do" in aws
    assert 'check efs_utils "$(/sbin/mount.efs --version | awk \'{print $NF}\')" "$(manifest .efs_utils.version)"' in aws
    assert "mount.efs" not in text.replace(aws, "")  # only the AWS image has it
