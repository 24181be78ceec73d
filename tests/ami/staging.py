"""Running a provisioning script off the build machine: the script and lib.sh copied with their absolute paths moved
under a test folder, commands stubbed on PATH, the manifest a test's copy. Nothing here needs root or a network."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from tests.ami.conftest import AMI, require

LIB = AMI / "scripts" / "lib.sh"


def stub(bin_dir: Path, name: str, body: str) -> Path:
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def stage(tmp_path: Path, script: str, paths: list[str]) -> Path:
    """SCRIPT and lib.sh under TMP/scripts, with every absolute path of PATHS moved under TMP/root."""
    root, scripts = tmp_path / "root", tmp_path / "scripts"
    scripts.mkdir(exist_ok=True)
    for source in (AMI / "scripts" / script, LIB):
        text = source.read_text()
        for path in paths:
            assert path.startswith("/")
            text = text.replace(path, f"{root}{path}")
        (scripts / source.name).write_text(text)
    return scripts / script


def manifest_copy(tmp_path: Path, **changes: dict) -> Path:
    """versions.json with CHANGES ({component: {key: value}}) merged in."""
    manifest = json.loads((AMI / "versions.json").read_text())
    for component, values in changes.items():
        node = manifest
        for key in component.split("."):
            node = node[key]
        node.update(values)
    path = tmp_path / "versions.json"
    path.write_text(json.dumps(manifest))
    return path


def run(script: Path, cloud: str, manifest: Path, stubs: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    require("bash")
    require("jq")
    environ = {"PATH": f"{stubs}:/usr/bin:/bin", "GPUFLEET_CLOUD": cloud, "GPUFLEET_MANIFEST": str(manifest),
               "TMPDIR": str(script.parent.parent / "tmp"), **(env or {})}
    (script.parent.parent / "tmp").mkdir(exist_ok=True)
    return subprocess.run(["bash", str(script)], capture_output=True, text=True, env=environ, timeout=60)


def dpkg_query(stubs: Path, versions: dict[str, str]) -> None:
    """dpkg-query -W -f '${Version}' PACKAGE answers from VERSIONS; a package not there is not installed."""
    table = stubs / "dpkg-versions"
    table.write_text("".join(f"{name} {version}\n" for name, version in versions.items()))
    stub(stubs, "dpkg-query", f'v="$(grep "^$4 " {table} | cut -d" " -f2)"\n[ -n "$v" ] || exit 1\nprintf %s "$v"\n')


class Gpg:
    """Two signing keys made for the tests, in a home of their own (short: gpg-agent's socket path is limited)."""

    def __init__(self, home: Path):
        self.home = home
        self.fingerprints = [self._make(f"gpufleet test {n} <test{n}@example.invalid>") for n in (1, 2)]

    def gpg(self, *args: str, out: Path | None = None) -> str:
        result = subprocess.run([require("gpg"), "--homedir", str(self.home), "--batch", *args], capture_output=True,
                                text=out is None, check=True, timeout=60)
        if out is not None:
            out.write_bytes(result.stdout)
            return ""
        return result.stdout

    def _make(self, uid: str) -> str:
        self.gpg("--pinentry-mode", "loopback", "--passphrase", "", "--quick-gen-key", uid, "ed25519", "sign", "never")
        listing = self.gpg("--with-colons", "--fingerprint", uid)
        return next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:"))

    def export(self, path: Path, *fingerprints: str) -> Path:
        self.gpg("--armor", "--export", *fingerprints, out=path)
        return path

    def close(self) -> None:
        subprocess.run([shutil.which("gpgconf") or "gpgconf", "--homedir", str(self.home), "--kill", "all"],
                       capture_output=True, timeout=30)
        shutil.rmtree(self.home, ignore_errors=True)


def keyring_fingerprints(path: Path) -> list[str]:
    """The primary fingerprints of the keys in the keyring file PATH (read without importing it)."""
    listing = subprocess.run([require("gpg"), "--batch", "--with-colons", "--show-keys", str(path)],
                             capture_output=True, text=True, check=True, timeout=30).stdout
    found, primary = [], False
    for line in listing.splitlines():
        fields = line.split(":")
        if fields[0] == "pub":
            primary = True
        elif fields[0] == "fpr" and primary:
            found.append(fields[9])
            primary = False
    return found
