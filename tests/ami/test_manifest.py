"""The pinned versions manifest is consistent, and the scripts and templates take every version from it."""
from __future__ import annotations

import re
import tomllib

from tests.ami.conftest import AMI, ROOT, downloads

# NVIDIA CUDA release notes, table "CUDA Toolkit and Minimum Required Driver Version" (Linux x86_64).
CUDA_TOOLKIT_MIN_DRIVER = {
    "12.4.0": "550.54.14", "12.4.1": "550.54.15", "12.5.0": "555.42.02", "12.5.1": "555.42.06",
    "12.6.0": "560.28.03", "12.6.1": "560.35.03", "12.6.2": "560.35.03", "12.6.3": "560.35.05",
    "12.8.0": "570.26", "12.8.1": "570.124.06", "12.9.0": "575.51.03",
}
CODENAMES = {"22.04": "jammy", "24.04": "noble"}
PINNED_FILES = [*AMI.glob("*.pkr.hcl"), *AMI.glob("scripts/*.sh"), *AMI.glob("files/*"), *AMI.glob("systemd/*")]


def vtuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def fingerprints(node, path=""):
    """Every pinned signing key in the manifest (a "gpg_fingerprint"), with its dotted path."""
    if isinstance(node, dict):
        if "gpg_fingerprint" in node:
            yield path.lstrip("."), node
        for key, value in node.items():
            yield from fingerprints(value, f"{path}.{key}")


def test_fabric_manager_is_the_driver_version(manifest):
    driver = manifest["nvidia_driver"]
    assert manifest["fabric_manager"]["version"] == driver["version"]
    assert manifest["fabric_manager"]["apt_pin"] == driver["apt_pin"]
    assert driver["version"].split(".")[0] == driver["branch"]
    assert driver["kernel_module"] == "open"


def test_driver_meets_the_cuda_toolkit_minimum(manifest):
    cuda = manifest["cuda"]
    assert cuda["min_driver"] == CUDA_TOOLKIT_MIN_DRIVER[cuda["version"]]
    assert vtuple(manifest["nvidia_driver"]["version"]) >= vtuple(cuda["min_driver"])


def test_cuda_dependent_packages_match_the_toolkit(manifest):
    major, minor, _ = manifest["cuda"]["version"].split(".")
    assert manifest["cuda"]["package"] == f"cuda-toolkit-{major}-{minor}"
    assert manifest["nccl"]["apt_pin"] == f"{manifest['nccl']['version']}-1+cuda{major}.{minor}"
    assert manifest["dcgm"]["package"].endswith(f"-cuda{major}")
    torch_cuda = re.fullmatch(r"(\d+)\.(\d+)", manifest["trainer"]["torch_cuda"])
    assert torch_cuda, "trainer.torch_cuda is the CUDA major.minor the torch wheel is built for"
    assert (int(torch_cuda[1]), int(torch_cuda[2])) <= (int(major), int(minor)), "torch built for a newer CUDA"


def test_apt_pins_select_the_manifest_version(manifest):
    pinned = {name: c for name, c in manifest.items() if isinstance(c, dict) and "apt_pin" in c}
    assert {"nvidia_driver", "fabric_manager", "cuda", "nccl", "dcgm", "docker", "nvidia_container_toolkit",
            "nfs_common", "aznfs"} <= set(pinned)
    for name, component in pinned.items():
        assert component["version"] in component["apt_pin"], name


def test_every_download_is_https_with_a_sha256_or_marked_pending(manifest):
    found = dict(downloads(manifest))
    assert {"cuda.keyring", "efa_installer", "aws_ofi_nccl", "cloudwatch_agent", "efs_utils", "efs_utils.rust",
            "efs_utils.go"} <= set(found)
    for path, item in found.items():
        assert item["url"].startswith("https://"), path
        assert "sha256" in item, f"{path} has no sha256 entry"
        sha = item["sha256"]
        assert sha is None or re.fullmatch(r"[0-9a-f]{64}", sha), f"{path}: sha256 {sha!r} is not 64 hex chars"
    assert "to be filled at bake time" in manifest["pending_checksum_note"]


def test_versioned_urls_carry_the_manifest_version(manifest):
    for path, item in downloads(manifest):
        component = manifest[path.split(".")[0]]
        if path == "cuda.keyring":
            assert f"/{manifest['ubuntu']['repo_path']}/" in item["url"]
        else:  # a build tool nested in a component carries its own version
            assert item.get("version", component["version"]) in item["url"], path
    efa = manifest["efa_installer"]
    assert efa["sig_url"] == efa["url"] + ".sig"
    assert re.fullmatch(r"[0-9A-F]{40}", efa["gpg_fingerprint"])


def test_ubuntu_release_is_consistent(manifest):
    ubuntu = manifest["ubuntu"]
    assert CODENAMES[ubuntu["release"]] == ubuntu["codename"]
    assert ubuntu["repo_path"] == "ubuntu" + ubuntu["release"].replace(".", "")
    assert manifest["azure_hpc_base"]["sku"] == ubuntu["release"].replace(".", "")


def test_trainer_pin_is_the_package_version(manifest):
    project = tomllib.loads((ROOT / "trainer" / "pyproject.toml").read_text())["project"]
    trainer = manifest["trainer"]
    assert trainer["version"] == project["version"]
    assert trainer["wheel"] == f"{project['name'].replace('-', '_')}-{project['version']}-py3-none-any.whl"


def test_no_version_is_written_outside_the_manifest(manifest):
    values = {c["version"] for c in manifest.values() if isinstance(c, dict) and "version" in c}
    values |= {manifest["nvidia_driver"]["branch"], manifest["image_version"], manifest["ubuntu"]["release"]}
    assert len(PINNED_FILES) > 20
    for path in PINNED_FILES:
        text = path.read_text()
        for value in values:
            assert not re.search(rf"(?<![\w.]){re.escape(value)}(?![\w.])", text), f"{path.name} hard-codes {value}"
        if path.suffix == ".sh":  # an IPv4 address (the metadata service's) is no version
            code = re.sub(r"(?<![\w.])\d{1,3}(\.\d{1,3}){3}(?![\w.])", "", text)
            assert not re.search(r"\b\d+\.\d+\.\d+\b", code), f"{path.name} has a version literal"


def test_every_manifest_lookup_resolves(manifest):
    script_paths = set()
    for script in AMI.glob("scripts/[0-9]*.sh"):
        script_paths |= set(re.findall(r"manifest '?(\.[\w.]+)", script.read_text()))
        script_paths |= {f".{name}" for name in re.findall(r"fetch_component (\w+(?:\.\w+)?)", script.read_text())}
    hcl_paths = set()
    for template in AMI.glob("*.pkr.hcl"):
        hcl_paths |= {"." + p for p in re.findall(r"local\.v\.([\w.]+)", template.read_text())}
    assert len(script_paths) > 20 and len(hcl_paths) > 8
    for path in sorted(script_paths | hcl_paths):
        node = manifest
        for key in path.strip(".").split("."):
            assert isinstance(node, dict) and key in node, f"{path} is not in versions.json"
            node = node[key]


# --- Slurm and MUNGE: one version for the controller and every node -----------------------------------------------

def test_slurm_is_pinned_to_one_schedmd_release(manifest):
    slurm = manifest["slurm"]
    assert re.fullmatch(r"\d\d\.(05|11)\.\d+", slurm["version"]), "a SchedMD release: YY.MM.N"
    assert slurm["url"] == f"https://download.schedmd.com/slurm/slurm-{slurm['version']}.tar.bz2"
    assert slurm["prefix"] == "/usr/local" and slurm["sysconfdir"] == "/etc/slurm"


def test_the_pinned_slurm_is_one_the_rendered_cloud_config_is_written_for(manifest):
    """trainer.slurm.conf leaves cloud_reg_addrs (defunct since 23.11) and PrivateData=cloud (default since 23.02)
    out of a cloud cluster's slurm.conf, and needs cgroup/v2 (22.05+) on Ubuntu 22.04: the images' Slurm is 23.11
    or newer."""
    major, minor, _ = (int(x) for x in manifest["slurm"]["version"].split("."))
    assert (major, minor) >= (23, 11)


def test_munge_is_pinned_to_its_signed_release(manifest):
    munge = manifest["munge"]
    tag = f"munge-{munge['version']}"
    assert munge["url"] == f"https://github.com/dun/munge/releases/download/{tag}/{tag}.tar.xz"
    assert munge["sig_url"] == munge["url"] + ".asc"
    assert re.fullmatch(r"[0-9A-F]{40}", munge["gpg_fingerprint"])
    assert vtuple(munge["version"]) >= (0, 5, 18), "0.5.18 fixes CVE-2026-25506"
    assert munge["prefix"] == manifest["slurm"]["prefix"]  # Slurm is built --with-munge there


def test_accounts_have_fixed_distinct_ids(manifest):
    accounts = manifest["accounts"]
    assert set(accounts) == {"munge", "slurm", "gpufleet"}
    uids = [a["uid"] for a in accounts.values()]
    gids = [a["gid"] for a in accounts.values()]
    assert all(isinstance(i, int) and i > 0 for i in uids + gids)
    assert len(set(uids)) == len(uids) and len(set(gids)) == len(gids)
    # The stack's shared file system keeps the controller's state directory for the slurm user's ids (an EFS
    # access point that enforces them): infra and the image agree on them.
    from infra.slurm import SLURM_GID, SLURM_UID

    assert (accounts["slurm"]["uid"], accounts["slurm"]["gid"]) == (SLURM_UID, SLURM_GID)
    assert accounts["gpufleet"]["uid"] >= 1000  # the job user: no system account
    assert accounts["gpufleet"]["home"] == "/var/lib/gpufleet"


# --- efs-utils: mount.efs for the AWS stacks' EFS mounts ----------------------------------------------------------

def test_efs_utils_is_pinned_to_a_release_tag_and_its_commit(manifest):
    efs = manifest["efs_utils"]
    assert efs["url"] == f"https://github.com/aws/efs-utils/archive/refs/tags/v{efs['version']}.tar.gz"
    assert re.fullmatch(r"[0-9a-f]{40}", efs["commit"]), "the tag's commit, checked against the archive"
    assert efs["package"] == "amazon-efs-utils" and re.fullmatch(r"\d+", efs["release"])  # build-deb.sh's RELEASE
    # 2.4.2 retries "access denied" on access-point mounts (a new access point's provisioning race at first boot);
    # 2.0.4 retries the IMDSv2 token an iam mount needs.
    assert vtuple(efs["version"]) >= (2, 4, 2)
    assert "no checksum" in efs["checksum_source"]
    assert "efs_utils" not in manifest["azure_hpc_base"]["ships"]


def test_efs_utils_build_tools_are_pinned_verified_downloads(manifest):
    rust, go = manifest["efs_utils"]["rust"], manifest["efs_utils"]["go"]
    assert rust["url"] == f"https://static.rust-lang.org/dist/rust-{rust['version']}-x86_64-unknown-linux-gnu.tar.xz"
    assert rust["sig_url"] == rust["url"] + ".asc"
    assert rust["gpg_key_url"] == "https://static.rust-lang.org/rust-key.gpg.ascii"
    # Rust Language (Tag and Release Signing Key) <rust-key@rust-lang.org>
    assert rust["gpg_fingerprint"] == "108F66205EAEB0AAA8DD5E1C85AB96E6FA1BE5FE"
    assert go["url"] == f"https://go.dev/dl/go{go['version']}.linux-amd64.tar.gz"
    for tool in (rust, go):  # the floors efs-utils' README gives for the pinned release
        assert vtuple(tool["version"]) >= vtuple(tool["minimum"])
        assert "sha256" in tool and "build tool only" in tool["reason"]


def test_every_signing_key_is_pinned_by_its_full_fingerprint(manifest):
    found = dict(fingerprints(manifest))
    assert {"efa_installer", "efs_utils.rust", "munge", "aznfs.apt_repository"} <= set(found)
    for path, item in found.items():
        assert re.fullmatch(r"[0-9A-F]{40}", item["gpg_fingerprint"]), path  # a v4 fingerprint, not a key id
        assert item["gpg_key_url"].startswith("https://"), path


# --- NFS clients: nfs-common everywhere, the AZNFS mount helper on Azure ------------------------------------------

def test_nfs_common_is_pinned_from_the_ubuntu_archive(manifest):
    nfs = manifest["nfs_common"]
    assert re.fullmatch(r"\d+\.\d+\.\d+", nfs["version"])
    # The upstream version with nfs-utils' epoch and any Ubuntu revision: jammy-updates/-security replace a revision,
    # and the archive keeps only the newest one, so an exact revision would stop resolving.
    assert nfs["apt_pin"] == f"1:{nfs['version']}-*"
    assert nfs["packages"][0] == "nfs-common" and "libnfsidmap1" in nfs["packages"]  # one source package: nfs-utils
    assert "url" not in nfs and "nfs_common" not in manifest["azure_hpc_base"]["ships"]


def test_aznfs_comes_from_microsofts_repository_with_its_key_pinned(manifest):
    aznfs, release = manifest["aznfs"], manifest["ubuntu"]["release"]
    repo = aznfs["apt_repository"]
    # Microsoft's documented install (Encryption in transit for NFS Azure file shares): packages.microsoft.com's
    # repository for the image's Ubuntu release, signed with Microsoft's key (microsoft.asc).
    assert repo["uri"] == f"https://packages.microsoft.com/ubuntu/{release}/prod" and repo["component"] == "main"
    assert repo["gpg_key_url"] == "https://packages.microsoft.com/keys/microsoft.asc"
    # Microsoft (Release signing) <gpgsecurity@microsoft.com>
    assert repo["gpg_fingerprint"] == "BC528686B50D79E339D3721CEB3E94ADBE1229CF"
    # apt checks the repository's signed Release file and each package's hash: nothing is downloaded outside apt.
    assert "url" not in aznfs and "sha256" not in aznfs
    assert aznfs["package"] == "aznfs" and aznfs["apt_pin"] == aznfs["version"]  # the .deb's version: no revision
    assert vtuple(aznfs["version"]) >= (3, 0, 19), "3.0.x carries the NFSv4 stunnel guard and mount-hang fixes"
    assert aznfs["config"] == "/opt/microsoft/aznfs/data/config"  # the package's AUTO_UPDATE_AZNFS switch
    assert aznfs["ca_file"] == "/etc/ssl/certs/DigiCert_Global_Root_G2.pem"  # stunnel's CAfile for Azure Files
    # The Ubuntu-HPC base image carries an aznfs of its own: not "shipped", the pinned one replaces it.
    assert "aznfs" not in manifest["azure_hpc_base"]["ships"]
