"""Fixtures for the image tests: required tools, the manifest, a built trainer wheel, a packer work dir; what the
image starts (units, power saving programs, batch scripts) as `python -m trainer` commands."""
from __future__ import annotations

import configparser
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
AMI = ROOT / "ami"
# Settings of the pinned amazon plugin that the builder bundled in Debian's packer 1.6.6 predates.
NEWER_THAN_PACKER_1_6_6 = ("metadata_options", "imds_support")


def require(tool: str) -> str:
    """Path of a tool the tests need; a missing tool fails the test (`make tools` installs it), never skips it."""
    path = shutil.which(tool)
    if path is None:
        pytest.fail(f"{tool} is not installed; `make tools` installs it from Debian's packages", pytrace=False)
    return path


def strip_newer_settings(text: str) -> tuple[str, list[str]]:
    """Remove the NEWER_THAN_PACKER_1_6_6 blocks/attributes; return the text and the removed lines."""
    kept, removed, depth = [], [], 0
    for line in text.splitlines(keepends=True):
        name = line.strip().split(" ", 1)[0]
        if depth:
            removed.append(line)
            depth += line.count("{") - line.count("}")
        elif name in NEWER_THAN_PACKER_1_6_6:
            removed.append(line)
            depth = line.count("{") - line.count("}")
        else:
            kept.append(line)
    return "".join(kept), removed


@pytest.fixture(scope="session")
def manifest() -> dict:
    return json.loads((AMI / "versions.json").read_text())


@pytest.fixture(scope="session")
def trainer_wheel_dir(tmp_path_factory) -> Path:
    """`pip wheel trainer/ --no-deps` into a fresh folder (the wheel the templates upload).

    Built from a copy, so setuptools' build/ and egg-info never land in (or leak stale files from) trainer/.
    """
    source = tmp_path_factory.mktemp("src") / "trainer"
    shutil.copytree(ROOT / "trainer", source,
                    ignore=shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__"))
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(out)], check=True, cwd=source.parent)
    return out


@pytest.fixture
def packer_dir(tmp_path) -> Path:
    """The templates without plugins.pkr.hcl (Debian's packer has no `required_plugins`), as shipped."""
    require("packer")
    work = tmp_path / "ami"
    shutil.copytree(AMI, work, ignore=shutil.ignore_patterns("plugins.pkr.hcl"))
    return work


# The tencentcloud-cvm builder refuses to validate without a key; placeholders, never sent anywhere.
PLACEHOLDER_TENCENT_KEY = {"TENCENTCLOUD_SECRET_ID": "AKIDplaceholder", "TENCENTCLOUD_SECRET_KEY": "placeholder"}


def packer(args: list[str], cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([require("packer"), *args], cwd=cwd, input=stdin, capture_output=True, text=True,
                          timeout=60, env={"PATH": "/usr/bin:/bin", "HOME": str(cwd), "CHECKPOINT_DISABLE": "1",
                                           **PLACEHOLDER_TENCENT_KEY})


def console(cwd: Path, expression: str, *var_args: str) -> str:
    """Evaluate an HCL expression over the templates with `packer console`."""
    result = packer(["console", *var_args, "."], cwd, stdin=expression + "\n")
    assert result.returncode == 0, result.stderr
    return result.stdout


def parse_hcl_map(text: str) -> dict[str, str]:
    return dict(re.findall(r'^\s*"([^"]+)"\s*=\s*"([^"]*)"\s*$', text, re.MULTILINE))


def parse_hcl_list(text: str) -> list[str]:
    return re.findall(r'^\s*"([^"]+)",?\s*$', text, re.MULTILINE)


def downloads(node, path=""):
    """Every object in the manifest that has a "url" (a download: checked by sha256), with its dotted path."""
    if isinstance(node, dict):
        if "url" in node:
            yield path.lstrip("."), node
        for key, value in node.items():
            yield from downloads(value, f"{path}.{key}")


def unit(name: str) -> configparser.ConfigParser:
    """One of ami/systemd's units, parsed (a missing file parses as empty: every lookup then fails)."""
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str
    parser.read(AMI / "systemd" / name)
    return parser


TRAINER_IN_UNIT = re.compile(r"/gpufleet-trainer\s+(\S+)")
TRAINER_IN_FILE = re.compile(r"(?:gpufleet-trainer|-m trainer)\s+(\w[\w-]*)")


def image_commands() -> dict[str, str]:
    """Every `python -m trainer` command the image starts -> where: the units' Exec lines, the files the image
    installs (Slurm's power saving programs) and the batch script every job runs (trainer.slurm.batch)."""
    found = {}
    for path in sorted(AMI.glob("systemd/*")):
        for key, value in unit(path.name).items("Service") if unit(path.name).has_section("Service") else []:
            if key.startswith("Exec"):
                for command in TRAINER_IN_UNIT.findall(value):
                    found.setdefault(command, path.name)
    for path in sorted(AMI.glob("files/*.sh")):
        code = "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("#"))
        for command in TRAINER_IN_FILE.findall(code):
            found.setdefault(command, path.name)
    batch = (ROOT / "trainer" / "slurm" / "batch.py").read_text()
    for command in re.findall(r'"-m", "trainer", "(\w+)"', batch):
        found.setdefault(command, "trainer/slurm/batch.py")
    return found
