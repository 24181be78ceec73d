"""Provisioning scripts: shellcheck-clean, and their helpers behave (verified downloads, manifest, scratch)."""
from __future__ import annotations

import configparser
import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.ami.conftest import AMI, require

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
    assert len(SCRIPTS) >= 17


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


@pytest.mark.parametrize("component", ["efa_installer", "aws_ofi_nccl", "cloudwatch_agent", "cuda.keyring"])
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
    assert "mkdir -p /mnt/scratch/data-cache /mnt/scratch/tmp /var/cache/gpufleet/data" in plan


def test_docker_run_passes_gpus_memlock_and_nccl_settings(tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "docker").write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    (fake / "docker").chmod(0o755)
    result = bash(f"{AMI / 'files' / 'gpufleet-docker-run.sh'} img:1 python -m trainer train",
                  path_prefix=f"{fake}:")
    assert result.returncode == 0, result.stderr
    args = result.stdout.splitlines()
    assert args[:3] == ["run", "--gpus", "all"]
    assert "--ulimit" in args and "memlock=-1:-1" in args
    assert args[args.index("--env-file") + 1] == "/etc/gpufleet/container.env"
    assert args[-5:] == ["img:1", "python", "-m", "trainer", "train"]
    infiniband = sorted(str(p) for p in Path("/dev/infiniband").glob("*") if p.is_char_device())
    assert [args[i + 1] for i, a in enumerate(args) if a == "--device"] == infiniband


def unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str
    parser.read(AMI / "systemd" / name)
    return parser


def test_units_order_scratch_then_preflight_then_agent(manifest):
    scratch, preflight, agent = unit("gpufleet-scratch.service"), unit("gpufleet-preflight.service"), unit("gpufleet-agent.service")
    assert scratch["Service"]["Type"] == "oneshot" and "gpufleet-preflight.service" in scratch["Unit"]["Before"]
    assert preflight["Service"]["Type"] == "oneshot" and preflight["Unit"]["Before"] == "gpufleet-agent.service"
    assert agent["Unit"]["Requires"] == "gpufleet-preflight.service"
    assert "gpufleet-preflight.service" in agent["Unit"]["After"]
    venv = manifest["trainer"]["venv"]
    assert preflight["Service"]["ExecStart"].startswith(f"{venv}/bin/gpufleet-trainer preflight")
    assert agent["Service"]["ExecStart"] == f"{venv}/bin/gpufleet-trainer agent"
    for u in (preflight, agent):
        assert u["Service"]["EnvironmentFile"] == "/etc/gpufleet/nccl.env"
        assert u["Unit"]["ConditionPathExists"] == "/etc/gpufleet/node.json"
    assert agent["Service"]["LimitMEMLOCK"] == "infinity"


def test_units_run_only_what_the_image_installs():
    installer = (AMI / "scripts" / "50-trainer.sh").read_text()
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


@pytest.mark.parametrize("script, cloud, skipped", [
    ("20-efa.sh", "tencent", "efa: not on tencent"), ("22-aws-ofi-nccl.sh", "tencent", "aws-ofi-nccl: not on tencent"),
    ("31-cloudwatch-agent.sh", "tencent", "cloudwatch agent: not on tencent"),
    ("20-efa.sh", "azure", "efa: not on azure"),
])
def test_aws_only_components_are_skipped_elsewhere(script, cloud, skipped):
    require("jq")
    result = bash(str(AMI / "scripts" / script), env={"GPUFLEET_CLOUD": cloud})
    assert result.returncode == 0 and skipped in result.stderr, result.stderr


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
