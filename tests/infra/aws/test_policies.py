"""Policy documents of the AWS stack (pure): the node, the controller, the shared file system, the key."""
import re
from fnmatch import fnmatchcase
from pathlib import Path

import pytest

from infra.aws import network, policies, registry
from tests.infra.aws.harness import assert_least_privilege
from trainer.jobs.layout import team_prefix

ACCOUNT = "123456789012"
BUCKET = "arn:aws:s3:::gpufleet-dev-data-abc"
KEY = "arn:aws:kms:eu-west-1:123456789012:key/k"
QUEUE = "arn:aws:sqs:eu-west-1:123456789012:jobs"
DLQ = "arn:aws:sqs:eu-west-1:123456789012:jobs-dlq"
PARAMETERS = policies.parameters_arn("eu-west-1", ACCOUNT, "/gpufleet/dev/")
LOGS = "arn:aws:logs:eu-west-1:123456789012:log-group:/gpufleet/dev"
FLOW_LOGS = "arn:aws:logs:eu-west-1:123456789012:log-group:/gpufleet/dev/vpc-flow-logs"
MUNGE = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:gpufleet-dev-munge-abc-Xy12Zw"
NODE_ROLE = "arn:aws:iam::123456789012:role/gpufleet-dev-node-abc"
CONTROLLER_ROLE = "arn:aws:iam::123456789012:role/gpufleet-dev-controller-abc"
JOB_ROLE = "arn:aws:iam::123456789012:role/gpufleet-dev-job-abc"
EC2 = "arn:aws:ec2:eu-west-1:123456789012"
TEMPLATES = [f"{EC2}:launch-template/lt-0123456789abcdef0", f"{EC2}:launch-template/lt-0fedcba9876543210"]
FS = "arn:aws:elasticfilesystem:eu-west-1:123456789012:file-system/fs-0123"
HOME_AP = "arn:aws:elasticfilesystem:eu-west-1:123456789012:access-point/fsap-home"
STATE_AP = "arn:aws:elasticfilesystem:eu-west-1:123456789012:access-point/fsap-state"
VPC = "vpc-0123456789abcdef0"


def node_policy() -> dict:
    return policies.node_policy(BUCKET, KEY, LOGS, PARAMETERS, MUNGE, VPC, "gpufleet/dev", JOB_ROLE)


def job_role_policy(region: str = "eu-west-1") -> dict:
    return policies.job_role_policy(BUCKET, KEY, PARAMETERS, VPC, region)


def controller_policy() -> dict:
    return policies.controller_policy(
        "eu-west-1", ACCOUNT, "dev", BUCKET, KEY, [QUEUE], [DLQ], LOGS, MUNGE, NODE_ROLE, TEMPLATES,
        subnet_arns=[f"{EC2}:subnet/subnet-1"], security_group_arns=[f"{EC2}:security-group/sg-1"],
        image_arns=["arn:aws:ec2:eu-west-1::image/ami-1"], placement_group_arns=[f"{EC2}:placement-group/pg"],
        metric_namespace="gpufleet/dev", vpc_id=VPC)


def _list(value) -> list:
    return value if isinstance(value, list) else [value]


def _actions(doc: dict) -> set[str]:
    return {a for st in doc["Statement"] if st["Effect"] == "Allow" for a in _list(st["Action"])}


def _statements_with(doc: dict, action: str) -> list[dict]:
    return [st for st in doc["Statement"] if st["Effect"] == "Allow" and action in _list(st["Action"])]


def test_node_policy_is_least_privilege_and_scoped():
    doc = node_policy()
    assert_least_privilege(doc, "gpufleet/dev")
    resources = {r for st in doc["Statement"] for r in _list(st["Resource"])}
    assert resources == {BUCKET, f"{BUCKET}/*", f"{BUCKET}/teams/*/jobs/*", f"{BUCKET}/teams/*/jobs-index/*", KEY, LOGS,
                         f"{LOGS}:*", PARAMETERS, MUNGE, JOB_ROLE, "*"}
    assert PARAMETERS == "arn:aws:ssm:eu-west-1:123456789012:parameter/gpufleet/dev/*"
    # a node reads the munge key; it launches, tags, terminates nothing and never touches the queue
    assert [st["Resource"] for st in _statements_with(doc, "secretsmanager:GetSecretValue")] == [MUNGE]
    assert not {a for a in _actions(doc) if a.startswith(("sqs:", "autoscaling:", "iam:"))}
    assert {a for a in _actions(doc) if a.startswith("ec2:")} == {"ec2:DescribeTags"}
    assert "secretsmanager:PutSecretValue" not in _actions(doc)


def test_session_manager_is_our_own_statement_bounded_to_the_vpc_and_ssm_reads_only_the_stacks_path():
    """Finding 1 of the isolation review: the managed AmazonSSMManagedInstanceCore let a job read any SSM
    parameter of the account ({"ssm": "/payments/prod/db-password"})."""
    for doc in (node_policy(), controller_policy()):
        (sm,) = [st for st in doc["Statement"] if st.get("Sid") == "SessionManager"]
        assert set(sm["Action"]) == set(policies.SESSION_MANAGER) and sm["Resource"] == "*"
        assert sm["Condition"] == {"StringEquals": {"aws:ec2InstanceSourceVPC": VPC}}
        assert not [a for a in _actions(doc) if a.startswith("ssm:Get") and a != "ssm:GetParameter"]
    assert [st["Resource"] for st in _statements_with(node_policy(), "ssm:GetParameter")] == [PARAMETERS]
    assert not _statements_with(controller_policy(), "ssm:GetParameter")


def test_least_privilege_check_rejects_wildcards():
    bad = {"Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": BUCKET}]}
    with pytest.raises(AssertionError):
        assert_least_privilege(bad, "x")
    bad = {"Statement": [{"Effect": "Allow", "Action": "cloudwatch:PutMetricData", "Resource": "*", "Condition": {}}]}
    with pytest.raises(AssertionError):
        assert_least_privilege(bad, "x")


def test_controller_launches_only_from_the_stack_templates_tagged_with_the_stack():
    doc = controller_policy()
    assert_least_privilege(doc, "gpufleet/dev")
    launch = _statements_with(doc, "ec2:RunInstances")
    created = [st for st in launch if any(r.endswith("/*") for r in _list(st["Resource"]))]
    # what a launch creates comes from one of the stack's templates; the instance carries the stack's tag
    assert {r for st in created for r in _list(st["Resource"])} == {
        f"{EC2}:instance/*", f"{EC2}:volume/*", f"{EC2}:network-interface/*", f"{EC2}:spot-instances-request/*"}
    for st in created:
        assert st["Condition"]["ArnEquals"] == {"ec2:LaunchTemplate": TEMPLATES}
    (instances,) = [st for st in created if st["Resource"] == f"{EC2}:instance/*"]
    assert instances["Condition"]["StringEquals"] == {"aws:RequestTag/gpufleet-stack": "dev"}
    # and the resources it names are the stack's own, one by one
    (named,) = [st for st in launch if st not in created]
    assert named["Resource"] == [*TEMPLATES, f"{EC2}:subnet/subnet-1", f"{EC2}:security-group/sg-1",
                                 "arn:aws:ec2:eu-west-1::image/ami-1", f"{EC2}:placement-group/pg"]
    assert not [st for st in launch if "*" in _list(st["Resource"])]


def test_controller_names_and_terminates_only_stack_instances_and_passes_only_the_node_role():
    doc = controller_policy()
    (terminate,) = _statements_with(doc, "ec2:TerminateInstances")
    assert terminate["Resource"] == f"{EC2}:instance/*"
    assert terminate["Condition"] == {"StringEquals": {"ec2:ResourceTag/gpufleet-stack": "dev"}}
    tagging = _statements_with(doc, "ec2:CreateTags")
    on_create, naming = tagging
    assert on_create["Condition"] == {"StringEquals": {"ec2:CreateAction": ["RunInstances", "CreateFleet"]}}
    assert naming["Condition"] == {"StringEquals": {"ec2:ResourceTag/gpufleet-stack": "dev"},
                                   "ForAllValues:StringEquals": {"aws:TagKeys": ["gpufleet-slurm-node", "Name"]}}
    (pass_role,) = _statements_with(doc, "iam:PassRole")
    assert pass_role["Resource"] == NODE_ROLE
    assert pass_role["Condition"] == {"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}}
    (slr,) = _statements_with(doc, "iam:CreateServiceLinkedRole")
    assert slr["Condition"] == {"StringEquals": {"iam:AWSServiceName": "spot.amazonaws.com"}}
    # the key is used for the nodes' volumes only through EC2, and grants only for AWS resources
    for st in _statements_with(doc, "kms:CreateGrant") + _statements_with(doc, "kms:ReEncryptFrom"):
        assert st["Resource"] == KEY
        assert st["Condition"]["StringEquals"] == {"kms:ViaService": "ec2.eu-west-1.amazonaws.com"}
    (grant,) = _statements_with(doc, "kms:CreateGrant")
    assert grant["Condition"]["Bool"] == {"kms:GrantIsForAWSResource": True}


def test_controller_keeps_the_munge_key_and_consumes_the_queue():
    doc = controller_policy()
    (munge,) = [st for st in doc["Statement"] if MUNGE in _list(st["Resource"])]
    assert sorted(munge["Action"]) == ["secretsmanager:GetSecretValue", "secretsmanager:PutSecretValue"]
    on_queue = {a for st in doc["Statement"] if QUEUE in _list(st["Resource"]) for a in st["Action"]}
    assert {"sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility"} <= on_queue
    assert "sqs:SendMessage" not in on_queue  # only a team's submit role sends to its queue
    on_dlq = {a for st in doc["Statement"] if DLQ in _list(st["Resource"]) for a in st["Action"]}
    assert on_dlq == {"sqs:GetQueueUrl", "sqs:SendMessage"}  # it puts jobs there; it never reads them


def test_shared_fs_takes_tls_only_nodes_through_home_and_root_for_the_controller_alone():
    doc = policies.shared_fs_policy(FS, HOME_AP, STATE_AP, NODE_ROLE, CONTROLLER_ROLE)
    deny, nodes, controller, root = doc["Statement"]
    assert (deny["Effect"], deny["Condition"]) == ("Deny", {"Bool": {"aws:SecureTransport": "false"}})
    assert nodes["Principal"] == {"AWS": NODE_ROLE}
    assert nodes["Action"] == ["elasticfilesystem:ClientMount", "elasticfilesystem:ClientWrite"]
    assert nodes["Condition"] == {"StringEquals": {"elasticfilesystem:AccessPointArn": [HOME_AP]}}
    assert controller["Condition"] == {"StringEquals": {"elasticfilesystem:AccessPointArn": [HOME_AP, STATE_AP]}}
    assert (root["Principal"], root["Action"]) == ({"AWS": CONTROLLER_ROLE}, "elasticfilesystem:ClientRootAccess")
    assert root["Condition"] == {"StringEquals": {"elasticfilesystem:AccessPointArn": [HOME_AP]}}
    assert all(st["Resource"] == FS for st in doc["Statement"])


def test_bucket_policy_denies_plain_http_and_old_tls():
    doc = policies.bucket_policy(BUCKET)
    by_sid = {st["Sid"]: st for st in doc["Statement"]}
    plain = by_sid["DenyInsecureTransport"]
    assert plain["Effect"] == "Deny" and plain["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    tls = by_sid["DenyTlsBelow12"]
    assert tls["Effect"] == "Deny" and tls["Condition"] == {"NumericLessThan": {"s3:TlsVersion": "1.2"}}
    for st in (plain, tls):
        assert st["Resource"] == [BUCKET, f"{BUCKET}/*"] and st["Principal"] == "*"


def test_key_policy_limits_logs_to_the_stack_log_groups_and_names_no_other_principal():
    doc = policies.key_policy(ACCOUNT, "eu-west-1", ["/gpufleet/dev", "/gpufleet/dev/vpc-flow-logs"])
    logs = next(st for st in doc["Statement"] if st["Sid"] == "CloudWatchLogsForStackLogGroups")
    assert logs["Principal"] == {"Service": "logs.eu-west-1.amazonaws.com"}
    assert logs["Condition"] == {"ArnEquals": {"kms:EncryptionContext:aws:logs:arn": [LOGS, FLOW_LOGS]}}
    assert "kms:GenerateDataKey" in logs["Action"] and "kms:Decrypt" in logs["Action"]
    assert [st["Sid"] for st in doc["Statement"]] == ["AccountAdministration", "CloudWatchLogsForStackLogGroups",
                                                      "AlertTopicPublishers"]


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


# Every AWS call the trainer makes (nodes' tasks and setup, the controller's bridge and power saving,
# checkpoints), as an IAM action.
TRAINER_CALLS = {
    "receive_message": "sqs:ReceiveMessage", "delete_message": "sqs:DeleteMessage",
    "change_message_visibility": "sqs:ChangeMessageVisibility",
    "describe_instances": "ec2:DescribeInstances", "describe_tags": "ec2:DescribeTags",
    "create_fleet": "ec2:CreateFleet", "create_tags": "ec2:CreateTags", "terminate_instances": "ec2:TerminateInstances",
    "get_object": "s3:GetObject", "head_object": "s3:GetObject", "download_fileobj": "s3:GetObject",
    "upload_fileobj": "s3:PutObject", "upload_file": "s3:PutObject", "delete_object": "s3:DeleteObject",
    "list_objects_v2": "s3:ListBucket", "put_object": "s3:PutObject", "delete_objects": "s3:DeleteObject",
    "send_message": "sqs:SendMessage", "get_queue_attributes": "sqs:GetQueueAttributes",
    "get_queue_url": "sqs:GetQueueUrl", "get_parameter": "ssm:GetParameter",
    "get_authorization_token": "ecr:GetAuthorizationToken",
    "get_secret_value": "secretsmanager:GetSecretValue", "put_secret_value": "secretsmanager:PutSecretValue",
    "assume_role": "sts:AssumeRole",
}
# The per-node agent's Auto Scaling calls: it runs on no Slurm stack (it goes once the last stack runs Slurm).
AGENT_ONLY = {"set_instance_protection", "complete_lifecycle_action", "set_instance_health",
              "describe_auto_scaling_instances", "describe_auto_scaling_groups"}
# The services whose clients the trainer makes.
TRAINER_SERVICES = ("sqs", "s3", "autoscaling", "ec2", "ecr", "ssm", "cloudwatch", "logs", "sts", "secretsmanager")
# What a node calls: its jobs' checkpoints and secrets, registry logins, its own Slurm name, the munge key, and
# the job role its credentials daemon assumes for each job.
NODE_CALLS = {"get_object", "put_object", "list_objects_v2", "delete_object", "get_parameter",
              "get_authorization_token", "describe_tags", "get_secret_value", "assume_role"}


def _called() -> set[str]:
    import boto3

    source = "\n".join(p.read_text() for p in (Path(__file__).parents[3] / "trainer").rglob("*.py")
                       if p.parent.name != "clouds" or p.name.startswith(("aws", "s3store")))  # not the other clouds
    operations = set().union(*(boto3.client(s, region_name="eu-west-1").meta.method_to_api_mapping
                               for s in TRAINER_SERVICES))
    named = set(re.findall(r"\.(\w+)\(", source)) | set(re.findall(r"get_paginator\(\s*[\"'](\w+)", source))
    return {m for m in named if m in operations or m in TRAINER_CALLS or m in AGENT_ONLY}


def test_the_two_roles_allow_every_call_the_trainer_makes():
    """Every operation of an AWS client that the trainer calls (directly or through a paginator) has its IAM action
    in TRAINER_CALLS, and the node's policy (with the registry's pull statements) or the controller's allows it."""
    called = _called() - AGENT_ONLY
    assert {"receive_message", "create_fleet", "terminate_instances", "get_secret_value", "put_secret_value",
            "get_parameter", "list_objects_v2", "describe_tags"} <= called
    assert called <= set(TRAINER_CALLS), f"which IAM action do {sorted(called - set(TRAINER_CALLS))} need?"
    statements = (node_policy()["Statement"] + controller_policy()["Statement"]
                  + registry.pull_statements("eu-west-1", ACCOUNT, "gpufleet-dev", []))
    allowed = {a for st in statements if st["Effect"] == "Allow" for a in _list(st["Action"])}
    assert {TRAINER_CALLS[m] for m in called} <= allowed


def test_the_node_role_allows_what_a_node_calls_and_no_more():
    assert NODE_CALLS <= _called()
    statements = node_policy()["Statement"] + registry.pull_statements("eu-west-1", ACCOUNT, "gpufleet-dev", [])
    allowed = {a for st in statements if st["Effect"] == "Allow" for a in _list(st["Action"])}
    assert {TRAINER_CALLS[m] for m in NODE_CALLS} <= allowed
    controller_only = {TRAINER_CALLS[m] for m in ("receive_message", "create_fleet", "terminate_instances",
                                                  "create_tags", "put_secret_value", "describe_instances")}
    assert not controller_only & allowed


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
    doc["Statement"] = [st for st in doc["Statement"] if st.get("Sid") != "ReadOwnTags"]
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


def _allows(doc: dict, action: str, resource: str) -> bool:
    """An Allow statement of ``doc`` names ``action`` on ``resource`` (IAM's * and ? wildcards)."""
    def matches(patterns, value: str) -> bool:
        return any(fnmatchcase(value, p) for p in _list(patterns))

    return any(st["Effect"] == "Allow" and matches(st["Action"], action) and matches(st["Resource"], resource)
               for st in doc["Statement"])


def test_a_node_writes_only_under_the_job_prefixes_and_never_touches_code_bundles():
    """Finding 5 of issue 23: a job could overwrite any object of the bucket, a content-addressed code bundle of
    another job included."""
    doc = node_policy()
    for team in ("vision", "nlp"):
        bundle, data = f"{BUCKET}/teams/{team}/code/0f3a9c.tar.gz", f"{BUCKET}/teams/{team}/data/shard-0"
        assert _allows(doc, "s3:GetObject", bundle) and _allows(doc, "s3:GetObject", data)
        for action in ("s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"):
            assert not _allows(doc, action, bundle), action
            assert not _allows(doc, action, data), action
        for key in ("jobs/j1/record.json", "jobs/j1/step-100/manifest.json", "jobs/j1/logs/1/node-0/00000000.log",
                    "jobs-index/07.json"):
            assert _allows(doc, "s3:PutObject", f"{BUCKET}/teams/{team}/{key}"), key
        assert _allows(doc, "s3:DeleteObject", f"{BUCKET}/teams/{team}/jobs/j1/step-100/model.pt")
        assert not _allows(doc, "s3:DeleteObject", f"{BUCKET}/teams/{team}/jobs-index/07.json")
    # the layout before teams (jobs/ at the bucket's root) is no longer written
    for key in ("jobs/j1/record.json", "jobs-index/07.json"):
        assert not _allows(doc, "s3:PutObject", f"{BUCKET}/{key}"), key


def test_the_node_write_prefixes_are_where_the_trainer_writes():
    """The keys a node writes (records, checkpoints, log chunks, the index) fall under NODE_WRITES; code bundles
    (which a node only reads) do not."""
    from trainer.jobs import bundle, logs, records
    from trainer.jobs.layout import job_uri

    written = [records.record_key("j1"), records.index_key("j1"), logs.chunk_key("j1", 1, "gpu-1", 0),
               job_uri("b", "vision", "j1").removeprefix("s3://b/") + "step-1/manifest.json"]
    for key in map(_in_team, written):
        assert _under(key, policies.NODE_WRITES), key
    assert not _under(_in_team(f"{bundle.PREFIX}0f3a9c.tar.gz"), policies.NODE_WRITES)


def _in_team(key: str) -> str:
    """A trainer key in the bucket: the trainer's own where it names the team (teams/<team>/...), else a key
    relative to a team's prefix, put under team vision's."""
    return key if key.startswith("teams/") else f"{team_prefix('vision')}{key}"


def _under(key: str, prefixes) -> bool:
    """``key`` is under one of ``prefixes`` (IAM patterns: ``teams/*/jobs/``)."""
    return any(fnmatchcase(key, f"{prefix}*") for prefix in prefixes)


# --- a team's submit role (issue 23: every team's things live under teams/<team>/) ---------------------------

def submit_policy(team: str) -> dict:
    return policies.submit_policy(BUCKET, KEY, QUEUE, DLQ, "eu-west-1", team=team)


def _s3_resources(doc: dict) -> set[str]:
    return {r for st in doc["Statement"] if any(a.startswith("s3:") for a in _list(st["Action"]))
            for r in _list(st["Resource"])}


def test_a_teams_submit_role_reaches_only_its_teams_prefix():
    doc = submit_policy("vision")
    assert_least_privilege(doc, "none")
    assert _s3_resources(doc) == {BUCKET, f"{BUCKET}/teams/vision/jobs/*", f"{BUCKET}/teams/vision/jobs-index/*",
                                  f"{BUCKET}/teams/vision/code/*"}
    for key in ("jobs/j1/record.json", "code/0f3a9c.tar.gz"):
        assert _allows(doc, "s3:PutObject", f"{BUCKET}/teams/vision/{key}"), key
    for key in ("jobs/j1/record.json", "jobs/j1/logs/1/gpu-1/00000000.log", "jobs-index/07.json", "code/0f3a9c.tar.gz"):
        assert _allows(doc, "s3:GetObject", f"{BUCKET}/teams/vision/{key}"), key
    # not another team's, not the bucket root's jobs/ (the layout before teams), not a team's data; no delete
    for key in ("teams/nlp/jobs/j1/record.json", "teams/nlp/jobs-index/07.json", "teams/nlp/code/0f3a9c.tar.gz",
                "teams/vision2/jobs/j1/record.json", "jobs/j1/record.json", "jobs-index/07.json",
                "code/0f3a9c.tar.gz", "teams/vision/data/shard-0"):
        for action in ("s3:GetObject", "s3:PutObject", "s3:DeleteObject"):
            assert not _allows(doc, action, f"{BUCKET}/{key}"), (action, key)
    assert not _allows(doc, "s3:PutObject", f"{BUCKET}/teams/vision/jobs-index/07.json")  # the bridge keeps it


def test_a_teams_submit_role_lists_only_under_its_teams_prefix():
    doc = submit_policy("nlp")
    (listing,) = _statements_with(doc, "s3:ListBucket")
    assert listing == {"Sid": "ListTeamPrefix", "Effect": "Allow", "Action": "s3:ListBucket", "Resource": BUCKET,
                       "Condition": {"StringLike": {"s3:prefix": "teams/nlp/*"}}}
    allowed = listing["Condition"]["StringLike"]["s3:prefix"]
    assert fnmatchcase("teams/nlp/jobs-index/", allowed) and fnmatchcase("teams/nlp/jobs/j1/logs/", allowed)
    for prefix in ("", "jobs/", "jobs-index/", "teams/", "teams/vision/", "teams/nlp2/"):
        assert not fnmatchcase(prefix, allowed), prefix
    (location,) = _statements_with(doc, "s3:GetBucketLocation")
    assert (location["Resource"], "Condition" in location) == (BUCKET, False)


def test_two_teams_submit_roles_share_no_object():
    vision, nlp = _s3_resources(submit_policy("vision")) - {BUCKET}, _s3_resources(submit_policy("nlp")) - {BUCKET}
    assert not [(a, b) for a in vision for b in nlp if fnmatchcase(a, b) or fnmatchcase(b, a)]


# --- the job role (issue 23: jobs stop holding the node role) -------------------------------------------------

def test_the_job_role_trusts_only_the_node_role_under_the_daemons_session_names():
    from trainer.clouds.aws_credentials import SESSION_PREFIX

    assert policies.assume_role_job(NODE_ROLE) == {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": {"AWS": NODE_ROLE}, "Action": "sts:AssumeRole",
         "Condition": {"StringLike": {"sts:RoleSessionName": "gpufleet-*"}}}]}
    # the names the daemon gives its sessions are the ones the trust admits
    assert fnmatchcase(f"{SESSION_PREFIX}4711-0", policies.JOB_SESSION_PATTERN)
    assert not fnmatchcase("attacker-4711", policies.JOB_SESSION_PATTERN)


def test_the_node_may_assume_the_job_role_and_no_other():
    (assume,) = [st for st in node_policy()["Statement"] if any(a.startswith("sts:") for a in _list(st["Action"]))]
    assert assume == {"Sid": "AssumeJobRole", "Effect": "Allow", "Action": "sts:AssumeRole", "Resource": JOB_ROLE}


def test_the_job_role_is_the_ceiling_a_jobs_session_narrows():
    """Every Allow names its resources (no '*'), on the stack's bucket, key and job secrets only; nothing of the
    node's own rights (munge key, logs, metrics, tags, Session Manager, another role) reaches a job."""
    doc = job_role_policy()
    allows = [st for st in doc["Statement"] if st["Effect"] == "Allow"]
    assert all("*" not in a for st in allows for a in _list(st["Action"]))
    assert {r for st in allows for r in _list(st["Resource"])} == {
        f"{BUCKET}/teams/*/jobs/*", f"{BUCKET}/teams/*/code/*", f"{BUCKET}/teams/*/data/*", BUCKET, KEY, PARAMETERS}
    assert {a.split(":")[0] for a in _actions(doc)} == {"s3", "kms", "ssm"}
    assert _actions(doc) == {"s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload",
                             "s3:ListMultipartUploadParts", "s3:ListBucket", "s3:GetBucketLocation",
                             "kms:Decrypt", "kms:GenerateDataKey", "ssm:GetParameter"}


def test_a_job_writes_only_under_jobs_and_reads_code_and_data():
    """The job role writes under teams/*/jobs/ only (the session policy narrows that to teams/<team>/jobs/<id>/);
    it reads code bundles and data sets, writes neither, and never touches the record index, which the bridge
    keeps."""
    doc = job_role_policy()
    for key in ("jobs/j1/record.json", "jobs/j1/step-100/manifest.json", "jobs/j1/logs/1/node-0/00000000.log"):
        for action in policies.JOB_OBJECT_ACTIONS:
            assert _allows(doc, action, f"{BUCKET}/teams/vision/{key}"), (action, key)
            assert not _allows(doc, action, f"{BUCKET}/{key}"), (action, key)  # the layout before teams
    for key in ("code/0f3a9c.tar.gz", "data/shard-0"):
        assert _allows(doc, "s3:GetObject", f"{BUCKET}/teams/vision/{key}"), key
        assert not _allows(doc, "s3:GetObject", f"{BUCKET}/{key}"), key
        for action in ("s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"):
            assert not _allows(doc, action, f"{BUCKET}/teams/vision/{key}"), (action, key)
    for action in ("s3:GetObject", "s3:PutObject", "s3:DeleteObject"):
        assert not _allows(doc, action, f"{BUCKET}/teams/vision/jobs-index/07.json"), action
        assert not _allows(doc, action, f"{BUCKET}/other/x"), action
        assert not _allows(doc, action, "arn:aws:s3:::another-bucket/teams/vision/jobs/j1/record.json"), action
    assert _allows(doc, "s3:ListBucket", BUCKET) and not _allows(doc, "s3:ListBucket", "arn:aws:s3:::another-bucket")


def test_a_job_lists_only_under_the_prefixes_it_reads():
    (listing,) = _statements_with(job_role_policy(), "s3:ListBucket")
    assert listing == {"Sid": "ListJobAndTeamPrefixes", "Effect": "Allow", "Action": "s3:ListBucket",
                       "Resource": BUCKET, "Condition": {"StringLike": {"s3:prefix": [
                           "teams/*/jobs/*", "teams/*/code/*", "teams/*/data/*"]}}}
    (location,) = _statements_with(job_role_policy(), "s3:GetBucketLocation")
    assert (location["Resource"], "Condition" in location) == (BUCKET, False)


def test_the_job_role_covers_what_a_jobs_session_policy_asks_for_its_own_prefix():
    """The daemon's session policy (trainer.clouds.aws_credentials) only narrows: what it allows a job on its own
    prefix and on its team's read prefixes, the job role allows too."""
    from trainer.clouds.aws_credentials import session_policy

    session = session_policy(BUCKET.removeprefix("arn:aws:s3:::"), "vision", "j1", "eu-west-1")
    (own,) = [st for st in session["Statement"] if st.get("Sid") == "OwnPrefix"]
    assert own["Resource"] == f"{BUCKET}/teams/vision/jobs/j1/*"
    for action in _list(own["Action"]):
        assert _allows(job_role_policy(), action, own["Resource"].replace("*", "step-1/model.pt")), action
    (reads,) = [st for st in session["Statement"] if st.get("Sid") == "ReadTeams"]
    for resource in reads["Resource"]:
        assert _allows(job_role_policy(), "s3:GetObject", resource.replace("*", "x.tar.gz")), resource


@pytest.mark.parametrize("region, suffix", [("eu-west-1", "amazonaws.com"), ("cn-north-1", "amazonaws.com.cn")])
def test_a_job_uses_the_stack_key_only_through_s3_and_ssm(region, suffix):
    (key,) = [st for st in job_role_policy(region)["Statement"] if KEY in _list(st["Resource"])]
    assert key["Action"] == ["kms:Decrypt", "kms:GenerateDataKey"]
    assert key["Condition"] == {"StringEquals": {"kms:ViaService": [f"s3.{region}.{suffix}", f"ssm.{region}.{suffix}"]}}


def test_job_credentials_work_only_through_the_stacks_vpc():
    """Copied off the node, a job's credentials are refused: a request that does not come through an endpoint of
    the stack's VPC has another aws:SourceVpc or none (IfExists: none matches too); an AWS service acting for the
    job is exempt."""
    (deny,) = [st for st in job_role_policy()["Statement"] if st["Effect"] == "Deny"]
    assert deny == {"Sid": "OnlyThroughStackVpc", "Effect": "Deny", "Action": "*", "Resource": "*",
                    "Condition": {"StringNotEqualsIfExists": {"aws:SourceVpc": VPC},
                                  "BoolIfExists": {"aws:ViaAWSService": "false"}}}


def test_both_roles_deny_their_credentials_off_their_instance():
    """AWS's data-perimeter Deny for EC2 role credentials: used from another VPC, another address, or not through
    an endpoint of the instance's VPC, node and controller credentials are refused; an AWS service acting for
    them is not held to it."""
    rest = {"Null": {"ec2:SourceInstanceARN": "false"}, "BoolIfExists": {"aws:ViaAWSService": "false"}}
    for doc in (node_policy(), controller_policy()):
        denies = [st for st in doc["Statement"] if st["Effect"] == "Deny"]
        assert [(st["Action"], st["Resource"], st["Condition"]) for st in denies] == [
            ("*", "*", {"StringNotEquals": {"aws:ec2InstanceSourceVPC": "${aws:SourceVpc}"}, **rest}),
            ("*", "*", {"StringNotEquals": {"aws:ec2InstanceSourcePrivateIPv4": "${aws:VpcSourceIp}"}, **rest})]


# Services whose actions the roles hold only for calls an AWS service makes on their behalf (aws:ViaAWSService
# is true, the Deny does not apply): KMS (S3, Secrets Manager and EC2 use the stack key), IAM (PassRole is checked
# within RunInstances/CreateFleet; EC2 creates the spot service-linked role).
VIA_SERVICES = {"kms", "iam"}
# The endpoint that carries a service's API when its name differs from the action prefix.
ENDPOINT_OF = {"cloudwatch": "monitoring", "ecr": "ecr.api"}


def test_every_service_the_roles_call_has_an_endpoint_in_the_vpc():
    """With the Deny, a call that does not go through an endpoint of the VPC fails: every service whose actions the
    node (with its registry pulls) or the controller holds is reached through the S3 gateway or an interface
    endpoint of the stack's VPC."""
    statements = (node_policy()["Statement"] + controller_policy()["Statement"]
                  + registry.pull_statements("eu-west-1", ACCOUNT, "gpufleet-dev", ["ecr-public"]))
    services = {a.split(":")[0] for st in statements if st["Effect"] == "Allow" for a in _list(st["Action"])}
    assert {"s3", "sqs", "ec2", "ssm", "ssmmessages", "secretsmanager", "logs", "cloudwatch", "ecr"} <= services
    reached = {"s3", *network.INTERFACE_ENDPOINTS}
    assert {ENDPOINT_OF.get(s, s) for s in services - VIA_SERVICES} <= reached
    # image layers come through ecr.dkr, the SSM agent keeps its channel through ec2messages, and the node's
    # credentials daemon assumes the job role through sts
    assert {"ecr.dkr", "ec2messages", "sts"} <= set(network.INTERFACE_ENDPOINTS)
    assert "sts" in services


def test_every_service_a_job_calls_has_an_endpoint_in_the_vpc():
    """The job role's Deny refuses what does not come through the VPC: S3, SSM and ECR (image jobs' logins and
    pulls) are all reached through endpoints of the stack's VPC; KMS only through S3 and SSM."""
    statements = (job_role_policy()["Statement"]
                  + registry.pull_statements("eu-west-1", ACCOUNT, "gpufleet-dev", ["ecr-public"]))
    services = {a.split(":")[0] for st in statements if st["Effect"] == "Allow" for a in _list(st["Action"])}
    assert services == {"s3", "kms", "ssm", "ecr"}
    assert {ENDPOINT_OF.get(s, s) for s in services - VIA_SERVICES} <= {"s3", *network.INTERFACE_ENDPOINTS}
