"""The Packer templates validate with Debian's packer 1.6.6 (plugin file left out) and carry the manifest."""
from __future__ import annotations

import re

import pytest

from tests.ami.conftest import (AMI, NEWER_THAN_PACKER_1_6_6, console, packer, parse_hcl_list, parse_hcl_map,
                                strip_newer_settings)


def _bundled_builder_view(packer_dir):
    """What Debian's packer can check: the AWS source without the settings its bundled builder predates."""
    aws = packer_dir / "aws.pkr.hcl"
    text, removed = strip_newer_settings(aws.read_text())
    aws.write_text(text)
    return removed


def test_templates_as_shipped_pass_syntax_check(packer_dir):
    result = packer(["validate", "-syntax-only", "."], packer_dir)
    assert result.returncode == 0, result.stdout + result.stderr


def test_aws_azure_and_tencent_templates_validate(packer_dir, trainer_wheel_dir):
    _bundled_builder_view(packer_dir)
    result = packer(["validate", f"-var=trainer_wheel_dir={trainer_wheel_dir}", "."], packer_dir)
    assert result.returncode == 0, result.stdout + result.stderr


def test_only_the_imdsv2_settings_are_left_out_for_packer_1_6_6(packer_dir):
    removed = _bundled_builder_view(packer_dir)
    names = {line.strip().split(" ", 1)[0] for line in removed if "=" in line or "{" in line}
    assert names - {"http_endpoint", "http_tokens", "http_put_response_hop_limit"} == set(NEWER_THAN_PACKER_1_6_6)
    assert any(re.match(r'\s*http_tokens\s*=\s*"required"', line) for line in removed)
    assert any(re.match(r'\s*imds_support\s*=\s*"v2.0"', line) for line in removed)


def test_the_baked_wheel_must_exist(packer_dir, tmp_path):
    _bundled_builder_view(packer_dir)
    result = packer(["validate", f"-var=trainer_wheel_dir={tmp_path}", "."], packer_dir)
    assert result.returncode == 1
    assert "gpufleet_trainer-" in result.stdout + result.stderr


@pytest.mark.parametrize("var, message", [
    ("root_volume_iops=20000", "root_volume_iops must be between 3000 and 16000"),
    ("root_volume_throughput=2000", "root_volume_throughput must be between 125 and 1000"),
    ("root_volume_gb=20", "root_volume_gb must be between 100"),
    ("aws_build_instance_type=m5.large", "aws_build_instance_type must be an NVIDIA GPU type"),
    ("azure_build_vm_size=Standard_D4s_v5", "azure_build_vm_size must be an N-series"),
    ("tencent_build_instance_type=S5.LARGE8", "tencent_build_instance_type must be an NVIDIA GPU type"),
])
def test_invalid_inputs_are_refused(packer_dir, trainer_wheel_dir, var, message):
    _bundled_builder_view(packer_dir)
    result = packer(["validate", f"-var={var}", f"-var=trainer_wheel_dir={trainer_wheel_dir}", "."], packer_dir)
    assert result.returncode == 1
    assert message in " ".join((result.stdout + result.stderr).split())


def test_image_is_tagged_with_every_manifest_version(packer_dir, manifest):
    tags = parse_hcl_map(console(packer_dir, "local.image_tags", "-var=tags={owner=\"ml-platform\"}"))
    versioned = {name: c["version"] for name, c in manifest.items() if isinstance(c, dict) and "version" in c}
    assert len(versioned) >= 10
    for name, version in versioned.items():
        assert tags[f"gpufleet:{name}"] == version
    assert tags["gpufleet:image-version"] == manifest["image_version"]
    assert tags["owner"] == "ml-platform"
    assert re.fullmatch(rf"gpufleet-gpu-{re.escape(manifest['image_version'])}-\d{{12}}", tags["Name"])


def test_build_runs_every_script_once_in_order(packer_dir):
    steps = []
    for name in ("steps_before_reboot", "steps", "steps_after_reboot"):
        steps += parse_hcl_list(console(packer_dir, f"local.{name}"))
    scripts = sorted(p.name for p in (AMI / "scripts").glob("*.sh") if p.name != "lib.sh")
    assert steps == scripts
    assert steps[0] == "00-base.sh" and steps[-1] == "99-validate.sh"


def test_aws_source_is_canonical_ubuntu_on_encrypted_gp3():
    text = (AMI / "aws.pkr.hcl").read_text()
    assert re.search(r'owners\s*=\s*\["099720109477"\]', text)
    assert re.search(r'name\s*=\s*"ubuntu/images/hvm-ssd\*/ubuntu-\$\{local\.v\.ubuntu\.codename\}', text)
    block = text[text.index("launch_block_device_mappings"):text.index("metadata_options")]
    assert re.search(r'volume_type\s*=\s*"gp3"', block) and re.search(r"encrypted\s*=\s*true", block)
    assert re.search(r"encrypt_boot\s*=\s*true", text)


def test_azure_publishes_to_a_gallery_from_ubuntu_hpc(packer_dir, manifest):
    text = (AMI / "azure.pkr.hcl").read_text()
    assert "shared_image_gallery_destination {" in text
    assert manifest["azure_hpc_base"]["publisher"] == "microsoft-dsvm"
    assert manifest["azure_hpc_base"]["offer"] == "ubuntu-hpc"
    assert console(packer_dir, "local.v.azure_hpc_base.sku").strip() == manifest["azure_hpc_base"]["sku"]


def test_tencent_image_comes_from_ubuntu_with_the_proprietary_module_on_premium_disk(packer_dir, manifest):
    text = (AMI / "tencent.pkr.hcl").read_text()
    assert 'source "tencentcloud-cvm" "gpu"' in text
    assert re.search(r"source_image_name\s*=\s*local\.v\.tencent_base\.image_name", text)
    assert re.search(r'disk_type\s*=\s*"CLOUD_PREMIUM"', text) and re.search(r"run_tags\s*=\s*local\.image_tags", text)
    assert manifest["tencent_base"]["image_name"].startswith(f"Ubuntu Server {manifest['ubuntu']['release']}")
    assert manifest["tencent_base"]["kernel_module"] == "proprietary"  # V100 (Volta) has no open-module support
    builds = (AMI / "build.pkr.hcl").read_text()
    assert "source.tencentcloud-cvm.gpu" in builds
    assert console(packer_dir, 'local.cloud["tencentcloud-cvm"]').strip() == "tencent"
    assert builds.count("GPUFLEET_CLOUD=${local.cloud[source.type]}") == 1  # in the one provisioner of every script


def test_templates_are_packer_formatted():
    result = packer(["fmt", "-check", "."], AMI)
    assert result.returncode == 0, f"packer fmt would change: {result.stdout}"


def test_plugin_file_holds_only_the_plugin_requirements():
    text = (AMI / "plugins.pkr.hcl").read_text()
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    assert re.findall(r"^(\w+)[^\n]*\{\s*$", code, re.MULTILINE) == ["packer"]  # one top-level block
    assert 'source  = "github.com/hashicorp/amazon"' in code and 'source  = "github.com/hashicorp/azure"' in code
    assert 'source  = "github.com/hashicorp/tencentcloud"' in code


def test_azure_tags_the_versions_it_installs_within_its_limit(packer_dir, manifest):
    tags = parse_hcl_map(console(packer_dir, "local.azure_image_tags", "-var=tags={owner=\"ml-platform\"}"))
    for name in ("slurm", "munge", "trainer", "nfs_common", "aznfs"):  # aznfs: Azure's alone
        assert tags[f"gpufleet:{name}"] == manifest[name]["version"]
    for name in (*manifest["azure_hpc_base"]["ships"], "efa_installer", "aws_ofi_nccl", "cloudwatch_agent",
                 "efs_utils"):
        assert f"gpufleet:{name}" not in tags  # the base image's own, or AWS's
    assert tags["gpufleet:base-image"].startswith(f"{manifest['azure_hpc_base']['offer']}:")
    assert tags["owner"] == "ml-platform" and len(tags) <= 15  # a managed image takes 15 tags
