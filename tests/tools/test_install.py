"""`make tools` (tools/install.sh): skips what is present, installs the rest, or says in one line why it cannot.

The apt-get and npm on PATH here are stand-ins that record or fail: no test installs anything. The copy of the
script a test runs writes its policy-rc.d into the test's folder instead of /usr/sbin (its one path is replaced).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "install.sh"
# the program each Debian package is looked for by (the one the tests run), in the script's order
PROGRAMS = {"packer": "packer", "shellcheck": "shellcheck", "cloud-init": "cloud-init", "jq": "jq", "curl": "curl",
            "systemd-analyze": "systemd", "dockerd": "docker.io", "slurmctld": "slurmctld", "slurmd": "slurmd",
            "sbatch": "slurm-client", "munged": "munge", "slurmdbd": "slurmdbd", "mariadbd": "mariadb-server",
            "iptables": "iptables", "ip": "iproute2", "visudo": "sudo", "npm": "npm"}
DEBIAN = " ".join(PROGRAMS.values())
BASH = shutil.which("bash")
POLICY_RC = "POLICY_RC=/usr/sbin/policy-rc.d"
# what the script runs once it installs (a bare PATH has none of them)
COREUTILS = ("chmod", "rm", "sleep")


def stand_in(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


@pytest.fixture
def bare_project():
    """A folder (readable by any user) holding only tools/install.sh, its policy-rc.d path moved to the folder's
    policy-rc.d, and an empty bin/ for stand-ins."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        root.chmod(0o755)
        (root / "tools").mkdir()
        text = SCRIPT.read_text()
        assert text.count(POLICY_RC) == 1, f"tools/install.sh no longer sets {POLICY_RC} once"
        (root / "tools" / "install.sh").write_text(text.replace(POLICY_RC, f"POLICY_RC={root / 'policy-rc.d'}"))
        (root / "bin").mkdir()
        yield root


def as_nobody() -> tuple[str, ...]:
    return () if os.geteuid() else (shutil.which("setpriv"), "--reuid=65534", "--regid=65534", "--clear-groups")


def with_coreutils(bin_dir: Path) -> None:
    for tool in COREUTILS:
        (bin_dir / tool).symlink_to(shutil.which(tool))


def install(root: Path, path: str, *prefix: str) -> subprocess.CompletedProcess:
    return subprocess.run([*prefix, BASH, "tools/install.sh"], cwd=root, capture_output=True, text=True,
                          timeout=120, env={"PATH": path, "TMPDIR": str(root)})


def test_everything_present_does_nothing(tmp_path):
    calls = tmp_path / "calls"
    for tool in ("apt-get", "npm"):
        stand_in(tmp_path, tool, f'echo "{tool} $*" >> {calls}; exit 1')
    proc = subprocess.run([BASH, str(SCRIPT)], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"})
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", ""), \
        f"a tool is missing here: run `make tools` ({proc.stdout}{proc.stderr})"
    assert not calls.exists()


def test_not_root_is_one_line_exit_2(bare_project):
    # Nothing on PATH, so every tool is missing; a user other than root cannot install them.
    proc = install(bare_project, "/nonexistent", *as_nobody())
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == f"make tools: cannot install {DEBIAN}: not root (run it as root, or install these " \
                          "Debian packages)\n"


@pytest.mark.parametrize("program", PROGRAMS)
def test_each_package_is_looked_for_by_the_program_the_tests_run(bare_project, program):
    # Every program present but one: only its package is missing. A docker CLI is always there (machines ship it
    # without the daemon), so looking for `docker` instead of `dockerd` would miss docker.io.
    bin_dir = bare_project / "bin"
    for other in {*PROGRAMS, "docker"} - {program}:
        stand_in(bin_dir, other, "exit 0")
    proc = install(bare_project, str(bin_dir), *as_nobody())
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == f"make tools: cannot install {PROGRAMS[program]}: not root (run it as root, or install " \
                          "these Debian packages)\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="only root gets as far as apt-get")
def test_apt_failure_is_one_line_exit_2(bare_project):
    with_coreutils(bare_project / "bin")
    stand_in(bare_project / "bin", "apt-get", 'echo "E: Unable to locate package $*" >&2; exit 100')
    proc = install(bare_project, str(bare_project / "bin"))
    log = bare_project / "gpufleet-tools.log"
    assert proc.returncode == 2
    assert proc.stdout == f"make tools: installing {DEBIAN} (log: {log})\n"
    assert proc.stderr == f"make tools: apt-get could not install {DEBIAN} (see {log})\n"
    assert "E: Unable to locate package -o DPkg::Lock::Timeout=600 update -qq" in log.read_text()
    assert not (bare_project / "policy-rc.d").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="only root gets as far as apt-get")
def test_apt_waits_for_the_lock_and_starts_no_daemon(bare_project):
    # The first apt-get update finds the lists lock held (DPkg::Lock::Timeout does not wait for that one); the
    # stand-in records each call and, while it installs, what the policy-rc.d says about starting slurmctld.
    bin_dir, calls, policy = bare_project / "bin", bare_project / "calls", bare_project / "policy-rc.d"
    with_coreutils(bin_dir)
    stand_in(bin_dir, "apt-get", f"""echo "$*" >> {calls}
case " $* " in
  *" update "*) [ -e {bare_project}/locked ] && exit 0
    : > {bare_project}/locked
    echo "E: Could not get lock /var/lib/apt/lists/lock. It is held by process 4381 (apt-get)" >&2; exit 100;;
  *" install "*) [ -x {policy} ] && {policy} slurmctld.service start; echo "policy-rc.d $?" >> {calls};;
esac""")
    (bare_project / "node_modules" / ".bin").mkdir(parents=True)
    stand_in(bare_project / "node_modules" / ".bin", "azurite", "exit 0")
    proc = install(bare_project, str(bin_dir))
    log = bare_project / "gpufleet-tools.log"
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, f"make tools: installing {DEBIAN} (log: {log})\n", "")
    lock = "-o DPkg::Lock::Timeout=600"
    assert calls.read_text().splitlines() == [
        f"{lock} update -qq", f"{lock} update -qq",
        f"{lock} install -y -qq --no-install-recommends {DEBIAN}", "policy-rc.d 101"]
    assert "E: Could not get lock /var/lib/apt/lists/lock" in log.read_text()
    assert not policy.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="only root gets as far as apt-get")
def test_a_policy_rc_d_already_there_is_left_as_it_is(bare_project):
    bin_dir, policy = bare_project / "bin", bare_project / "policy-rc.d"
    with_coreutils(bin_dir)
    stand_in(bin_dir, "apt-get", "exit 0")
    stand_in(bare_project, "policy-rc.d", "# the machine's own\nexit 0")
    before = policy.read_text()
    (bare_project / "node_modules" / ".bin").mkdir(parents=True)
    stand_in(bare_project / "node_modules" / ".bin", "azurite", "exit 0")
    proc = install(bare_project, str(bin_dir))
    assert (proc.returncode, proc.stderr) == (0, "")
    assert policy.read_text() == before


def test_npm_failure_is_one_line_exit_2(bare_project):
    bin_dir = bare_project / "bin"
    for tool in set(PROGRAMS) - {"npm"}:
        stand_in(bin_dir, tool, "exit 0")
    stand_in(bin_dir, "npm", 'echo "npm ERR! $*" >&2; exit 1')
    proc = install(bare_project, str(bin_dir))
    log = bare_project / "gpufleet-tools.log"
    assert proc.returncode == 2
    assert proc.stdout == f"make tools: installing Azurite into node_modules (log: {log})\n"
    assert proc.stderr == f"make tools: npm could not install Azurite (see {log})\n"
    assert "npm ERR! install --no-audit --no-fund" in log.read_text()


def test_script_is_shellcheck_clean():
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.fail("shellcheck is not installed; `make tools` installs it", pytrace=False)
    proc = subprocess.run([shellcheck, "--severity=style", str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout
