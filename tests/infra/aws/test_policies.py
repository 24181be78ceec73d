"""Policy documents and IAM names (pure)."""
import re
from pathlib import Path

import pytest

from infra.aws import policies, registry
from infra.aws.stack import role_suffix
from tests.infra.aws.harness import assert_autoscaling_ebs_grants, assert_least_privilege

BUCKET = "arn:aws:s3:::gpufleet-dev-data-abc"
KEY = "arn:aws:kms:eu-west-1:123456789012:key/k"
QUEUE = "arn:aws:sqs:eu-west-1:123456789012:jobs"
DLQ = "arn:aws:sqs:eu-west-1:123456789012:jobs-dlq"
PARAMETERS = policies.parameters_arn("eu-west-1", "123456789012", "/gpufleet/dev/")
ASG = policies.asg_arn("eu-west-1", "123456789012", "gpufleet-dev-nodes")
LOGS = "arn:aws:logs:eu-west-1:123456789012:log-group:/gpufleet/dev"
FLOW_LOGS = "arn:aws:logs:eu-west-1:123456789012:log-group:/gpufleet/dev/vpc-flow-logs"
SLR = ("arn:aws:iam::123456789012:role/aws-service-role/autoscaling.amazonaws.com/"
       "AWSServiceRoleForAutoScaling_gpufleet-dev")


def node_policy() -> dict:
    return policies.node_policy(BUCKET, KEY, QUEUE, DLQ, ASG, LOGS, PARAMETERS, "gpufleet/dev")


def test_node_policy_is_least_privilege_and_scoped():
    doc = node_policy()
    assert_least_privilege(doc, "gpufleet/dev")
    resources = {r for st in doc["Statement"] for r in
                 (st["Resource"] if isinstance(st["Resource"], list) else [st["Resource"]])}
    assert resources == {BUCKET, f"{BUCKET}/*", KEY, QUEUE, DLQ, ASG, LOGS, f"{LOGS}:*", PARAMETERS, "*"}
    assert PARAMETERS == "arn:aws:ssm:eu-west-1:123456789012:parameter/gpufleet/dev/*"
    on_dlq = {a for st in doc["Statement"] if st["Resource"] == DLQ for a in st["Action"]}
    assert on_dlq == {"sqs:GetQueueUrl", "sqs:SendMessage"}  # the node puts jobs there; it never reads them
    on_queue = {a for st in doc["Statement"] if st["Resource"] == QUEUE for a in st["Action"]}
    assert "sqs:SendMessage" in on_queue  # a hand-back sends the job back as a fresh message
    assert ASG == "arn:aws:autoscaling:eu-west-1:123456789012:autoScalingGroup:*:autoScalingGroupName/gpufleet-dev-nodes"


def test_least_privilege_check_rejects_wildcards():
    bad = {"Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": BUCKET}]}
    with pytest.raises(AssertionError):
        assert_least_privilege(bad, "x")
    bad = {"Statement": [{"Effect": "Allow", "Action": "cloudwatch:PutMetricData", "Resource": "*", "Condition": {}}]}
    with pytest.raises(AssertionError):
        assert_least_privilege(bad, "x")


def test_bucket_policy_denies_plain_http_and_old_tls():
    doc = policies.bucket_policy(BUCKET)
    by_sid = {st["Sid"]: st for st in doc["Statement"]}
    plain = by_sid["DenyInsecureTransport"]
    assert plain["Effect"] == "Deny" and plain["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    tls = by_sid["DenyTlsBelow12"]
    assert tls["Effect"] == "Deny" and tls["Condition"] == {"NumericLessThan": {"s3:TlsVersion": "1.2"}}
    for st in (plain, tls):
        assert st["Resource"] == [BUCKET, f"{BUCKET}/*"] and st["Principal"] == "*"


def test_key_policy_limits_logs_to_the_stack_log_groups():
    doc = policies.key_policy("123456789012", "eu-west-1", ["/gpufleet/dev", "/gpufleet/dev/vpc-flow-logs"], SLR)
    logs = next(st for st in doc["Statement"] if st["Sid"] == "CloudWatchLogsForStackLogGroups")
    assert logs["Principal"] == {"Service": "logs.eu-west-1.amazonaws.com"}
    assert logs["Condition"] == {"ArnEquals": {"kms:EncryptionContext:aws:logs:arn": [LOGS, FLOW_LOGS]}}
    assert "kms:GenerateDataKey" in logs["Action"] and "kms:Decrypt" in logs["Action"]


def test_key_policy_lets_the_autoscaling_role_encrypt_node_volumes():
    doc = policies.key_policy("123456789012", "eu-west-1", ["/gpufleet/dev"], SLR)
    assert_autoscaling_ebs_grants(doc, SLR)
    sids = [st["Sid"] for st in doc["Statement"]]
    assert len(sids) == len(set(sids)) == 5


def test_ebs_grant_check_rejects_a_grant_without_the_aws_resource_condition():
    doc = policies.key_policy("123456789012", "eu-west-1", ["/gpufleet/dev"], SLR)
    del doc["Statement"][-1]["Condition"]
    with pytest.raises(AssertionError):
        assert_autoscaling_ebs_grants(doc, SLR)
    doc = policies.key_policy("123456789012", "eu-west-1", ["/gpufleet/dev"], SLR)
    doc["Statement"][-2]["Action"] = ["kms:Encrypt", "kms:Decrypt", "kms:ReEncrypt*", "kms:GenerateDataKey*",
                                      "kms:DescribeKey"]
    with pytest.raises(AssertionError):
        assert_autoscaling_ebs_grants(doc, SLR)


@pytest.mark.parametrize("prefix,suffix", [
    ("gpufleet-dev", "gpufleet-dev"),
    ("gpufleet-team.a_b@x", "gpufleet-team.a_b@x"),       # IAM allows \w+=,.@-
    ("gpufleet-a/b c:ä", "gpufleet-a-b-c--"),             # anything else becomes '-'
])
def test_role_suffix_keeps_a_short_stack_prefix(prefix, suffix):
    assert role_suffix(prefix) == suffix


def test_role_suffix_fits_the_iam_role_name_limit_and_stays_unique():
    a, b = (role_suffix("gpufleet-" + "research-cluster-eu-" * 3 + end) for end in ("one", "two"))
    assert a != b
    for s in (a, b):
        assert len("AWSServiceRoleForAutoScaling_" + s) == 64
        assert re.fullmatch(r"[A-Za-z0-9_+=,.@-]+", s)
        assert s.startswith("gpufleet-research-cluster")
    assert role_suffix("gpufleet-" + "x" * 26) == "gpufleet-" + "x" * 26   # exactly 64 with the prefix


def test_flow_log_role_trusts_only_vpc_flow_logs_of_this_account():
    doc = policies.assume_role_flow_logs("cn-north-1", "123456789012")
    (st,) = doc["Statement"]
    assert (st["Effect"], st["Action"]) == ("Allow", "sts:AssumeRole")
    assert st["Principal"] == {"Service": "vpc-flow-logs.amazonaws.com"}
    assert st["Condition"] == {
        "StringEquals": {"aws:SourceAccount": "123456789012"},
        "ArnLike": {"aws:SourceArn": "arn:aws-cn:ec2:cn-north-1:123456789012:vpc-flow-log/*"}}


def test_flow_log_delivery_writes_only_into_its_log_group():
    doc = policies.flow_log_delivery_policy(FLOW_LOGS)
    assert_least_privilege(doc, "none")
    (st,) = doc["Statement"]
    assert sorted(st["Action"]) == ["logs:CreateLogStream", "logs:DescribeLogStreams", "logs:PutLogEvents"]
    assert st["Resource"] == [FLOW_LOGS, f"{FLOW_LOGS}:*"]
    assert "Condition" not in st


@pytest.mark.parametrize("region,part", [("eu-west-1", "aws"), ("cn-north-1", "aws-cn"), ("us-gov-west-1", "aws-us-gov")])
def test_partition(region, part):
    assert policies.partition(region) == part


# Every AWS call the node-side trainer makes (agent, preflight, rendezvous, checkpoints), as an IAM action.
TRAINER_CALLS = {
    "receive_message": "sqs:ReceiveMessage", "delete_message": "sqs:DeleteMessage",
    "change_message_visibility": "sqs:ChangeMessageVisibility",
    "set_instance_protection": "autoscaling:SetInstanceProtection",
    "complete_lifecycle_action": "autoscaling:CompleteLifecycleAction",
    "set_instance_health": "autoscaling:SetInstanceHealth",
    "describe_auto_scaling_instances": "autoscaling:DescribeAutoScalingInstances",
    "describe_auto_scaling_groups": "autoscaling:DescribeAutoScalingGroups",
    "describe_instances": "ec2:DescribeInstances",
    "get_object": "s3:GetObject", "head_object": "s3:GetObject", "download_fileobj": "s3:GetObject",
    "upload_fileobj": "s3:PutObject", "upload_file": "s3:PutObject", "delete_object": "s3:DeleteObject",
    "list_objects_v2": "s3:ListBucket", "put_object": "s3:PutObject", "delete_objects": "s3:DeleteObject",
    "send_message": "sqs:SendMessage", "get_queue_attributes": "sqs:GetQueueAttributes",
    "get_queue_url": "sqs:GetQueueUrl", "get_parameter": "ssm:GetParameter",
    "get_authorization_token": "ecr:GetAuthorizationToken",
}
# The services whose clients the node-side trainer makes.
TRAINER_SERVICES = ("sqs", "s3", "autoscaling", "ec2", "ecr", "ssm", "cloudwatch", "logs", "sts")


def test_node_policy_allows_every_call_the_trainer_makes():
    """Every operation of an AWS client that the node-side trainer calls (directly or through a paginator)
    has its IAM action in TRAINER_CALLS, and the node's policy (with the registry's pull statements) allows it."""
    import boto3

    source = "\n".join(p.read_text() for p in (Path(__file__).parents[3] / "trainer").rglob("*.py")
                       if p.parent.name != "clouds" or p.name == "aws.py")  # the AWS side: not the other clouds
    operations = set().union(*(boto3.client(s, region_name="eu-west-1").meta.method_to_api_mapping
                               for s in TRAINER_SERVICES))
    named = set(re.findall(r"\.(\w+)\(", source)) | set(re.findall(r"get_paginator\(\s*[\"'](\w+)", source))
    called = {m for m in named if m in operations or m in TRAINER_CALLS}
    assert {"receive_message", "send_message", "get_parameter", "set_instance_health", "complete_lifecycle_action",
            "list_objects_v2"} <= called
    assert called <= set(TRAINER_CALLS), f"which IAM action do {sorted(called - set(TRAINER_CALLS))} need?"
    doc = node_policy()
    statements = doc["Statement"] + registry.pull_statements("eu-west-1", "123456789012", "gpufleet-dev", [])
    allowed = {a for st in statements if st["Effect"] == "Allow"
               for a in (st["Action"] if isinstance(st["Action"], list) else [st["Action"]])}
    assert {TRAINER_CALLS[m] for m in called} <= allowed


# What the CloudWatch agent needs to resolve each placeholder of its config (CloudWatch User Guide, the agent
# configuration file: append_dimensions takes ImageId, InstanceId, InstanceType and AutoScalingGroupName).
# The instance's own id, type, image, host name and address come from the instance metadata service; the
# group name comes from the instance's tags, which is why AWS's CloudWatchAgentServerPolicy has ec2:DescribeTags.
AGENT_PLACEHOLDER_ACTIONS = {
    "${aws:AutoScalingGroupName}": {"ec2:DescribeTags"},
    "${aws:InstanceId}": set(), "${aws:InstanceType}": set(), "${aws:ImageId}": set(),
    "{instance_id}": set(), "{hostname}": set(), "{ip_address}": set(),
}
AGENT_CONFIG = Path(__file__).resolve().parents[3] / "ami" / "files" / "cloudwatch-agent.json"


def _allowed_on_any_resource(doc: dict) -> set[str]:
    return {a for st in doc["Statement"] if st["Effect"] == "Allow" and st["Resource"] == "*" and "Condition" not in st
            for a in (st["Action"] if isinstance(st["Action"], list) else [st["Action"]])}


def test_node_role_lets_the_cloudwatch_agent_resolve_every_placeholder():
    used = set(re.findall(r"\$\{aws:\w+\}|\{\w+\}", AGENT_CONFIG.read_text()))
    assert "${aws:AutoScalingGroupName}" in used
    assert used <= set(AGENT_PLACEHOLDER_ACTIONS), f"what permission does {used - set(AGENT_PLACEHOLDER_ACTIONS)} need?"
    needed = set().union(*(AGENT_PLACEHOLDER_ACTIONS[p] for p in used))
    doc = node_policy()
    assert needed and needed <= _allowed_on_any_resource(doc)


def test_without_describe_tags_the_placeholder_check_fails():
    doc = node_policy()
    doc["Statement"] = [st for st in doc["Statement"] if st.get("Sid") != "ResolveAgentDimensions"]
    assert "ec2:DescribeTags" not in _allowed_on_any_resource(doc)


def test_interface_endpoints_keep_to_the_account():
    (st,) = policies.interface_endpoint_policy("123456789012")["Statement"]
    assert (st["Effect"], st["Principal"], st["Action"], st["Resource"]) == ("Allow", "*", "*", "*")
    assert st["Condition"] == {"StringEquals": {"aws:PrincipalAccount": "123456789012",
                                                "aws:ResourceAccount": "123456789012"}}


def test_s3_endpoint_reaches_only_the_named_buckets():
    doc = policies.s3_endpoint_policy("123456789012", [BUCKET])
    (st,) = doc["Statement"]
    assert st["Resource"] == [BUCKET, f"{BUCKET}/*"] and st["Effect"] == "Allow"
    assert st["Condition"]["StringEquals"]["aws:ResourceAccount"] == "123456789012"
    assert all(st["Resource"] != "*" for st in doc["Statement"])


def test_s3_endpoint_reads_ecr_layers_from_the_one_aws_owned_bucket_and_nothing_more():
    layers = registry.layer_bucket_arn("eu-west-1")
    doc = policies.s3_endpoint_policy("123456789012", [BUCKET], [layers])
    stack, owned = doc["Statement"]
    assert stack["Resource"] == [BUCKET, f"{BUCKET}/*"]
    assert owned == {"Sid": "AwsOwnedReads", "Effect": "Allow", "Principal": "*", "Action": "s3:GetObject",
                     "Resource": ["arn:aws:s3:::prod-eu-west-1-starport-layer-bucket/*"],
                     "Condition": {"StringEquals": {"aws:PrincipalAccount": "123456789012"}}}
