"""The review flow on the real stacks: the preview engine runs the program on Pulumi's mock runtime,
then the cost, diff and Markdown hooks of this area (no fixtures)."""
from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from infra.config import read_stack_file
from infra.preview import cost, diff, runner

ROOT = Path(__file__).resolve().parents[3]


def _preview(stack: str, raw: dict | None = None, base: dict | None = None) -> dict:
    file_raw, secrets = read_stack_file(ROOT / f"Pulumi.{stack}.yaml")
    return runner.preview(raw or file_raw, secrets, stack, base=base)


@pytest.fixture(scope="module")
def dev() -> dict:
    return _preview("dev")


@pytest.fixture(scope="module")
def azure() -> dict:
    return _preview("azure")


@pytest.mark.parametrize("stack", ["dev", "prod", "azure", "tencent"])
def test_every_resource_type_of_the_stacks_has_a_replacement_rule(stack, dev, azure):
    doc = {"dev": dev, "azure": azure}.get(stack) or _preview(stack)
    types = {r["type"] for r in doc["resources"] if r["custom"] and not r["type"].startswith("pulumi:providers:")}
    assert types
    assert sorted(types - set(diff.REPLACE_ON)) == [], "add these types to infra/preview/diff.py REPLACE_ON"


def _inputs(doc: dict, rtype: str) -> list[dict]:
    return [r["inputs"] for r in doc["resources"] if r["type"] == rtype]


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_cost_model_counts_what_the_aws_stacks_create(stack, dev):
    doc = dev if stack == "dev" else _preview(stack)
    endpoints = [e for e in _inputs(doc, "aws:ec2/vpcEndpoint:VpcEndpoint") if e["vpcEndpointType"] == "Interface"]
    endpoint_azs = sum(len(e["subnetIds"]) for e in endpoints)
    fixed = {f["item"].split(" (")[0]: f["quantity"] for f in doc["cost"]["fixed"]}
    assert fixed["interface VPC endpoints"] == endpoint_azs
    assert len(endpoints) == cost.AWS_INTERFACE_ENDPOINTS
    assert fixed["KMS customer managed key"] == len(_inputs(doc, "aws:kms/key:Key"))
    assert fixed["CloudWatch dashboard"] == len(_inputs(doc, "aws:cloudwatch/dashboard:Dashboard"))
    (template,) = _inputs(doc, "aws:ec2/launchTemplate:LaunchTemplate")
    (root,) = template["blockDeviceMappings"]
    assert (root["ebs"]["volumeSize"], root["ebs"]["volumeType"]) == (cost.AWS_ROOT_VOLUME_GIB, "gp3")


def test_cost_model_of_the_tencent_stack_is_in_cny_and_counts_what_it_creates(tmp_path):
    doc = _preview("tencent")
    cost_doc = doc["cost"]
    assert (cost_doc["currency"], cost_doc["price_region"]) == ("CNY", "ap-guangzhou")
    (node,) = _inputs(doc, "tencentcloud:As/scalingConfig:ScalingConfig")
    assert (node["systemDiskSize"], node["systemDiskType"]) == (cost.TENCENT_SYSTEM_DISK_GB, "CLOUD_PREMIUM")
    fixed = {f["item"]: f["quantity"] for f in cost_doc["fixed"]}
    assert fixed == {"KMS customer master key": len(_inputs(doc, "tencentcloud:Kms/key:Key"))}
    (budget,) = _inputs(doc, "tencentcloud:Billing/budget:Budget")
    assert float(budget["budgetQuota"]) == cost_doc["budget"]["monthly_usd"] == 300000
    text = subprocess.run([sys.executable, "-m", "infra.preview", "--stack", "tencent", "--format", "markdown"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert text.returncode == 0, text.stderr
    assert "List prices in CNY of ap-guangzhou" in text.stdout and "$" not in text.stdout.split("### Resources")[0]
    assert f"budget ¥{300000:,.2f}/month" in text.stdout


def test_cost_model_os_disk_matches_the_azure_scale_set(azure):
    (vmss,) = _inputs(azure, "azure-native:compute:VirtualMachineScaleSet")
    os_disk = vmss["virtualMachineProfile"]["storageProfile"]["osDisk"]
    assert (os_disk["diskSizeGB"], os_disk["managedDisk"]["storageAccountType"]) == \
        (cost.AZURE_OS_DISK_GB, "Premium_LRS")


def test_cost_model_counts_the_azure_registry_the_vault_and_their_private_paths(azure):
    fixed = {f["item"]: f["quantity"] for f in azure["cost"]["fixed"]}
    (acr,) = _inputs(azure, "azure-native:containerregistry:Registry")
    assert acr["sku"]["name"] == "Premium" and fixed["Container Registry, Premium tier"] == 1
    endpoints = [e["privateEndpointName"].rsplit("-", 1)[1] for e in
                 _inputs(azure, "azure-native:network:PrivateEndpoint")]
    assert sorted(endpoints) == ["registry", "vault"]
    assert fixed["private endpoint (registry)"] == fixed["private endpoint (Key Vault)"] == 1
    for zone in _inputs(azure, "azure-native:privatedns:PrivateZone"):
        assert fixed[f"private DNS zone ({zone['privateZoneName']})"] == 1


def _edited(doc: dict, rtype: str, edit) -> dict:
    head = copy.deepcopy(doc)
    edit(next(r for r in head["resources"] if r["type"] == rtype)["inputs"])
    return head


@pytest.mark.parametrize("rtype,edit,paths,replace", [
    ("aws:s3/bucket:Bucket", lambda i: i.update(bucket="gpufleet-dev-data"), ["bucket"], True),
    ("aws:ec2/launchTemplate:LaunchTemplate", lambda i: i.update(imageId="ami-0123456789abcdef0"), ["imageId"], False),
    ("aws:ec2/vpc:Vpc", lambda i: i.update(cidrBlock="10.43.0.0/16"), ["cidrBlock"], True),
])
def test_replacement_marks_on_the_aws_stack(dev, rtype, edit, paths, replace):
    change = next(c for c in diff.compute(dev, _edited(dev, rtype, edit))["changed"] if c["type"] == rtype)
    assert (change["paths"], change["replace"]) == (paths, replace)


@pytest.mark.parametrize("edit,paths,replace", [
    (lambda i: i["addressSpace"]["addressPrefixes"].__setitem__(0, "10.65.0.0/16"),
     ["addressSpace.addressPrefixes[0]"], True),
    (lambda i: i.update(location="northeurope"), ["location"], True),
    (lambda i: i["tags"].update(team="research-infra"), ["tags.team"], False),
])
def test_replacement_marks_on_the_azure_vnet(azure, edit, paths, replace):
    (change,) = diff.compute(azure, _edited(azure, "azure-native:network:VirtualNetwork", edit))["changed"]
    assert (change["paths"], change["replace"]) == (paths, replace)


def test_more_and_other_node_types_update_in_place_and_cost_more(dev):
    raw, _ = read_stack_file(ROOT / "Pulumi.dev.yaml")
    raw = {**copy.deepcopy(raw), "gpufleet:instanceTypes": ["g6.2xlarge", "g6.xlarge"],
           "gpufleet:nodes": {"min": 0, "desired": 0, "max": 6}}
    head = _preview("dev", raw, base=dev)
    result = head["diff"]
    assert (result["added"], result["removed"], result["renamed"]) == ([], [], [])
    changed = {c["type"]: c for c in result["changed"]}
    assert not any(c["replace"] for c in result["changed"])
    assert "maxSize" in changed["aws:autoscaling/group:Group"]["paths"]
    assert "mixedInstancesPolicy.launchTemplate.overrides[0].instanceType" in \
        changed["aws:autoscaling/group:Group"]["paths"]
    # the node settings in user-data list the instance types: a new launch template version
    assert changed["aws:ec2/launchTemplate:LaunchTemplate"]["paths"] == ["userData"]
    # 2 more nodes at max, each a g6.xlarge spot node (cheapest listed) plus its root volume:
    # 2 x (0.3219 x 730 + 16.00) = 501.974
    assert result["cost"]["delta_monthly_usd"] == {"min": 0.0, "desired": 0.0, "max": 501.97}


def test_cli_markdown_with_diff(tmp_path, dev):
    base = tmp_path / "base.json"
    base.write_text(json.dumps(dev))
    doc = yaml.safe_load((ROOT / "Pulumi.dev.yaml").read_text())
    doc["config"]["gpufleet:tags"]["team"] = "research-infra"
    head_file = tmp_path / "Pulumi.dev.yaml"
    head_file.write_text(yaml.safe_dump(doc))
    proc = subprocess.run([sys.executable, "-m", "infra.preview", "--config-file", str(head_file),
                           "--format", "markdown", "--diff", str(base)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode in (0, 1), proc.stderr
    text = proc.stdout
    assert text.startswith("## gpufleet preview: `dev` (aws, eu-west-1)")
    section = text.split("### Changes against the base branch", 1)[1].split("\n### ", 1)[0]
    assert "0 to add, 0 to remove," in section and "0 to replace" in section
    assert "`tags.team`: `ml-platform` → `research-infra`" in section
    assert "| 🔁 replace |" not in section
    assert "```mermaid" in text and "### Monthly cost" in text


def test_cli_stack_against_its_own_preview_shows_no_changes(tmp_path, dev):
    base = tmp_path / "base.json"
    base.write_text(json.dumps(dev))
    proc = subprocess.run([sys.executable, "-m", "infra.preview", "--stack", "dev", "--format", "json",
                           "--diff", str(base)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode in (0, 1), proc.stderr
    assert diff.is_empty(json.loads(proc.stdout)["diff"])
