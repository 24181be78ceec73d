"""The NFS clients of the image: nfs-common from Ubuntu's archive on every cloud (33-nfs-common.sh), the AZNFS mount
helper from packages.microsoft.com on Azure (34-aznfs.sh, through lib.sh's apt_source). Run off the build machine:
apt, dpkg and systemctl are stubs that record what they were asked, the scripts' absolute paths sit under the test's
folder, and the signing keys are made for the test (the manifest's copy pins them instead of Microsoft's)."""
from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from tests.ami.conftest import AMI
from tests.ami.staging import Gpg, dpkg_query, keyring_fingerprints, manifest_copy, run, stage, stub

APT_PATHS = ["/etc/apt", "/usr/share/keyrings"]


@pytest.fixture(scope="module")
def keys():
    gpg = Gpg(Path(tempfile.mkdtemp(prefix="gpg", dir="/tmp")))
    yield gpg
    gpg.close()


@pytest.fixture
def machine(tmp_path) -> tuple[Path, Path, Path]:
    """The build machine's stand-ins: stubs on PATH, a state folder where they record their calls, and a root."""
    stubs, state, root = tmp_path / "bin", tmp_path / "state", tmp_path / "root"
    for d in (stubs, state, root / "etc/apt/preferences.d", root / "etc/apt/sources.list.d"):
        d.mkdir(parents=True)
    stub(stubs, "apt-get", f'echo "$*" >>{state}/apt-get\n'
                           f'[ "$1" = install ] && echo "${{AZNFS_NONINTERACTIVE_INSTALL:-unset}}" >>{state}/env\n'
                           "exit 0\n")
    stub(stubs, "apt-mark", f'echo "$*" >>{state}/apt-mark\n')
    stub(stubs, "systemctl", f'echo "$*" >>{state}/systemctl\n')
    return stubs, state, root


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


# --- nfs-common on every cloud ----------------------------------------------------------------------------------

def nfs_common(tmp_path, machine, cloud, installed) -> tuple:
    stubs, state, root = machine
    dpkg_query(stubs, {"nfs-common": installed})
    (root / "sbin").mkdir(parents=True, exist_ok=True)
    stub(root / "sbin", "mount.nfs", "exit 0\n")
    script = stage(tmp_path, "33-nfs-common.sh", ["/etc/apt", "/sbin/mount.nfs"])
    return run(script, cloud, AMI / "versions.json", stubs), state, root


@pytest.mark.parametrize("cloud", ["aws", "azure", "tencent"])
def test_nfs_common_is_installed_pinned_and_held_on_every_cloud(tmp_path, machine, manifest, cloud):
    nfs = manifest["nfs_common"]
    result, state, root = nfs_common(tmp_path, machine, cloud, f"1:{nfs['version']}-1ubuntu1.2")
    assert result.returncode == 0, result.stderr
    packages = " ".join(nfs["packages"])
    assert (root / "etc/apt/preferences.d/gpufleet-nfs-common").read_text() == (
        f"Package: {packages}\nPin: version {nfs['apt_pin']}\nPin-Priority: 1001\n")
    assert lines(state / "apt-get") == [f"install -y -q --no-install-recommends {packages}"]  # Ubuntu's archive
    assert lines(state / "apt-mark") == [f"hold {packages}"]
    assert f"nfs-common 1:{nfs['version']}-1ubuntu1.2 installed and held" in result.stderr


def test_nfs_common_of_another_version_stops_the_build(tmp_path, machine, manifest):
    result, _, _ = nfs_common(tmp_path, machine, "tencent", "1:2.8.3-1ubuntu1")
    assert result.returncode == 1
    assert f"nfs-common is 1:2.8.3-1ubuntu1, the manifest pins {manifest['nfs_common']['version']}" in result.stderr


# --- apt_source: a repository trusted with its pinned key only ---------------------------------------------------

URI = "https://packages.microsoft.com/ubuntu/22.04/prod"


def apt_source(tmp_path, machine, key: Path, fingerprint: str) -> tuple:
    stubs, state, root = machine
    script = tmp_path / "scripts" / "apt-source.sh"
    stage(tmp_path, "00-base.sh", APT_PATHS)  # copies lib.sh with the apt paths moved
    script.write_text(f'set -euo pipefail\n. "$(dirname "$0")/lib.sh"\n'
                      f'apt_source microsoft-prod {URI} jammy main {key.as_uri()} {fingerprint}\n')
    return run(script, "azure", AMI / "versions.json", stubs), root


def test_a_repository_is_trusted_with_exactly_its_pinned_key(tmp_path, machine, keys):
    pinned = keys.fingerprints[0]
    result, root = apt_source(tmp_path, machine, keys.export(tmp_path / "k.asc", pinned), pinned)
    assert result.returncode == 0, result.stderr
    keyring = root / "usr/share/keyrings/gpufleet-microsoft-prod.gpg"
    assert keyring_fingerprints(keyring) == [pinned]
    assert (root / "etc/apt/sources.list.d/gpufleet-microsoft-prod.list").read_text() == (
        f"deb [signed-by={keyring}] {URI} jammy main\n")


@pytest.mark.parametrize("which", ["another key", "the pinned key and another"])
def test_a_key_file_that_is_not_exactly_the_pinned_key_is_refused(tmp_path, machine, keys, which):
    pinned, other = keys.fingerprints
    exported = [other] if which == "another key" else [pinned, other]
    result, root = apt_source(tmp_path, machine, keys.export(tmp_path / "k.asc", *exported), pinned)
    assert result.returncode == 1
    assert f"is '{' '.join(exported)}', not exactly the pinned {pinned}" in result.stderr
    assert not (root / "usr/share/keyrings").exists() and list((root / "etc/apt/sources.list.d").iterdir()) == []


def test_a_base_images_entry_for_the_repository_is_set_aside_and_others_are_kept(tmp_path, machine, keys):
    """Ubuntu-HPC configures packages.microsoft.com itself (packages-microsoft-prod.deb, another Signed-By): apt
    refuses two entries for one repository with different keys, and the pinned key must be its only trust."""
    pinned = keys.fingerprints[0]
    lists = tmp_path / "root/etc/apt/sources.list.d"
    base = "deb [arch=amd64,arm64,armhf signed-by=/usr/share/keyrings/microsoft-prod.gpg] " + URI + " jammy main\n"
    (lists / "microsoft-prod.list").write_text(base)
    (lists / "microsoft-prod-deb822.sources").write_text(f"Types: deb\nURIs: {URI}/\nSuites: jammy\n")
    kept = {"azure-cli.list": "deb [signed-by=/x.gpg] https://packages.microsoft.com/repos/azure-cli/ jammy main\n",
            "insiders.list": f"deb [signed-by=/x.gpg] {URI}-insiders jammy main\n",
            "commented.list": f"# deb {URI} jammy main\n"}
    for name, text in kept.items():
        (lists / name).write_text(text)
    result, _ = apt_source(tmp_path, machine, keys.export(tmp_path / "k.asc", pinned), pinned)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in lists.iterdir()) == sorted([
        "gpufleet-microsoft-prod.list", "microsoft-prod.list.gpufleet-replaced",
        "microsoft-prod-deb822.sources.gpufleet-replaced", *kept])
    assert (lists / "microsoft-prod.list.gpufleet-replaced").read_text() == base  # set aside, not edited
    assert f"set aside {lists}/microsoft-prod.list (another entry for {URI})" in result.stderr


# --- 34-aznfs.sh: the AZNFS mount helper on Azure -----------------------------------------------------------------

@pytest.fixture
def azure(tmp_path, machine, keys, manifest):
    """34-aznfs.sh staged for an Azure build: the test's key pinned, the helper's config, CA file and mount.aznfs
    under the test's root, the package's postinst having turned self-update on (as it does non-interactively)."""
    stubs, state, root = machine
    pinned = keys.fingerprints[0]
    config, ca_file = root / "opt/microsoft/aznfs/data/config", root / "etc/ssl/certs/DigiCert_Global_Root_G2.pem"
    config.parent.mkdir(parents=True)
    config.write_text("AUTO_UPDATE_AZNFS=true\n")
    ca_file.parent.mkdir(parents=True)
    ca_file.write_text("-----BEGIN CERTIFICATE-----\n")
    stub(root / "sbin", "mount.aznfs", "exit 0\n")
    key = keys.export(tmp_path / "microsoft.asc", pinned)
    versions = manifest_copy(tmp_path, **{"aznfs": {"config": str(config), "ca_file": str(ca_file)},
                                          "aznfs.apt_repository": {"gpg_key_url": key.as_uri(),
                                                                   "gpg_fingerprint": pinned}})
    dpkg_query(stubs, {"aznfs": manifest["aznfs"]["version"], "stunnel4": "3:5.63-1build1"})
    script = stage(tmp_path, "34-aznfs.sh", [*APT_PATHS, "/sbin/mount.aznfs"])
    return script, versions, stubs, state, root


def test_aznfs_is_installed_from_the_pinned_repository_pinned_held_and_kept_from_updating(azure, manifest):
    script, versions, stubs, state, root = azure
    result = run(script, "azure", versions, stubs)
    assert result.returncode == 0, result.stderr
    aznfs, release = manifest["aznfs"], manifest["ubuntu"]
    keyring = root / "usr/share/keyrings/gpufleet-microsoft-prod.gpg"
    assert (root / "etc/apt/sources.list.d/gpufleet-microsoft-prod.list").read_text() == (
        f"deb [signed-by={keyring}] {aznfs['apt_repository']['uri']} {release['codename']} main\n")
    assert (root / "etc/apt/preferences.d/gpufleet-aznfs").read_text() == (
        f"Package: aznfs\nPin: version {aznfs['apt_pin']}\nPin-Priority: 1001\n")
    # The repository is added before apt reads the indexes; the pinned version replaces a base image's, up or down.
    assert lines(state / "apt-get") == ["update -q", "install -y -q --no-install-recommends --allow-downgrades aznfs"]
    assert lines(state / "env") == ["1"]  # AZNFS_NONINTERACTIVE_INSTALL: the postinst asks nothing
    assert lines(state / "apt-mark") == ["hold aznfs"]
    assert lines(root / "opt/microsoft/aznfs/data/config") == ["AUTO_UPDATE_AZNFS=false"]
    assert lines(state / "systemctl") == ["disable --now aznfswatchdog.service", "enable aznfswatchdogv4.service"]
    assert f"aznfs {aznfs['version']} installed and held (self-update off); stunnel4 3:5.63-1build1" in result.stderr


def test_aznfs_of_another_version_stops_the_build(azure, manifest):
    script, versions, stubs, state, _ = azure
    dpkg_query(stubs, {"aznfs": "3.0.11", "stunnel4": "3:5.63-1build1"})
    result = run(script, "azure", versions, stubs)
    assert result.returncode == 1
    assert f"aznfs is 3.0.11, the manifest pins {manifest['aznfs']['version']}" in result.stderr
    assert not (state / "systemctl").exists()


def test_aznfs_with_an_unpinned_key_installs_nothing(azure, keys, tmp_path):
    script, versions, stubs, state, root = azure
    keys.export(tmp_path / "microsoft.asc", keys.fingerprints[1])  # what the key URL serves is another key
    result = run(script, "azure", versions, stubs)
    assert result.returncode == 1 and f"not exactly the pinned {keys.fingerprints[0]}" in result.stderr
    assert not (state / "apt-get").exists() and not (root / "etc/apt/preferences.d/gpufleet-aznfs").exists()


def test_aznfs_needs_the_root_its_tunnels_check_azure_files_against(azure):
    """Without DigiCert Global Root G2 in /etc/ssl/certs the helper fetches it at mount time with wget
    --no-check-certificate: the image must carry it (ca-certificates)."""
    script, versions, stubs, _, root = azure
    (root / "etc/ssl/certs/DigiCert_Global_Root_G2.pem").unlink()
    result = run(script, "azure", versions, stubs)
    assert result.returncode == 1 and "DigiCert_Global_Root_G2.pem is missing (ca-certificates)" in result.stderr


@pytest.mark.parametrize("cloud", ["aws", "tencent"])
def test_aznfs_is_azures_only(machine, cloud):
    stubs, state, _ = machine
    result = run(AMI / "scripts" / "34-aznfs.sh", cloud, AMI / "versions.json", stubs)
    assert result.returncode == 0 and f"aznfs: not on {cloud}" in result.stderr
    assert not any(state.iterdir())  # no apt, no key, no unit touched


def test_aznfs_is_fetched_by_apt_alone():
    script = "\n".join(line for line in (AMI / "scripts" / "34-aznfs.sh").read_text().splitlines()
                       if not line.startswith("#"))
    assert "curl" not in script and "wget" not in script and "fetch_" not in script and "dpkg -i" not in script
    assert "apt_source microsoft-prod \"$(manifest .aznfs.apt_repository.uri)\" \"$(manifest .ubuntu.codename)\"" in script
