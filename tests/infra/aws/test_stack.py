"""The AWS stack on Pulumi's mock runtime: security properties for dev and prod, EFA, scaling, tags."""
from __future__ import annotations

import importlib
import inspect
import json

import pulumi
import pytest

from infra import scaling
from infra.aws import efa, network
from infra.catalog import CATALOG
from tests.infra.aws.harness import (ACCOUNT, assert_autoscaling_ebs_grants, assert_least_privilege, build_stack,
                                     stack_config)

STACKS = ["dev", "prod"]
T = {  # resource type tokens
    "bucket": "aws:s3/bucket:Bucket", "key": "aws:kms/key:Key", "queue": "aws:sqs/queue:Queue",
    "lt": "aws:ec2/launchTemplate:LaunchTemplate", "asg": "aws:autoscaling/group:Group",
    "sg": "aws:ec2/securityGroup:SecurityGroup", "ingress": "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule",
    "egress": "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule", "endpoint": "aws:ec2/vpcEndpoint:VpcEndpoint",
    "subnet": "aws:ec2/subnet:Subnet", "alarm": "aws:cloudwatch/metricAlarm:MetricAlarm",
    "policy": "aws:autoscaling/policy:Policy", "log_group": "aws:cloudwatch/logGroup:LogGroup",
    "role": "aws:iam/role:Role", "role_policy": "aws:iam/rolePolicy:RolePolicy", "flow_log": "aws:ec2/flowLog:FlowLog",
    "slr": "aws:iam/serviceLinkedRole:ServiceLinkedRole", "repo": "aws:ecr/repository:Repository",
}


@pytest.fixture(params=STACKS)
def built(request):
    return request.getfixturevalue(request.param)


def _node_sg(b):
    return b.one(T["sg"], "-nodes")


def _log_group(b, name):
    (found,) = [r for r in b.of_type(T["log_group"]) if r.inputs["name"] == name]
    return found


# --- network ------------------------------------------------------------------------------------

def test_private_network_without_internet_path(built):
    types = {r.type for r in built.resources}
    for forbidden in ("aws:ec2/internetGateway:InternetGateway", "aws:ec2/natGateway:NatGateway",
                      "aws:ec2/eip:Eip", "aws:ec2/route:Route", "aws:ec2/instance:Instance"):
        assert forbidden not in types
    subnets = built.of_type(T["subnet"])
    assert len(subnets) == (1 if built.cfg.mode == "gang" else 3)
    assert all(s.inputs["mapPublicIpOnLaunch"] is False for s in subnets)
    assert len({s.inputs["availabilityZone"] for s in subnets}) == len(subnets)
    assert all("routes" not in r.inputs for r in built.of_type("aws:ec2/routeTable:RouteTable"))
    default_sg = built.one("aws:ec2/defaultSecurityGroup:DefaultSecurityGroup")
    assert "ingress" not in default_sg.inputs and "egress" not in default_sg.inputs


def test_endpoints_replace_a_nat(built):
    region = built.cfg.region
    endpoints = {r.inputs["serviceName"]: r for r in built.of_type(T["endpoint"])}
    s3 = endpoints.pop(f"com.amazonaws.{region}.s3")
    assert s3.inputs["vpcEndpointType"] == "Gateway" and len(s3.inputs["routeTableIds"]) == 1
    assert set(endpoints) == {f"com.amazonaws.{region}.{s}" for s in network.INTERFACE_ENDPOINTS}
    subnet_ids = built.outputs["subnetIds"]
    for ep in endpoints.values():
        assert ep.inputs["vpcEndpointType"] == "Interface" and ep.inputs["privateDnsEnabled"] is True
        assert ep.inputs["subnetIds"] == subnet_ids
    # every endpoint keeps to this account; through S3 only the stack's bucket, and ECR's layers read only
    account = {"StringEquals": {"aws:PrincipalAccount": ACCOUNT, "aws:ResourceAccount": ACCOUNT}}
    s3_statement, layers = json.loads(s3.inputs["policy"])["Statement"]
    bucket_arn = f"arn:aws:s3:::{built.outputs['bucket']}"
    assert s3_statement["Resource"] == [bucket_arn, bucket_arn + "/*"] and s3_statement["Condition"] == account
    assert layers["Action"] == "s3:GetObject"
    assert layers["Resource"] == [f"arn:aws:s3:::prod-{region}-starport-layer-bucket/*"]
    for ep in endpoints.values():
        (statement,) = json.loads(ep.inputs["policy"])["Statement"]
        assert (statement["Principal"], statement["Resource"], statement["Condition"]) == ("*", "*", account)
    endpoint_ingress = built.one(T["ingress"], "endpoints-ingress")
    assert (endpoint_ingress.inputs["fromPort"], endpoint_ingress.inputs["toPort"]) == (443, 443)
    assert endpoint_ingress.inputs["referencedSecurityGroupId"] == built.outputs["nodeSecurityGroup"]


def test_no_ssh_and_no_open_ingress(built):
    for sg in built.of_type(T["sg"]):
        assert "ingress" not in sg.inputs and "egress" not in sg.inputs, "rules are separate resources"
    for rule in built.of_type(T["ingress"]):
        assert "cidrIpv4" not in rule.inputs and "cidrIpv6" not in rule.inputs
        assert "referencedSecurityGroupId" in rule.inputs
        if rule.inputs["ipProtocol"] != "-1":
            assert not rule.inputs["fromPort"] <= 22 <= rule.inputs["toPort"]
    lt = built.one(T["lt"])
    assert "keyName" not in lt.inputs
    assert "vpcSecurityGroupIds" not in lt.inputs


def test_node_to_node_rules_only_in_gang_mode(built):
    sg_id = built.outputs["nodeSecurityGroup"]
    self_rules = [r for r in built.of_type(T["ingress"]) + built.of_type(T["egress"])
                  if r.inputs.get("referencedSecurityGroupId") == sg_id and r.inputs["securityGroupId"] == sg_id]
    if built.cfg.mode == "gang":
        kinds = sorted(r.type for r in self_rules)
        assert kinds == sorted([T["egress"], T["ingress"]])
        assert all(r.inputs["ipProtocol"] == "-1" for r in self_rules)
    else:
        assert self_rules == []


def test_gang_mode_has_cluster_placement_group_and_one_subnet(built):
    asg = built.one(T["asg"])
    groups = built.of_type("aws:ec2/placementGroup:PlacementGroup")
    if built.cfg.mode == "gang":
        assert [g.inputs["strategy"] for g in groups] == ["cluster"]
        assert asg.inputs["placementGroup"] == groups[0].state["name"] == built.outputs["placementGroup"]
        assert len(asg.inputs["vpcZoneIdentifiers"]) == 1
    else:
        assert groups == [] and "placementGroup" not in asg.inputs
        assert len(asg.inputs["vpcZoneIdentifiers"]) == 3


def test_no_public_ip_on_any_interface(built):
    nics = built.one(T["lt"]).inputs["networkInterfaces"]
    primary = [n for n in nics if n["networkCardIndex"] == 0 and n["deviceIndex"] == 0]
    assert len(primary) == 1 and primary[0]["associatePublicIpAddress"] == "false"
    assert all(n.get("associatePublicIpAddress", "false") == "false" for n in nics)
    assert all(n["securityGroups"] == [built.outputs["nodeSecurityGroup"]] for n in nics)


# --- flow logs ----------------------------------------------------------------------------------

def assert_flow_logs(b, vpc_ids):
    """One ALL-traffic flow log per VPC into the KMS-encrypted flow log group, through a least-privilege
    role that only VPC Flow Logs of this account can assume."""
    stack, o = b.cfg.stack, b.outputs
    group = _log_group(b, f"/gpufleet/{stack}/vpc-flow-logs")
    assert o["flowLogGroup"] == group.state["name"]
    assert group.inputs["kmsKeyId"] == o["kmsKey"]
    assert group.inputs["retentionInDays"] == _log_group(b, f"/gpufleet/{stack}").inputs["retentionInDays"]
    key_doc = json.loads(b.one(T["key"]).inputs["policy"])
    key_logs = next(s for s in key_doc["Statement"] if s["Sid"] == "CloudWatchLogsForStackLogGroups")
    assert key_logs["Principal"] == {"Service": f"logs.{b.cfg.region}.amazonaws.com"}
    assert group.state["arn"] in key_logs["Condition"]["ArnEquals"]["kms:EncryptionContext:aws:logs:arn"]

    role = b.one(T["role"], "vpc-flow-logs")
    logs = b.of_type(T["flow_log"])
    assert sorted(f.inputs["vpcId"] for f in logs) == sorted(vpc_ids)
    for f in logs:
        assert f.inputs["trafficType"] == "ALL" and f.inputs["maxAggregationInterval"] == 60
        assert f.inputs["logDestinationType"] == "cloud-watch-logs"
        assert f.inputs["logDestination"] == group.state["arn"]
        assert f.inputs["iamRoleArn"] == role.state["arn"]
        assert f.inputs["tags"] == b.cfg.all_tags

    (trust,) = json.loads(role.inputs["assumeRolePolicy"])["Statement"]
    assert trust["Principal"] == {"Service": "vpc-flow-logs.amazonaws.com"} and trust["Action"] == "sts:AssumeRole"
    assert trust["Condition"]["StringEquals"] == {"aws:SourceAccount": ACCOUNT}
    assert "managedPolicyArns" not in role.inputs and "inlinePolicies" not in role.inputs
    assert not [a for a in b.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
                if a.inputs["role"] == role.state["name"]]
    (inline,) = [r for r in b.of_type(T["role_policy"]) if r.inputs["role"] == role.state["name"]]
    doc = json.loads(inline.inputs["policy"])
    assert_least_privilege(doc, f"gpufleet/{stack}")
    actions = {a for st in doc["Statement"] for a in st["Action"]}
    resources = {r for st in doc["Statement"] for r in st["Resource"]}
    assert actions == {"logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"}
    assert resources == {group.state["arn"], group.state["arn"] + ":*"}


def test_every_vpc_the_stack_creates_has_flow_logs(built):
    vpcs = built.of_type("aws:ec2/vpc:Vpc")
    assert [v.id for v in vpcs] == [built.outputs["vpcId"]]
    assert_flow_logs(built, [v.id for v in vpcs])


def test_phi_flow_logs_keep_the_phi_retention(phi):
    assert_flow_logs(phi, [phi.outputs["vpcId"]])
    # HIPAA keeps records six years
    assert _log_group(phi, "/gpufleet/dev/vpc-flow-logs").inputs["retentionInDays"] >= 365 * 6


# --- storage ------------------------------------------------------------------------------------

def _for_bucket(b, typ, bucket_name):
    found = [r for r in b.of_type(typ) if r.inputs["bucket"] == bucket_name]
    assert len(found) == 1, (typ, bucket_name)
    return found[0].inputs


def test_key_rotates(built):
    key = built.one(T["key"])
    assert key.inputs["enableKeyRotation"] is True
    doc = json.loads(key.inputs["policy"])
    logs = next(s for s in doc["Statement"] if s["Sid"] == "CloudWatchLogsForStackLogGroups")
    assert logs["Principal"] == {"Service": f"logs.{built.cfg.region}.amazonaws.com"}
    # the encryption context CloudWatch Logs sends is the log group's ARN
    assert set(logs["Condition"]["ArnEquals"]["kms:EncryptionContext:aws:logs:arn"]) == {
        r.state["arn"] for r in built.of_type(T["log_group"])}


def test_bucket_is_private_versioned_encrypted_tls_only(built):
    name, key_arn = built.outputs["bucket"], built.outputs["kmsKey"]
    bucket = [r for r in built.of_type(T["bucket"]) if r.state["bucket"] == name][0]
    assert _for_bucket(built, "aws:s3/bucketVersioning:BucketVersioning", name)["versioningConfiguration"] == {
        "status": "Enabled"}
    (rule,) = _for_bucket(built, "aws:s3/bucketServerSideEncryptionConfiguration:"
                                 "BucketServerSideEncryptionConfiguration", name)["rules"]
    assert rule["applyServerSideEncryptionByDefault"] == {"sseAlgorithm": "aws:kms", "kmsMasterKeyId": key_arn}
    assert rule["bucketKeyEnabled"] is True
    pab = _for_bucket(built, "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock", name)
    assert all(pab[flag] is True for flag in
               ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets"))
    ownership = _for_bucket(built, "aws:s3/bucketOwnershipControls:BucketOwnershipControls", name)
    assert ownership["rule"] == {"objectOwnership": "BucketOwnerEnforced"}
    assert "acl" not in bucket.inputs and "policy" not in bucket.inputs
    doc = json.loads(_for_bucket(built, "aws:s3/bucketPolicy:BucketPolicy", name)["policy"])
    conditions = [s["Condition"] for s in doc["Statement"] if s["Effect"] == "Deny"]
    assert {"Bool": {"aws:SecureTransport": "false"}} in conditions
    assert {"NumericLessThan": {"s3:TlsVersion": "1.2"}} in conditions
    assert all(s["Resource"] == [bucket.state["arn"], bucket.state["arn"] + "/*"] for s in doc["Statement"])
    (life,) = _for_bucket(built, "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration", name)["rules"]
    assert life["status"] == "Enabled" and life["noncurrentVersionExpiration"]["noncurrentDays"] > 0


def test_access_logging_for_personal_and_phi_data_only(built):
    logged = built.cfg.data_classification in ("personal", "phi")
    assert built.cfg.data_classification == ("personal" if built.cfg.stack == "prod" else "internal")
    assert len(built.of_type("aws:s3/bucketLogging:BucketLogging")) == logged
    assert (built.outputs["accessLogBucket"] is not None) == logged


@pytest.fixture(scope="module")
def phi():
    return build_stack(stack_config("dev", {"gpufleet:dataClassification": "phi",
                                            "gpufleet:alertEmails": ["ops@example.com", "ml@example.com"]}))


@pytest.mark.parametrize("variant", ["phi", "prod"])
def test_regulated_bucket_logs_access_to_a_locked_log_bucket(variant, request):
    phi = request.getfixturevalue(variant)
    data, logs = phi.outputs["bucket"], phi.outputs["accessLogBucket"]
    logging = phi.one("aws:s3/bucketLogging:BucketLogging")
    assert logging.inputs["bucket"] == data and logging.inputs["targetBucket"] == logs
    # the log bucket carries the same guards (S3 delivers access logs to SSE-S3 buckets only)
    (rule,) = _for_bucket(phi, "aws:s3/bucketServerSideEncryptionConfiguration:"
                               "BucketServerSideEncryptionConfiguration", logs)["rules"]
    assert rule["applyServerSideEncryptionByDefault"]["sseAlgorithm"] == "AES256"
    pab = _for_bucket(phi, "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock", logs)
    assert all(pab[f] is True for f in ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls",
                                         "restrictPublicBuckets"))
    doc = json.loads(_for_bucket(phi, "aws:s3/bucketPolicy:BucketPolicy", logs)["policy"])
    delivery = next(s for s in doc["Statement"] if s["Effect"] == "Allow")
    assert delivery["Principal"] == {"Service": "logging.s3.amazonaws.com"}
    assert delivery["Condition"]["ArnLike"]["aws:SourceArn"] == f"arn:aws:s3:::{data}"
    assert _log_group(phi, f"/gpufleet/{phi.cfg.stack}").inputs["retentionInDays"] >= 365


def test_alert_emails_subscribe_and_get_budget_mail(phi):
    subs = phi.of_type("aws:sns/topicSubscription:TopicSubscription")
    assert sorted(s.inputs["endpoint"] for s in subs) == ["ml@example.com", "ops@example.com"]
    assert all(s.inputs["protocol"] == "email" and s.inputs["topic"] == phi.outputs["alertTopic"] for s in subs)
    budget = phi.one("aws:budgets/budget:Budget")
    assert all(n["subscriberEmailAddresses"] == ["ops@example.com", "ml@example.com"]
               for n in budget.inputs["notifications"])


def test_alert_recipients_email_https_and_chat():
    b = build_stack(stack_config("dev", {"gpufleet:alertEmails": ["ops@example.com"], "gpufleet:alerts": [
        {"email": "ml@example.com"}, {"https": "https://events.example.com/sns"},
        {"chat": "https://hooks.example.com/services/T0/B0/x"}]}))
    topic = b.outputs["alertTopic"]
    subs = {(s.inputs["protocol"], s.inputs["endpoint"]) for s in b.of_type("aws:sns/topicSubscription:TopicSubscription")
            if s.inputs["topic"] == topic}
    function = b.one("aws:lambda/function:Function")
    assert subs == {("email", "ops@example.com"), ("email", "ml@example.com"),
                    ("https", "https://events.example.com/sns"), ("lambda", function.state["arn"])}
    env = function.inputs["environment"]  # a secret: the webhook URL is a credential
    assert env[pulumi.runtime.rpc._special_sig_key] == pulumi.runtime.rpc._special_secret_sig
    assert json.loads(env["value"]["variables"]["GPUFLEET_CHAT_WEBHOOKS"]) == [
        "https://hooks.example.com/services/T0/B0/x"]
    assert function.inputs["handler"] == "chat_forwarder.handler"
    permission = b.one("aws:lambda/permission:Permission")
    assert (permission.inputs["principal"], permission.inputs["sourceArn"]) == ("sns.amazonaws.com", topic)
    # its log group is encrypted with the stack key, which lets CloudWatch Logs use it for that group
    logs = _log_group(b, "/gpufleet/dev/chat-alerts")
    assert function.inputs["loggingConfig"]["logGroup"] == logs.inputs["name"] and logs.inputs["kmsKeyId"]
    key = json.loads(b.one(T["key"]).inputs["policy"])
    grant = next(s for s in key["Statement"] if s["Sid"] == "CloudWatchLogsForStackLogGroups")
    assert logs.state["arn"] in grant["Condition"]["ArnEquals"]["kms:EncryptionContext:aws:logs:arn"]
    (writes,) = json.loads(b.one(T["role_policy"], "-chat").inputs["policy"])["Statement"]
    assert writes["Resource"] == [logs.state["arn"], logs.state["arn"] + ":*"]
    budget = b.one("aws:budgets/budget:Budget")
    assert all(n["subscriberEmailAddresses"] == ["ops@example.com", "ml@example.com"]
               for n in budget.inputs["notifications"])


def test_no_forwarder_without_chat_recipients(built):
    assert built.of_type("aws:lambda/function:Function") == []
    assert built.of_type("aws:sns/topicSubscription:TopicSubscription") == []


# --- queue --------------------------------------------------------------------------------------

def test_queues_encrypted_redriven_tls_only(built):
    key_arn = built.outputs["kmsKey"]
    queues = {r.state["url"]: r for r in built.of_type(T["queue"])}
    main, dlq = queues[built.outputs["queueUrl"]], queues[built.outputs["dlqUrl"]]
    assert main.inputs["kmsMasterKeyId"] == dlq.inputs["kmsMasterKeyId"] == key_arn
    redrive = json.loads(main.inputs["redrivePolicy"])
    assert redrive["deadLetterTargetArn"] == dlq.state["arn"] and redrive["maxReceiveCount"] >= 1
    policies = {r.inputs["queueUrl"]: json.loads(r.inputs["policy"]) for r in built.of_type("aws:sqs/queuePolicy:QueuePolicy")}
    for q in (main, dlq):
        (st,) = policies[q.state["url"]]["Statement"]
        assert st["Effect"] == "Deny" and st["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
        assert st["Resource"] == [q.state["arn"]]


# --- identity -----------------------------------------------------------------------------------

def test_node_identity_is_least_privilege_and_ssm_only(built):
    role = built.one(T["role"], "-node")
    assume = json.loads(role.inputs["assumeRolePolicy"])
    assert assume["Statement"][0]["Principal"] == {"Service": "ec2.amazonaws.com"}
    assert "managedPolicyArns" not in role.inputs and "inlinePolicies" not in role.inputs
    attached = [r.inputs["policyArn"] for r in built.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")]
    assert attached == ["arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore"]
    doc = json.loads(built.one(T["role_policy"], "-node").inputs["policy"])
    assert_least_privilege(doc, f"gpufleet/{built.cfg.stack}")
    bucket_arn = f"arn:aws:s3:::{built.outputs['bucket']}"
    queue_arn = next(q.state["arn"] for q in built.of_type(T["queue"]) if q.state["url"] == built.outputs["queueUrl"])
    dlq_arn = next(q.state["arn"] for q in built.of_type(T["queue"]) if q.state["url"] == built.outputs["dlqUrl"])
    log_arn = _log_group(built, built.outputs["logGroup"]).state["arn"]
    scoped = {r for st in doc["Statement"] for r in ([st["Resource"]] if isinstance(st["Resource"], str) else st["Resource"])}
    repositories = {built.one(T["repo"]).state["arn"]} | {
        f"arn:aws:ecr:{built.cfg.region}:{ACCOUNT}:repository/{rule.prefix}/*" for rule in built.cfg.pull_through}
    secrets = f"arn:aws:ssm:{built.cfg.region}:{ACCOUNT}:parameter/gpufleet/{built.cfg.stack}/*"
    assert scoped - {"*"} == {bucket_arn, bucket_arn + "/*", built.outputs["kmsKey"], queue_arn, dlq_arn, secrets, log_arn,
                              log_arn + ":*", f"arn:aws:autoscaling:{built.cfg.region}:123456789012:autoScalingGroup:*:"
                                              f"autoScalingGroupName/{built.outputs['autoscalingGroup']}"} | repositories
    profile = built.one("aws:iam/instanceProfile:InstanceProfile")
    assert profile.inputs["role"] == role.state["name"]
    assert built.one(T["lt"]).inputs["iamInstanceProfile"] == {"arn": profile.state["arn"]}


# --- compute ------------------------------------------------------------------------------------

def test_launch_template_hardening(built):
    lt = built.one(T["lt"]).inputs
    assert lt["metadataOptions"]["httpTokens"] == "required"
    assert lt["metadataOptions"]["httpEndpoint"] == "enabled"
    assert 1 <= lt["metadataOptions"]["httpPutResponseHopLimit"] <= 2
    (root,) = lt["blockDeviceMappings"]
    assert root["deviceName"] == "/dev/sda1"  # the AMI's root device, from the one AMI lookup
    assert root["ebs"]["volumeType"] == "gp3" and root["ebs"]["encrypted"] == "true"
    assert root["ebs"]["kmsKeyId"] == built.outputs["kmsKey"]
    assert "instanceType" not in lt, "types come from the mixed-instances overrides"


@pytest.mark.parametrize("variant", ["dev", "prod", "phi"])
def test_root_volumes_use_the_stack_key_through_the_stack_autoscaling_role(variant, request):
    b = request.getfixturevalue(variant)
    key = b.one(T["key"])
    (root,) = b.one(T["lt"]).inputs["blockDeviceMappings"]
    assert root["ebs"] == {"volumeSize": 200, "volumeType": "gp3", "encrypted": "true",
                           "kmsKeyId": key.state["arn"], "deleteOnTermination": "true"}
    slr = b.one(T["slr"])
    assert slr.inputs["awsServiceName"] == "autoscaling.amazonaws.com"
    assert slr.inputs["customSuffix"] == f"gpufleet-{b.cfg.stack}"
    assert slr.state["arn"] == (f"arn:aws:iam::{ACCOUNT}:role/aws-service-role/autoscaling.amazonaws.com/"
                                f"AWSServiceRoleForAutoScaling_gpufleet-{b.cfg.stack}")
    assert b.one(T["asg"]).inputs["serviceLinkedRoleArn"] == slr.state["arn"] == b.outputs["autoscalingServiceRole"]
    assert_autoscaling_ebs_grants(json.loads(key.inputs["policy"]), slr.state["arn"])
    # the key policy names the role, so the role exists before the key
    assert b.resources.index(slr) < b.resources.index(key)
    # nodes need no key rights for their own volumes (EC2 uses the grants); theirs are for S3 and SQS
    node_doc = json.loads(b.one(T["role_policy"], "-node").inputs["policy"])
    node_kms = [st for st in node_doc["Statement"] if str(st["Action"]).startswith(("kms:", "['kms:"))]
    assert [(st["Action"], st["Resource"]) for st in node_kms] == [(["kms:Decrypt", "kms:GenerateDataKey"],
                                                                   key.state["arn"])]


def test_ami_looked_up_once_by_id_or_name(built):
    amis = [args for token, args in built.calls if token == "aws:ec2/getAmi:getAmi"]
    assert len(amis) == 1
    secrets = [args for token, args in built.calls if token == "aws:secretsmanager/getSecret:getSecret"]
    assert sorted(a["name"] for a in secrets) == sorted(
        r.credential_secret for r in built.cfg.pull_through if r.credential_secret)
    # caller identity, availability zones, AMI: each once; one secret lookup per credentialed cache rule
    assert len(built.calls) == 3 + len(secrets)
    image = built.cfg.image
    filters = {f["name"]: f["values"] for f in amis[0]["filters"]}
    if image.id:
        assert filters["image-id"] == [image.id]
        assert built.one(T["lt"]).inputs["imageId"] == image.id
    else:
        assert filters["name"] == [image.name] and amis[0]["owners"] == list(image.owners)
        assert amis[0]["mostRecent"] is True


def test_efa_interfaces_in_launch_template(built):
    nics = built.one(T["lt"]).inputs["networkInterfaces"]
    expected = efa.layout(built.cfg.primary, use_efa=built.cfg.multi_node)
    got = tuple(efa.Interface(int(n["networkCardIndex"]), int(n["deviceIndex"]), n["interfaceType"]) for n in nics)
    assert got == expected
    assert efa.efa_count(got) == (32 if built.cfg.stack == "prod" else 0)
    assert built.outputs["efaInterfacesPerNode"] == efa.efa_count(got)


@pytest.mark.parametrize("instance_type,count", [("p4d.24xlarge", 4), ("p5e.48xlarge", 32), ("p5en.48xlarge", 16),
                                                 ("g6e.48xlarge", 4)])
def test_efa_layout_reaches_the_launch_template(instance_type, count):
    b = build_stack(stack_config("prod", {"gpufleet:instanceTypes": [instance_type]}))
    nics = b.one(T["lt"]).inputs["networkInterfaces"]
    assert sum(n["interfaceType"] in ("efa", "efa-only") for n in nics) == count
    assert len({n["networkCardIndex"] for n in nics}) == CATALOG[instance_type].network_cards
    assert b.node_json()["instance_types"][instance_type]["efa"] == count


def test_user_data_writes_node_settings_and_starts_the_agent(built):
    assert built.user_data().startswith("#cloud-config")
    assert "gpufleet-agent.service" in built.user_data()
    node = built.node_json()
    o = built.outputs
    assert node["bucket"] == o["bucket"] and node["queue_url"] == o["queueUrl"]
    assert node["asg_name"] == o["autoscalingGroup"] and node["log_group"] == o["logGroup"]
    assert node["metric_namespace"] == f"gpufleet/{built.cfg.stack}" and node["mode"] == built.cfg.mode
    assert node["node_count"] == (4 if built.cfg.mode == "gang" else 1)
    assert set(node["instance_types"]) == set(built.cfg.instance_types)
    hooks = {h["lifecycleTransition"]: h["name"] for h in built.one(T["asg"]).inputs["initialLifecycleHooks"]}
    assert node["launch_hook"] == hooks["autoscaling:EC2_INSTANCE_LAUNCHING"]
    assert node["terminate_hook"] == hooks["autoscaling:EC2_INSTANCE_TERMINATING"]


def test_autoscaling_group(built):
    cfg, asg = built.cfg, built.one(T["asg"]).inputs
    mip = asg["mixedInstancesPolicy"]
    dist = mip["instancesDistribution"]
    assert dist["spotAllocationStrategy"] == "price-capacity-optimized"
    assert dist["onDemandBaseCapacity"] == cfg.on_demand_base
    assert dist["onDemandPercentageAboveBaseCapacity"] == (0 if cfg.spot else 100)
    assert [o["instanceType"] for o in mip["launchTemplate"]["overrides"]] == list(cfg.instance_types)
    spec = mip["launchTemplate"]["launchTemplateSpecification"]
    assert spec["launchTemplateId"] == built.outputs["launchTemplate"] and spec["version"] == "1"
    assert asg["capacityRebalance"] is cfg.spot
    hooks = {h["lifecycleTransition"]: h for h in asg["initialLifecycleHooks"]}
    assert hooks["autoscaling:EC2_INSTANCE_LAUNCHING"]["defaultResult"] == "ABANDON"
    assert hooks["autoscaling:EC2_INSTANCE_TERMINATING"]["defaultResult"] == "CONTINUE"
    assert hooks["autoscaling:EC2_INSTANCE_TERMINATING"]["heartbeatTimeout"] >= 120
    assert "GroupInServiceInstances" in asg["enabledMetrics"]
    assert asg["instanceRefresh"]["strategy"] == "Rolling"
    assert asg["waitForCapacityTimeout"] == "0"
    assert asg["vpcZoneIdentifiers"] == built.outputs["subnetIds"]


def test_gang_mode_fixed_size_without_scaling(prod):
    asg = prod.one(T["asg"]).inputs
    assert (asg["minSize"], asg["maxSize"], asg["desiredCapacity"]) == (4, 4, 4)
    assert prod.of_type(T["policy"]) == []
    assert all("backlog" not in a.name for a in prod.of_type(T["alarm"]))


def _step_capacity_from_inputs(policy_inputs, backlog):
    steps = [scaling.Step(float(s["metricIntervalLowerBound"]) if "metricIntervalLowerBound" in s else None,
                          float(s["metricIntervalUpperBound"]) if "metricIntervalUpperBound" in s else None,
                          int(s["scalingAdjustment"])) for s in policy_inputs["stepAdjustments"]]
    return scaling.step_capacity(steps, backlog)


def test_queue_mode_scales_from_zero_to_max_and_back_to_zero(dev):
    asg = dev.one(T["asg"]).inputs
    assert (asg["minSize"], asg["maxSize"], asg["desiredCapacity"]) == (0, 4, 0)
    policy = dev.one(T["policy"])
    assert policy.inputs["policyType"] == "StepScaling" and policy.inputs["adjustmentType"] == "ExactCapacity"
    assert policy.inputs["autoscalingGroupName"] == "gpufleet-dev-nodes"
    alarm = dev.one(T["alarm"], "backlog").inputs
    assert alarm["alarmActions"] == [policy.state["arn"]]
    assert alarm["comparisonOperator"] == "GreaterThanOrEqualToThreshold" and alarm["threshold"] == 0
    queries = {q["id"]: q for q in alarm["metricQueries"]}
    queue_name = next(q.state["name"] for q in dev.of_type(T["queue"]) if q.state["url"] == dev.outputs["queueUrl"])
    assert queries["visible"]["metric"]["metricName"] == "ApproximateNumberOfMessagesVisible"
    assert queries["in_flight"]["metric"]["metricName"] == "ApproximateNumberOfMessagesNotVisible"
    assert all(queries[i]["metric"]["dimensions"] == {"QueueName": queue_name} for i in ("visible", "in_flight"))
    assert queries["backlog"]["returnData"] is True
    assert queries["backlog"]["expression"] == "FILL(visible, 0) + FILL(in_flight, 0)"
    # Walk a day of jobs through the deployed steps: 0 -> max -> 0, running jobs keep their nodes.
    day = [(0, 0, 0), (1, 0, 1), (3, 1, 4), (9, 4, 4), (0, 3, 3), (0, 1, 1), (0, 0, 0)]
    for visible, in_flight, nodes in day:
        assert _step_capacity_from_inputs(policy.inputs, visible + in_flight) == nodes


# --- monitoring ---------------------------------------------------------------------------------

def test_monitoring(built):
    stack, o = built.cfg.stack, built.outputs
    log_group = _log_group(built, f"/gpufleet/{stack}").inputs
    assert log_group["name"] == f"/gpufleet/{stack}" == o["logGroup"]
    assert log_group["kmsKeyId"] == o["kmsKey"] and log_group["retentionInDays"] > 0
    topic = built.one("aws:sns/topic:Topic")
    assert topic.inputs["kmsMasterKeyId"] == o["kmsKey"]
    topic_doc = json.loads(built.one("aws:sns/topicPolicy:TopicPolicy").inputs["policy"])
    assert any(s["Effect"] == "Deny" and s["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
               for s in topic_doc["Statement"])
    alarms = {a.name.removeprefix(f"gpufleet-{stack}-"): a.inputs for a in built.of_type(T["alarm"])}
    queues = {q.state["url"]: q.state["name"] for q in built.of_type(T["queue"])}
    dlq = alarms["dead-letters"]
    assert dlq["dimensions"] == {"QueueName": queues[o["dlqUrl"]]} and dlq["threshold"] == 0
    assert dlq["comparisonOperator"] == "GreaterThanThreshold"
    old = alarms["old-jobs"]  # waiting jobs only: visible messages, never the in-flight ones of running jobs
    assert (old["metricName"], old["statistic"]) == ("ApproximateNumberOfMessagesVisible", "Minimum")
    assert old["dimensions"] == {"QueueName": queues[o["queueUrl"]]}
    assert old["period"] * old["evaluationPeriods"] == 3600 and old["datapointsToAlarm"] == old["evaluationPeriods"]
    idle = {q["id"]: q for q in alarms["idle-gpus"]["metricQueries"]}
    assert idle["gpu"]["metric"]["namespace"] == f"gpufleet/{stack}"
    assert idle["nodes"]["metric"]["metricName"] == "GroupInServiceInstances"
    assert idle["nodes"]["metric"]["dimensions"] == {"AutoScalingGroupName": o["autoscalingGroup"]}
    # GPUs count as idle only where nodes measured them: no FILL turns a missing GPU metric into 0 %
    assert idle["idle"]["expression"] == "IF(FILL(nodes, 0) > 0 AND gpu < 5, 1, 0)"
    for name in ("dead-letters", "old-jobs", "idle-gpus"):
        assert alarms[name]["alarmActions"] == [o["alertTopic"]]
    body = json.loads(built.one("aws:cloudwatch/dashboard:Dashboard").inputs["dashboardBody"])
    assert queues[o["queueUrl"]] in json.dumps(body) and len(body["widgets"]) >= 4
    budget = built.one("aws:budgets/budget:Budget").inputs
    assert budget["timeUnit"] == "MONTHLY" and budget["budgetType"] == "COST"
    assert float(budget["limitAmount"]) == built.cfg.budget_monthly_usd and budget["limitUnit"] == "USD"
    assert budget["notifications"] and all(n["subscriberSnsTopicArns"] == [o["alertTopic"]]
                                           for n in budget["notifications"])


# --- every resource -----------------------------------------------------------------------------

def _taggable(token: str) -> bool:
    module, cls = token.split(":")[1].split("/")[0], token.split(":")[2]
    pyclass = getattr(importlib.import_module(f"pulumi_aws.{module}"), cls)
    return "tags" in inspect.signature(pyclass._internal_init).parameters


def test_every_taggable_resource_carries_the_tags(built):
    want = built.cfg.all_tags
    assert want["data-classification"] == built.cfg.data_classification and "team" in want
    custom = [r for r in built.resources if r.custom]
    taggable = [r for r in custom if _taggable(r.type)]
    assert len(taggable) > 30
    for r in taggable:
        tags = r.inputs.get("tags")
        if r.type == T["asg"]:
            tags = {t["key"]: t["value"] for t in tags if t["propagateAtLaunch"]}
        assert tags is not None and want.items() <= tags.items(), r.name
    specs = {s["resourceType"]: s["tags"] for s in built.one(T["lt"]).inputs["tagSpecifications"]}
    assert {"instance", "volume", "network-interface"} <= set(specs)
    assert all(want.items() <= t.items() for t in specs.values())


def test_each_resource_belongs_to_one_concern(built):
    concerns = {"Network", "FlowLogs", "Storage", "Queue", "Identity", "Compute", "Monitoring", "Registry"}
    components = [r for r in built.resources if not r.custom]
    assert sorted(r.type for r in components) == sorted(f"gpufleet:aws:{c}" for c in concerns)
    for r in built.resources:
        if r.custom:
            parent = r.urn.split("::")[2].split("$")[0]
            assert parent.removeprefix("gpufleet:aws:") in concerns, r.urn


def test_outputs(built):
    o = built.outputs
    for key in ("bucket", "queueUrl", "dlqUrl", "autoscalingGroup", "dashboard", "logGroup", "kmsKey", "nodeRole",
                "launchTemplate", "region", "alertTopic", "vpcId", "subnetIds", "metricNamespace",
                "autoscalingServiceRole", "registry"):
        assert o[key], key
    assert o["region"] == built.cfg.region
    assert o["queueUrl"].startswith(f"https://sqs.{built.cfg.region}.amazonaws.com/")


def test_existing_network_is_used_as_given():
    existing = {"vpcId": "vpc-0123456789abcdef0",
                "subnetIds": ["subnet-0aaaaaaaaaaaaaaa1", "subnet-0bbbbbbbbbbbbbbb2"]}
    for stack, subnets in (("dev", existing["subnetIds"]), ("prod", existing["subnetIds"][:1])):
        b = build_stack(stack_config(stack, {"gpufleet:network": existing}))
        types = {r.type for r in b.resources}
        assert not types & {"aws:ec2/vpc:Vpc", T["subnet"], T["endpoint"]}
        assert b.one(T["asg"]).inputs["vpcZoneIdentifiers"] == subnets
        assert _node_sg(b).inputs["vpcId"] == existing["vpcId"]
        https = b.one(T["egress"], "egress-https").inputs
        assert (https["ipProtocol"], https["fromPort"], https["toPort"]) == ("tcp", 443, 443)
        assert not [r for r in b.of_type(T["ingress"]) if "cidrIpv4" in r.inputs]
        assert_flow_logs(b, [existing["vpcId"]])
