"""Direct tests of the pure derivations behind the policies (no pack process)."""
from __future__ import annotations

import json

import pytest
from pulumi_policy import PolicyResourceOptions, PolicyCustomTimeouts, ResourceValidationArgs
from pulumi_policy.proxy import UNKNOWN_STRING_VALUE, UnknownValueError, unknown_checking_proxy

from infra.catalog import CATALOG
from infra.preview.analyzer import reconcile
from policies import all_policies
from policies.aws_iam import is_write
from policies.aws_s3 import tls_gaps
from policies.common import UNKNOWN, flag, get, plain
from policies.compliance import HIPAA_ELIGIBLE
from policies.gpu import efa_layout_problems, monthly_max_usd
from tests.policies.fixtures import efa_interfaces, tls_policy


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


def test_hipaa_default_list_is_the_datacenter_training_gpus():
    assert "p5.48xlarge" in HIPAA_ELIGIBLE and "Standard_ND96isr_H100_v5" in HIPAA_ELIGIBLE
    assert not {"g5.xlarge", "g6.xlarge", "g6e.48xlarge"} & set(HIPAA_ELIGIBLE)


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
