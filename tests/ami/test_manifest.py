"""The pinned versions manifest is consistent, and the scripts and templates take every version from it."""
from __future__ import annotations

import re
import tomllib

from tests.ami.conftest import AMI, ROOT

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


def downloads(node, path=""):
    """Every object in the manifest that has a "url", with its dotted path."""
    if isinstance(node, dict):
        if "url" in node:
            yield path.lstrip("."), node
        for key, value in node.items():
            yield from downloads(value, f"{path}.{key}")


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
    assert {"nvidia_driver", "fabric_manager", "cuda", "nccl", "dcgm", "docker", "nvidia_container_toolkit"} <= set(pinned)
    for name, component in pinned.items():
        assert component["version"] in component["apt_pin"], name


def test_every_download_is_https_with_a_sha256_or_marked_pending(manifest):
    found = dict(downloads(manifest))
    assert {"cuda.keyring", "efa_installer", "aws_ofi_nccl", "cloudwatch_agent"} <= set(found)
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
        else:
            assert component["version"] in item["url"], path
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
        if path.suffix == ".sh":
            assert not re.search(r"\b\d+\.\d+\.\d+\b", text), f"{path.name} has a version literal"


def test_every_manifest_lookup_resolves(manifest):
    script_paths = set()
    for script in AMI.glob("scripts/[0-9]*.sh"):
        script_paths |= set(re.findall(r"manifest (\.[\w.]+)", script.read_text()))
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
