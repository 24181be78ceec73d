"""The review flow on the real stacks: the preview engine runs the program on Pulumi's mock runtime,
then the cost, diff and Markdown hooks of this area (no fixtures)."""
from __future__ import annotations

import base64
import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from infra.config import read_stack_file
from infra.preview import cost, diff, runner
from infra.userdata import NODES_JSON_PATH

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


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def _nodes_json(controller_inputs: dict) -> dict:
    """The controller's /etc/gpufleet/nodes.json, read back from its cloud-config (plain or base64, in whichever
    input of the controller carries it: userDataBase64, customData, userData, userDataRaw)."""
    for value in _strings(controller_inputs):
        try:
            text = value if value.startswith("#cloud-config") else base64.b64decode(value, validate=True).decode()
        except (ValueError, UnicodeDecodeError):
            continue
        if text.startswith("#cloud-config"):
            files = yaml.safe_load(text)["write_files"]
            return json.loads(next(f["content"] for f in files if f["path"] == NODES_JSON_PATH))
    raise AssertionError("the controller carries no cloud-config")


def _fixed(doc: dict) -> dict[str, int]:
    return {f["item"].split(" (")[0]: f["quantity"] for f in doc["cost"]["fixed"]}


def _check_partitions(doc: dict, nodes: dict) -> None:
    """The cost prices the partitions the power-saving config launches, with their purchase options."""
    assert [p["name"] for p in doc["cost"]["partitions"]] == list(nodes["partitions"])
    for p in doc["cost"]["partitions"]:
        launched = nodes["partitions"][p["name"]]
        assert (p["purchase"] == "spot", p["on_demand_base"]) == (launched["spot"], launched["on_demand_base"])


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_cost_model_counts_what_the_aws_stacks_create(stack, dev):
    doc = dev if stack == "dev" else _preview(stack)
    endpoints = [e for e in _inputs(doc, "aws:ec2/vpcEndpoint:VpcEndpoint") if e["vpcEndpointType"] == "Interface"]
    endpoint_azs = sum(len(e["subnetIds"]) for e in endpoints)
    fixed = _fixed(doc)
    assert fixed["interface VPC endpoints"] == endpoint_azs
    assert len(endpoints) == cost.AWS_INTERFACE_ENDPOINTS
    assert fixed["KMS customer managed key"] == len(_inputs(doc, "aws:kms/key:Key"))
    assert fixed["CloudWatch dashboard"] == len(_inputs(doc, "aws:cloudwatch/dashboard:Dashboard"))
    assert fixed["Secrets Manager secret"] == len(_inputs(doc, "aws:secretsmanager/secret:Secret"))
    # the controller: one instance of the configured size, its root volume
    (controller,) = _inputs(doc, "aws:ec2/instance:Instance")
    assert fixed[f"controller {controller['instanceType']}"] == 1
    root = controller["rootBlockDevice"]
    assert (root["volumeSize"], root["volumeType"]) == (cost.AWS_CONTROLLER_ROOT_GIB, "gp3")
    # every partition's nodes boot from a launch template with the node root volume
    templates = _inputs(doc, "aws:ec2/launchTemplate:LaunchTemplate")
    assert len(templates) == len(doc["cost"]["partitions"])
    for template in templates:
        (node_root,) = template["blockDeviceMappings"]
        assert (node_root["ebs"]["volumeSize"], node_root["ebs"]["volumeType"]) == (cost.AWS_ROOT_VOLUME_GIB, "gp3")
    _check_partitions(doc, _nodes_json(controller))
    # the shared file system is EFS, priced per GB stored (usage); the VPC's DNS firewall per million queries
    # (usage), its domain names (under a cent a month) counted
    assert len(_inputs(doc, "aws:efs/fileSystem:FileSystem")) == 1
    assert [u["item"].split(" (")[0] for u in doc["cost"]["usage"]] == ["EFS Standard storage", "DNS Firewall queries"]
    domain_lists = _inputs(doc, "aws:route53/resolverFirewallDomainList:ResolverFirewallDomainList")
    assert sum(len(d["domains"]) for d in domain_lists) == cost.DNS_FIREWALL_DOMAINS
    # the CloudWatch alarms are left out of the sums, and said so
    assert _inputs(doc, "aws:cloudwatch/metricAlarm:MetricAlarm") and "CloudWatch alarms" in doc["cost"]["excluded"]


def test_cost_model_of_the_tencent_stack_is_in_cny_and_counts_what_it_creates(tmp_path):
    doc = _preview("tencent")
    cost_doc = doc["cost"]
    assert (cost_doc["currency"], cost_doc["price_region"]) == ("CNY", "ap-guangzhou")
    fixed = _fixed(doc)
    assert fixed["KMS customer master key"] == len(_inputs(doc, "tencentcloud:Kms/key:Key"))
    (controller,) = _inputs(doc, "tencentcloud:Instance/instance:Instance")
    assert fixed[f"controller {controller['instanceType']}"] == 1
    assert (controller["systemDiskSize"], controller["systemDiskType"]) == \
        (cost.TENCENT_CONTROLLER_SYSTEM_DISK_GB, "CLOUD_PREMIUM")
    templates = _inputs(doc, "tencentcloud:Cvm/launchTemplate:LaunchTemplate")
    assert len(templates) == len(cost_doc["partitions"])
    for template in templates:
        disk = template["systemDisk"]
        assert (disk["diskSize"], disk["diskType"]) == (cost.TENCENT_SYSTEM_DISK_GB, "CLOUD_PREMIUM")
    _check_partitions(doc, _nodes_json(controller))
    # the shared file systems (home, slurm state): CFS Standard (SD), priced per GiB stored (usage), as many as the
    # usage item says
    file_systems = _inputs(doc, "tencentcloud:Cfs/fileSystem:FileSystem")
    assert len(file_systems) == cost.TENCENT_CFS_FILE_SYSTEMS
    assert {fs.get("storageType", "SD") for fs in file_systems} == {"SD"}
    assert [u["item"].split(" (")[0] for u in cost_doc["usage"]] == ["CFS Standard storage"]
    assert f"({len(file_systems)} file systems" in cost_doc["usage"][0]["item"]
    # the munge key's SSM secret bills per secret at a CNY price not known here: named in excluded, not summed
    assert len(_inputs(doc, "tencentcloud:Ssm/secret:Secret")) == 1 and "SSM secret" in cost_doc["excluded"]
    # the alarm policies are left out like the other clouds' alarms, and said so
    assert _inputs(doc, "tencentcloud:Monitor/alarmPolicy:AlarmPolicy")
    assert "Cloud Monitor alarm policies" in cost_doc["excluded"]
    (budget,) = _inputs(doc, "tencentcloud:Billing/budget:Budget")
    assert float(budget["budgetQuota"]) == cost_doc["budget"]["monthly_usd"] == 300000
    text = subprocess.run([sys.executable, "-m", "infra.preview", "--stack", "tencent", "--format", "markdown"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert text.returncode == 0, text.stderr
    assert "List prices in CNY of ap-guangzhou" in text.stdout and "$" not in text.stdout.split("### Resources")[0]
    assert f"budget ¥{300000:,.2f}/month" in text.stdout


def test_cost_model_prices_the_azure_controller_share_and_node_disks(azure):
    fixed = _fixed(azure)
    (vm,) = _inputs(azure, "azure-native:compute:VirtualMachine")
    assert fixed[f"controller {vm['hardwareProfile']['vmSize']}"] == 1
    os_disk = vm["storageProfile"]["osDisk"]
    assert (os_disk["diskSizeGB"], os_disk["managedDisk"]["storageAccountType"]) == \
        (cost.AZURE_CONTROLLER_OS_DISK_GB, "Premium_LRS")
    # the node provider creates each node's OS disk at the size the cost prices
    nodes = _nodes_json(vm)
    assert {p["os_disk_gb"] for p in nodes["partitions"].values()} == {cost.AZURE_OS_DISK_GB}
    _check_partitions(azure, nodes)
    # the shared file systems: premium NFS shares (home, slurm-state) on one FileStorage account, each provisioned
    # at the size the cost prices, as many as it counts
    shares = _inputs(azure, "azure-native:storage:FileShare")
    assert sorted(s["shareName"] for s in shares) == ["home", "slurm-state"]
    assert {(s["shareQuota"], s["enabledProtocols"]) for s in shares} == {(cost.AZURE_FILES_SHARE_GIB, "NFS")}
    assert fixed["Azure Files premium NFS share"] == len(shares) == cost.AZURE_FILES_SHARES
    accounts = [a for a in _inputs(azure, "azure-native:storage:StorageAccount") if a.get("kind") == "FileStorage"]
    assert [a["sku"]["name"] for a in accounts] == ["Premium_LRS"]


def test_cost_model_counts_the_azure_nat_gateway_its_address_and_leaves_the_alert_out(azure):
    fixed = _fixed(azure)
    # the controller subnet's NAT gateway (hourly, fixed) and the data it processes (usage)
    gateways = _inputs(azure, "azure-native:network:NatGateway")
    assert [g["sku"]["name"] for g in gateways] == ["Standard"] and fixed["NAT gateway"] == len(gateways)
    assert [u["item"].split(" (")[0] for u in azure["cost"]["usage"]] == ["NAT gateway data processed"]
    # its one public address: Standard, static, billed by the hour
    addresses = _inputs(azure, "azure-native:network:PublicIPAddress")
    assert [(a["sku"]["name"], a["publicIPAllocationMethod"]) for a in addresses] == [("Standard", "Static")]
    assert fixed["public IP address, Standard static"] == len(addresses)
    assert [ip["id"].rsplit("/", 1)[1] for ip in gateways[0]["publicIpAddresses"]] == \
        [addresses[0]["publicIpAddressName"]]
    # the controller-down metric alert is left out like the AWS stack's CloudWatch alarms, and said so
    assert len(_inputs(azure, "azure-native:monitor:MetricAlert")) == 1
    assert "metric alert" in azure["cost"]["excluded"]


def test_cost_model_counts_the_azure_registry_the_vault_and_their_private_paths(azure):
    fixed = {f["item"]: f["quantity"] for f in azure["cost"]["fixed"]}
    (acr,) = _inputs(azure, "azure-native:containerregistry:Registry")
    assert acr["sku"]["name"] == "Premium" and fixed["Container Registry, Premium tier"] == 1
    # a private endpoint each for the registry, the Key Vault and the Files account, each with its own zone
    endpoints = [e["privateEndpointName"].rsplit("-", 1)[1] for e in
                 _inputs(azure, "azure-native:network:PrivateEndpoint")]
    assert sorted(endpoints) == ["file", "registry", "vault"]
    assert fixed["private endpoint (registry)"] == fixed["private endpoint (Key Vault)"] == \
        fixed["private endpoint (Azure Files)"] == 1
    assert sum(q for item, q in fixed.items() if item.startswith("private endpoint (")) == len(endpoints)
    zones = _inputs(azure, "azure-native:privatedns:PrivateZone")
    for zone in zones:
        assert fixed[f"private DNS zone ({zone['privateZoneName']})"] == 1
    assert sum(q for item, q in fixed.items() if item.startswith("private DNS zone (")) == len(zones) == 3


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


def test_more_and_other_node_types_change_the_controllers_config_and_cost_more(dev):
    raw, _ = read_stack_file(ROOT / "Pulumi.dev.yaml")
    raw = {**copy.deepcopy(raw), "gpufleet:instanceTypes": ["g6.2xlarge", "g6.xlarge"],
           "gpufleet:nodes": {"min": 0, "max": 6}}
    head = _preview("dev", raw, base=dev)
    result = head["diff"]
    assert (result["added"], result["removed"], result["renamed"]) == ([], [], [])
    changed = {c["type"]: c for c in result["changed"]}
    # the partition's types and size live in the power-saving config and slurm.conf on the controller
    assert "userDataBase64" in changed["aws:ec2/instance:Instance"]["paths"]
    # 2 more nodes at full size, each a g6.xlarge spot node (cheapest listed) plus its root volume:
    # 2 x (0.3219 x 730 + 16.00) = 501.974; nothing more is always on
    assert result["cost"] == {"delta_monthly_usd": {"idle": 0.0, "full": 501.97}, "currency": "USD"}
    (gpu,) = head["cost"]["partitions"]
    assert (gpu["prices"]["on_demand"]["instance_type"], gpu["prices"]["spot"]["instance_type"]) == \
        ("g6.2xlarge", "g6.xlarge")


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
