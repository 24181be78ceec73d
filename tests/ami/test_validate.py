"""99-validate.sh, the last step of every build, run off a GPU machine: each tool it asks (nvidia-smi, dpkg-query,
systemctl, the trainer's Python, slurmd, ...) is a stub that answers what a good build of that cloud has, and the
files it reads sit under the test's folder. A good build passes and writes image-versions.json; each defect the
validation exists for stops it, with the component named."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.ami.staging import dpkg_query, manifest_copy, run, stage, stub

# The absolute paths 99-validate.sh reads or writes, moved under the test's root.
PATHS = ["/etc/gpufleet", "/sbin/mount.", "/usr/bin/stunnel", "/usr/bin/efs-proxy", "/usr/local/cuda",
         "/proc/driver/nvidia/version", "/opt/amazon", "/sys/class/infiniband"]


class Build:
    """A build machine that did everything right for CLOUD; a test then breaks one thing."""

    def __init__(self, tmp_path: Path, manifest: dict, cloud: str):
        self.cloud, self.m = cloud, manifest
        self.root, self.stubs, self.state = tmp_path / "root", tmp_path / "bin", tmp_path / "state"
        self.state.mkdir(parents=True)
        r, m = self.root, manifest
        self.enabled = {"nvidia-dcgm.service", "docker.service", "gpufleet-imds.service",
                        "gpufleet-credentials.service", "gpufleet-dns-rules.service", "gpufleet-dns-guard.service"}
        self.dns_guard_user = True
        self.held = {"linux-image-6.8.0-1021-aws", "nfs-common", "libnfsidmap1"}
        self.config = r / "opt/microsoft/aznfs/data/config"
        self.ca_file = r / "etc/ssl/certs/DigiCert_Global_Root_G2.pem"
        self.manifest_changes = {
            "trainer": {"venv": str(r / "venv")}, "slurm": {"prefix": str(r / "usr/local")},
            "munge": {"prefix": str(r / "usr/local")}, "aws_ofi_nccl": {"prefix": str(r / "opt/aws-ofi-nccl")},
            "aznfs": {"config": str(self.config), "ca_file": str(self.ca_file)}}
        driver, branch = m["nvidia_driver"]["version"], m["nvidia_driver"]["branch"]
        self.versions = {
            m["docker"]["package"]: f"{m['docker']['version']}-0ubuntu1~22.04.1",
            f"nvidia-fabricmanager-{branch}": f"{m['fabric_manager']['version']}-1",
            "libnccl2": m["nccl"]["apt_pin"], m["dcgm"]["package"]: f"1:{m['dcgm']['version']}-1",
            "nfs-common": f"1:{m['nfs_common']['version']}-1ubuntu1.2", "stunnel4": "3:5.63-1build1"}
        self.trainer_commands_missing: set[str] = set()
        # jobs start containers only through the launcher (sudo), never as members of the docker group
        self.gpufleet_groups = "gpufleet"
        self.visudo_ok = self.launcher_ok = True
        self.modes = {"/usr/local/sbin/gpufleet-container": "root:root 755",
                      "/etc/sudoers.d/gpufleet-container": "root:root 440",
                      "/etc/sudoers.d/gpufleet-bridge": "root:root 440"}
        self.teams_group = True  # the group of the teams' users, whom the bridge may submit as
        self.iptables = True
        (r / "etc/gpufleet").mkdir(parents=True)
        stub(r / "sbin", "mount.nfs", "exit 0\n")
        stub(r / "venv/bin", "python", "")  # written in run()
        stub(r / "usr/local/sbin", "slurmd", f'echo "slurm {m["slurm"]["version"]}"\n')
        stub(r / "usr/local/sbin", "munged", f'echo "munge-{m["munge"]["version"]} (2026-02-10)"\n')
        stub(r / "usr/local/cuda/bin", "nvcc", f'echo "Cuda compilation tools, release '
                                               f'{".".join(m["cuda"]["version"].split(".")[:2])}, V{m["cuda"]["version"]}"\n')
        (r / "proc/driver/nvidia").mkdir(parents=True)
        module = "Open Kernel Module" if cloud == "aws" else "Kernel Module"
        (r / "proc/driver/nvidia/version").write_text(f"NVRM version: NVIDIA UNIX x86_64 {module}  {driver}\n")
        if cloud == "aws":
            self.held.add(f"nvidia-driver-{branch}-open")
            self.versions.update({"amazon-cloudwatch-agent": f"{m['cloudwatch_agent']['version']}-1",
                                  m["efs_utils"]["package"]: f"{m['efs_utils']['version']}-{m['efs_utils']['release']}"})
            (r / "opt/amazon").mkdir(parents=True)
            (r / "opt/amazon/efa_installed_packages").write_text(
                f"# EFA installer version: {m['efa_installer']['version']}\n")
            stub(r / "opt/amazon/efa/bin", "fi_info", "exit 0\n")
            (r / "opt/aws-ofi-nccl").mkdir(parents=True)
            (r / "opt/aws-ofi-nccl/VERSION").write_text(m["aws_ofi_nccl"]["version"] + "\n")
            stub(r / "sbin", "mount.efs", f'echo "/sbin/mount.efs Version: {m["efs_utils"]["version"]}"\n')
            stub(r / "usr/bin", "efs-proxy", "exit 0\n")
            stub(r / "usr/bin", "stunnel", "exit 0\n")
        elif cloud == "tencent":
            self.held.add(f"nvidia-driver-{branch}")
        else:
            self.held.add(m["aznfs"]["package"])
            self.enabled.add("aznfswatchdogv4.service")
            self.versions[m["aznfs"]["package"]] = m["aznfs"]["version"]
            stub(r / "sbin", "mount.aznfs", "exit 0\n")
            stub(r / "usr/bin", "stunnel", "exit 0\n")
            self.config.parent.mkdir(parents=True)
            self.config.write_text("AUTO_UPDATE_AZNFS=false\n")
            self.ca_file.parent.mkdir(parents=True)
            self.ca_file.write_text("-----BEGIN CERTIFICATE-----\n")
        self.driver = driver if cloud != "azure" else "570.172.08"

    def run(self, tmp_path: Path):
        m, s = self.m, self.stubs
        trainer_version, torch_cuda = m["trainer"]["version"], m["trainer"]["torch_cuda"]
        missing = " ".join(sorted(self.trainer_commands_missing))
        stub(self.root / "venv/bin", "python",
             f'case "$1" in\n'
             f'  -c) case "$2" in *torch*) echo {torch_cuda} ;; *importlib*) echo {trainer_version} ;; esac ;;\n'
             f'  -m) for gone in {missing}; do [ "$3" = "$gone" ] && exit 2; done; echo "$3" >>{self.state}/trainer ;;\n'
             f'esac\n')
        stub(s, "nvidia-smi", f'case "$*" in\n  *name*) echo "NVIDIA H100 80GB HBM3" ;;\n'
                              f'  *driver_version*) echo {self.driver} ;;\n  *) echo "| CUDA Version: 12.8 |" ;;\nesac\n')
        stub(s, "nvidia-ctk", f'echo "NVIDIA Container Toolkit CLI version {m["nvidia_container_toolkit"]["version"]}"\n')
        stub(s, "docker", f'case "$1" in info) echo \'{{"nvidia":{{"path":"nvidia-container-runtime"}}}}\' ;;\n'
                          f'  version) echo {m["docker"]["version"]} ;;\nesac\n')
        stub(s, "id", '[ "$1" = -nG ] && {{ echo {groups}; exit; }}\n'
                      '[ "$2" = gpufleet-dns-guard ] && {{ echo 998; exit {dns}; }}\n'
                      '[ "$2" = slurm ] && echo {slurm} || echo {gpufleet}\n'.format(
            groups=self.gpufleet_groups, slurm=m["accounts"]["slurm"]["uid"],
            gpufleet=m["accounts"]["gpufleet"]["uid"], dns=0 if self.dns_guard_user else 1))
        stub(s, "visudo", f'echo "$*" >>{self.state}/visudo\nexit {0 if self.visudo_ok else 1}\n')
        stub(s, "getent", f'[ "$*" = "group gpufleet-teams" ] && exit {0 if self.teams_group else 2}\nexit 2\n')
        (s / "modes").write_text("".join(f"{path} {mode}\n" for path, mode in self.modes.items()))
        stub(s, "stat", f'grep "^$3 " {s}/modes | cut -d" " -f2-\n')
        stub(s, "runuser", f'echo "$*" >>{self.state}/runuser\nexit {0 if self.launcher_ok else 1}\n')
        (s / "enabled").write_text("".join(f"{u}\n" for u in sorted(self.enabled)))
        stub(s, "systemctl", f'[ "$1" = is-enabled ] && grep -qx "$3" {s}/enabled\n')
        (s / "held").write_text("".join(f"{p}\n" for p in sorted(self.held)))
        stub(s, "apt-mark", f'[ "$1" = showhold ] && cat {s}/held\n')
        stub(s, "dcgmi", "exit 0\n")
        if self.iptables:  # (/usr/sbin is not on the test's PATH)
            stub(s, "iptables", "exit 0\n")
        dpkg_query(s, self.versions)
        script = stage(tmp_path, "99-validate.sh", PATHS)
        return run(script, self.cloud, manifest_copy(tmp_path, **self.manifest_changes), s)

    def image_versions(self) -> dict:
        return json.loads((self.root / "etc/gpufleet/image-versions.json").read_text())


@pytest.mark.parametrize("cloud", ["aws", "azure", "tencent"])
def test_a_good_build_passes_and_records_what_it_saw(tmp_path, manifest, cloud):
    build = Build(tmp_path, manifest, cloud)
    result = build.run(tmp_path)
    assert result.returncode == 0, result.stderr
    assert "image validated: 1 GPU(s)" in result.stderr
    seen = build.image_versions()["observed"]
    assert seen["nfs_common"] == f"{manifest['nfs_common']['version']}-1ubuntu1.2"  # every cloud mounts NFS
    assert seen["slurm"] == manifest["slurm"]["version"] and seen["trainer"] == manifest["trainer"]["version"]
    if cloud == "azure":
        assert seen["aznfs"] == manifest["aznfs"]["version"] and seen["stunnel"] == "3:5.63-1build1"
    else:
        assert "aznfs" not in seen
    assert sorted((tmp_path / "state/trainer").read_text().split()) == ["container", "controller", "credentials",
                                                                         "dns", "nodes", "setup", "task"]
    assert (tmp_path / "state/visudo").read_text() == ("-cf /etc/sudoers.d/gpufleet-container\n"
                                                       "-cf /etc/sudoers.d/gpufleet-bridge\n")
    assert (tmp_path / "state/runuser").read_text() == (
        "-u gpufleet -- sudo -n /usr/local/sbin/gpufleet-container --help\n")  # the rule, the launcher, the module


@pytest.mark.parametrize("defect, message", [
    ("in the docker group", "gpufleet is in the docker group, which is root on the host"),
    ("visudo refuses", "visudo refuses /etc/sudoers.d/gpufleet-container"),
    ("launcher writable", "/usr/local/sbin/gpufleet-container is not root's, mode 0755"),
    ("launcher missing", "/usr/local/sbin/gpufleet-container is not root's, mode 0755"),
    ("rule not 0440", "/etc/sudoers.d/gpufleet-container is not root's, mode 0440"),
    ("sudo refuses", "gpufleet cannot start gpufleet-container through sudo (python -m trainer container)"),
    ("no teams group", "no group gpufleet-teams (the teams' users join it at boot)"),
    ("bridge rule not 0440", "/etc/sudoers.d/gpufleet-bridge is not root's, mode 0440"),
])
def test_a_job_user_with_another_way_to_docker_or_none_fails_the_build(tmp_path, manifest, defect, message):
    """The docker group is root on the host: gpufleet is not in it, and reaches containers through the launcher (a
    root-owned program its sudoers rule names), which must start."""
    build = Build(tmp_path, manifest, "aws")
    if defect == "in the docker group":
        build.gpufleet_groups = "gpufleet docker"
    elif defect == "visudo refuses":
        build.visudo_ok = False
    elif defect == "launcher writable":
        build.modes["/usr/local/sbin/gpufleet-container"] = "gpufleet:gpufleet 755"
    elif defect == "launcher missing":
        del build.modes["/usr/local/sbin/gpufleet-container"]
    elif defect == "rule not 0440":
        build.modes["/etc/sudoers.d/gpufleet-container"] = "root:root 644"
    elif defect == "no teams group":
        build.teams_group = False
    elif defect == "bridge rule not 0440":
        build.modes["/etc/sudoers.d/gpufleet-bridge"] = "gpufleet:root 640"
    else:
        build.launcher_ok = False
    result = build.run(tmp_path)
    assert result.returncode == 1 and f"error: {message}" in result.stderr, result.stderr
    assert not (build.root / "etc/gpufleet/image-versions.json").exists()


def test_an_aznfs_of_another_version_fails_the_azure_build(tmp_path, manifest):
    build = Build(tmp_path, manifest, "azure")
    build.versions["aznfs"] = "3.0.11"
    result = build.run(tmp_path)
    assert result.returncode == 1
    assert f"FAIL aznfs is '3.0.11', expected '{manifest['aznfs']['version']}'" in result.stderr
    assert "1 component(s) differ from the manifest" in result.stderr


@pytest.mark.parametrize("defect, message", [
    ("no mount.aznfs", "mount.aznfs is missing: the Azure Files mounts of the stack need it (34-aznfs.sh)"),
    ("no stunnel", "/usr/bin/stunnel is missing"),
    ("no CA root", "DigiCert_Global_Root_G2.pem is missing"),
    ("not held", "aznfs is not held"),
    ("self-update on", "aznfs updates itself"),
    ("no v4 watchdog", "aznfswatchdogv4.service is not enabled"),
    ("v3 watchdog enabled", "aznfswatchdog.service (its self-update) is enabled"),
])
def test_an_aznfs_that_would_not_mount_or_would_not_stay_pinned_fails_the_azure_build(tmp_path, manifest, defect,
                                                                                        message):
    build = Build(tmp_path, manifest, "azure")
    if defect == "no mount.aznfs":
        (build.root / "sbin/mount.aznfs").unlink()
    elif defect == "no stunnel":
        (build.root / "usr/bin/stunnel").unlink()
    elif defect == "no CA root":
        build.ca_file.unlink()
    elif defect == "not held":
        build.held.discard("aznfs")
    elif defect == "self-update on":
        build.config.write_text("AUTO_UPDATE_AZNFS=true\n")
    elif defect == "no v4 watchdog":
        build.enabled.discard("aznfswatchdogv4.service")
    else:
        build.enabled.add("aznfswatchdog.service")
    result = build.run(tmp_path)
    assert result.returncode == 1 and message in result.stderr, result.stderr
    assert not (build.root / "etc/gpufleet/image-versions.json").exists()


@pytest.mark.parametrize("cloud", ["aws", "azure", "tencent"])
def test_an_nfs_client_of_another_version_or_none_fails_every_cloud(tmp_path, manifest, cloud):
    build = Build(tmp_path, manifest, cloud)
    build.versions["nfs-common"] = "1:2.8.3-1ubuntu1"
    result = build.run(tmp_path)
    assert result.returncode == 1
    assert f"FAIL nfs_common is '2.8.3-1ubuntu1', expected '{manifest['nfs_common']['version']}'" in result.stderr

    build = Build(tmp_path / "again", manifest, cloud)
    (build.root / "sbin/mount.nfs").unlink()
    result = build.run(tmp_path / "again")
    assert result.returncode == 1 and "/sbin/mount.nfs is missing" in result.stderr


def test_nfs_common_must_be_held(tmp_path, manifest):
    build = Build(tmp_path, manifest, "tencent")
    build.held.discard("nfs-common")
    result = build.run(tmp_path)
    assert result.returncode == 1 and "nfs-common is not held" in result.stderr


@pytest.mark.parametrize("command", ["setup", "controller", "nodes", "task", "credentials", "container", "dns"])
def test_a_trainer_without_a_command_the_image_starts_fails_the_build(tmp_path, manifest, command):
    build = Build(tmp_path, manifest, "tencent")
    build.trainer_commands_missing.add(command)
    result = build.run(tmp_path)
    assert result.returncode == 1 and f"python -m trainer {command} does not start" in result.stderr


@pytest.mark.parametrize("cloud", ["aws", "azure", "tencent"])
@pytest.mark.parametrize("unit", ["gpufleet-imds.service", "gpufleet-credentials.service"])
def test_a_build_without_the_job_credentials_units_enabled_fails(tmp_path, manifest, cloud, unit):
    """Enabled on every image (each skips itself off AWS): a build whose AWS nodes would let jobs hold the node's
    identity fails."""
    build = Build(tmp_path, manifest, cloud)
    build.enabled.discard(unit)
    result = build.run(tmp_path)
    assert result.returncode == 1
    assert f"{unit} is not enabled: jobs would hold the node's identity" in result.stderr


@pytest.mark.parametrize("cloud", ["aws", "azure", "tencent"])
@pytest.mark.parametrize("unit", ["gpufleet-dns-rules.service", "gpufleet-dns-guard.service"])
def test_a_build_without_the_dns_guards_units_enabled_fails(tmp_path, manifest, cloud, unit):
    """Enabled on every image (each skips itself off Tencent): a build whose Tencent nodes would let jobs resolve any
    name fails."""
    build = Build(tmp_path, manifest, cloud)
    build.enabled.discard(unit)
    result = build.run(tmp_path)
    assert result.returncode == 1 and f"{unit} is not enabled: jobs would resolve any name" in result.stderr


def test_a_build_without_the_dns_guards_user_fails(tmp_path, manifest):
    build = Build(tmp_path, manifest, "tencent")
    build.dns_guard_user = False
    result = build.run(tmp_path)
    assert result.returncode == 1 and "no user gpufleet-dns-guard: the DNS guard runs as it" in result.stderr


def test_a_build_without_iptables_fails(tmp_path, manifest):
    build = Build(tmp_path, manifest, "aws")
    build.iptables = False
    result = build.run(tmp_path)
    assert result.returncode == 1 and "iptables is missing: gpufleet-imds-root-only needs it" in result.stderr


def test_mount_aznfs_is_checked_on_azure_only():
    text = (Path(__file__).resolve().parents[2] / "ami" / "scripts" / "99-validate.sh").read_text()
    azure = text[text.index("\nelse\n  # The stack's Azure Files"):text.index('record nvidia_driver "$driver (Ubuntu-HPC')]
    code = [line for line in text.replace(azure, "").splitlines() if not line.lstrip().startswith("#")]
    assert not [line for line in code if "aznfs" in line]  # the AWS and Tencent runs above never ask for it
