"""The real stacks (Pulumi.dev.yaml, Pulumi.prod.yaml) through the preview: complete, resolved, linked."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import jsonschema
import pytest

from infra import config
from infra.preview import runner
from tests.infra.preview.helpers import REPO
from tests.infra.preview.test_cli import SCHEMA


@pytest.fixture(scope="module", params=["dev", "prod"])
def doc(request):
    raw, secrets = config.read_stack_file(REPO / f"Pulumi.{request.param}.yaml")
    return runner.preview(raw, secrets, request.param)


def of_type(doc, typ):
    return [r for r in doc["resources"] if r["type"] == typ]


def test_document_is_complete_and_fully_resolved(doc):
    jsonschema.validate(doc, SCHEMA)
    text = json.dumps(doc)
    assert runner.UNKNOWN not in text
    resources = doc["resources"]
    urns = {r["urn"] for r in resources}
    assert len(urns) == len(resources)
    assert all(r["parent"] in urns for r in resources if r["type"] != runner.STACK_TYPE)
    components = {r["type"] for r in resources if not r["custom"] and r["type"] != runner.STACK_TYPE}
    assert components and all(t.startswith("gpufleet:aws:") for t in components)
    for r in resources:
        assert (r["id"] is not None) == r["custom"], r["urn"]
        assert set(r["dependencies"]) <= urns and all(set(v) <= urns for v in r["propertyDependencies"].values())
    # Every cloud resource lives inside a component.
    top = {r["urn"] for r in resources if r["type"] == runner.STACK_TYPE}
    assert all(r["parent"] not in top for r in resources if r["custom"])


def test_bucket_policies_are_built_from_the_bucket_arns(doc):
    buckets = {r["id"]: r for r in of_type(doc, "aws:s3/bucket:Bucket")}
    policies = of_type(doc, "aws:s3/bucketPolicy:BucketPolicy")
    assert buckets and policies
    for policy in policies:
        bucket = buckets[policy["inputs"]["bucket"]]
        statements = json.loads(policy["inputs"]["policy"])["Statement"]
        resources = {res for s in statements for res in ([s["Resource"]] if isinstance(s["Resource"], str)
                                                         else s["Resource"])}
        assert {f"arn:aws:s3:::{bucket['id']}", f"arn:aws:s3:::{bucket['id']}/*"} <= resources
        assert bucket["urn"] in policy["propertyDependencies"]["bucket"]


def test_the_controller_is_wired_to_the_partition_template_role_and_queue(doc):
    [template] = of_type(doc, "aws:ec2/launchTemplate:LaunchTemplate")
    [controller] = of_type(doc, "aws:ec2/instance:Instance")
    [policy] = [r for r in of_type(doc, "aws:iam/rolePolicy:RolePolicy") if r["name"].endswith("-controller-policy")]
    assert re.fullmatch(r"lt-[0-9a-f]{17}", template["id"])
    # the controller's user-data names the template (its nodes.json), its policy launches from it alone
    assert template["urn"] in controller["dependencies"] and template["id"] in policy["inputs"]["policy"]
    assert re.fullmatch(r"ami-[0-9a-f]{8,17}", template["inputs"]["imageId"])
    profile = template["inputs"]["iamInstanceProfile"]
    [instance_profile] = [r for r in of_type(doc, "aws:iam/instanceProfile:InstanceProfile") if r["name"].endswith("-node")]
    assert instance_profile["id"] in json.dumps(profile) or profile.get("arn", "").endswith(instance_profile["id"])
    queues = {r["id"] for r in of_type(doc, "aws:sqs/queue:Queue")}
    assert all(re.fullmatch(r"https://sqs\.eu-\w+-\d\.amazonaws\.com/123456789012/[\w-]+", q) for q in queues)
    outputs = set(map(str, doc["outputs"].values()))
    assert controller["id"] in outputs and queues & outputs
    assert {r["id"] for r in of_type(doc, "aws:s3/bucket:Bucket")} & outputs


def test_policy_pack_ran_without_mandatory_violations(doc):
    assert doc["policy"]["pack"]
    assert runner.mandatory_violations(doc) == []


def test_alerts_that_reach_nobody_are_warned_in_every_format(doc):
    from infra.preview import markdown, report

    assert doc["warnings"] == [config.ALERTS_NOBODY]
    assert config.ALERTS_NOBODY in report.table(doc, width=200) and config.ALERTS_NOBODY in markdown.render(doc)
    assert {v["policy"] for v in doc["policy"]["violations"]} == {"aws-sns-topic-alert-subscribers"}
    raw, secrets = config.read_stack_file(REPO / f"Pulumi.{doc['stack']}.yaml")
    subscribed = runner.preview({**raw, "gpufleet:alertEmails": ["ops@example.com"]}, secrets, doc["stack"])
    assert subscribed["warnings"] == [] and subscribed["policy"]["violations"] == []


def test_make_preview_command_exits_0_with_the_table():
    proc = subprocess.run([sys.executable, "-m", "infra.preview", "--stack", "dev"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert proc.stdout.startswith("Stack dev (aws, eu-west-1): partition gpu 0-4 x")
    assert "aws:ec2/instance:Instance" in proc.stdout and "Policy (" in proc.stdout


def test_azure_stack_resolves_resource_ids_and_endpoints():
    raw, secrets = config.read_stack_file(REPO / "Pulumi.azure.yaml")
    doc = runner.preview(raw, secrets, "azure")
    jsonschema.validate(doc, SCHEMA)
    assert runner.UNKNOWN not in json.dumps(doc)
    components = {r["type"] for r in doc["resources"] if not r["custom"] and r["type"] != runner.STACK_TYPE}
    assert components and all(t.startswith("gpufleet:azure:") for t in components)
    groups = {r["name"]: r["id"] for r in of_type(doc, "azure-native:resources:ResourceGroup")}
    assert all(re.fullmatch(r"/subscriptions/[0-9a-f-]{36}/resourceGroups/[\w-]+", g) for g in groups.values())
    subscription = next(iter(groups.values())).split("/resourceGroups/")[0]
    for r in doc["resources"]:
        if r["type"] == "azure-native:authorization:RoleDefinition":  # custom roles live in the subscription
            assert r["id"].startswith(subscription + "/providers/Microsoft.Authorization/roleDefinitions/"), r["id"]
        elif r["custom"] and r["type"] != "azure-native:resources:ResourceGroup":
            assert any(r["id"].startswith(g + "/providers/Microsoft.") for g in groups.values()), r["id"]
    [controller] = of_type(doc, "azure-native:compute:VirtualMachine")
    identity = next(r for r in of_type(doc, "azure-native:managedidentity:UserAssignedIdentity")
                    if r["id"].endswith("-controller"))
    assert identity["id"] in json.dumps(controller["inputs"]) and identity["urn"] in controller["dependencies"]
    account = next(r for r in of_type(doc, "azure-native:storage:StorageAccount") if r["inputs"].get("kind") != "FileStorage")
    name = account["id"].rsplit("/", 1)[1]
    assert doc["outputs"]["queueUrl"].startswith(f"https://{name}.queue.core.windows.net/")
    assert runner.mandatory_violations(doc) == []
    assert doc["warnings"] == [config.ALERTS_NOBODY]


def test_the_pulumi_host_entry_registers_what_the_preview_shows(doc):
    """infra/__main__.py, run as the Pulumi Python host runs a program directory, on the same mocks."""
    import runpy

    from infra.preview.mocks import PreviewMocks

    raw, secrets = config.read_stack_file(REPO / f"Pulumi.{doc['stack']}.yaml")
    captured = runner.run_program(lambda: runpy.run_path(str(REPO / "infra"), run_name="__main__"),
                                  stack=doc["stack"], config_map=config.to_engine_config(raw),
                                  secret_keys=secrets, mocks=PreviewMocks(doc["stack"], doc["config"]["region"]))
    assert captured.resources == doc["resources"]
    assert captured.outputs == doc["outputs"]


def test_tencent_stack_resolves_tencent_ids_and_previews_offline():
    raw, secrets = config.read_stack_file(REPO / "Pulumi.tencent.yaml")
    doc = runner.preview(raw, secrets, "tencent")
    jsonschema.validate(doc, SCHEMA)
    assert runner.UNKNOWN not in json.dumps(doc)
    components = {r["type"] for r in doc["resources"] if not r["custom"] and r["type"] != runner.STACK_TYPE}
    assert components and all(t.startswith("gpufleet:tencent:") for t in components)
    shapes = {"tencentcloud:Vpc/instance:Instance": r"vpc-[0-9a-z]{8}", "tencentcloud:Subnet/instance:Instance":
              r"subnet-[0-9a-z]{8}", "tencentcloud:Security/group:Group": r"sg-[0-9a-z]{8}",
              "tencentcloud:Instance/instance:Instance": r"ins-[0-9a-z]{8}",
              "tencentcloud:Cvm/launchTemplate:LaunchTemplate": r"lt-[0-9a-z]{8}",
              "tencentcloud:Cfs/fileSystem:FileSystem": r"cfs-[0-9a-z]{8}",
              "tencentcloud:Tcmq/queue:Queue": r"queue-[0-9a-z]{8}", "tencentcloud:Cam/role:Role": r"4611686\d{12}",
              "tencentcloud:Cos/bucket:Bucket": r"gpufleet-tencent-(data|logs)-1250000000"}
    for typ, shape in shapes.items():
        found = of_type(doc, typ)
        assert found and all(re.fullmatch(shape, r["id"]) for r in found), (typ, [r["id"] for r in found])
    [controller] = of_type(doc, "tencentcloud:Instance/instance:Instance")
    [template] = of_type(doc, "tencentcloud:Cvm/launchTemplate:LaunchTemplate")
    assert template["urn"] in controller["dependencies"]  # its nodes.json names the partition's template
    assert doc["cost"]["currency"] == "CNY" and runner.mandatory_violations(doc) == []
    # What `make preview STACK=tencent` runs.
    proc = subprocess.run([sys.executable, "-m", "infra.preview", "--stack", "tencent", "--format", "table"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("Stack tencent (tencent, ap-shanghai): partition gpu 0-4 x GN10Xp.20XLARGE320")
    assert "Cost per month in CNY" in proc.stdout
