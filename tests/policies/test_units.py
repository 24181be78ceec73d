"""Direct tests of the pure derivations behind the policies (no pack process)."""
from __future__ import annotations

import json

import pytest
from pulumi_policy import PolicyResourceOptions, PolicyCustomTimeouts, ResourceValidationArgs
from pulumi_policy.proxy import UNKNOWN_STRING_VALUE, UnknownValueError, unknown_checking_proxy

from infra.catalog import CATALOG
from infra.preview.analyzer import reconcile
from policies import all_policies
from policies.aws_data import denies_insecure_transport
from policies.aws_ec2 import metadata_gaps
from policies.aws_iam import is_write, launch_gaps
from policies.aws_s3 import tls_gaps
from policies.common import UNKNOWN, aws_managed_key, flag, get, plain, type_chain
from policies.compliance import HIPAA_CONTROLLER_ELIGIBLE, HIPAA_ELIGIBLE
from policies.azure_rules import placement_problems
from policies.common import Resource, Stack
from policies.gpu import efa_layout_problems, monthly_max_usd
from policies.tencent_rules import cam_launch_gaps, single_client, tag_condition, world_client
from tests.policies.fixtures import FS_ARN, efa_interfaces, efs_policy, launch_statements, tls_policy


def test_plain_turns_unknowns_into_a_marker_instead_of_raising():
    proxied = unknown_checking_proxy({"a": {"b": UNKNOWN_STRING_VALUE, "c": [1, UNKNOWN_STRING_VALUE]}, "d": "x"})
    with pytest.raises(UnknownValueError):
        proxied["a"]["b"]
    assert plain(proxied) == {"a": {"b": UNKNOWN, "c": [1, UNKNOWN]}, "d": "x"}
    assert get(plain(proxied), "a", "b", "deeper") is UNKNOWN
    assert get({"a": None}, "a", "b", default=7) == 7


@pytest.mark.parametrize("value, expected", [
    (True, True), ("true", True), ("True", True), (False, False), ("false", False),
    (None, None), (UNKNOWN, None), ("yes", None), (1, None)])
def test_flag_reads_booleans_sent_as_strings(value, expected):
    assert flag(value) is expected


@pytest.mark.parametrize("instance_type, cards", [("p5.48xlarge", 32), ("p5en.48xlarge", 16), ("p4d.24xlarge", 4),
                                                   ("g6e.24xlarge", 2)])
def test_full_efa_set_one_per_card_passes(instance_type, cards):
    assert CATALOG[instance_type].max_efa == cards
    assert efa_layout_problems(instance_type, efa_interfaces(cards, "sg")) == []


def test_single_card_efa_as_primary_passes():
    nics = [{"deviceIndex": 0, "networkCardIndex": 0, "interfaceType": "efa"}]
    assert efa_layout_problems("g5.8xlarge", nics) == []


def test_efa_layout_problems():
    assert efa_layout_problems("p5.48xlarge", efa_interfaces(8, "sg")) == [
        "8 EFA interface(s) for p5.48xlarge, which has 32: attach all or none"]
    assert efa_layout_problems("g6.xlarge", efa_interfaces(1, "sg")) == [
        "g6.xlarge supports no EFA but the template attaches 1 EFA interface(s)"]
    moved = efa_interfaces(4, "sg")
    moved[4]["networkCardIndex"] = 2
    problems = efa_layout_problems("p4d.24xlarge", moved)
    assert problems[0].startswith("EFA interfaces must take network cards 0..3 once each, got [0, 1, 2, 2]")
    assert problems[1] == "two interfaces share a network card and device index"
    no_primary = [n for n in efa_interfaces(4, "sg") if n["interfaceType"] != "interface"]
    assert efa_layout_problems("p4d.24xlarge", no_primary) == ["no primary interface (network card 0, device index 0)"]
    assert efa_layout_problems("p5.48xlarge", efa_interfaces(0, "sg")) == []   # none is allowed
    assert efa_layout_problems("x9.unknown", efa_interfaces(2, "sg")) == []     # not in the catalog: no opinion


def test_tls_gaps():
    assert tls_gaps(json.loads(tls_policy("b"))) == []
    only_transport = {"Statement": [json.loads(tls_policy("b"))["Statement"][0]]}
    assert tls_gaps(only_transport) == ["a Deny of s3:* when s3:TlsVersion is less than 1.2"]
    allow_instead = {"Statement": [{**s, "Effect": "Allow"} for s in json.loads(tls_policy("b"))["Statement"]]}
    assert len(tls_gaps(allow_instead)) == 2
    assert len(tls_gaps(None)) == 2


@pytest.mark.parametrize("action, write", [
    ("s3:GetObject", False), ("ec2:Describe*", False), ("sqs:ReceiveMessage", True), ("s3:PutObject", True),
    ("cloudwatch:PutMetricData", True), ("dynamodb:BatchGetItem", False), ("s3:*", True), ("*", True)])
def test_write_actions(action, write):
    assert is_write(action) is write


def test_monthly_max_prices_the_dearest_type_at_max_size():
    assert monthly_max_usd(["p5.48xlarge"], 4, spot=False) == pytest.approx(55.04 * 4 * 730)
    assert monthly_max_usd(["g6.xlarge", "g5.xlarge"], 2, spot=True) == pytest.approx(
        CATALOG["g5.xlarge"].spot_price_hour * 2 * 730)
    assert monthly_max_usd(["unknown"], 9, spot=False) == 0


def test_monthly_max_prices_on_demand_base_nodes_on_demand():
    on_demand, spot = CATALOG["g5.xlarge"].price_hour, CATALOG["g5.xlarge"].spot_price_hour
    assert monthly_max_usd(["g6.xlarge", "g5.xlarge"], 8, spot=True, on_demand_base=3) == pytest.approx(
        (3 * on_demand + 5 * spot) * 730)
    assert monthly_max_usd(["g5.xlarge"], 2, spot=True, on_demand_base=5) == pytest.approx(2 * on_demand * 730)
    assert monthly_max_usd(["g5.xlarge"], 2, spot=False, on_demand_base=0) == pytest.approx(2 * on_demand * 730)


def test_hipaa_default_list_is_the_datacenter_training_gpus():
    assert "p5.48xlarge" in HIPAA_ELIGIBLE and "Standard_ND96isr_H100_v5" in HIPAA_ELIGIBLE
    assert not {"g5.xlarge", "g6.xlarge", "g6e.48xlarge"} & set(HIPAA_ELIGIBLE)
    assert HIPAA_CONTROLLER_ELIGIBLE[0] == "m6i.large" and not set(HIPAA_CONTROLLER_ELIGIBLE) & set(HIPAA_ELIGIBLE)


def test_type_chain_and_aws_managed_keys():
    assert type_chain("urn:pulumi:dev::gpufleet::gpufleet:aws:Controller$aws:ec2/instance:Instance::c") == [
        "gpufleet:aws:Controller", "aws:ec2/instance:Instance"]
    assert type_chain("not a urn") == []
    assert aws_managed_key("alias/aws/secretsmanager")
    assert aws_managed_key("arn:aws:kms:eu-west-1:123456789012:alias/aws/ebs")
    assert not aws_managed_key("arn:aws:kms:eu-west-1:123456789012:key/2ea3ad1a")
    assert not aws_managed_key("alias/gpufleet-dev") and not aws_managed_key(None)


def test_metadata_gaps():
    assert metadata_gaps({"httpTokens": "required", "httpPutResponseHopLimit": 1}) == []
    assert metadata_gaps({"httpEndpoint": "disabled"}) == [] and metadata_gaps(UNKNOWN) == []
    assert metadata_gaps({"httpTokens": "optional", "httpPutResponseHopLimit": 2.0}) == [
        "metadataOptions.httpTokens is optional, not 'required' (IMDSv1 allowed)",
        "metadataOptions.httpPutResponseHopLimit is 2, not 1"]
    assert metadata_gaps(None) == ["metadataOptions.httpTokens is unset, not 'required' (IMDSv1 allowed)",
                                   "metadataOptions.httpPutResponseHopLimit is unset, not 1"]


def _with(index: int, **fields) -> dict:
    statement = launch_statements("dev")[index]
    return {k: v for k, v in {**statement, **fields}.items() if v is not None}


def test_the_controllers_launch_rights_are_bounded():
    assert [gap for st in launch_statements("dev") for gap in launch_gaps(st)] == []


@pytest.mark.parametrize("statement, gaps", [
    (_with(0, Condition={"StringEquals": {"aws:RequestTag/gpufleet-stack": "dev"}}),
     ["ec2:RunInstances and ec2:CreateFleet on instances without an ArnEquals ec2:LaunchTemplate condition naming "
      "the stack's launch templates"]),
    (_with(0, Condition={"ArnEquals": {"ec2:LaunchTemplate": "arn:aws:ec2:eu-north-1:1:launch-template/lt-1"},
                         "StringEqualsIfExists": {"aws:RequestTag/gpufleet-stack": "dev"}}),
     ["ec2:RunInstances and ec2:CreateFleet on instances without a StringEquals aws:RequestTag/gpufleet-stack "
      "condition"]),
    (_with(0, Action="ec2:RunInstances", Condition={"ArnLike": {"ec2:LaunchTemplate": "arn:aws:ec2:*"},
                                                    "StringEquals": {"aws:RequestTag/gpufleet-stack": "dev"}}),
     ["ec2:RunInstances on instances without an ArnEquals ec2:LaunchTemplate condition naming the stack's launch "
      "templates"]),
    (_with(0, Resource=None, NotResource="arn:aws:ec2:*:*:volume/*", Condition=None),
     ["ec2:RunInstances and ec2:CreateFleet on instances without an ArnEquals ec2:LaunchTemplate condition naming "
      "the stack's launch templates",
      "ec2:RunInstances and ec2:CreateFleet on instances without a StringEquals aws:RequestTag/gpufleet-stack "
      "condition"]),
    (_with(1, Condition=None), []),   # volumes and interfaces: not instances
    ({"Effect": "Allow", "NotAction": "iam:*", "Resource": "arn:aws:ec2:eu-north-1:1:instance/i-0fixed"}, []),
    (_with(4, Condition={"StringEquals": {"ec2:ResourceTag/team": "ml"}}),
     ["ec2:TerminateInstances without a StringEquals ec2:ResourceTag/gpufleet-stack condition"]),
    (_with(5, Resource="arn:aws:iam::123456789012:role/gpufleet-*"),
     ["iam:PassRole on arn:aws:iam::123456789012:role/gpufleet-*, not named role ARNs"]),
    (_with(5, Condition={"StringLike": {"iam:PassedToService": "*"}}),
     ["iam:PassRole without a StringEquals iam:PassedToService condition"]),
    ({"Effect": "Allow", "Action": "*", "Resource": "*"},
     ["ec2:RunInstances and ec2:CreateFleet on instances without an ArnEquals ec2:LaunchTemplate condition naming "
      "the stack's launch templates",
      "ec2:RunInstances and ec2:CreateFleet on instances without a StringEquals aws:RequestTag/gpufleet-stack "
      "condition",
      "ec2:TerminateInstances without a StringEquals ec2:ResourceTag/gpufleet-stack condition",
      "iam:PassRole on *, not named role ARNs", "iam:PassRole without a StringEquals iam:PassedToService condition"]),
])
def test_launch_gaps(statement, gaps):
    assert launch_gaps(statement) == gaps


def test_efs_policy_denies_insecure_transport():
    assert denies_insecure_transport(json.loads(efs_policy()))
    deny = json.loads(efs_policy())["Statement"][0]
    assert denies_insecure_transport({"Statement": {**deny, "Principal": "*"}})
    assert denies_insecure_transport({"Statement": [{**deny, "Action": [
        "elasticfilesystem:ClientMount", "elasticfilesystem:ClientWrite", "elasticfilesystem:ClientRootAccess"]}]})
    assert not denies_insecure_transport({"Statement": [{**deny, "Effect": "Allow"}]})
    assert not denies_insecure_transport({"Statement": [{**deny, "Principal": {"AWS": "arn:aws:iam::1:root"}}]})
    assert not denies_insecure_transport({"Statement": [{**deny, "Action": "elasticfilesystem:ClientMount"}]})
    assert not denies_insecure_transport({"Statement": [{**deny, "Condition": {
        "Bool": {"aws:SecureTransport": "true"}}}]})
    assert not denies_insecure_transport(None) and FS_ARN in json.dumps(deny)


def test_reconcile_applies_defaults_then_all_then_each_policy():
    policies = [{"name": "a", "level": "mandatory", "config_schema": {"n": {"type": "integer", "default": 3}},
                 "required": []},
                {"name": "b", "level": "advisory", "config_schema": {}, "required": []}]
    assert reconcile(policies, {}, {}) == {"a": {"enforcementLevel": "mandatory", "n": 3},
                                           "b": {"enforcementLevel": "advisory"}}
    merged = reconcile(policies, {}, {"all": "advisory", "a": {"n": 5}, "b": "mandatory"})
    assert merged == {"a": {"enforcementLevel": "advisory", "n": 5}, "b": {"enforcementLevel": "mandatory"}}


def _args(resource_type: str, props: dict) -> ResourceValidationArgs:
    opts = PolicyResourceOptions(False, [], None, [], PolicyCustomTimeouts(0, 0, 0), [])
    return ResourceValidationArgs(resource_type, unknown_checking_proxy(props), "urn:x", "x", opts, None)


def test_direct_validate_with_launch_template_strings():
    policy = next(p for p in all_policies() if p.name == "aws-ec2-launchtemplate-no-public-ip")
    reported = []
    nics = [{"deviceIndex": 0, "associatePublicIpAddress": "true"}, {"deviceIndex": 1, "associatePublicIpAddress": "false"}]
    policy.validate(_args("aws:ec2/launchTemplate:LaunchTemplate", {"networkInterfaces": nics}),
                    lambda message, urn=None: reported.append(message))
    assert reported == ["network interface 0 (device 0) associates a public IP address"]
    reported.clear()
    policy.validate(_args("aws:ec2/instance:Instance", {"associatePublicIpAddress": True}),
                    lambda message, urn=None: reported.append(message))
    assert reported == []   # another type: not this policy's business


# --- Azure: where a partition's VMs go -------------------------------------------------------------------------------

def _azure_partition(children: list[tuple[str, dict]], **props) -> Stack:
    part = Resource(type="gpufleet:azure:Partition", name="partition-big", urn="urn:p", props={
        "partition": "big", "vmSize": "Standard_ND96isr_H100_v5", "maxNodes": 4, "gang": True, "spot": False,
        **props})
    kids = [Resource(type=f"azure-native:compute:{kind}", name=f"child-{i}", urn=f"urn:c{i}", props=values,
                     parent="urn:p") for i, (kind, values) in enumerate(children)]
    return Stack([part, *kids])


AVSET = ("AvailabilitySet", {"platformFaultDomainCount": 1, "sku": {"name": "Aligned"}})
FLEX = ("VirtualMachineScaleSet", {"orchestrationMode": "Flexible", "platformFaultDomainCount": 1})


def test_a_multi_node_gang_shares_one_aligned_availability_set():
    stack = _azure_partition([AVSET])
    assert placement_problems(stack, stack.resources[0]) == []


def test_infiniband_comes_from_the_catalog_when_the_property_is_missing():
    stack = _azure_partition([FLEX])     # no infiniband property: the H100 size has InfiniBand
    assert placement_problems(stack, stack.resources[0]) == [
        "multi-node InfiniBand gang partition 'big' puts its VMs in scale set(s) child-0: Flexible scale sets have "
        "no InfiniBand", "multi-node InfiniBand gang partition 'big' has no availability set"]


def test_a_gang_without_infiniband_is_judged_as_a_queue_partition():
    stack = _azure_partition([FLEX], infiniband=False)
    assert placement_problems(stack, stack.resources[0]) == []


def test_availability_set_limits():
    stack = _azure_partition([("AvailabilitySet", {"platformFaultDomainCount": 3, "sku": {"name": "Classic"}})],
                             spot=True, maxNodes=250)
    assert placement_problems(stack, stack.resources[0]) == [
        "availability set 'child-0' of partition 'big': platformFaultDomainCount 3, not 1",
        "availability set 'child-0' of partition 'big': sku Classic, not Aligned (managed disks)",
        "multi-node InfiniBand gang partition 'big' runs spot VMs, which an availability set does not take",
        "multi-node InfiniBand gang partition 'big' can reach 250 VMs; an availability set holds at most 200"]


def test_a_queue_partition_needs_one_flexible_scale_set():
    stack = _azure_partition([("VirtualMachineScaleSet", {"platformFaultDomainCount": 1})], gang=False)
    assert placement_problems(stack, stack.resources[0]) == [
        "scale set 'child-0' of partition 'big': Uniform (unset) orchestration, not Flexible"]
    alone = _azure_partition([], gang=False)
    assert placement_problems(alone, alone.resources[0]) == ["partition 'big' has no scale set for its VMs to join"]


# --- Tencent: CFS clients, CAM launch rights -------------------------------------------------------------------------

@pytest.mark.parametrize("address, world, single", [
    ("*", True, False), ("0.0.0.0/0", True, False), ("10.0.0.0/0", True, False), ("10.72.0.0/20", False, False),
    ("10.72.240.10", False, True), ("10.72.240.10/32", False, True), ("not-an-address", False, False)])
def test_cfs_client_addresses(address, world, single):
    assert (world_client(address), single_client(address)) == (world, single)


def test_cam_launch_gaps():
    run = {"effect": "allow", "action": ["name/cvm:RunInstances"], "resource": ["qcs::cvm:r:uin/1:instance/*"],
           "condition": {"for_any_value:string_equal": {"qcs:request_tag": ["gpufleet-stack&dev"]}}}
    assert cam_launch_gaps(run) == []
    assert tag_condition(run, "qcs:request_tag") == ["gpufleet-stack&dev"]
    assert tag_condition({**run, "condition": {"string_like": {"qcs:request_tag": "gpufleet-stack&*"}}},
                         "qcs:request_tag") == []
    everything = {"effect": "allow", "action": ["*"], "resource": ["*"]}
    assert cam_launch_gaps(everything) == [
        "cvm:RunInstances without a string_equal qcs:request_tag condition on gpufleet-stack&<stack>",
        "cvm:TerminateInstances without a string_equal qcs:resource_tag condition on gpufleet-stack&<stack>",
        "cam:PassRole on *, not named roles"]
    assert cam_launch_gaps({**everything, "effect": "deny"}) == []


CONTAINER = ("/subscriptions/s/resourceGroups/rg/providers/Microsoft.Storage/storageAccounts/a/blobServices/default/"
             "containers/checkpoints")


@pytest.mark.parametrize("props, flagged", [
    ({"principalType": "Group", "scope": CONTAINER}, True),                   # a team's people on every prefix
    ({"principalType": "User", "scope": CONTAINER, "condition": ""}, True),
    ({"principalType": "Group", "scope": CONTAINER, "condition": "(@Request[x] StringStartsWith 'teams/a/')"}, False),
    ({"principalType": "ServicePrincipal", "scope": CONTAINER}, False),      # the machines' own identities
    ({"principalType": "Group", "scope": CONTAINER.rsplit("/blobServices", 1)[0] + "/queueServices/default/queues/jobs"},
     False),                                                                 # a queue: a team's own already
    ({"principalType": "Group", "scope": CONTAINER, "condition": UNKNOWN}, False),  # known at apply
])
def test_a_teams_people_on_the_container_are_held_to_its_prefix(props, flagged):
    from policies.azure_rules import check_people_on_a_container_conditioned

    found = list(check_people_on_a_container_conditioned(props, None))
    assert bool(found) == flagged and all("no condition holding it to a team's prefix" in f for f in found)
