"""Diff semantics of two preview documents: no-op, property change, add/remove, rename, replacement."""
from __future__ import annotations

import copy
import importlib
import inspect
import json
import re
from pathlib import Path

import pytest

from infra.preview import diff

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def base() -> dict:
    return json.loads((FIXTURES / "dev_base.json").read_text())


def _find(doc: dict, rtype: str, name: str) -> dict:
    return next(r for r in doc["resources"] if r["type"] == rtype and r["name"] == name)


def _only_change(result: dict) -> dict:
    assert len(result["changed"]) == 1, result["changed"]
    return result["changed"][0]


def test_stack_against_itself_is_empty(base):
    result = diff.compute(base, copy.deepcopy(base))
    assert result["added"] == result["removed"] == result["renamed"] == result["changed"] == []
    assert result["policy"] == {"appeared": [], "disappeared": []}
    assert result["cost"] == {"delta_monthly_usd": {"idle": 0.0, "full": 0.0}, "currency": "USD"}
    assert diff.is_empty(result)


def test_reformatted_json_document_is_no_change(base):
    head = copy.deepcopy(base)
    pol = _find(head, "aws:s3/bucketPolicy:BucketPolicy", "dev-checkpoints-policy")
    pol["inputs"]["policy"] = json.dumps(json.loads(pol["inputs"]["policy"]), indent=4, sort_keys=True)
    assert diff.is_empty(diff.compute(base, head))


def test_tag_change_is_an_update_with_its_path_and_values(base):
    head = copy.deepcopy(base)
    _find(head, "aws:s3/bucket:Bucket", "dev-checkpoints")["inputs"]["tags"]["team"] = "research-infra"
    change = _only_change(diff.compute(base, head))
    assert change["urn"].endswith("aws:s3/bucket:Bucket::dev-checkpoints")
    assert change["paths"] == ["tags.team"]
    assert change["values"] == {"tags.team": {"old": "ml-platform", "new": "research-infra"}}
    assert change["replace"] is False and change["replace_paths"] == []
    assert not diff.is_empty(diff.compute(base, head))


def test_list_element_paths_carry_the_index(base):
    head = copy.deepcopy(base)
    lt = _find(head, "aws:ec2/launchTemplate:LaunchTemplate", "dev-nodes")
    lt["inputs"]["networkInterfaces"] += [{"deviceIndex": 1, "networkCardIndex": 1, "interfaceType": "efa"}]
    lt["inputs"]["networkInterfaces"][0]["interfaceType"] = "efa"
    change = _only_change(diff.compute(base, head))
    assert change["paths"] == ["networkInterfaces[0].interfaceType", "networkInterfaces[1]"]
    assert change["values"]["networkInterfaces[1]"]["old"] is None


def test_key_value_lists_are_matched_by_key_not_position(base):
    head = copy.deepcopy(base)
    base = copy.deepcopy(base)
    tags = [{"key": "team", "value": "ml", "propagateAtLaunch": True},
            {"key": "env", "value": "dev", "propagateAtLaunch": True}]
    _find(base, "aws:autoscaling/group:Group", "dev-nodes")["inputs"]["tags"] = tags
    _find(head, "aws:autoscaling/group:Group", "dev-nodes")["inputs"]["tags"] = [
        {**tags[1], "value": "test"}, tags[0], {"key": "owner", "value": "ops", "propagateAtLaunch": True}]
    change = _only_change(diff.compute(base, head))
    assert change["paths"] == ["tags[key=env].value", "tags[key=owner]"]
    assert change["values"]["tags[key=env].value"] == {"old": "dev", "new": "test"}


def test_instance_type_on_a_launch_template_is_an_update(base):
    head = copy.deepcopy(base)
    _find(head, "aws:ec2/launchTemplate:LaunchTemplate", "dev-nodes")["inputs"]["instanceType"] = "p5.48xlarge"
    change = _only_change(diff.compute(base, head))
    assert (change["paths"], change["replace"]) == (["instanceType"], False)


@pytest.mark.parametrize("rtype,name,path,value", [
    ("aws:s3/bucket:Bucket", "dev-checkpoints", "bucket", "gpufleet-dev-checkpoints"),
    ("aws:ec2/vpc:Vpc", "dev-vpc", "cidrBlock", "10.30.0.0/16"),
    ("aws:ec2/subnet:Subnet", "dev-private-a", "availabilityZone", "eu-west-1b"),
    ("aws:kms/key:Key", "dev-key", "customerMasterKeySpec", "RSA_4096"),
    ("aws:sqs/queue:Queue", "dev-jobs", "fifoQueue", True),
])
def test_replace_causing_property_marks_a_replacement(base, rtype, name, path, value):
    head = copy.deepcopy(base)
    res = _find(head, rtype, name)
    res["inputs"][path] = value
    res["inputs"]["tags"] = {**res["inputs"]["tags"], "team": "other"}
    change = _only_change(diff.compute(base, head))
    assert change["replace"] is True
    assert change["replace_paths"] == [path]
    assert set(change["paths"]) == {path, "tags.team"}


def test_replace_table_for_azure_vnet_and_nested_paths():
    vnet = "azure-native:network:VirtualNetwork"
    assert diff.replace_paths(vnet, ["addressSpace.addressPrefixes[0]", "tags.team"]) == \
        ["addressSpace.addressPrefixes[0]"]
    assert diff.replace_paths(vnet, ["location"]) == ["location"]  # every azure-native resource
    assert diff.replace_paths("aws:ec2/vpc:Vpc", ["location"]) == []
    # a path that merely starts with the same letters is not under the property
    assert diff.replace_paths("aws:s3/bucket:Bucket", ["bucketPrefixes"]) == []


def _sdk_class(token: str):
    """The SDK class of a type token: aws:s3/bucket:Bucket -> pulumi_aws.s3.Bucket,
    tencentcloud:As/scalingGroup:ScalingGroup -> tencentcloud_iac_pulumi.as_.ScalingGroup."""
    package, module, name = token.split(":")
    sdk = {"aws": "pulumi_aws", "azure-native": "pulumi_azure_native", "tencentcloud": "tencentcloud_iac_pulumi"}[package]
    module = module.split("/")[0]
    if package == "tencentcloud":
        module = "as_" if module == "As" else module.lower()
    return getattr(importlib.import_module(f"{sdk}.{module}"), name)


@pytest.mark.parametrize("token", sorted(diff.REPLACE_ON))
def test_replace_table_names_real_provider_types_and_inputs(token):
    cls = _sdk_class(token)
    assert cls.pulumi_type == token
    args = inspect.signature(cls._internal_init).parameters  # every input, as a keyword
    for prop in diff.REPLACE_ON[token]:
        if prop == diff.ANY:  # every input replaces
            continue
        top = prop.split(".")[0]
        snake = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<!^)(?=[A-Z][a-z])", "_", top).lower()  # publicIPAddress...
        assert snake in args, prop


def test_add_and_remove(base):
    head = copy.deepcopy(base)
    alarm = _find(head, "aws:cloudwatch/metricAlarm:MetricAlarm", "dev-dlq-not-empty")
    head["resources"].remove(alarm)
    new = copy.deepcopy(alarm)
    new["name"], new["urn"] = "dev-old-jobs", alarm["urn"].replace("dev-dlq-not-empty", "dev-old-jobs")
    new["inputs"]["metricName"] = "ApproximateAgeOfOldestMessage"
    head["resources"].append(new)
    result = diff.compute(base, head)
    assert [r["name"] for r in result["added"]] == ["dev-old-jobs"]
    assert [r["name"] for r in result["removed"]] == ["dev-dlq-not-empty"]
    assert result["renamed"] == [] and result["changed"] == []
    assert result["summary"]["added"] == result["summary"]["removed"] == 1


def test_same_inputs_under_a_new_name_is_a_rename(base):
    head = copy.deepcopy(base)
    logs = _find(head, "aws:cloudwatch/logGroup:LogGroup", "dev-logs")
    old_urn = logs["urn"]
    logs["name"], logs["urn"] = "dev-log-group", old_urn.replace("::dev-logs", "::dev-log-group")
    result = diff.compute(base, head)
    assert result["renamed"] == [{"from": old_urn, "to": logs["urn"], "type": "aws:cloudwatch/logGroup:LogGroup"}]
    assert result["added"] == result["removed"] == []


def test_rename_follows_a_renamed_parent_component(base):
    head = copy.deepcopy(base)
    comp = _find(head, "gpufleet:aws:Queue", "dev-queue")
    old_comp = comp["urn"]
    comp["name"], comp["urn"] = "dev-jobqueue", old_comp.replace("::dev-queue", "::dev-jobqueue")
    for res in head["resources"]:
        if res["parent"] == old_comp:
            res["parent"] = comp["urn"]
            res["name"] = res["name"].replace("dev-jobs", "dev-work")
            res["urn"] = res["urn"].replace("dev-jobs", "dev-work")
    result = diff.compute(base, head)
    assert {(r["from"].rsplit("::", 1)[1], r["to"].rsplit("::", 1)[1]) for r in result["renamed"]} == {
        ("dev-queue", "dev-jobqueue"), ("dev-jobs", "dev-work"), ("dev-jobs-dlq", "dev-work-dlq")}
    assert result["added"] == result["removed"] == []


def test_changed_inputs_under_a_new_name_is_add_and_remove(base):
    head = copy.deepcopy(base)
    logs = _find(head, "aws:cloudwatch/logGroup:LogGroup", "dev-logs")
    logs["name"], logs["urn"] = "dev-log-group", logs["urn"].replace("::dev-logs", "::dev-log-group")
    logs["inputs"]["retentionInDays"] = 90
    result = diff.compute(base, head)
    assert result["renamed"] == []
    assert [r["name"] for r in result["added"]] == ["dev-log-group"]
    assert [r["name"] for r in result["removed"]] == ["dev-logs"]


def test_changes_inside_a_json_policy_document(base):
    head = copy.deepcopy(base)
    pol = _find(head, "aws:s3/bucketPolicy:BucketPolicy", "dev-checkpoints-policy")
    doc = json.loads(pol["inputs"]["policy"])
    doc["Statement"][0]["Effect"] = "Allow"
    pol["inputs"]["policy"] = json.dumps(doc)
    change = _only_change(diff.compute(base, head))
    assert change["values"] == {"policy.Statement[0].Effect": {"old": "Deny", "new": "Allow"}}


def test_secret_values_are_masked(base):
    head = copy.deepcopy(base)
    base = copy.deepcopy(base)
    lt_base = _find(base, "aws:ec2/launchTemplate:LaunchTemplate", "dev-nodes")["inputs"]
    lt_head = _find(head, "aws:ec2/launchTemplate:LaunchTemplate", "dev-nodes")["inputs"]
    lt_base.update({"adminPassword": "hunter2", "keyName": "ops", "userData": "[secret]",
                    "sealed": {"4dabf18193072939515e22adb298388d": "1b47061264138c4ac30d75fd1eb44270", "value": "a"}})
    lt_head.update({"adminPassword": "correct-horse", "keyName": "ops2", "userData": "#cloud-config",
                    "sealed": {"4dabf18193072939515e22adb298388d": "1b47061264138c4ac30d75fd1eb44270", "value": "b"}})
    change = _only_change(diff.compute(base, head))
    assert change["paths"] == ["adminPassword", "keyName", "sealed", "userData"]
    assert change["values"]["adminPassword"] == change["values"]["sealed"] == change["values"]["userData"] == \
        {"old": "[secret]", "new": "[secret]"}
    assert change["values"]["keyName"] == {"old": "ops", "new": "ops2"}
    text = json.dumps(change)
    assert "hunter2" not in text and "correct-horse" not in text and "#cloud-config" not in text


def test_secrets_inside_an_added_element_are_masked(base):
    head = copy.deepcopy(base)
    lt = _find(head, "aws:ec2/launchTemplate:LaunchTemplate", "dev-nodes")
    lt["inputs"]["networkInterfaces"].append({"deviceIndex": 1, "authToken": "s3cr3t", "inner": "[secret]"})
    change = _only_change(diff.compute(base, head))
    assert change["values"]["networkInterfaces[1]"]["new"] == {"deviceIndex": 1, "authToken": "[secret]",
                                                               "inner": "[secret]"}


def test_keys_that_are_not_identifiers_are_quoted_in_paths(base):
    head = copy.deepcopy(base)
    _find(head, "aws:s3/bucket:Bucket", "dev-checkpoints")["inputs"]["tags"]["owner team"] = "ml"
    assert _only_change(diff.compute(base, head))["paths"] == ['tags["owner team"]']


def test_policy_verdicts_that_appear_and_disappear(base):
    head = copy.deepcopy(base)
    old = head["policy"]["violations"].pop()
    new = {"policy": "aws-s3-bucket-public-access-block", "level": "mandatory", "severity": "high",
           "urn": _find(head, "aws:s3/bucket:Bucket", "dev-checkpoints")["urn"], "message": "no public access block"}
    head["policy"]["violations"].append(new)
    result = diff.compute(base, head)
    assert result["policy"] == {"appeared": [new], "disappeared": [old]}
    assert (result["summary"]["policy_appeared"], result["summary"]["policy_disappeared"]) == (1, 1)


def test_cost_delta_is_head_minus_base(base):
    head = copy.deepcopy(base)
    head["cost"]["monthly_usd"] = {"idle": 297.48, "full": 1410.92}
    base["cost"]["monthly_usd"] = {"idle": 1.0, "full": 940.95}
    assert diff.compute(base, head)["cost"]["delta_monthly_usd"] == {"idle": 296.48, "full": 469.97}
    assert diff.compute(head, base)["cost"]["delta_monthly_usd"] == {"idle": -296.48, "full": -469.97}


def test_a_base_from_before_the_slurm_cost_model_counts_as_zero(base):
    """A base preview written before this model has min/desired/max: its idle and full count 0 (no crash),
    so the delta is the head's whole cost."""
    head = copy.deepcopy(base)
    base["cost"] = {"currency": "USD", "monthly_usd": {"min": 179.2, "desired": 179.2, "max": 1183.15}}
    result = diff.compute(base, head)
    assert result["cost"]["delta_monthly_usd"] == {"idle": 297.48, "full": 1301.43}
    assert not diff.is_empty(result)
    # nor does a base (or head) with no cost at all, or with null amounts
    assert diff.compute({"resources": []}, head)["cost"]["delta_monthly_usd"] == {"idle": 297.48, "full": 1301.43}
    assert diff.compute(head, {"cost": {"monthly_usd": None}})["cost"]["delta_monthly_usd"] == \
        {"idle": -297.48, "full": -1301.43}
    assert diff.compute({"cost": {"monthly_usd": {"idle": None}}}, head)["cost"]["delta_monthly_usd"]["idle"] == 297.48


def test_cost_delta_is_in_the_currency_of_the_head(base):
    head = copy.deepcopy(base)
    head["cost"]["currency"] = "CNY"
    assert diff.compute(base, head)["cost"]["currency"] == "CNY"
    assert diff.compute({}, {})["cost"] == {"delta_monthly_usd": {"idle": 0.0, "full": 0.0}, "currency": "USD"}


def test_fixture_pair_summary():
    base = json.loads((FIXTURES / "dev_base.json").read_text())
    head = json.loads((FIXTURES / "dev_head.json").read_text())
    assert diff.compute(base, head)["summary"] == {
        "added": 1, "removed": 1, "renamed": 1, "updated": 4, "replaced": 1,
        "policy_appeared": 2, "policy_disappeared": 1}
