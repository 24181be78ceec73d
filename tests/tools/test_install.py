"""`make tools` (tools/install.sh): skips what is present, installs the rest, or says in one line why it cannot.

The apt-get and npm on PATH here are stand-ins that record or fail: no test installs anything.
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
DEBIAN = "packer shellcheck cloud-init jq curl systemd docker.io npm"
BASH = shutil.which("bash")


def stand_in(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


@pytest.fixture
def bare_project():
    """A folder (readable by any user) holding only tools/install.sh, and an empty bin/ for stand-ins."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        root.chmod(0o755)
        (root / "tools").mkdir()
        shutil.copy(SCRIPT, root / "tools" / "install.sh")
        (root / "bin").mkdir()
        yield root


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
    as_nobody = () if os.geteuid() else (shutil.which("setpriv"), "--reuid=65534", "--regid=65534", "--clear-groups")
    proc = install(bare_project, "/nonexistent", *as_nobody)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == f"make tools: cannot install {DEBIAN}: not root (run it as root, or install these " \
                          "Debian packages)\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="only root gets as far as apt-get")
def test_apt_failure_is_one_line_exit_2(bare_project):
    stand_in(bare_project / "bin", "apt-get", 'echo "E: Unable to locate package $*" >&2; exit 100')
    proc = install(bare_project, str(bare_project / "bin"))
    log = bare_project / "gpufleet-tools.log"
    assert proc.returncode == 2
    assert proc.stdout == f"make tools: installing {DEBIAN} (log: {log})\n"
    assert proc.stderr == f"make tools: apt-get could not install {DEBIAN} (see {log})\n"
    assert "E: Unable to locate package update -qq" in log.read_text()


def test_npm_failure_is_one_line_exit_2(bare_project):
    bin_dir = bare_project / "bin"
    for tool in ("packer", "shellcheck", "cloud-init", "jq", "curl", "systemd-analyze", "docker"):
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
