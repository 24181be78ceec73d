"""The AWS stack on Pulumi's mock runtime: security properties for dev and prod, the Slurm controller, the
partitions' launch templates, EFA, the shared file system, tags."""
from __future__ import annotations

import importlib
import inspect
import json

import pulumi
import pytest

from infra import slurm
from infra.aws import dns_firewall, efa, network, policies, registry
from infra.aws import stack as aws_stack
from infra.catalog import CATALOG
from tests.infra.aws.harness import ACCOUNT, assert_least_privilege, build_stack, stack_config

STACKS = ["dev", "prod"]
T = {  # resource type tokens
    "bucket": "aws:s3/bucket:Bucket", "key": "aws:kms/key:Key", "queue": "aws:sqs/queue:Queue",
    "lt": "aws:ec2/launchTemplate:LaunchTemplate", "instance": "aws:ec2/instance:Instance",
    "eni": "aws:ec2/networkInterface:NetworkInterface", "secret": "aws:secretsmanager/secret:Secret",
    "efs": "aws:efs/fileSystem:FileSystem", "ap": "aws:efs/accessPoint:AccessPoint",
    "mount": "aws:efs/mountTarget:MountTarget", "partition": "gpufleet:aws:Partition",
    "sg": "aws:ec2/securityGroup:SecurityGroup", "ingress": "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule",
    "egress": "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule", "endpoint": "aws:ec2/vpcEndpoint:VpcEndpoint",
    "subnet": "aws:ec2/subnet:Subnet", "alarm": "aws:cloudwatch/metricAlarm:MetricAlarm",
    "log_group": "aws:cloudwatch/logGroup:LogGroup",
    "role": "aws:iam/role:Role", "role_policy": "aws:iam/rolePolicy:RolePolicy", "flow_log": "aws:ec2/flowLog:FlowLog",
    "repo": "aws:ecr/repository:Repository",
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
                      "aws:ec2/eip:Eip", "aws:ec2/route:Route", "aws:autoscaling/group:Group"):
        assert forbidden not in types
    (controller,) = built.of_type(T["instance"])  # the one instance the stack runs itself: GPU nodes come from Slurm
    assert "associatePublicIpAddress" not in controller.inputs and "subnetId" not in controller.inputs
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
    for who, sg in (("nodes", "nodeSecurityGroup"), ("controller", "controllerSecurityGroup")):
        endpoint_ingress = built.one(T["ingress"], f"endpoints-ingress-{who}")
        assert (endpoint_ingress.inputs["fromPort"], endpoint_ingress.inputs["toPort"]) == (443, 443)
        assert endpoint_ingress.inputs["referencedSecurityGroupId"] == built.outputs[sg]


def test_no_ssh_and_no_open_ingress(built):
    for sg in built.of_type(T["sg"]):
        assert "ingress" not in sg.inputs and "egress" not in sg.inputs, "rules are separate resources"
    for rule in built.of_type(T["ingress"]):
        assert "cidrIpv4" not in rule.inputs and "cidrIpv6" not in rule.inputs
        assert "referencedSecurityGroupId" in rule.inputs
        if rule.inputs["ipProtocol"] != "-1":
            assert not rule.inputs["fromPort"] <= 22 <= rule.inputs["toPort"]
    lt = built.one(T["lt"])
    assert "keyName" not in lt.inputs and "keyName" not in built.one(T["instance"]).inputs
    assert "vpcSecurityGroupIds" not in lt.inputs


def _rules(b, sg_id: str) -> set[tuple]:
    """(direction, peer security group, from port, to port) of a group's rules."""
    out = set()
    for kind in ("ingress", "egress"):
        for r in b.of_type(T[kind]):
            if r.inputs["securityGroupId"] == sg_id and "referencedSecurityGroupId" in r.inputs:
                out.add((kind, r.inputs["referencedSecurityGroupId"], r.inputs.get("fromPort"), r.inputs.get("toPort")))
    return out


def test_slurm_and_nfs_traffic_is_held_to_its_ports(built):
    o = built.outputs
    nodes, ctl = o["nodeSecurityGroup"], o["controllerSecurityGroup"]
    fs = built.one(T["sg"], "-shared-fs").id
    low, high = slurm.SRUN_PORTS
    assert {r for r in _rules(built, ctl) if r[1] == nodes} == {
        ("ingress", nodes, 6817, 6817), ("ingress", nodes, low, high), ("egress", nodes, 6818, 6818)}
    assert {r for r in _rules(built, nodes) if r[1] == ctl} == {
        ("egress", ctl, 6817, 6817), ("egress", ctl, low, high), ("ingress", ctl, 6818, 6818)}
    assert _rules(built, fs) == {("ingress", nodes, 2049, 2049), ("ingress", ctl, 2049, 2049)}
    for sg in (nodes, ctl):
        assert ("egress", fs, 2049, 2049) in _rules(built, sg)
    # the controller's address: an interface of its own in the first subnet, in the controller's group
    eni = built.one(T["eni"])
    assert eni.inputs["subnetId"] == o["subnetIds"][0] and eni.inputs["securityGroups"] == [ctl]
    assert o["controllerAddress"] == eni.state["privateIp"]


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


def test_gang_partition_has_a_cluster_placement_group_and_one_subnet(built):
    groups = built.of_type("aws:ec2/placementGroup:PlacementGroup")
    nodes = built.controller_file("/etc/gpufleet/nodes.json")["partitions"]["gpu"]
    if built.cfg.mode == "gang":
        assert [g.inputs["strategy"] for g in groups] == ["cluster"]
        assert nodes["placement_group"] == groups[0].state["name"] == built.outputs["placementGroups"]["gpu"]
        assert nodes["subnet_ids"] == built.outputs["subnetIds"] and len(nodes["subnet_ids"]) == 1
        assert nodes["gang"] is True
    else:
        assert groups == [] and nodes["placement_group"] is None
        assert nodes["subnet_ids"] == built.outputs["subnetIds"] and len(nodes["subnet_ids"]) == 3


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


DNS = "aws:route53/resolver"


def test_the_stacks_vpc_resolves_only_aws_and_its_own_names_and_logs_every_query(built):
    """The DNS firewall: the region's AWS names and the VPC's own allowed first, every other name answered
    NXDOMAIN, the rule group on the stack's VPC; every query into a log group encrypted with the stack key."""
    region, vpc = built.cfg.region, built.outputs["vpcId"]
    lists = {r.id: r.inputs["domains"] for r in built.of_type(f"{DNS}FirewallDomainList:ResolverFirewallDomainList")}
    group = built.one(f"{DNS}FirewallRuleGroup:ResolverFirewallRuleGroup")
    rules = sorted((r.inputs for r in built.of_type(f"{DNS}FirewallRule:ResolverFirewallRule")),
                   key=lambda r: r["priority"])
    assert all(r["firewallRuleGroupId"] == group.id for r in rules)
    assert [(r["action"], lists[r["firewallDomainListId"]]) for r in rules] == [
        ("ALLOW", dns_firewall.allowed_domains(region)), ("BLOCK", ["*"])]
    assert rules[1]["blockResponse"] == "NXDOMAIN"
    association = built.one(f"{DNS}FirewallRuleGroupAssociation:ResolverFirewallRuleGroupAssociation").inputs
    assert (association["vpcId"], association["firewallRuleGroupId"]) == (vpc, group.id)
    log_group = _log_group(built, f"/gpufleet/{built.cfg.stack}/dns-queries")
    assert log_group.inputs["kmsKeyId"] == built.outputs["kmsKey"] and log_group.inputs["retentionInDays"]
    query_log = built.one(f"{DNS}QueryLogConfig:ResolverQueryLogConfig")
    assert query_log.inputs["destinationArn"] == log_group.state["arn"]
    logged = built.one(f"{DNS}QueryLogConfigAssociation:ResolverQueryLogConfigAssociation").inputs
    assert (logged["resolverQueryLogConfigId"], logged["resourceId"]) == (query_log.id, vpc)
    assert built.outputs["dnsQueryLogGroup"] == log_group.inputs["name"]


@pytest.mark.parametrize("region,allowed", [
    ("eu-west-1", ["*.eu-west-1.amazonaws.com", "*.eu-west-1.compute.internal"]),
    ("us-east-1", ["*.us-east-1.amazonaws.com", "*.ec2.internal"]),
    ("cn-north-1", ["*.cn-north-1.amazonaws.com.cn", "*.cn-north-1.compute.internal"])])
def test_allowed_domains_are_the_regions_aws_names_and_the_vpcs_own(region, allowed):
    assert dns_firewall.allowed_domains(region) == allowed


def test_every_name_a_node_resolves_is_allowed():
    """The names the nodes look up (the endpoints' private DNS, bucket and registry hosts, the EFS mount, the
    instances' own names) match an allowed domain; a name elsewhere does not."""
    from fnmatch import fnmatchcase

    from infra.aws import registry

    region = "eu-west-1"
    names = [f"{s}.{region}.amazonaws.com" for s in network.INTERFACE_ENDPOINTS]
    names += [f"gpufleet-dev-data-abc.s3.{region}.amazonaws.com", f"prod-{region}-starport-layer-bucket.s3.{region}."
              "amazonaws.com", registry.registry_host(ACCOUNT, region), f"fs-0123.efs.{region}.amazonaws.com",
              f"ip-10-42-0-17.{region}.compute.internal"]
    allowed = dns_firewall.allowed_domains(region)
    assert all(any(fnmatchcase(n, d) for d in allowed) for n in names)
    for outside in ("pypi.org", "s3.amazonaws.com", "attacker.example", f"x.{region}.amazonaws.com.attacker.example"):
        assert not any(fnmatchcase(outside, d) for d in allowed), outside


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
    teams = [t.name for t in built.cfg.teams]
    assert list(built.outputs["teamQueues"]) == teams and len(queues) == 2 * len(teams)
    assert built.outputs["teamQueues"][teams[0]] == built.outputs["queueUrl"]  # the first team's: the stack's queue
    policies = {r.inputs["queueUrl"]: json.loads(r.inputs["policy"]) for r in built.of_type("aws:sqs/queuePolicy:QueuePolicy")}
    for team in teams:
        main, dlq = queues[built.outputs["teamQueues"][team]], queues[built.outputs["teamDeadLetterQueues"][team]]
        assert main.inputs["kmsMasterKeyId"] == dlq.inputs["kmsMasterKeyId"] == key_arn
        redrive = json.loads(main.inputs["redrivePolicy"])
        assert redrive["deadLetterTargetArn"] == dlq.state["arn"] and redrive["maxReceiveCount"] >= 1
        for q in (main, dlq):
            tls = policies[q.state["url"]]["Statement"][0]
            assert tls["Effect"] == "Deny" and tls["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
            assert tls["Resource"] == [q.state["arn"]]
        # the queue takes messages from the team's submit role alone: its team is who sent it
        assert policies[main.state["url"]]["Statement"][1:] == [
            {"Sid": "OnlyTheTeamSends", "Effect": "Deny", "Principal": "*", "Action": "sqs:SendMessage",
             "Resource": main.state["arn"],
             "Condition": {"ArnNotEquals": {"aws:PrincipalArn": built.outputs["submitRoles"][team]}}}]
        assert len(policies[dlq.state["url"]]["Statement"]) == 1


def test_each_teams_submit_role_reaches_its_own_queues_only(built):
    queues = {r.state["url"]: r.state["arn"] for r in built.of_type(T["queue"])}
    account = built.outputs["kmsKey"].split(":")[4]
    for team, url in built.outputs["teamQueues"].items():
        role = built.one(T["role"], f"-submit-{team}")
        assert json.loads(role.inputs["assumeRolePolicy"])["Statement"] == [
            {"Effect": "Allow", "Principal": {"AWS": f"arn:aws:iam::{account}:root"}, "Action": "sts:AssumeRole"}]
        doc = json.loads(built.one(T["role_policy"], f"-submit-{team}-policy").inputs["policy"])
        sqs = {r for st in doc["Statement"] for r in ([st["Resource"]] if isinstance(st["Resource"], str)
                                                     else st["Resource"]) if ":sqs:" in r}
        assert sqs == {queues[url], queues[built.outputs["teamDeadLetterQueues"][team]]}
        sends = [st for st in doc["Statement"] if "sqs:SendMessage" in st["Action"]]
        assert [st["Resource"] for st in sends] == [queues[url]]
        assert not any(a.startswith(("ec2:", "iam:", "ssm:", "secretsmanager:")) for st in doc["Statement"]
                       for a in ([st["Action"]] if isinstance(st["Action"], str) else st["Action"]))


def test_each_teams_submit_role_reaches_only_its_teams_prefix_in_the_bucket(dev):
    """Issue 23: with two teams in config, each team's submit role names only teams/<team>/ in the bucket (not
    the other team's, not the bucket root's jobs/ or code/), and lists only there."""
    bucket_arn = f"arn:aws:s3:::{dev.outputs['bucket']}"
    teams = dev.outputs["teams"]
    assert teams == ["vision", "nlp"]
    for team in teams:
        doc = json.loads(dev.one(T["role_policy"], f"-submit-{team}-policy").inputs["policy"])
        s3 = [st for st in doc["Statement"] if any(a.startswith("s3:") for a in _actions(st))]
        objects = {r for st in s3 for r in _resources(st)} - {bucket_arn}
        assert objects == {f"{bucket_arn}/teams/{team}/{p}*" for p in ("jobs/", "jobs-index/", "code/")}
        assert [st["Condition"] for st in s3 if "s3:ListBucket" in _actions(st)] == [
            {"StringLike": {"s3:prefix": f"teams/{team}/*"}}]
        others = [f"{bucket_arn}/teams/{other}/" for other in teams if other != team]
        assert not [r for r in objects if r.startswith((*others, f"{bucket_arn}/jobs", f"{bucket_arn}/code"))]


# --- identity -----------------------------------------------------------------------------------

def _actions(st: dict) -> list[str]:
    return [st["Action"]] if isinstance(st["Action"], str) else st["Action"]


def _resources(st: dict) -> list[str]:
    return [st["Resource"]] if isinstance(st["Resource"], str) else st["Resource"]


def _policy_resources(doc: dict) -> set[str]:
    return {r for st in doc["Statement"] for r in _resources(st)}


def test_node_identity_is_least_privilege_and_ssm_only(built):
    role = built.one(T["role"], "-node")
    assume = json.loads(role.inputs["assumeRolePolicy"])
    assert assume["Statement"][0]["Principal"] == {"Service": "ec2.amazonaws.com"}
    assert "managedPolicyArns" not in role.inputs and "inlinePolicies" not in role.inputs
    # no managed policy (AmazonSSMManagedInstanceCore reads every SSM parameter of the account): Session Manager
    # is a statement of the stack's own, held to its VPC
    assert not built.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
    doc = json.loads(built.one(T["role_policy"], "-node").inputs["policy"])
    assert_least_privilege(doc, f"gpufleet/{built.cfg.stack}")
    bucket_arn = f"arn:aws:s3:::{built.outputs['bucket']}"
    log_arn = _log_group(built, built.outputs["logGroup"]).state["arn"]
    repositories = {built.one(T["repo"]).state["arn"]} | {
        f"arn:aws:ecr:{built.cfg.region}:{ACCOUNT}:repository/{rule.prefix}/*" for rule in built.cfg.pull_through}
    secrets = f"arn:aws:ssm:{built.cfg.region}:{ACCOUNT}:parameter/gpufleet/{built.cfg.stack}/*"
    assert _policy_resources(doc) - {"*"} == {bucket_arn, bucket_arn + "/*", bucket_arn + "/teams/*/jobs/*",
                                              bucket_arn + "/teams/*/jobs-index/*", built.outputs["kmsKey"], secrets,
                                              log_arn, log_arn + ":*", built.outputs["mungeKeySecret"],
                                              built.outputs["jobRole"]} | repositories
    (sm,) = [st for st in doc["Statement"] if st.get("Sid") == "SessionManager"]
    assert sm["Condition"] == {"StringEquals": {"aws:ec2InstanceSourceVPC": built.outputs["vpcId"]}}
    profile = built.one("aws:iam/instanceProfile:InstanceProfile", "-node")
    assert profile.inputs["role"] == role.state["name"]
    assert built.one(T["lt"]).inputs["iamInstanceProfile"] == {"arn": profile.state["arn"]}


def test_jobs_get_a_role_of_their_own_that_only_the_node_role_assumes(built):
    """Issue 23: the job role's trust names the node role; its policy is job_role_policy (held to the stack's VPC)
    plus the registry's pull statements; the node may assume it and no other role; node.json names it."""
    o, cfg = built.outputs, built.cfg
    node_role, role = built.one(T["role"], "-node"), built.one(T["role"], "-job")
    assert o["jobRole"] == role.state["arn"] and o["nodeRole"] == node_role.state["arn"]
    assert json.loads(role.inputs["assumeRolePolicy"]) == policies.assume_role_job(o["nodeRole"])
    assert "managedPolicyArns" not in role.inputs and "inlinePolicies" not in role.inputs
    assert cfg.all_tags.items() <= role.inputs["tags"].items()
    inline = built.one(T["role_policy"], "-job")
    assert inline.inputs["role"] == role.state["name"]
    bucket_arn = f"arn:aws:s3:::{o['bucket']}"
    parameters = policies.parameters_arn(cfg.region, ACCOUNT, f"/gpufleet/{cfg.stack}/")
    pulls = registry.pull_statements(cfg.region, ACCOUNT, f"gpufleet-{cfg.stack}",
                                     [rule.prefix for rule in cfg.pull_through])
    doc = json.loads(inline.inputs["policy"])
    assert doc["Statement"] == (policies.job_role_policy(bucket_arn, o["kmsKey"], parameters, o["vpcId"],
                                                         cfg.region)["Statement"] + pulls)
    (deny,) = [st for st in doc["Statement"] if st["Effect"] == "Deny"]
    assert deny["Condition"]["StringNotEqualsIfExists"] == {"aws:SourceVpc": o["vpcId"]}
    node_doc = json.loads(built.one(T["role_policy"], "-node").inputs["policy"])
    assert [st for st in node_doc["Statement"] if "sts:AssumeRole" in st["Action"]] == [
        {"Sid": "AssumeJobRole", "Effect": "Allow", "Action": "sts:AssumeRole", "Resource": o["jobRole"]}]
    assert built.node_json()["aws"] == {"job_role_arn": o["jobRole"], "bucket": o["bucket"]}
    # IAM takes a trust naming an existing role only; nodes launch once both roles' rights are in place
    order = built.resources.index
    profile = built.one("aws:iam/instanceProfile:InstanceProfile", "-node")
    assert order(node_role) < order(role) < order(built.one(T["role_policy"], "-node")) < order(profile)
    assert order(inline) < order(profile)


def test_controller_identity_launches_only_the_stack_nodes(built):
    o = built.outputs
    role = built.one(T["role"], "-controller")
    profile = built.one("aws:iam/instanceProfile:InstanceProfile", "-controller")
    assert profile.inputs["role"] == role.state["name"]
    assert built.one(T["instance"]).inputs["iamInstanceProfile"] == profile.state["name"]
    policy = built.one(T["role_policy"], "-controller")
    assert policy.inputs["role"] == role.state["name"]
    doc = json.loads(policy.inputs["policy"])
    assert_least_privilege(doc, f"gpufleet/{built.cfg.stack}")
    lt = built.one(T["lt"])
    by_sid = {st["Sid"]: st for st in doc["Statement"]}
    assert by_sid["LaunchNodesTagged"]["Condition"]["ArnEquals"] == {"ec2:LaunchTemplate": [lt.state["arn"]]}
    region = built.cfg.region
    ec2 = f"arn:aws:ec2:{region}:{ACCOUNT}"
    groups = [g for g in o["placementGroups"].values() if g]
    assert by_sid["LaunchFromStackResources"]["Resource"] == [
        lt.state["arn"], *(f"{ec2}:subnet/{s}" for s in o["subnetIds"]),
        f"{ec2}:security-group/{o['nodeSecurityGroup']}", f"arn:aws:ec2:{region}::image/{o['ami']}",
        *(f"{ec2}:placement-group/{g}" for g in groups)]
    assert by_sid["PassNodeRole"]["Resource"] == o["nodeRole"]
    assert by_sid["KeepMungeKey"]["Resource"] == o["mungeKeySecret"]
    assert by_sid["TerminateStackNodes"]["Condition"] == {
        "StringEquals": {"ec2:ResourceTag/gpufleet-stack": built.cfg.stack}}
    # the instance waits for its rights
    assert built.resources.index(policy) < built.resources.index(built.one(T["instance"]))


def test_munge_key_secret_is_empty_and_encrypted_with_the_stack_key(built):
    secret = built.one(T["secret"])
    assert secret.inputs["kmsKeyId"] == built.outputs["kmsKey"]
    assert secret.state["arn"] == built.outputs["mungeKeySecret"]
    # no value in the program: the controller makes the key at its first boot
    assert not [r for r in built.resources if r.type.startswith("aws:secretsmanager/secretVersion")]
    assert "secretString" not in secret.inputs and "secretBinary" not in secret.inputs


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
    assert "instanceType" not in lt, "types come from the node provider's CreateFleet overrides"


def test_controller_hardening(built):
    o, c = built.outputs, built.one(T["instance"]).inputs
    assert c["metadataOptions"]["httpTokens"] == "required" and c["metadataOptions"]["httpPutResponseHopLimit"] == 1
    assert c["rootBlockDevice"]["encrypted"] is True and c["rootBlockDevice"]["kmsKeyId"] == o["kmsKey"]
    assert c["networkInterfaces"] == [{"networkInterfaceId": built.one(T["eni"]).id, "deviceIndex": 0}]
    assert c["instanceType"] == built.cfg.controller.instance_type == "m6i.large"
    assert c["ami"] == o["ami"] and c["maintenanceOptions"] == {"autoRecovery": "default"}
    assert c["userDataReplaceOnChange"] is True


@pytest.mark.parametrize("variant", ["dev", "prod", "phi"])
def test_root_volumes_use_the_stack_key_which_names_no_other_principal(variant, request):
    b = request.getfixturevalue(variant)
    key = b.one(T["key"])
    (root,) = b.one(T["lt"]).inputs["blockDeviceMappings"]
    assert root["ebs"] == {"volumeSize": 200, "volumeType": "gp3", "encrypted": "true",
                           "kmsKeyId": key.state["arn"], "deleteOnTermination": "true"}
    key_doc = json.loads(key.inputs["policy"])
    assert [st["Sid"] for st in key_doc["Statement"]] == ["AccountAdministration", "CloudWatchLogsForStackLogGroups",
                                                          "AlertTopicPublishers"]
    # EC2 encrypts the nodes' volumes with the launching controller's rights, through EC2 only
    ctl_doc = json.loads(b.one(T["role_policy"], "-controller").inputs["policy"])
    grants = [st for st in ctl_doc["Statement"] if st["Sid"] in ("EncryptNodeVolumes", "EncryptNodeVolumeGrants")]
    assert [st["Resource"] for st in grants] == [key.state["arn"]] * 2
    # nodes need no key rights for their own volumes; theirs are for S3
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
    assert built.one(T["instance"]).inputs["ami"] == built.outputs["ami"]
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
    assert built.outputs["efaInterfacesPerNode"] == {"gpu": efa.efa_count(got)}


@pytest.mark.parametrize("instance_type,count", [("p4d.24xlarge", 4), ("p5e.48xlarge", 32), ("p5en.48xlarge", 16),
                                                 ("g6e.48xlarge", 4)])
def test_efa_layout_reaches_the_launch_template(instance_type, count):
    b = build_stack(stack_config("prod", {"gpufleet:instanceTypes": [instance_type]}))
    nics = b.one(T["lt"]).inputs["networkInterfaces"]
    assert sum(n["interfaceType"] in ("efa", "efa-only") for n in nics) == count
    assert len({n["networkCardIndex"] for n in nics}) == CATALOG[instance_type].network_cards
    assert b.node_json()["instance_types"][instance_type]["efa"] == count


def test_node_user_data_writes_node_settings_and_starts_the_node(built):
    assert built.user_data().startswith("#cloud-config")
    assert "gpufleet-node.service" in built.user_data() and "gpufleet-agent" not in built.user_data()
    node = built.node_json()
    o = built.outputs
    assert node["bucket"] == o["bucket"] and node["log_group"] == o["logGroup"]
    assert node["metric_namespace"] == f"gpufleet/{built.cfg.stack}"
    assert not {"mode", "node_count", "queue_url"} & set(node)  # Slurm's partitions; a node polls no queue
    assert set(node["instance_types"]) == set(built.cfg.instance_types)
    assert node["slurm"] == {"controller_addr": o["controllerAddress"], "controller_port": 6817,
                             "munge": o["mungeKeySecret"]}
    (home,) = node["mounts"]
    assert home["source"] == f"{o['sharedFileSystem']}:/" and home["target"] == "/home" and home["type"] == "efs"
    assert "tls" in home["options"].split(",") and "iam" in home["options"].split(",")


def test_controller_user_data_holds_the_cluster_and_no_secret(built):
    o = built.outputs
    text = built.controller_user_data()
    conf = built.controller_file("/etc/slurm/slurm.conf")
    assert f"SlurmctldHost=controller({o['controllerAddress']})" in conf.splitlines()
    assert "enable_configless" in conf
    assert "PartitionName=gpu Nodes=gpu-[1-4] Default=YES" in conf
    nodes = built.controller_file("/etc/gpufleet/nodes.json")
    assert nodes["provider"] == "aws" and "tags" not in nodes  # the launch templates tag the nodes
    part = nodes["partitions"]["gpu"]
    assert part["launch_template_id"] == o["launchTemplates"]["gpu"] == built.one(T["lt"]).id
    assert (part["instance_types"], part["spot"], part["on_demand_base"]) == (
        list(built.cfg.instance_types), built.cfg.spot, built.cfg.on_demand_base)
    ctl = built.controller_file("/etc/gpufleet/controller.json")
    assert (ctl["bucket"], ctl["queue_url"], ctl["partition"]) == (o["bucket"], o["queueUrl"], "gpu")
    assert [m["target"] for m in ctl["mounts"]] == ["/home", "/var/spool/slurmctld"]
    assert ctl["slurm"]["munge"] == o["mungeKeySecret"]
    # the key's secret is named, never its value (the program has none)
    assert "munge.key" not in text and "BEGIN" not in text


def test_shared_file_system_encrypted_tls_only_in_the_stack_subnets(built):
    o = built.outputs
    fs = built.one(T["efs"])
    assert fs.inputs["encrypted"] is True and fs.inputs["kmsKeyId"] == o["kmsKey"]
    assert fs.id == o["sharedFileSystem"]
    mounts = built.of_type(T["mount"])
    assert sorted(m.inputs["subnetId"] for m in mounts) == sorted(o["subnetIds"])
    sg = {m.inputs["securityGroups"][0] for m in mounts}
    assert len(sg) == 1 and sg != {o["nodeSecurityGroup"]} and sg != {o["controllerSecurityGroup"]}
    doc = json.loads(built.one("aws:efs/fileSystemPolicy:FileSystemPolicy").inputs["policy"])
    assert doc["Statement"][0]["Effect"] == "Deny"
    assert doc["Statement"][0]["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    home, state = sorted(built.of_type(T["ap"]), key=lambda a: a.name)
    assert home.inputs["rootDirectory"]["path"] == "/home"
    assert state.inputs["rootDirectory"]["path"] == "/slurm/state"
    assert state.inputs["posixUser"] == {"uid": slurm.SLURM_UID, "gid": slurm.SLURM_GID}
    assert state.inputs["rootDirectory"]["creationInfo"]["permissions"] == "0700"


def test_partition_component_carries_what_the_policies_judge(built):
    (part,) = built.of_type(T["partition"])
    cfg = built.cfg
    assert part.inputs == {"partition": "gpu", "instanceTypes": list(cfg.instance_types), "maxNodes": cfg.nodes.max,
                           "alwaysOn": cfg.nodes.min, "spot": cfg.spot, "onDemandBase": cfg.on_demand_base,
                           "gang": cfg.mode == "gang", "gpusPerNode": cfg.primary.gpus,
                           "efaInterfaces": 32 if cfg.stack == "prod" else 0, "subnetIds": built.outputs["subnetIds"]}


def test_partitions_key_gives_a_template_per_partition():
    cfg = stack_config("dev", {"gpufleet:partitions": [
        {"name": "small", "instanceTypes": ["g6.xlarge"], "nodes": {"max": 8}, "spot": True},
        {"name": "big", "instanceTypes": ["p5.48xlarge"], "nodes": {"max": 2}, "gang": True}]},
        drop=("gpufleet:mode", "gpufleet:instanceTypes", "gpufleet:nodes", "gpufleet:spot"))
    b = build_stack(cfg)
    templates = {t.name: t for t in b.of_type(T["lt"])}
    assert sorted(templates) == ["gpufleet-dev-big-node", "gpufleet-dev-small-node"]
    big = templates["gpufleet-dev-big-node"].inputs["networkInterfaces"]
    assert sum(n["interfaceType"] in ("efa", "efa-only") for n in big) == 32
    assert len(templates["gpufleet-dev-small-node"].inputs["networkInterfaces"]) == 1
    (group,) = b.of_type("aws:ec2/placementGroup:PlacementGroup")
    parts = b.controller_file("/etc/gpufleet/nodes.json")["partitions"]
    assert parts["big"]["placement_group"] == group.state["name"] and parts["small"]["placement_group"] is None
    assert len(parts["big"]["subnet_ids"]) == 1 and len(parts["small"]["subnet_ids"]) == 3
    conf = b.controller_file("/etc/slurm/slurm.conf")
    assert "PartitionName=small Nodes=small-[1-8] Default=YES" in conf
    assert "PartitionName=big Nodes=big-[1-2] Default=NO" in conf
    # both templates, and only they, are what the controller may launch from
    doc = json.loads(b.one(T["role_policy"], "-controller").inputs["policy"])
    (launch,) = [st for st in doc["Statement"] if st["Sid"] == "LaunchNodesTagged"]
    assert sorted(launch["Condition"]["ArnEquals"]["ec2:LaunchTemplate"]) == sorted(
        t.state["arn"] for t in templates.values())


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
    teams = [t.name for t in built.cfg.teams]  # one dead-letter alarm per team, the first team's named as before
    per_team = {team: "dead-letters" if i == 0 else f"dead-letters-{team}" for i, team in enumerate(teams)}
    assert set(alarms) == {*per_team.values(), "old-jobs", "resume-failures", "controller-down", "idle-gpus"}
    queues = {q.state["url"]: q.state["name"] for q in built.of_type(T["queue"])}
    for team, name in per_team.items():
        dlq = alarms[name]
        assert dlq["dimensions"] == {"QueueName": queues[o["teamDeadLetterQueues"][team]]} and dlq["threshold"] == 0
        assert dlq["comparisonOperator"] == "GreaterThanThreshold"
    assert queues[o["dlqUrl"]] == alarms["dead-letters"]["dimensions"]["QueueName"]
    # jobs pending for over an hour and nodes that failed to power up: the bridge's gauges, from Slurm's state
    for name, metric in (("old-jobs", "JobsPendingOverAnHour"), ("resume-failures", "NodesFailedToResume")):
        a = alarms[name]
        assert (a["namespace"], a["metricName"], a["threshold"]) == (f"gpufleet/{stack}", metric, 0)
        assert a["comparisonOperator"] == "GreaterThanThreshold" and "dimensions" not in a
    down = alarms["controller-down"]
    assert (down["namespace"], down["metricName"]) == ("AWS/EC2", "StatusCheckFailed")
    assert down["dimensions"] == {"InstanceId": o["controller"]} and down["treatMissingData"] == "breaching"
    (idle,) = alarms["idle-gpus"]["metricQueries"]
    assert idle["metric"]["namespace"] == f"gpufleet/{stack}" and idle["metric"]["metricName"] == "GPUUtilization"
    assert alarms["idle-gpus"]["treatMissingData"] == "notBreaching"  # no node, no GPU metric: not idle
    for name in alarms:
        assert alarms[name]["alarmActions"] == [o["alertTopic"]]
    body = json.loads(built.one("aws:cloudwatch/dashboard:Dashboard").inputs["dashboardBody"])
    assert queues[o["queueUrl"]] in json.dumps(body) and "JobsPending" in json.dumps(body)
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
        assert tags is not None and want.items() <= tags.items(), r.name
    specs = {s["resourceType"]: s["tags"] for s in built.one(T["lt"]).inputs["tagSpecifications"]}
    assert {"instance", "volume", "network-interface"} <= set(specs)
    assert all(want.items() <= t.items() for t in specs.values())


def test_each_resource_belongs_to_one_concern(built):
    concerns = {"Network", "FlowLogs", "DnsFirewall", "Storage", "Queue", "Identity", "Partition", "Controller",
                "SharedFs", "Monitoring", "Registry"}
    components = [r for r in built.resources if not r.custom]
    one_each = sorted(f"gpufleet:aws:{c}" for c in concerns)  # and a Queue per team
    assert sorted(r.type for r in components) == sorted(one_each + ["gpufleet:aws:Queue"] * (len(built.cfg.teams) - 1))
    for r in built.resources:
        if r.custom:
            parent = r.urn.split("::")[2].split("$")[0]
            assert parent.removeprefix("gpufleet:aws:") in concerns, r.urn


def test_outputs(built):
    o = built.outputs
    for key in ("bucket", "queueUrl", "dlqUrl", "controller", "controllerAddress", "dashboard", "logGroup", "kmsKey",
                "nodeRole", "jobRole", "controllerRole", "launchTemplates", "region", "alertTopic", "vpcId",
                "subnetIds", "metricNamespace", "mungeKeySecret", "sharedFileSystem", "registry"):
        assert o[key], key
    assert o["region"] == built.cfg.region
    assert o["queueUrl"].startswith(f"https://sqs.{built.cfg.region}.amazonaws.com/")
    # issue 23: a job's things under its team's prefix; the teams in config order (the first: the stack's queue's)
    assert o["checkpointUriTemplate"] == f"s3://{o['bucket']}/teams/<team>/jobs/<job_id>/"
    assert o["teams"] == [t.name for t in built.cfg.teams] == list(o["teamQueues"])


def test_existing_network_is_used_as_given():
    existing = {"vpcId": "vpc-0123456789abcdef0",
                "subnetIds": ["subnet-0aaaaaaaaaaaaaaa1", "subnet-0bbbbbbbbbbbbbbb2"]}
    for stack, subnets in (("dev", existing["subnetIds"]), ("prod", existing["subnetIds"][:1])):
        b = build_stack(stack_config(stack, {"gpufleet:network": existing}))
        types = {r.type for r in b.resources}
        assert not types & {"aws:ec2/vpc:Vpc", T["subnet"], T["endpoint"]}
        # its DNS is its owner's: no firewall, no query log (infra.aws.dns_firewall)
        assert not [t for t in types if t.startswith(DNS)] and b.outputs["dnsQueryLogGroup"] is None
        assert b.controller_file("/etc/gpufleet/nodes.json")["partitions"]["gpu"]["subnet_ids"] == subnets
        assert _node_sg(b).inputs["vpcId"] == existing["vpcId"]
        for who in ("nodes", "controller"):
            https = b.one(T["egress"], f"{who}-egress-https").inputs
            assert (https["ipProtocol"], https["fromPort"], https["toPort"]) == ("tcp", 443, 443)
        assert sorted(m.inputs["subnetId"] for m in b.of_type(T["mount"])) == sorted(subnets)
        assert not [r for r in b.of_type(T["ingress"]) if "cidrIpv4" in r.inputs]
        assert_flow_logs(b, [existing["vpcId"]])
