"""Provisioning scripts: shellcheck-clean, and their helpers behave (verified downloads, manifest, accounts, scratch,
Slurm's power saving programs); the units start what the image installs and what `python -m trainer` has."""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
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


FAKE_DOCKER = ('#!/bin/sh\nprintf "%s\\n" "$@"\n'
               'echo "env: ${AWS_CONTAINER_CREDENTIALS_FULL_URI:-} ${AWS_CONTAINER_AUTHORIZATION_TOKEN:-}"\n')


def docker_run_args(script: Path = AMI / "files" / "gpufleet-docker-run.sh", env: dict | None = None,
                    user: int | None = None) -> list[str]:
    """gpufleet-docker-run's docker argv for `img:1 python -m trainer train`, printed one a line by a fake docker
    (which then prints the credentials variables it was given), as USER (setpriv) if given. The fake sits in a
    folder every user can reach, so no user's PATH finds a real docker first."""
    fake = Path(tempfile.mkdtemp(prefix="gpufleet-fake-docker-"))
    try:
        fake.chmod(0o755)
        (fake / "docker").write_text(FAKE_DOCKER)
        (fake / "docker").chmod(0o755)
        as_user = [] if user is None else [require("setpriv"), "--reuid", str(user), "--regid", str(user),
                                           "--clear-groups"]
        result = subprocess.run([*as_user, "bash", str(script), "img:1", "python", "-m", "trainer", "train"],
                                capture_output=True, text=True, timeout=30, cwd="/",
                                env={"PATH": f"{fake}:/usr/bin:/bin", **(env or {})})
    finally:
        shutil.rmtree(fake)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def option_values(args: list[str], option: str) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args[:-1]) if a == option]


def test_docker_run_passes_gpus_memlock_and_nccl_settings():
    args = docker_run_args()
    assert args[:3] == ["run", "--gpus", "all"]
    assert "--ulimit" in args and "memlock=-1:-1" in args
    assert args[args.index("--env-file") + 1] == "/etc/gpufleet/container.env"
    assert args[-6:] == ["img:1", "python", "-m", "trainer", "train", "env:  "]
    infiniband = sorted(str(p) for p in Path("/dev/infiniband").glob("*") if p.is_char_device())
    assert option_values(args, "--device") == infiniband


def test_docker_run_is_hardened_as_the_runtimes_containers_are():
    """As trainer.node.runner.docker_argv: never root (nobody where the caller is root), every capability dropped, no
    new privileges; the caller's own uid:gid otherwise."""
    from trainer.node.runner import NOBODY, NodeFacts, docker_argv

    args = docker_run_args()
    uid, gid = (os.getuid(), os.getgid()) if os.getuid() != 0 else NOBODY
    assert option_values(args, "--user") == [f"{uid}:{gid}"]
    assert option_values(args, "--cap-drop") == ["ALL"]
    assert option_values(args, "--security-opt") == ["no-new-privileges"]
    if not any(p.is_char_device() for p in Path("/dev/infiniband").glob("*")):
        assert "--cap-add" not in args
    runtime = docker_argv("n", "img:1", ["true"], {}, NodeFacts("aws", 0), None, "/c", 30, "1000:1000", "/s")
    for option in ("--cap-drop", "--security-opt"):
        assert option_values(runtime, option) == option_values(args, option)
    if os.getuid() == 0:  # a user of the node's: its own ids
        assert option_values(docker_run_args(user=4321), "--user") == ["4321:4321"]


@pytest.mark.parametrize("driver, ipc_lock", [("mlx5_core", True), ("efa", False)])
def test_docker_run_keeps_ipc_lock_for_infiniband_but_not_for_efa(tmp_path, driver, ipc_lock):
    """Azure's InfiniBand (mlx5) gets IPC_LOCK back, as the runner's containers do; EFA's devices do not need it.
    The helper's /dev/infiniband and /sys/class/infiniband are the test's (character devices need root)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the fake /dev/infiniband holds character devices (mknod)")
    dev, sys_ib = tmp_path / "dev-infiniband", tmp_path / "sys-infiniband"
    dev.mkdir()
    for i, name in enumerate(("uverbs0", "uverbs1", "rdma_cm")):
        os.mknod(dev / name, 0o600 | stat.S_IFCHR, os.makedev(231, i))
    (dev / "not-a-device").write_text("")
    (tmp_path / "drivers" / driver).mkdir(parents=True)
    (sys_ib / "dev0" / "device").mkdir(parents=True)
    (sys_ib / "dev0" / "device" / "driver").symlink_to(tmp_path / "drivers" / driver)
    text = (AMI / "files" / "gpufleet-docker-run.sh").read_text()
    assert "/dev/infiniband/*" in text and "/sys/class/infiniband/*" in text
    script = tmp_path / "gpufleet-docker-run"
    script.write_text(text.replace("/dev/infiniband", str(dev)).replace("/sys/class/infiniband", str(sys_ib)))
    args = docker_run_args(script)
    assert option_values(args, "--device") == [str(dev / n) for n in ("rdma_cm", "uverbs0", "uverbs1")]
    assert option_values(args, "--cap-add") == (["IPC_LOCK"] if ipc_lock else [])
    assert option_values(args, "--cap-drop") == ["ALL"]


def test_docker_run_passes_the_jobs_own_credentials_by_name():
    """The task's AWS_CONTAINER_* (gpufleet-task-prolog's) go on to the container by name: the token in no argv."""
    token = "4242." + "t" * 43
    env = {"AWS_CONTAINER_CREDENTIALS_FULL_URI": "http://127.0.0.1:51680/v1/credentials",
           "AWS_CONTAINER_AUTHORIZATION_TOKEN": token}
    args = docker_run_args(env=env)
    assert option_values(args, "--env") == ["AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_CONTAINER_AUTHORIZATION_TOKEN"]
    assert args[-1] == f"env: http://127.0.0.1:51680/v1/credentials {token}"  # docker has the values itself
    assert not any(token in a for a in args[:-1])
    assert "--env" not in docker_run_args()  # no credentials of its own: nothing passed


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
