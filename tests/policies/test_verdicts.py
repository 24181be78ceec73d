"""Per policy, checkov style: a compliant and a violating resource set, judged through the Analyzer protocol.

Every case starts from a compliant stack (tests/policies/fixtures.py), changes one thing and expects
exactly the named policies to fire (or, for a passing variant, nothing at all).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Callable, Optional

import pytest

from tests.policies import fixtures as f
from tests.policies.conftest import names

BUILD = {"prod": f.aws_gang, "dev": f.aws_queue, "phi": lambda: f.aws_gang("phi", "phi"),
         "azure": f.azure_queue, "azure-phi": lambda: f.azure_queue("azure-phi", "phi"), "tencent": f.tencent_queue}


@dataclass
class Case:
    id: str
    stack: str
    change: Callable[[f.Stack], None]
    fires: tuple[str, ...] = ()          # exactly these policies report; () means a clean verdict
    on: Optional[str] = None             # the resource the (first) policy names
    level: str = "mandatory"
    policy_config: Optional[dict] = None
    build: Optional[Callable[[], f.Stack]] = field(default=None)


def inputs(name: str) -> Callable[[f.Stack], dict]:
    return lambda s: s.get(name)["inputs"]


def edit(name: str, **values) -> Callable[[f.Stack], None]:
    def change(s: f.Stack) -> None:
        s.get(name)["inputs"].update(values)
    return change


def drop(name: str) -> Callable[[f.Stack], None]:
    return lambda s: s.remove(name)


def pop(name: str, *keys: str) -> Callable[[f.Stack], None]:
    def change(s: f.Stack) -> None:
        for key in keys:
            s.get(name)["inputs"].pop(key, None)
    return change


def both(*changes) -> Callable[[f.Stack], None]:
    def change(s: f.Stack) -> None:
        for c in changes:
            c(s)
    return change


def nothing(s: f.Stack) -> None:
    return None


def set_path(name: str, path: tuple, value) -> Callable[[f.Stack], None]:
    def change(s: f.Stack) -> None:
        target = s.get(name)["inputs"]
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return change


CONTAINER_SCOPE = ("/subscriptions/s/resourceGroups/rg/providers/Microsoft.Storage/storageAccounts/a/blobServices/"
                   "default/containers/checkpoints")


def add(type_: str, name: str, values: dict, deps: Optional[dict[str, list[str]]] = None):
    def change(s: f.Stack) -> None:
        s.add(type_, name, values, deps={k: [s.get(n) for n in v] for k, v in (deps or {}).items()})
    return change


def role_policy(statements: list[dict]) -> Callable[[f.Stack], None]:
    """The node role's policy: `statements` and the Denies that keep its credentials on the instance."""
    return edit("node-policy", policy=json.dumps({"Version": "2012-10-17",
                                                  "Statement": statements + f.on_instance_statements()}))


def without_deny(name: str, sid: str) -> Callable[[f.Stack], None]:
    """Drop one of the credential Denies from role policy `name`."""
    def change(s: f.Stack) -> None:
        doc = json.loads(s.get(name)["inputs"]["policy"])
        doc["Statement"] = [st for st in doc["Statement"] if st.get("Sid") != sid]
        s.get(name)["inputs"]["policy"] = json.dumps(doc)
    return change


def deny_condition(name: str, sid: str, operator: str, value) -> Callable[[f.Stack], None]:
    """Set (None: remove) one condition operator of a credential Deny of role policy `name`."""
    def change(s: f.Stack) -> None:
        doc = json.loads(s.get(name)["inputs"]["policy"])
        (st,) = [st for st in doc["Statement"] if st.get("Sid") == sid]
        if value is None:
            st["Condition"].pop(operator)
        else:
            st["Condition"][operator] = value
        s.get(name)["inputs"]["policy"] = json.dumps(doc)
    return change


def ecr_grants(condition) -> Callable[[f.Stack], None]:
    return edit("ecr-templates-policy", policy=json.dumps({"Version": "2012-10-17",
                                                           "Statement": f.ecr_template_statements(condition)}))


def instance(**overrides) -> Callable[[f.Stack], None]:
    values = {"instanceType": "p5.48xlarge", "ami": "ami-0a1b2c3d4e5f60718", "subnetId": "subnet-1",
              "metadataOptions": {"httpTokens": "required"}, "associatePublicIpAddress": False,
              "rootBlockDevice": {"encrypted": True, "volumeSize": 200}, "tags": f.tags("personal", "prod")}
    return add("aws:ec2/instance:Instance", "debug-node", {**values, **overrides})


def template_nics(nics) -> Callable[[f.Stack], None]:
    return edit("node", networkInterfaces=nics)


def pop_path(name: str, path: tuple) -> Callable[[f.Stack], None]:
    def change(s: f.Stack) -> None:
        target = s.get(name)["inputs"]
        for key in path[:-1]:
            target = target[key]
        target.pop(path[-1], None)
    return change


def depend(name: str, prop: str, *on: str) -> Callable[[f.Stack], None]:
    """`name` takes input `prop` from the resources `on` (its property dependencies)."""
    def change(s: f.Stack) -> None:
        r = s.get(name)
        r["propertyDependencies"][prop] = [s.get(n)["urn"] for n in on]
        r["dependencies"] = sorted({u for urns in r["propertyDependencies"].values() for u in urns})
    return change


def child(parent: str, type_: str, name: str, values: dict) -> Callable[[f.Stack], None]:
    return lambda s: s.add(type_, name, values, parent=s.get(parent))


def placement_through_template(s: f.Stack) -> None:
    """The gang's placement group outside the partition, named by its launch template's placement."""
    s.remove("cluster")
    group = s.add("aws:ec2/placementGroup:PlacementGroup", "shared-cluster", {"strategy": "cluster",
                                                                             "tags": f.tags("personal", "prod")})
    s.get("node")["inputs"]["placement"] = {"groupName": "gpufleet-shared-cluster-1a2b"}
    depend("node", "placement", "shared-cluster")(s)
    assert group["urn"] in s.get("node")["dependencies"]


def second_partition(**props) -> Callable[[f.Stack], None]:
    """A second queue partition of the same types beside the stack's first."""
    def change(s: f.Stack) -> None:
        values = {**s.get("gpu")["inputs"], "partition": "big", **props}
        part = s.add(f.PARTITION, "big", values, custom=False)
        s.add("aws:ec2/launchTemplate:LaunchTemplate", "big-node", dict(s.get("node")["inputs"]), parent=part,
              deps={"networkInterfaces": [s.get("nodes-sg")]})
    return change


def launch_statement(index: int, **values) -> Callable[[f.Stack], None]:
    """Replace fields of one statement of the controller's launch rights (None removes the field)."""
    def change(s: f.Stack) -> None:
        statements = f.launch_statements(s.stack)
        for key, value in values.items():
            if value is None:
                statements[index].pop(key, None)
            else:
                statements[index][key] = value
        s.get("controller-policy")["inputs"]["policy"] = json.dumps({
            "Version": "2012-10-17", "Statement": statements + f.on_instance_statements()})
    return change


def launch_condition(index: int, operator: str, value, **others) -> Callable[[f.Stack], None]:
    """Set (None: remove) one condition operator of a launch statement, and add `others`."""
    def change(s: f.Stack) -> None:
        statements = f.launch_statements(s.stack)
        condition = statements[index]["Condition"]
        if value is None:
            condition.pop(operator, None)
        else:
            condition[operator] = value
        condition.update(others)
        s.get("controller-policy")["inputs"]["policy"] = json.dumps({
            "Version": "2012-10-17", "Statement": statements + f.on_instance_statements()})
    return change


def efs_doc(*statements: dict) -> str:
    return json.dumps({"Version": "2012-10-17", "Statement": list(statements)})


CTL = "controller-instance"
SSE = "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration"
PAB = "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock"
KMS_RULE = {"rule": {"applyServerSideEncryptionByDefault": {"sseAlgorithm": "aws:kms", "kmsMasterKeyId": f.KEY_ARN}}}
WORLD_SSH = {"ipProtocol": "tcp", "fromPort": 22, "toPort": 22, "cidrIpv4": "0.0.0.0/0",
             "securityGroupId": "sg-51b340616cd3da298"}
SELF_ALL = {"protocol": "-1", "fromPort": 0, "toPort": 0, "self": True}
US_PROVIDER = "urn:pulumi:prod::gpufleet::pulumi:providers:aws::us"


def us_provider(s: f.Stack) -> None:
    provider = s.add("pulumi:providers:aws", "us", {"region": "us-east-1"})
    logs = s.add("aws:cloudwatch/logGroup:LogGroup", "replica", {"kmsKeyId": f.KEY_ARN, "retentionInDays": 365,
                                                                "tags": f.tags("personal", "prod")}, provider=provider)
    assert logs["provider"].startswith(US_PROVIDER)


def tag_free_with_default_tags(s: f.Stack) -> None:
    provider = s.add("pulumi:providers:aws", "tagged", {"region": "eu-west-1", "defaultTags": {"tags": {
        **f.TAGS, "data-classification": "internal"}}})
    s.add("aws:cloudwatch/logGroup:LogGroup", "scratch", {"kmsKeyId": f.KEY_ARN, "retentionInDays": 365},
          provider=provider)


def no_tags(name: str) -> Callable[[f.Stack], None]:
    return pop(name, "tags")


def tencent_abroad(s: f.Stack) -> None:
    """A bucket of the personal-data stack through a provider in Singapore."""
    provider = s.add("pulumi:providers:tencentcloud", "sg", {"region": "ap-singapore"})
    s.add("tencentcloud:Cos/bucket:Bucket", "replica", {
        "bucket": "gpufleet-tencent-replica-1250000000", "acl": "private", "encryptionAlgorithm": "KMS",
        "kmsId": "key-1", "versioningEnable": True, "logEnable": True, "logTargetBucket": "logs",
        "tags": f.tags("personal", "tencent")}, provider=provider)
    s.add("tencentcloud:Cos/bucketPolicy:BucketPolicy", "replica-policy", {
        "bucket": "gpufleet-tencent-replica-1250000000",
        "policy": f.tencent_tls_policy("gpufleet-tencent-replica-1250000000")},
        deps={"bucket": [s.get("replica")]}, provider=provider)


TC_CTL = "controller-instance"


def cam_statement(index: int, **values) -> Callable[[f.Stack], None]:
    """Replace fields of one statement of the Tencent controller's launch rights (None removes the field)."""
    def change(s: f.Stack) -> None:
        statements = f.tencent_launch_statements(s.stack)
        for key, value in values.items():
            if value is None:
                statements[index].pop(key, None)
            else:
                statements[index][key] = value
        s.get("controller-policy")["inputs"]["document"] = json.dumps({"version": "2.0", "statement": statements})
    return change


def tc_second_partition(**props) -> Callable[[f.Stack], None]:
    """A second Tencent queue partition of the same type beside the stack's first."""
    def change(s: f.Stack) -> None:
        part = s.add(f.TC_PARTITION, "big", f.tencent_partition("big", **props), custom=False)
        s.add("tencentcloud:Cvm/launchTemplate:LaunchTemplate", "big-node", dict(s.get("node")["inputs"]), parent=part)
    return change


AZ_SA, AZ_FILES, AZ_VMSS, AZ_VM = "data", "shared-fs-account", "gpu-vmss", "controller-vm"


def AZ_GANG() -> f.Stack:
    """The Azure stack with a second partition: a two-node InfiniBand gang in an availability set."""
    return f.azure_queue(gang_nodes=2)


def add_vm(name: str, **overrides) -> Callable[[f.Stack], None]:
    """A VM outside the controller (a debugging VM), compliant but for `overrides`."""
    return add("azure-native:compute:VirtualMachine", name, {**f.azure_vm(**overrides),
                                                              "tags": f.tags("personal", "azure")})
CASES = [
    # --- S3 ---------------------------------------------------------------------------------------
    Case("sse-aes256", "prod", set_path("data-sse", ("rules", 0, "applyServerSideEncryptionByDefault"),
                                        {"sseAlgorithm": "AES256"}), ("aws-s3-bucket-sse-kms",), on="data-sse"),
    Case("sse-missing", "prod", drop("data-sse"), ("aws-s3-bucket-sse-kms",), on="data"),
    Case("sse-inline-kms", "prod", both(drop("data-sse"), edit("data", serverSideEncryptionConfiguration=KMS_RULE))),
    Case("sse-log-bucket-kms", "phi", set_path("access-logs-sse", ("rules", 0, "applyServerSideEncryptionByDefault"),
                                               {"sseAlgorithm": "aws:kms", "kmsMasterKeyId": f.KEY_ARN}),
         ("aws-s3-bucket-sse-kms",), on="access-logs-sse"),
    Case("versioning-suspended", "prod", set_path("data-versioning", ("versioningConfiguration", "status"), "Suspended"),
         ("aws-s3-bucketversioning-enabled",), on="data-versioning", level="advisory"),
    Case("versioning-missing", "prod", drop("data-versioning"), ("aws-s3-bucket-versioning",), on="data",
         level="advisory"),
    Case("versioning-inline", "prod", both(drop("data-versioning"), edit("data", versioning={"enabled": True}))),
    Case("pab-flag-off", "prod", edit("data-pab", ignorePublicAcls=False), ("aws-s3-publicaccessblock-all-flags",),
         on="data-pab"),
    Case("pab-missing", "prod", drop("data-pab"), ("aws-s3-bucket-public-access-block",), on="data"),
    Case("tls-policy-missing-tls12", "prod", edit("data-policy", policy=json.dumps({"Statement": [
        json.loads(f.tls_policy("b"))["Statement"][0]]})), ("aws-s3-bucketpolicy-tls-only",), on="data-policy"),
    Case("tls-inline-policy-without-denies", "prod", edit("data", policy=json.dumps({"Statement": []})),
         ("aws-s3-bucketpolicy-tls-only",), on="data"),
    Case("tls-policy-missing", "prod", drop("data-policy"), ("aws-s3-bucket-tls-only",), on="data"),
    Case("tls-policy-unknown", "prod", edit("data-policy", policy=f.UNKNOWN)),
    Case("acl-public-read", "prod", edit("data", acl="public-read"), ("aws-s3-bucket-no-public-acl",), on="data"),
    Case("acl-grant-all-users", "prod", add("aws:s3/bucketAcl:BucketAcl", "data-acl", {
        "bucket": "b", "accessControlPolicy": {"owner": {"id": "o"}, "grants": [
            {"permission": "READ", "grantee": {"type": "Group",
                                               "uri": "http://acs.amazonaws.com/groups/global/AllUsers"}}]}},
        {"bucket": ["data"]}), ("aws-s3-bucket-no-public-acl",), on="data-acl"),
    Case("acl-private", "prod", edit("data", acl="private")),
    Case("access-logs-missing", "phi", both(*map(drop, ("data-logging", "access-logs", "access-logs-sse",
                                                         "access-logs-versioning", "access-logs-pab",
                                                         "access-logs-policy"))), ("aws-s3-bucket-access-logging",), on="data"),
    Case("access-logs-missing-personal", "prod", both(*map(drop, ("data-logging", "access-logs", "access-logs-sse",
                                                                  "access-logs-versioning", "access-logs-pab",
                                                                  "access-logs-policy"))),
         ("aws-s3-bucket-access-logging",), on="data"),
    Case("access-logs-not-needed-internal", "dev", nothing),
    # settings of a bucket that is not in this stack (imported, or another stack's, named by its id)
    Case("foreign-pab-flag-off", "prod", add(PAB, "imported-pab", {
        "bucket": "legacy-datasets", "blockPublicAcls": True, "blockPublicPolicy": False, "ignorePublicAcls": True,
        "restrictPublicBuckets": True}), ("aws-s3-publicaccessblock-all-flags",), on="imported-pab"),
    Case("foreign-sse-aes256", "prod", add(SSE, "imported-sse", {
        "bucket": "legacy-datasets", "rules": [{"applyServerSideEncryptionByDefault": {"sseAlgorithm": "AES256"}}]}),
        ("aws-s3-bucket-sse-kms",), on="imported-sse"),
    Case("foreign-log-target-sse-s3", "prod", both(
        add(SSE, "imported-sse", {"bucket": "legacy-logs", "rules": [
            {"applyServerSideEncryptionByDefault": {"sseAlgorithm": "AES256"}}]}),
        add("aws:s3/bucketLogging:BucketLogging", "data-logging-2", {"bucket": "b", "targetBucket": "legacy-logs",
                                                                     "targetPrefix": "data/"}, {"bucket": ["data"]}))),
    Case("foreign-versioning-suspended", "prod", add("aws:s3/bucketVersioning:BucketVersioning", "imported-versioning", {
        "bucket": "legacy-datasets", "versioningConfiguration": {"status": "Suspended"}}),
        ("aws-s3-bucketversioning-enabled",), on="imported-versioning", level="advisory"),
    Case("foreign-policy-no-tls", "prod", add("aws:s3/bucketPolicy:BucketPolicy", "imported-policy", {
        "bucket": "legacy-datasets", "policy": json.dumps({"Statement": [
            {"Effect": "Allow", "Principal": {"AWS": "arn:aws:iam::123456789012:root"}, "Action": "s3:GetObject",
             "Resource": "arn:aws:s3:::legacy-datasets/*"}]})}),
        ("aws-s3-bucketpolicy-tls-only",), on="imported-policy"),
    # --- EC2 --------------------------------------------------------------------------------------
    Case("imds-optional", "prod", set_path("node", ("metadataOptions", "httpTokens"), "optional"),
         ("aws-ec2-launchtemplate-imdsv2",), on="node"),
    Case("imds-unset", "prod", pop("node", "metadataOptions"), ("aws-ec2-launchtemplate-imdsv2",), on="node"),
    Case("imds-disabled", "prod", edit("node", metadataOptions={"httpEndpoint": "disabled"})),
    Case("instance-compliant", "prod", instance()),
    Case("instance-imds-unset", "prod", instance(metadataOptions=None), ("aws-ec2-instance-imdsv2",), on="debug-node"),
    Case("instance-root-unencrypted", "prod", instance(rootBlockDevice={"encrypted": False}),
         ("aws-ec2-instance-ebs-encrypted",), on="debug-node"),
    Case("instance-public-ip", "prod", instance(associatePublicIpAddress=True), ("aws-ec2-instance-no-public-ip",),
         on="debug-node"),
    Case("ebs-string-false", "prod", set_path("node", ("blockDeviceMappings", 0, "ebs", "encrypted"), "false"),
         ("aws-ec2-launchtemplate-ebs-encrypted",), on="node"),
    Case("ebs-no-mappings", "prod", pop("node", "blockDeviceMappings"), ("aws-ec2-launchtemplate-ebs-encrypted",)),
    Case("ebs-bool-true", "prod", set_path("node", ("blockDeviceMappings", 0, "ebs", "encrypted"), True)),
    Case("volume-unencrypted", "prod", add("aws:ebs/volume:Volume", "scratch", {
        "availabilityZone": "eu-north-1a", "size": 100, "encrypted": False, "tags": f.tags("personal", "prod")}),
        ("aws-ebs-volume-encrypted",), on="scratch"),
    Case("volume-encrypted", "prod", add("aws:ebs/volume:Volume", "scratch", {
        "availabilityZone": "eu-north-1a", "size": 100, "encrypted": True, "kmsKeyId": f.KEY_ARN,
        "tags": f.tags("personal", "prod")})),
    Case("lt-public-ip", "prod", set_path("node", ("networkInterfaces", 0, "associatePublicIpAddress"), "true"),
         ("aws-ec2-launchtemplate-no-public-ip",), on="node"),
    Case("subnet-public", "prod", edit("private-0", mapPublicIpOnLaunch=True),
         ("aws-ec2-subnet-no-public-ip-on-launch",), on="private-0"),
    Case("sg-rule-world-ssh", "prod", add("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule", "ssh",
                                          WORLD_SSH, {"securityGroupId": ["nodes-sg"]}),
         ("aws-ec2-securitygroup-no-internet-ingress",), on="ssh"),
    Case("sg-inline-world-v6", "prod", edit("nodes-sg", ingress=[{"protocol": "tcp", "fromPort": 443, "toPort": 443,
                                                                 "ipv6CidrBlocks": ["::/0"]}]),
         ("aws-ec2-securitygroup-no-internet-ingress",), on="nodes-sg"),
    Case("sg-legacy-rule-world", "prod", add("aws:ec2/securityGroupRule:SecurityGroupRule", "legacy", {
        "type": "ingress", "protocol": "tcp", "fromPort": 8888, "toPort": 8888, "cidrBlocks": ["0.0.0.0/0"],
        "securityGroupId": "sg-1"}, {"securityGroupId": ["nodes-sg"]}),
        ("aws-ec2-securitygroup-no-internet-ingress",), on="legacy"),
    Case("sg-legacy-egress-world", "prod", add("aws:ec2/securityGroupRule:SecurityGroupRule", "legacy", {
        "type": "egress", "protocol": "-1", "fromPort": 0, "toPort": 0, "cidrBlocks": ["0.0.0.0/0"],
        "securityGroupId": "sg-1"}, {"securityGroupId": ["nodes-sg"]})),
    # --- IAM --------------------------------------------------------------------------------------
    Case("iam-service-wildcard", "prod", role_policy([{"Effect": "Allow", "Action": "s3:*",
                                                       "Resource": "arn:aws:s3:::b/*"}]),
         ("aws-iam-policy-no-wildcard-actions",), on="node-policy"),
    Case("iam-star", "prod", add("aws:iam/policy:Policy", "admin", {"policy": json.dumps({"Statement": [
        {"Effect": "Allow", "Action": "*", "Resource": "*"}]}), "tags": f.tags("personal", "prod")}),
        ("aws-iam-policy-no-wildcard-actions", "aws-iam-policy-no-unconditioned-wildcard-write",
         "aws-iam-policy-bounded-launch", "aws-iam-policy-kms-grant-for-aws-resource"), on="admin"),
    Case("iam-read-wildcard-ok", "prod", role_policy([{"Effect": "Allow", "Action": ["ec2:Describe*"],
                                                       "Resource": "*"}])),
    Case("iam-write-star-no-condition", "prod", role_policy([{"Effect": "Allow", "Action": "cloudwatch:PutMetricData",
                                                              "Resource": "*"}]),
         ("aws-iam-policy-no-unconditioned-wildcard-write",), on="node-policy"),
    Case("iam-admin-attachment", "prod", edit("node-extra", policyArn="arn:aws:iam::aws:policy/AdministratorAccess"),
         ("aws-iam-attachment-no-admin-managed-policy",), on="node-extra"),
    Case("iam-fullaccess-attachment", "prod", edit("node-extra",
                                                   policyArn="arn:aws:iam::aws:policy/AmazonS3FullAccess"),
         ("aws-iam-attachment-no-admin-managed-policy",), on="node-extra"),
    Case("iam-ssm-core-attachment", "prod", edit("node-extra",  # every SSM parameter of the account
                                                 policyArn="arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore"),
         ("aws-iam-attachment-no-admin-managed-policy",), on="node-extra"),
    # --- KMS grants -------------------------------------------------------------------------------
    Case("kms-grant-unconditioned", "prod", ecr_grants({}), ("aws-iam-policy-kms-grant-for-aws-resource",),
         on="ecr-templates-policy"),
    Case("kms-grant-false", "prod", ecr_grants({"Bool": {"kms:GrantIsForAWSResource": "false"}}),
         ("aws-iam-policy-kms-grant-for-aws-resource",), on="ecr-templates-policy"),
    Case("kms-grant-bool-true", "prod", ecr_grants({"Bool": {"kms:GrantIsForAWSResource": True}})),
    Case("kms-grant-pattern", "prod", role_policy([{"Effect": "Allow", "Action": "kms:*Grant", "Resource": f.KEY_ARN}]),
         ("aws-iam-policy-kms-grant-for-aws-resource",), on="node-policy"),
    Case("kms-star-in-managed-policy", "prod", add("aws:iam/policy:Policy", "key-admin", {"policy": json.dumps({
        "Statement": [{"Effect": "Allow", "Action": "kms:*", "Resource": f.KEY_ARN}]}),
        "tags": f.tags("personal", "prod")}),
        ("aws-iam-policy-kms-grant-for-aws-resource", "aws-iam-policy-no-wildcard-actions"), on="key-admin"),
    # --- instance credentials ---------------------------------------------------------------------
    Case("credentials-no-vpc-deny", "prod", without_deny("node-policy", "CredentialsOnlyFromOwnVpc"),
         ("aws-iam-instance-role-credentials-stay-on-instance",), on="node-role"),
    Case("credentials-no-address-deny", "dev", without_deny("controller-policy", "CredentialsOnlyFromOwnAddress"),
         ("aws-iam-instance-role-credentials-stay-on-instance",), on="controller-role"),
    Case("credentials-deny-any-instance", "prod", deny_condition("node-policy", "CredentialsOnlyFromOwnVpc", "Null",
                                                                 None),
         ("aws-iam-instance-role-credentials-stay-on-instance",), on="node-role"),
    Case("credentials-deny-fixed-vpc", "prod", deny_condition(
        "node-policy", "CredentialsOnlyFromOwnVpc", "StringNotEquals", {"aws:ec2InstanceSourceVPC": "vpc-1"}),
         ("aws-iam-instance-role-credentials-stay-on-instance",), on="node-role"),
    Case("credentials-deny-in-attached-policy", "prod", both(
        without_deny("node-policy", "CredentialsOnlyFromOwnVpc"),
        without_deny("node-policy", "CredentialsOnlyFromOwnAddress"),
        add("aws:iam/policy:Policy", "on-instance", {"policy": json.dumps({"Statement": f.on_instance_statements()}),
                                                     "tags": f.tags("personal", "prod")}),
        add("aws:iam/rolePolicyAttachment:RolePolicyAttachment", "node-on-instance", {
            "role": "node-1a2b", "policyArn": "arn:aws:iam::123456789012:policy/on-instance"},
            {"role": ["node-role"], "policyArn": ["on-instance"]}))),
    Case("credentials-not-an-instance-role", "prod", edit("ecr-templates-policy", policy=json.dumps({
        "Statement": f.ecr_template_statements()}))),
    Case("credentials-policy-unknown", "prod", edit("node-policy", policy=f.UNKNOWN)),
    # --- job role credentials ------------------------------------------------------------------------
    Case("job-role-no-vpc-deny", "prod", without_deny("job-policy", "OnlyThroughStackVpc"),
         ("aws-iam-job-role-stays-in-vpc",), on="job-role"),
    Case("job-role-deny-narrowed", "dev", deny_condition("job-policy", "OnlyThroughStackVpc", "StringEquals",
                                                         {"aws:PrincipalTag/team": "ml"}),
         ("aws-iam-job-role-stays-in-vpc",), on="job-role"),
    Case("job-role-deny-any-vpc", "prod", deny_condition("job-policy", "OnlyThroughStackVpc",
                                                         "StringNotEqualsIfExists", {"aws:SourceVpc": "vpc-*"}),
         ("aws-iam-job-role-stays-in-vpc",), on="job-role"),
    Case("job-role-deny-other-key", "prod", deny_condition("job-policy", "OnlyThroughStackVpc",
                                                           "StringNotEqualsIfExists", {"aws:SourceVpce": "vpce-1"}),
         ("aws-iam-job-role-stays-in-vpc",), on="job-role"),
    Case("job-role-deny-string-not-equals", "prod", both(
        deny_condition("job-policy", "OnlyThroughStackVpc", "StringNotEqualsIfExists", None),
        deny_condition("job-policy", "OnlyThroughStackVpc", "StringNotEquals", {"aws:SourceVpc": f.VPC_ID}))),
    Case("job-role-deny-in-attached-policy", "prod", both(
        without_deny("job-policy", "OnlyThroughStackVpc"),
        add("aws:iam/policy:Policy", "in-vpc", {"policy": json.dumps({"Statement": [f.in_vpc_statement()]}),
                                                "tags": f.tags("personal", "prod")}),
        add("aws:iam/rolePolicyAttachment:RolePolicyAttachment", "job-in-vpc", {
            "role": "job-1a2b", "policyArn": "arn:aws:iam::123456789012:policy/in-vpc"},
            {"role": ["job-role"], "policyArn": ["in-vpc"]}))),
    Case("job-role-trusted-by-a-service", "prod", both(   # not assumed by a role: not a job role
        without_deny("job-policy", "OnlyThroughStackVpc"),
        edit("job-role", assumeRolePolicy=json.dumps({"Statement": [
            {"Effect": "Allow", "Principal": {"Service": "lambda.amazonaws.com"}, "Action": "sts:AssumeRole"}]})))),
    Case("job-role-policy-unknown", "prod", edit("job-policy", policy=f.UNKNOWN)),
    # --- KMS, SQS, logs ---------------------------------------------------------------------------
    Case("kms-no-rotation", "prod", edit("key", enableKeyRotation=False), ("aws-kms-key-rotation",), on="key"),
    Case("kms-asymmetric-no-rotation", "prod", edit("key", enableKeyRotation=False, customerMasterKeySpec="RSA_2048")),
    Case("sqs-unencrypted", "prod", pop("jobs", "kmsMasterKeyId"), ("aws-sqs-queue-encrypted",), on="jobs"),
    Case("sqs-managed-sse", "dev", both(pop("jobs", "kmsMasterKeyId"), edit("jobs", sqsManagedSseEnabled=True))),
    Case("sqs-any-sender", "dev", drop("jobs-policy"), ("aws-sqs-job-queue-one-sender",), on="jobs"),
    Case("sqs-tls-only-policy-lets-any-sender", "prod", edit("jobs-policy", policy=json.dumps(
        {"Statement": f.one_sender_policy("prod")["Statement"][:1]})), ("aws-sqs-job-queue-one-sender",), on="jobs"),
    Case("sqs-sender-wildcard-role", "prod", edit("jobs-policy", policy=json.dumps(f.one_sender_policy(
        "prod", "ArnNotLike", "arn:aws:iam::123456789012:role/*"))), ("aws-sqs-job-queue-one-sender",), on="jobs"),
    Case("sqs-sender-spared-by-like", "prod", edit("jobs-policy", policy=json.dumps(f.one_sender_policy(
        "prod", "ArnNotLike")))),
    Case("sqs-sender-policy-unknown", "prod", edit("jobs-policy", policy=f.UNKNOWN)),
    Case("sqs-dead-letter-queue-needs-no-sender", "prod", both(
        add("aws:sqs/queue:Queue", "jobs-dlq", {"kmsMasterKeyId": f.KEY_ARN, "tags": f.tags("personal", "prod")}),
        depend("jobs", "redrivePolicy", "jobs-dlq"))),
    Case("logs-no-kms", "prod", pop("logs", "kmsKeyId"), ("aws-cloudwatch-loggroup-encrypted",), on="logs"),
    Case("logs-forever", "prod", pop("logs", "retentionInDays"), ("aws-cloudwatch-loggroup-retention",), on="logs",
         level="advisory"),
    Case("logs-retention-under-config", "prod", nothing, ("aws-cloudwatch-loggroup-retention",), on="logs",
         level="advisory", policy_config={"aws-cloudwatch-loggroup-retention": {"minDays": 400}}),
    Case("flow-logs-missing", "phi", drop("flow"), ("aws-ec2-vpc-flow-logs",), on="vpc"),
    Case("flow-logs-reject-only", "phi", edit("flow", trafficType="REJECT"), ("aws-ec2-vpc-flow-logs",), on="flow"),
    Case("flow-logs-not-needed-internal", "dev", drop("flow")),
    Case("dns-firewall-missing", "dev", drop("dns-association"), ("aws-ec2-vpc-dns-firewall",), on="vpc"),
    Case("dns-firewall-other-vpc", "prod", depend("dns-association", "vpcId", "private-0"),
         ("aws-ec2-vpc-dns-firewall",), on="vpc"),
    Case("dns-firewall-existing-vpc", "prod", both(*map(drop, ("vpc", "dns-association")))),
    Case("topic-without-subscribers", "prod", drop("alerts-email"), ("aws-sns-topic-alert-subscribers",),
         on="alerts", level="advisory"),
    # --- VPC endpoints ----------------------------------------------------------------------------
    Case("endpoint-no-policy", "prod", pop("sqs", "policy"), ("aws-ec2-vpcendpoint-restricted-policy",), on="sqs"),
    Case("endpoint-full-access", "prod", edit("sqs", policy=json.dumps({"Statement": [
        {"Effect": "Allow", "Principal": "*", "Action": "*", "Resource": "*"}]})),
        ("aws-ec2-vpcendpoint-restricted-policy",), on="sqs"),
    Case("endpoint-principal-account-only", "prod", edit("sqs", policy=json.dumps({"Statement": [
        {"Effect": "Allow", "Principal": {"AWS": "*"}, "Action": "*", "Resource": "*",
         "Condition": {"StringEquals": {"aws:PrincipalAccount": "123456789012"}}}]})),
        ("aws-ec2-vpcendpoint-restricted-policy",), on="sqs"),
    Case("endpoint-org-scoped", "prod", edit("sqs", policy=json.dumps({"Statement": [
        {"Effect": "Allow", "Principal": "*", "Action": "*", "Resource": "*",
         "Condition": {"StringEquals": {"aws:PrincipalOrgID": "o-abc", "aws:ResourceOrgID": "o-abc"}}}]}))),
    Case("endpoint-s3-any-bucket", "prod", edit("s3", policy=json.dumps({"Statement": [
        {"Effect": "Allow", "Principal": "*", "Action": "s3:PutObject", "Resource": "*",
         "Condition": {"StringEquals": {"aws:PrincipalAccount": "123456789012"}}}]})),
        ("aws-ec2-vpcendpoint-restricted-policy",), on="s3"),
    Case("endpoint-policy-resource", "prod", both(pop("sqs", "policy"), add(
        "aws:ec2/vpcEndpointPolicy:VpcEndpointPolicy", "sqs-policy",
        {"vpcEndpointId": "vpce-1", "policy": f.account_only_policy()}, {"vpcEndpointId": ["sqs"]}))),
    Case("endpoint-policy-resource-open", "prod", add(
        "aws:ec2/vpcEndpointPolicy:VpcEndpointPolicy", "foreign-policy", {"vpcEndpointId": "vpce-0imported",
                                                                       "policy": json.dumps({"Statement": [
            {"Effect": "Allow", "NotPrincipal": {"AWS": "arn:aws:iam::111122223333:root"}, "Action": "*",
             "Resource": "*"}]})}), ("aws-ec2-vpcendpoint-restricted-policy",), on="foreign-policy"),
    # --- GPU --------------------------------------------------------------------------------------
    Case("efa-partial", "prod", template_nics(f.efa_interfaces(16, "sg-1")), ("aws-ec2-launchtemplate-efa-layout",),
         on="node"),
    Case("efa-duplicate-card", "prod", set_path("node", ("networkInterfaces", 3, "networkCardIndex"), 1),
         ("aws-ec2-launchtemplate-efa-layout",), on="node"),
    Case("efa-on-non-efa-type", "dev", template_nics(f.efa_interfaces(2, "sg-1")),
         ("aws-ec2-launchtemplate-efa-layout",), on="node"),
    Case("efa-unused-multi-node-gang", "prod", template_nics(f.efa_interfaces(0, "sg-1")),
         ("aws-ec2-launchtemplate-efa-layout",), on="node"),
    Case("efa-p4d-full-set", "prod", nothing, build=lambda: f.aws_gang(instance_type="p4d.24xlarge", efa_cards=4)),
    Case("efa-sg-no-self-egress", "prod", drop("nodes-sg-egress-self"), ("aws-ec2-securitygroup-efa-self-traffic",),
         on="node"),
    Case("efa-sg-inline-self-rules", "prod", both(drop("nodes-sg-egress-self"), drop("nodes-sg-ingress-self"),
                                                  edit("nodes-sg", ingress=[SELF_ALL], egress=[SELF_ALL]))),
    Case("efa-spread-placement", "prod", edit("cluster", strategy="spread"), ("aws-slurm-partition-efa-cluster",),
         on="gpu"),
    Case("efa-three-subnets", "prod", edit("gpu", subnetIds=["subnet-1", "subnet-2", "subnet-3"]),
         ("aws-slurm-partition-efa-cluster",), on="gpu"),
    Case("efa-no-placement-group", "prod", drop("cluster"), ("aws-slurm-partition-efa-cluster",), on="gpu"),
    Case("efa-two-placement-groups", "prod", child("gpu", "aws:ec2/placementGroup:PlacementGroup", "cluster-2",
                                                   {"strategy": "cluster", "tags": f.tags("personal", "prod")}),
         ("aws-slurm-partition-efa-cluster",), on="gpu"),
    Case("efa-placement-group-through-template", "prod", placement_through_template),
    Case("efa-single-node", "prod", nothing, build=lambda: f.aws_gang(nodes=1)),
    Case("efa-queue-partition-many-subnets", "dev", edit("gpu", maxNodes=8)),
    Case("gpu-quota-exceeded", "prod", nothing, ("aws-slurm-partition-gpu-quota",
                                                 "aws-slurm-partition-monthly-ceiling"), on="gpu",
         build=lambda: f.aws_gang(nodes=16)),
    Case("gpu-quota-raised", "prod", nothing, build=lambda: f.aws_gang(nodes=16),
         policy_config={"aws-slurm-partition-gpu-quota": {"maxGpus": 256},
                        "aws-slurm-partition-monthly-ceiling": {"monthlyCeilingUsd": 1_000_000}}),
    Case("gpu-quota-sums-partitions", "dev", second_partition(maxNodes=61),
         ("aws-slurm-partition-gpu-quota", "aws-slurm-partition-monthly-ceiling"), on="gpu"),
    Case("gpu-quota-two-partitions-within", "dev", second_partition(maxNodes=4)),
    Case("queue-always-on", "dev", edit("gpu", alwaysOn=1), ("aws-slurm-partition-queue-scale-to-zero",),
         on="gpu", level="advisory"),
    Case("gang-always-on", "prod", edit("gpu", alwaysOn=4)),
    Case("monthly-ceiling", "dev", edit("gpu", maxNodes=20), ("aws-slurm-partition-monthly-ceiling",),
         on="gpu", level="advisory"),
    Case("monthly-ceiling-on-demand-base", "dev", edit("gpu", maxNodes=8, onDemandBase=4),
         ("aws-slurm-partition-monthly-ceiling",), on="gpu", level="advisory"),
    Case("monthly-ceiling-all-spot", "dev", edit("gpu", maxNodes=8)),
    Case("monthly-ceiling-configured", "dev", edit("gpu", maxNodes=20),
         policy_config={"aws-slurm-partition-monthly-ceiling": {"monthlyCeilingUsd": 10000}}),
    # --- the Slurm controller ----------------------------------------------------------------------
    Case("controller-hop-limit-2", "prod", set_path(CTL, ("metadataOptions", "httpPutResponseHopLimit"), 2),
         ("aws-slurm-controller-hardened",), on=CTL),
    Case("controller-hop-limit-unset", "dev", pop_path(CTL, ("metadataOptions", "httpPutResponseHopLimit")),
         ("aws-slurm-controller-hardened",), on=CTL),
    Case("controller-imds-optional", "prod", set_path(CTL, ("metadataOptions", "httpTokens"), "optional"),
         ("aws-slurm-controller-hardened", "aws-ec2-instance-imdsv2"), on=CTL),
    Case("controller-metadata-off", "prod", edit(CTL, metadataOptions={"httpEndpoint": "disabled"})),
    Case("controller-root-default-key", "prod", pop_path(CTL, ("rootBlockDevice", "kmsKeyId")),
         ("aws-slurm-controller-hardened",), on=CTL),
    Case("controller-root-aws-managed-key", "prod", set_path(CTL, ("rootBlockDevice", "kmsKeyId"), "alias/aws/ebs"),
         ("aws-slurm-controller-hardened",), on=CTL),
    Case("controller-root-unencrypted", "prod", set_path(CTL, ("rootBlockDevice", "encrypted"), False),
         ("aws-slurm-controller-hardened", "aws-ec2-instance-ebs-encrypted"), on=CTL),
    Case("controller-data-volume-default-key", "prod", edit(CTL, ebsBlockDevices=[
        {"deviceName": "/dev/sdf", "volumeSize": 100, "encrypted": True}]), ("aws-slurm-controller-hardened",), on=CTL),
    Case("controller-public-ip", "prod", edit(CTL, associatePublicIpAddress=True),
         ("aws-slurm-controller-hardened", "aws-ec2-instance-no-public-ip"), on=CTL),
    Case("controller-eip-on-interface", "prod", add("aws:ec2/eip:Eip", "controller-eip", {
        "domain": "vpc", "networkInterface": "eni-b85d18a3ef8ebcb32"}, {"networkInterface": ["controller-eni"]}),
         ("aws-slurm-controller-hardened",), on=CTL),
    Case("controller-eip-association", "prod", add("aws:ec2/eipAssociation:EipAssociation", "controller-eip", {
        "allocationId": "eipalloc-0a1b2c3d", "instanceId": "i-0a1b2c3d"}, {"instanceId": [CTL]}),
         ("aws-slurm-controller-hardened",), on=CTL),
    Case("controller-eip-elsewhere", "prod", add("aws:ec2/eip:Eip", "nat-eip", {"domain": "vpc"})),
    Case("controller-public-subnet", "prod", both(
        add("aws:ec2/subnet:Subnet", "public-0", {"vpcId": "vpc-1", "cidrBlock": "10.42.200.0/24",
                                                  "mapPublicIpOnLaunch": True, "tags": f.tags("personal", "prod")}),
        pop(CTL, "networkInterfaces"), edit(CTL, subnetId="subnet-0public"), depend(CTL, "subnetId", "public-0")),
         ("aws-slurm-controller-hardened", "aws-ec2-subnet-no-public-ip-on-launch"), on=CTL),
    Case("controller-public-subnet-no-address", "prod", both(
        add("aws:ec2/subnet:Subnet", "public-0", {"vpcId": "vpc-1", "cidrBlock": "10.42.200.0/24",
                                                  "mapPublicIpOnLaunch": True, "tags": f.tags("personal", "prod")}),
        pop(CTL, "networkInterfaces"), edit(CTL, subnetId="subnet-0public", associatePublicIpAddress=False),
        depend(CTL, "subnetId", "public-0")), ("aws-ec2-subnet-no-public-ip-on-launch",), on="public-0"),
    Case("controller-unknown-options", "prod", edit(CTL, metadataOptions=f.UNKNOWN, rootBlockDevice=f.UNKNOWN)),
    # --- the munge key's secret, the shared file system --------------------------------------------
    Case("secret-default-key", "prod", pop("munge", "kmsKeyId"), ("aws-secretsmanager-secret-cmk",), on="munge"),
    Case("secret-aws-managed-key", "dev", edit("munge", kmsKeyId="alias/aws/secretsmanager"),
         ("aws-secretsmanager-secret-cmk",), on="munge"),
    Case("secret-aws-managed-key-arn", "prod", edit("munge", kmsKeyId="arn:aws:kms:eu-north-1:123456789012:"
                                                                     "alias/aws/secretsmanager"),
         ("aws-secretsmanager-secret-cmk",), on="munge"),
    Case("secret-replica-default-key", "prod", edit("munge", replicas=[{"region": "eu-central-1"}]),
         ("aws-secretsmanager-secret-cmk",), on="munge"),
    Case("secret-replica-cmk", "prod", edit("munge", replicas=[{"region": "eu-central-1", "kmsKeyId": f.KEY_ARN}])),
    Case("secret-key-unknown", "prod", edit("munge", kmsKeyId=f.UNKNOWN)),
    Case("efs-default-key", "prod", pop("shared", "kmsKeyId"), ("aws-efs-filesystem-cmk-tls-only",), on="shared"),
    Case("efs-unencrypted", "dev", both(pop("shared", "kmsKeyId"), edit("shared", encrypted=False)),
         ("aws-efs-filesystem-cmk-tls-only",), on="shared"),
    Case("efs-no-policy", "prod", drop("shared-policy"), ("aws-efs-filesystem-cmk-tls-only",), on="shared"),
    Case("efs-policy-without-deny", "prod", edit("shared-policy", policy=efs_doc(
        {"Effect": "Allow", "Principal": {"AWS": "*"}, "Action": ["elasticfilesystem:ClientMount"],
         "Resource": f.FS_ARN, "Condition": {"Bool": {"aws:SecureTransport": "true"}}})),
         ("aws-efs-filesystem-cmk-tls-only",), on="shared-policy"),
    Case("efs-deny-misses-root-access", "prod", edit("shared-policy", policy=efs_doc(
        {"Effect": "Deny", "Principal": "*",
         "Action": ["elasticfilesystem:ClientMount", "elasticfilesystem:ClientWrite"], "Resource": f.FS_ARN,
         "Condition": {"Bool": {"aws:SecureTransport": "false"}}})),
         ("aws-efs-filesystem-cmk-tls-only",), on="shared-policy"),
    Case("efs-deny-client-actions", "prod", edit("shared-policy", policy=efs_doc(
        {"Effect": "Deny", "Principal": "*", "Action": "elasticfilesystem:Client*", "Resource": f.FS_ARN,
         "Condition": {"Bool": {"aws:SecureTransport": False}}}))),
    Case("efs-foreign-policy", "prod", add("aws:efs/fileSystemPolicy:FileSystemPolicy", "legacy-policy", {
        "fileSystemId": "fs-0legacy", "policy": efs_doc({"Effect": "Allow", "Principal": {"AWS": f.NODE_ROLE_ARN},
                                                         "Action": "elasticfilesystem:ClientMount"})}),
         ("aws-efs-filesystem-cmk-tls-only",), on="legacy-policy"),
    Case("efs-policy-unknown", "prod", edit("shared-policy", policy=f.UNKNOWN)),
    # --- launch rights -------------------------------------------------------------------------------------
    Case("launch-without-template-condition", "prod", launch_condition(0, "ArnEquals", None),
         ("aws-iam-policy-bounded-launch",), on="controller-policy"),
    Case("launch-any-template", "prod", launch_condition(0, "ArnEquals", None, ArnLike={
        "ec2:LaunchTemplate": "arn:aws:ec2:*:123456789012:launch-template/*"}),
         ("aws-iam-policy-bounded-launch",), on="controller-policy"),
    Case("launch-template-if-exists", "prod", launch_condition(0, "ArnEquals", None, ArnEqualsIfExists={
        "ec2:LaunchTemplate": f.TEMPLATE_ARN}), ("aws-iam-policy-bounded-launch",), on="controller-policy"),
    Case("launch-template-arn-like-exact", "prod", launch_condition(0, "ArnEquals", None, ArnLike={
        "ec2:LaunchTemplate": [f.TEMPLATE_ARN]})),
    Case("launch-without-stack-tag", "prod", launch_condition(0, "StringEquals", None),
         ("aws-iam-policy-bounded-launch",), on="controller-policy"),
    Case("launch-any-stack-tag", "prod", launch_condition(0, "StringEquals", None, StringLike={
        "aws:RequestTag/gpufleet-stack": "*"}), ("aws-iam-policy-bounded-launch",), on="controller-policy"),
    Case("launch-on-any-resource", "prod", role_policy([{"Effect": "Allow", "Action": "ec2:RunInstances",
                                                         "Resource": "*"}]),
         ("aws-iam-policy-bounded-launch", "aws-iam-policy-no-unconditioned-wildcard-write"), on="node-policy"),
    Case("launch-action-pattern", "prod", role_policy([{
        "Effect": "Allow", "Action": "ec2:Create*", "Resource": "arn:aws:ec2:eu-north-1:123456789012:instance/*"}]),
         ("aws-iam-policy-bounded-launch",), on="node-policy"),
    Case("launch-in-managed-policy", "prod", add("aws:iam/policy:Policy", "launcher", {"policy": json.dumps({
        "Statement": [{"Effect": "Allow", "Action": ["ec2:CreateFleet"], "Resource": "arn:aws:ec2:*:*:instance/*",
                       "Condition": {"ArnEquals": {"ec2:LaunchTemplate": f.TEMPLATE_ARN}}}]}),
        "tags": f.tags("personal", "prod")}), ("aws-iam-policy-bounded-launch",), on="launcher"),
    Case("terminate-any-instance", "prod", launch_condition(4, "StringEquals", None),
         ("aws-iam-policy-bounded-launch",), on="controller-policy"),
    Case("terminate-aws-resource-tag", "prod", launch_condition(4, "StringEquals", None, StringEquals={
        "aws:ResourceTag/gpufleet-stack": "prod"})),
    Case("pass-any-role", "prod", launch_statement(5, Resource="*"), ("aws-iam-policy-bounded-launch",),
         on="controller-policy"),
    Case("pass-role-to-any-service", "prod", launch_statement(5, Condition=None), ("aws-iam-policy-bounded-launch",),
         on="controller-policy"),
    # --- registries -------------------------------------------------------------------------------
    Case("ecr-aes256", "prod", edit("images", encryptionConfigurations=[{"encryptionType": "AES256"}]),
         ("aws-ecr-repository-kms-encrypted",), on="images"),
    Case("ecr-encryption-unset", "dev", pop("images", "encryptionConfigurations"),
         ("aws-ecr-repository-kms-encrypted",), on="images"),
    Case("ecr-template-default-encryption", "prod", pop("cache-ecr-public", "encryptionConfigurations"),
         ("aws-ecr-repository-kms-encrypted",), on="cache-ecr-public"),
    Case("ecr-kms-dsse", "prod", edit("images", encryptionConfigurations=[
        {"encryptionType": "KMS_DSSE", "kmsKey": f.KEY_ARN}])),
    Case("ecr-encryption-unknown", "prod", edit("images", encryptionConfigurations=f.UNKNOWN)),
    Case("ecr-no-scan", "prod", edit("images", imageScanningConfiguration={"scanOnPush": False}),
         ("aws-ecr-repository-scan-on-push",), on="images"),
    Case("ecr-scan-unset", "dev", pop("images", "imageScanningConfiguration"),
         ("aws-ecr-repository-scan-on-push",), on="images"),
    Case("ecr-mutable-tags", "prod", edit("images", imageTagMutability="MUTABLE"),
         ("aws-ecr-repository-immutable-tags",), on="images"),
    Case("ecr-mutability-unset", "dev", pop("images", "imageTagMutability"),
         ("aws-ecr-repository-immutable-tags",), on="images"),
    Case("ecr-public-repository-policy", "prod", add("aws:ecr/repositoryPolicy:RepositoryPolicy", "images-policy", {
        "repository": "gpufleet-prod", "policy": json.dumps({"Version": "2012-10-17", "Statement": [
            {"Sid": "AnyonePulls", "Effect": "Allow", "Principal": "*",
             "Action": ["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"]}]})}, {"repository": ["images"]}),
         ("aws-ecr-repository-no-public-policy",), on="images-policy"),
    Case("ecr-public-registry-policy", "prod", add("aws:ecr/registryPolicy:RegistryPolicy", "registry-policy", {
        "policy": json.dumps({"Statement": [{"Effect": "Allow", "Principal": {"AWS": ["*"]},
                                             "Action": "ecr:CreateRepository", "Resource": "*"}]})}),
         ("aws-ecr-repository-no-public-policy",), on="registry-policy"),
    Case("ecr-public-template-policy", "dev", edit("cache-ecr-public", repositoryPolicy=json.dumps({"Statement": [
        {"Effect": "Allow", "Principal": "*", "Action": "ecr:BatchGetImage"}]})),
         ("aws-ecr-repository-no-public-policy",), on="cache-ecr-public"),
    Case("ecr-org-scoped-policy", "prod", add("aws:ecr/repositoryPolicy:RepositoryPolicy", "images-policy", {
        "repository": "gpufleet-prod", "policy": json.dumps({"Statement": [
            {"Effect": "Allow", "Principal": "*", "Action": "ecr:BatchGetImage",
             "Condition": {"StringEquals": {"aws:PrincipalOrgID": "o-a1b2c3d4e5"}}}]})})),
    Case("ecr-account-policy", "prod", add("aws:ecr/repositoryPolicy:RepositoryPolicy", "images-policy", {
        "repository": "gpufleet-prod", "policy": json.dumps({"Statement": [
            {"Effect": "Allow", "Principal": {"AWS": "arn:aws:iam::210987654321:root"},
             "Action": "ecr:BatchGetImage"}]})})),
    Case("azure-dns-policy-missing", "azure", drop("dns-link"), ("azure-network-vnet-dns-security-policy",),
         on="vnet"),
    Case("azure-dns-policy-other-vnet", "azure-phi", both(
        lambda s: s.add("azure-native:network:VirtualNetwork", "other-vnet", {
            "resourceGroupName": "gpufleet-azure-rg", "virtualNetworkName": "other", "location": "westeurope",
            "addressSpace": {"addressPrefixes": ["10.65.0.0/16"]}, "tags": f.tags("phi", "azure-phi")}),
        depend("dns-link", "virtualNetwork", "other-vnet")), ("azure-network-vnet-dns-security-policy",), on="vnet"),
    Case("tencent-node-cos-from-anywhere", "tencent", edit("node-policy", document=f._cam([
        {"effect": "allow", "action": ["name/cos:GetObject"],
         "resource": ["qcs::cos:ap-shanghai:uid/1250000000:gpufleet-tencent-data-1250000000/*"]}])),
         ("tencent-cam-policy-cos-in-vpc",), on="node-policy"),
    Case("tencent-node-cos-any-vpc", "tencent", edit("node-policy", document=f._cam([
        {"effect": "allow", "action": ["name/cos:GetObject"],
         "resource": ["qcs::cos:ap-shanghai:uid/1250000000:gpufleet-tencent-data-1250000000/*"],
         "condition": {"string_like": {"vpc:requester_vpc": ["vpc-*"]}}}])),
         ("tencent-cam-policy-cos-in-vpc",), on="node-policy"),
    Case("tencent-submit-policy-off-its-group", "tencent", drop("submit-attachment"),
         ("tencent-cam-policy-cos-in-vpc",), on="submit-policy"),
    Case("acr-admin-user", "azure", edit("registry", adminUserEnabled=True),
         ("azure-containerregistry-registry-admin-disabled",), on="registry"),
    Case("acr-admin-unset", "azure", pop("registry", "adminUserEnabled")),
    Case("acr-public-network", "azure", edit("registry", publicNetworkAccess="Enabled"),
         ("azure-containerregistry-registry-no-public-access",), on="registry"),
    Case("acr-public-network-unset", "azure-phi", pop("registry", "publicNetworkAccess"),
         ("azure-containerregistry-registry-no-public-access",), on="registry"),
    Case("acr-anonymous-pull", "azure", edit("registry", anonymousPullEnabled=True),
         ("azure-containerregistry-registry-no-public-access",), on="registry"),
    Case("acr-network-unknown", "azure", edit("registry", publicNetworkAccess=f.UNKNOWN)),
    Case("vault-access-policies", "azure", edit("vault", properties=f.vault_properties(enableRbacAuthorization=False)),
         ("azure-keyvault-vault-rbac-purge-protected",), on="vault"),
    Case("vault-purge-protection-unset", "azure",
         edit("vault", properties=f.vault_properties(enablePurgeProtection=None)),
         ("azure-keyvault-vault-rbac-purge-protected",), on="vault"),
    Case("vault-public-network", "azure", edit("vault", properties=f.vault_properties(
        publicNetworkAccess="Enabled", networkAcls={"defaultAction": "Allow"})),
         ("azure-keyvault-vault-no-public-access",), on="vault"),
    Case("vault-public-but-deny-by-default", "azure", edit("vault", properties=f.vault_properties(
        publicNetworkAccess="Enabled"))),
    Case("vault-network-unknown", "azure", edit("vault", properties=f.vault_properties(
        publicNetworkAccess=f.UNKNOWN, networkAcls=f.UNKNOWN))),
    # --- Azure ------------------------------------------------------------------------------------
    Case("az-team-on-every-prefix", "azure", add("azure-native:authorization:RoleAssignment", "nlp-blobs", {
        "principalId": "0b5e9a52-7c1d-4f7e-9a3b-2f6d8c4e1a90", "principalType": "Group",
        "roleDefinitionId": "/subscriptions/s/providers/Microsoft.Authorization/roleDefinitions/r",
        "scope": CONTAINER_SCOPE}), ("azure-authorization-team-container-role-conditioned",), on="nlp-blobs"),
    Case("az-team-on-its-prefix", "azure", add("azure-native:authorization:RoleAssignment", "nlp-blobs", {
        "principalId": "0b5e9a52-7c1d-4f7e-9a3b-2f6d8c4e1a90", "principalType": "Group",
        "roleDefinitionId": "/subscriptions/s/providers/Microsoft.Authorization/roleDefinitions/r",
        "scope": CONTAINER_SCOPE, "condition": "(@Request[x] StringStartsWith 'teams/nlp/')",
        "conditionVersion": "2.0"})),
    Case("az-http", "azure", edit(AZ_SA, enableHttpsTrafficOnly=False), ("azure-storage-account-https-only",),
         on=AZ_SA),
    Case("az-tls10", "azure", edit(AZ_SA, minimumTlsVersion="TLS1_0"), ("azure-storage-account-min-tls",), on=AZ_SA),
    Case("az-tls-unset", "azure", pop(AZ_SA, "minimumTlsVersion"), ("azure-storage-account-min-tls",), on=AZ_SA),
    Case("az-public-blob", "azure", edit(AZ_SA, allowBlobPublicAccess=True), ("azure-storage-account-no-public-blob",),
         on=AZ_SA),
    Case("az-public-container", "azure", edit("checkpoints", publicAccess="Blob"),
         ("azure-storage-account-no-public-blob",), on="checkpoints"),
    Case("az-shared-key-default", "azure", pop(AZ_SA, "allowSharedKeyAccess"), ("azure-storage-account-no-shared-key",),
         on=AZ_SA),
    Case("az-network-open", "azure", edit(AZ_SA, networkRuleSet={"defaultAction": "Allow"}),
         ("azure-storage-account-restricted-network",), on=AZ_SA),
    Case("az-network-private-only", "azure", both(pop(AZ_SA, "networkRuleSet"),
                                                  edit(AZ_SA, publicNetworkAccess="Disabled"))),
    Case("az-file-storage-shared-key", "azure", edit(AZ_FILES, allowSharedKeyAccess=True),
         ("azure-storage-account-no-shared-key",), on=AZ_FILES),
    # where a partition's VMs go
    Case("az-queue-uniform-scale-set", "azure", edit(AZ_VMSS, orchestrationMode="Uniform"),
         ("azure-slurm-partition-placement",), on="gpu"),
    Case("az-queue-fault-domains", "azure", edit(AZ_VMSS, platformFaultDomainCount=5),
         ("azure-slurm-partition-placement",), on="gpu"),
    Case("az-queue-no-scale-set", "azure", drop(AZ_VMSS), ("azure-slurm-partition-placement",), on="gpu"),
    Case("az-queue-in-availability-set", "azure", both(drop(AZ_VMSS), child(
        "gpu", "azure-native:compute:AvailabilitySet", "gpu-avset", {
            "platformFaultDomainCount": 1, "sku": {"name": "Aligned"}, "tags": f.tags("personal", "azure")})),
         ("azure-slurm-partition-placement",), on="gpu"),
    Case("az-gang-availability-set", "azure", nothing, build=AZ_GANG),
    Case("az-gang-in-scale-set", "azure", both(drop("big-avset"), child(
        "big", "azure-native:compute:VirtualMachineScaleSet", "big-vmss", {
            "orchestrationMode": "Flexible", "platformFaultDomainCount": 1, "tags": f.tags("personal", "azure")})),
         ("azure-slurm-partition-placement",), on="big", build=AZ_GANG),
    Case("az-gang-two-availability-sets", "azure", child("big", "azure-native:compute:AvailabilitySet", "big-avset-2", {
        "platformFaultDomainCount": 1, "sku": {"name": "Aligned"}, "tags": f.tags("personal", "azure")}),
         ("azure-slurm-partition-placement",), on="big", build=AZ_GANG),
    Case("az-gang-fault-domains", "azure", edit("big-avset", platformFaultDomainCount=2),
         ("azure-slurm-partition-placement",), on="big", build=AZ_GANG),
    Case("az-gang-classic-avset", "azure", edit("big-avset", sku={"name": "Classic"}),
         ("azure-slurm-partition-placement",), on="big", build=AZ_GANG),
    Case("az-gang-spot", "azure", edit("big", spot=True), ("azure-slurm-partition-placement",), on="big",
         build=AZ_GANG),
    Case("az-gang-over-200", "azure", edit("big", maxNodes=201),
         ("azure-slurm-partition-placement", "azure-slurm-partition-gpu-quota", "azure-slurm-partition-monthly-ceiling"),
         on="big", build=AZ_GANG),
    Case("az-one-node-gang-scale-set", "azure", edit("gpu", gang=True, maxNodes=1, placement="scale_set")),
    Case("az-partition-unknown", "azure", edit("gpu", gang=f.UNKNOWN, maxNodes=f.UNKNOWN)),
    # VMs: the controller, any other VM, scale set VM profiles
    Case("az-vm-password-login", "azure", add_vm("debug-vm", osProfile={
        "adminUsername": "azureuser", "adminPassword": "[secret]",
        "linuxConfiguration": {"disablePasswordAuthentication": False}}),
        ("azure-compute-vm-ssh-keys-only",), on="debug-vm"),
    Case("az-vm-no-host-encryption", "azure", add_vm("debug-vm", securityProfile={}),
         ("azure-compute-vm-encryption-at-host",), on="debug-vm"),
    Case("az-vm-compliant", "azure", add_vm("debug-vm")),
    Case("az-vmss-profile-password", "azure", set_path(AZ_VMSS, ("virtualMachineProfile",), {
        "osProfile": {"adminUsername": "azureuser", "adminPassword": "[secret]",
                      "linuxConfiguration": {"disablePasswordAuthentication": False}},
        "securityProfile": {"encryptionAtHost": True}}), ("azure-compute-vm-ssh-keys-only",), on=AZ_VMSS),
    Case("az-vmss-profile-no-host-encryption", "azure", set_path(AZ_VMSS, ("virtualMachineProfile",), {
        "osProfile": f.linux_os_profile("gpu")}), ("azure-compute-vm-encryption-at-host",), on=AZ_VMSS),
    Case("az-controller-password", "azure", set_path(AZ_VM, ("osProfile", "adminPassword"), "[secret]"),
         ("azure-slurm-controller-hardened", "azure-compute-vm-ssh-keys-only"), on=AZ_VM),
    Case("az-controller-no-host-encryption", "azure", edit(AZ_VM, securityProfile={"encryptionAtHost": False}),
         ("azure-slurm-controller-hardened", "azure-compute-vm-encryption-at-host"), on=AZ_VM),
    Case("az-controller-nic-public-ip", "azure", both(
        add("azure-native:network:PublicIPAddress", "controller-pip", {
            "sku": {"name": "Standard"}, "publicIPAllocationMethod": "Static", "tags": f.tags("personal", "azure")}),
        set_path("controller-nic", ("ipConfigurations", 0, "publicIPAddress"), {"id": f"{f.SUBSCRIPTION}/pip"}),
        depend("controller-nic", "ipConfigurations", "controller-subnet", "controller-pip")),
         ("azure-slurm-controller-hardened", "azure-network-publicip-nat-only"), on=AZ_VM),
    Case("az-controller-inline-public-ip", "azure", edit(AZ_VM, networkProfile={"networkInterfaceConfigurations": [
        {"name": "primary", "primary": True, "ipConfigurations": [
            {"name": "ipconfig1", "publicIPAddressConfiguration": {"name": "pip", "sku": {"name": "Standard"}}}]}]}),
         ("azure-slurm-controller-hardened", "azure-network-publicip-nat-only"), on=AZ_VM),
    Case("az-controller-unknown", "azure", edit(AZ_VM, securityProfile=f.UNKNOWN, osProfile=f.UNKNOWN)),
    # public IPs: a NAT gateway's outbound address only
    Case("az-public-ip-unused", "azure", add("azure-native:network:PublicIPAddress", "spare", {
        "sku": {"name": "Standard"}, "publicIPAllocationMethod": "Static", "tags": f.tags("personal", "azure")}),
         ("azure-network-publicip-nat-only",), on="spare"),
    Case("az-nat-ip-also-on-nic", "azure", both(
        set_path("controller-nic", ("ipConfigurations", 0, "publicIPAddress"), {"id": f"{f.SUBSCRIPTION}/egress"}),
        depend("controller-nic", "ipConfigurations", "controller-subnet", "controller-egress")),
         ("azure-network-publicip-nat-only", "azure-slurm-controller-hardened"), on="controller-egress"),
    Case("az-nic-foreign-public-ip", "azure", add("azure-native:network:NetworkInterface", "debug-nic", {
        "ipConfigurations": [{"name": "ipconfig1", "publicIPAddress": {"id": f"{f.SUBSCRIPTION}/imported-pip"}}],
        "tags": f.tags("personal", "azure")}), ("azure-network-publicip-nat-only",), on="debug-nic"),
    Case("az-nsg-internet-ssh", "azure", set_path("nodes-nsg", ("securityRules", 1), {
        "name": "ssh", "direction": "Inbound", "access": "Allow", "priority": 200, "protocol": "Tcp",
        "sourceAddressPrefix": "Internet", "destinationPortRange": "22"}),
        ("azure-network-nsg-no-internet-inbound",), on="nodes-nsg"),
    Case("az-security-rule-any", "azure", add("azure-native:network:SecurityRule", "jupyter", {
        "networkSecurityGroupName": "nsg", "direction": "Inbound", "access": "Allow", "priority": 300,
        "protocol": "Tcp", "sourceAddressPrefixes": ["10.0.0.0/8", "*"], "destinationPortRange": "8888"}),
        ("azure-network-nsg-no-internet-inbound",), on="jupyter"),
    # partitions: scale to zero, GPU quota, monthly ceiling
    Case("az-queue-always-on", "azure", edit("gpu", alwaysOn=1), ("azure-slurm-partition-queue-scale-to-zero",),
         on="gpu", level="advisory"),
    Case("az-gang-always-on", "azure", edit("big", alwaysOn=2), build=AZ_GANG),
    Case("az-gpu-quota", "azure", edit("gpu", maxNodes=10), ("azure-slurm-partition-gpu-quota",), on="gpu"),
    Case("az-gpu-quota-sums-partitions", "azure", edit("big", maxNodes=5), ("azure-slurm-partition-gpu-quota",
                                                                             "azure-slurm-partition-monthly-ceiling"),
         on="gpu", build=AZ_GANG),
    Case("az-monthly-ceiling", "azure", nothing, ("azure-slurm-partition-monthly-ceiling",), on="gpu",
         level="advisory", policy_config={"azure-slurm-partition-monthly-ceiling": {"monthlyCeilingUsd": 10000}}),
    Case("az-monthly-ceiling-all-spot", "azure", edit("gpu", maxNodes=8)),
    Case("az-monthly-ceiling-on-demand-base", "azure", edit("gpu", maxNodes=8, onDemandBase=4),
         ("azure-slurm-partition-monthly-ceiling",), on="gpu", level="advisory"),
    # --- compliance -------------------------------------------------------------------------------
    Case("gdpr-resource-region", "prod", edit("jobs", region="us-east-1"), ("aws-any-resource-gdpr-region",),
         on="jobs"),
    Case("gdpr-provider-region", "prod", us_provider, ("aws-any-resource-gdpr-region",), on="replica"),
    Case("gdpr-internal-anywhere", "dev", edit("jobs", region="us-east-1")),
    Case("gdpr-configured-region", "prod", edit("jobs", region="us-east-1"),
         policy_config={"aws-any-resource-gdpr-region": {"allowedRegions": ["eu-north-1", "us-east-1"]}}),
    Case("gdpr-azure-location", "azure", edit(AZ_SA, location="East US"), ("azure-any-resource-gdpr-region",),
         on=AZ_SA),
    Case("hipaa-type", "phi", nothing, ("aws-ec2-instancetype-hipaa-eligible",), on="gpu",
         build=lambda: f.aws_gang("phi", "phi", instance_type="g6e.48xlarge", efa_cards=4)),
    Case("hipaa-controller-type", "phi", nothing, ("aws-ec2-instancetype-hipaa-eligible",), on=CTL,
         policy_config={"aws-ec2-instancetype-hipaa-eligible": {"eligibleControllerTypes": ["m6i.xlarge"]}}),
    Case("hipaa-controller-type-not-needed-personal", "prod", nothing,
         policy_config={"aws-ec2-instancetype-hipaa-eligible": {"eligibleControllerTypes": []}}),
    Case("hipaa-instance-not-a-controller", "phi", add("aws:ec2/instance:Instance", "bastion", {
        "instanceType": "m6i.large", "ami": "ami-0a1b2c3d4e5f60718", "subnetId": "subnet-1",
        "metadataOptions": {"httpTokens": "required"}, "rootBlockDevice": {"encrypted": True, "kmsKeyId": f.KEY_ARN},
        "tags": f.tags("phi", "phi")}), ("aws-ec2-instancetype-hipaa-eligible",), on="bastion"),
    Case("hipaa-type-approved", "phi", nothing, build=lambda: f.aws_gang("phi", "phi", instance_type="g6e.48xlarge",
                                                                          efa_cards=4),
         policy_config={"aws-ec2-instancetype-hipaa-eligible": {"eligibleTypes": ["g6e.48xlarge"]}}),
    Case("hipaa-vm-size", "azure-phi", nothing, ("azure-compute-vmsize-hipaa-eligible",), on="gpu",
         policy_config={"azure-compute-vmsize-hipaa-eligible": {"eligibleTypes": ["Standard_ND96isr_H100_v5"]}}),
    Case("hipaa-azure-controller-size", "azure-phi", nothing, ("azure-compute-vmsize-hipaa-eligible",), on=AZ_VM,
         policy_config={"azure-compute-vmsize-hipaa-eligible": {"eligibleControllerTypes": ["Standard_D8s_v5"]}}),
    Case("hipaa-azure-vm-not-a-controller", "azure-phi", add("azure-native:compute:VirtualMachine", "debug-vm", {
        **f.azure_vm(), "tags": f.tags("phi", "azure-phi")}), ("azure-compute-vmsize-hipaa-eligible",),
         on="debug-vm"),
    Case("hipaa-azure-gang-size", "azure-phi", edit("big", vmSize="Standard_NC24ads_A100_v4",
                                                     instanceTypes=["Standard_NC24ads_A100_v4"]),
         ("azure-compute-vmsize-hipaa-eligible",), on="big", build=lambda: f.azure_queue("azure-phi", "phi", 2)),
    Case("hipaa-azure-not-needed-personal", "azure", nothing,
         policy_config={"azure-compute-vmsize-hipaa-eligible": {"eligibleTypes": [], "eligibleControllerTypes": []}}),
    Case("cmk-aws-managed-sqs", "phi", edit("jobs", kmsMasterKeyId="alias/aws/sqs"), ("aws-kms-phi-cmk-encryption",),
         on="jobs"),
    Case("cmk-ebs-default-key", "phi", set_path("node", ("blockDeviceMappings", 0, "ebs", "kmsKeyId"), None),
         ("aws-kms-phi-cmk-encryption",), on="node"),
    Case("cmk-not-needed-personal", "prod", edit("jobs", kmsMasterKeyId="alias/aws/sqs")),
    Case("cmk-azure-storage", "azure-phi", pop(AZ_SA, "encryption"), ("azure-storage-account-phi-cmk",), on=AZ_SA),
    Case("cmk-azure-file-storage", "azure-phi", edit(AZ_FILES, encryption={"keySource": "Microsoft.Storage"}),
         ("azure-storage-account-phi-cmk",), on=AZ_FILES),
    Case("cmk-azure-not-needed-personal", "azure", edit(AZ_FILES, encryption={"keySource": "Microsoft.Storage"})),
    Case("cost-tags-missing", "prod", set_path("jobs", ("tags",), {"team": "ml-platform"}),
         ("aws-any-resource-cost-tags",), on="jobs", level="advisory"),
    Case("cost-tags-from-provider", "dev", tag_free_with_default_tags),
    Case("cost-tags-azure", "azure", no_tags("nodes-nsg"), ("azure-any-resource-cost-tags",), on="nodes-nsg",
         level="advisory"),
    Case("cost-tags-azure-vm", "azure", no_tags(AZ_VM), ("azure-any-resource-cost-tags",), on=AZ_VM,
         level="advisory"),
    Case("cost-tags-azure-avset", "azure", no_tags("big-avset"), ("azure-any-resource-cost-tags",), on="big-avset",
         level="advisory", build=AZ_GANG),
    Case("cost-tags-azure-file-share-untaggable", "azure", nothing),
    # --- Tencent ------------------------------------------------------------------------------------------
    Case("tc-public-read", "tencent", edit("data", acl="public-read"), ("tencent-cos-bucket-private",), on="data"),
    Case("tc-acl-body-all-users", "tencent", edit("data", aclBody="<Grant><URI>http://cam.qcloud.com/groups/global/"
                                                               "AllUsers</URI></Grant>"),
         ("tencent-cos-bucket-private",), on="data"),
    Case("tc-log-bucket-unencrypted", "tencent", pop("access-logs", "encryptionAlgorithm"), ("tencent-cos-bucket-sse",),
         on="access-logs"),
    Case("tc-personal-sse-cos", "tencent", edit("data", encryptionAlgorithm="AES256"),
         ("tencent-cos-bucket-personal-kms",), on="data"),
    Case("tc-internal-sse-cos", "tencent", edit("data", encryptionAlgorithm="AES256",
                                                 tags=f.tags("internal", "tencent"))),
    Case("tc-versioning-off", "tencent", edit("data", versioningEnable=False), ("tencent-cos-bucket-versioning",),
         on="data", level="advisory"),
    Case("tc-tls-policy-missing", "tencent", drop("data-policy"), ("tencent-cos-bucket-tls-only",), on="data"),
    Case("tc-tls-policy-allows-http", "tencent", edit("data-policy", policy=json.dumps({"version": "2.0", "statement": [
        json.loads(f.tencent_tls_policy("gpufleet-tencent-data-1250000000"))["statement"][1]]})),
         ("tencent-cos-bucket-tls-only",), on="data"),
    Case("tc-no-access-logs", "tencent", pop("data", "logEnable"), ("tencent-cos-bucket-access-logging",), on="data"),
    Case("tc-public-ip", "tencent", set_path("node", ("internetAccessible", "publicIpAssigned"), True),
         ("tencent-cvm-node-no-public-ip",), on="node"),
    Case("tc-internet-bandwidth", "tencent", set_path("node", ("internetAccessible", "internetMaxBandwidthOut"), 10),
         ("tencent-cvm-node-no-public-ip",), on="node"),
    Case("tc-controller-public-ip", "tencent", edit(TC_CTL, allocatePublicIp=True), ("tencent-cvm-node-no-public-ip",),
         on=TC_CTL),
    Case("tc-controller-bandwidth", "tencent", edit(TC_CTL, internetMaxBandwidthOut=5),
         ("tencent-cvm-node-no-public-ip",), on=TC_CTL),
    Case("tc-internet-unknown", "tencent", edit("node", internetAccessible=f.UNKNOWN)),
    Case("tc-template-password", "tencent", set_path("node", ("loginSettings", "password"), "[secret]"),
         ("tencent-cvm-node-no-password-login",), on="node"),
    Case("tc-controller-password", "tencent", edit(TC_CTL, password="[secret]"),
         ("tencent-cvm-node-no-password-login",), on=TC_CTL),
    Case("tc-template-ssh-keys", "tencent", edit("node", loginSettings={"keyIds": ["skey-3glfot13"]})),
    Case("tc-world-ssh", "tencent", set_path("nodes-rules", ("ingresses", 0),
                                             {"action": "ACCEPT", "protocol": "TCP", "port": "22",
                                              "cidrBlock": "0.0.0.0/0"}),
         ("tencent-vpc-securitygroup-no-world-inbound",), on="nodes-rules"),
    Case("tc-world-lite-rule", "tencent", add("tencentcloud:Security/groupLiteRule:GroupLiteRule", "jupyter", {
        "securityGroupId": "sg-zr5s9g2e", "ingresses": ["ACCEPT#0.0.0.0/0#8888#TCP"]}),
         ("tencent-vpc-securitygroup-no-world-inbound",), on="jupyter"),
    Case("tc-cam-service-wildcard", "tencent", edit("node-policy", document=json.dumps({"version": "2.0", "statement": [
        {"effect": "allow", "action": ["name/cos:*"],
         "resource": ["qcs::cos:ap-shanghai:uid/1250000000:gpufleet-tencent-data-1250000000/*"],
         "condition": {"string_equal": {"vpc:requester_vpc": ["vpc-ohdqtqwt"]}}}]})),
         ("tencent-cam-policy-no-wildcards",), on="node-policy"),
    Case("tc-cam-any-resource", "tencent", edit("node-policy", document=json.dumps({"version": "2.0", "statement": [
        {"effect": "allow", "action": ["name/cvm:DescribeInstances"], "resource": ["*"]}]})),
         ("tencent-cam-policy-no-wildcards",), on="node-policy"),
    Case("tc-cam-operation-level-listed", "tencent", edit("node-policy", document=json.dumps({
        "version": "2.0", "statement": [{"effect": "allow", "action": ["name/cvm:DescribeInstances"],
                                         "resource": ["*"]}]})),
         policy_config={"tencent-cam-policy-no-wildcards": {"operationLevelActions": ["name/cvm:DescribeInstances"]}}),
    # the controller's launch rights
    Case("tc-run-without-request-tag", "tencent", cam_statement(0, condition=None),
         ("tencent-cam-policy-bounded-launch",), on="controller-policy"),
    Case("tc-run-any-stack-tag", "tencent", cam_statement(0, condition={"for_any_value:string_like": {
        "qcs:request_tag": ["gpufleet-stack&*"]}}), ("tencent-cam-policy-bounded-launch",), on="controller-policy"),
    Case("tc-run-other-tag", "tencent", cam_statement(0, condition={"for_any_value:string_equal": {
        "qcs:request_tag": ["team&ml-platform"]}}), ("tencent-cam-policy-bounded-launch",), on="controller-policy"),
    Case("tc-run-string-equal", "tencent", cam_statement(0, condition={"string_equal": {
        "qcs:request_tag": "gpufleet-stack&tencent"}})),
    Case("tc-terminate-any-instance", "tencent", cam_statement(2, condition=None),
         ("tencent-cam-policy-bounded-launch",), on="controller-policy"),
    Case("tc-terminate-on-request-tag", "tencent", cam_statement(2, condition={"for_any_value:string_equal": {
        "qcs:request_tag": ["gpufleet-stack&tencent"]}}), ("tencent-cam-policy-bounded-launch",),
         on="controller-policy"),
    Case("tc-pass-any-role", "tencent", cam_statement(1, resource=["*"]),
         ("tencent-cam-policy-bounded-launch", "tencent-cam-policy-no-wildcards"), on="controller-policy"),
    Case("tc-pass-role-pattern", "tencent", cam_statement(1, resource=["qcs::cam::uin/100000000001:roleName/*"]),
         ("tencent-cam-policy-bounded-launch",), on="controller-policy"),
    Case("tc-cvm-action-pattern", "tencent", edit("node-policy", document=json.dumps({"version": "2.0", "statement": [
        {"effect": "allow", "action": ["name/cvm:*Instances"],
         "resource": ["qcs::cvm:ap-shanghai:uin/100000000001:instance/*"]}]})),
         ("tencent-cam-policy-bounded-launch",), on="node-policy"),
    Case("tc-cam-document-unknown", "tencent", edit("controller-policy", document=f.UNKNOWN)),
    # disks
    Case("tc-data-disk", "tencent", edit("node", dataDisks=[{"diskType": "CLOUD_SSD", "diskSize": 500}]),
         ("tencent-cvm-disk-encrypted",), on="node"),
    Case("tc-data-disk-encrypted", "tencent", edit("node", dataDisks=[{"diskType": "CLOUD_SSD", "diskSize": 500,
                                                                       "encrypt": True, "kmsKeyId": "key-1"}])),
    Case("tc-controller-data-disk", "tencent", edit(TC_CTL, dataDisks=[{"dataDiskType": "CLOUD_SSD",
                                                                        "dataDiskSize": 100}]),
         ("tencent-cvm-disk-encrypted",), on=TC_CTL),
    Case("tc-system-disk-not-judged", "tencent", nothing),
    Case("tc-cbs-plain", "tencent", add("tencentcloud:Cbs/storage:Storage", "scratch", {
        "storageType": "CLOUD_SSD", "storageSize": 500, "availabilityZone": "ap-shanghai-2",
        "tags": f.tags("personal", "tencent")}), ("tencent-cvm-disk-encrypted",), on="scratch"),
    Case("tc-key-not-rotated", "tencent", edit("key", keyRotationEnabled=False), ("tencent-kms-key-rotation",),
         on="key"),
    Case("tc-personal-abroad", "tencent", tencent_abroad, ("tencent-any-resource-pipl-region",), on="replica"),
    # CFS
    Case("tc-cfs-default-group", "tencent", both(edit("home", accessGroupId="pgroupbasic"),
                                                 depend("home", "accessGroupId")),
         ("tencent-cfs-filesystem-private-access",), on="home"),
    Case("tc-cfs-foreign-group", "tencent", both(edit("home", accessGroupId="pgroup-imported"),
                                                 depend("home", "accessGroupId")),
         ("tencent-cfs-filesystem-private-access",), on="home"),
    Case("tc-cfs-world-rule", "tencent", edit("home-rule-1", authClientIp="0.0.0.0/0"),
         ("tencent-cfs-filesystem-private-access",), on="home-rule-1"),
    Case("tc-cfs-star-rule", "tencent", edit("home-rule-1", authClientIp="*"),
         ("tencent-cfs-filesystem-private-access",), on="home-rule-1"),
    Case("tc-cfs-root-for-range", "tencent", edit("home-rule-1", userPermission="no_root_squash"),
         ("tencent-cfs-filesystem-private-access",), on="home-rule-1"),
    Case("tc-cfs-root-for-one-address", "tencent", edit("home-rule-0", authClientIp="10.72.240.10/32")),
    Case("tc-cfs-root-squash-default", "tencent", pop("home-rule-1", "userPermission")),
    Case("tc-cfs-foreign-rule", "tencent", add("tencentcloud:Cfs/accessRule:AccessRule", "imported-rule", {
        "accessGroupId": "pgroup-imported", "authClientIp": "*", "priority": 1, "rwPermission": "RW"}),
         ("tencent-cfs-filesystem-private-access",), on="imported-rule"),
    Case("tc-cfs-group-unknown", "tencent", edit("home", accessGroupId=f.UNKNOWN)),
    # SSM: the munge key
    Case("tc-secret-default-key", "tencent", pop("munge", "kmsKeyId"), ("tencent-ssm-secret-kms-no-value",),
         on="munge"),
    Case("tc-secret-key-unknown", "tencent", edit("munge", kmsKeyId=f.UNKNOWN)),
    Case("tc-secret-value", "tencent", edit("munge-init", secretString="0123456789abcdef"),
         ("tencent-ssm-secret-kms-no-value",), on="munge-init"),
    Case("tc-secret-binary", "tencent", both(pop("munge-init", "secretString"),
                                             edit("munge-init", secretBinary="c2VjcmV0")),
         ("tencent-ssm-secret-kms-no-value",), on="munge-init"),
    Case("tc-secret-value-unknown", "tencent", edit("munge-init", secretString=f.UNKNOWN)),
    # partitions
    Case("tc-queue-always-on", "tencent", edit("gpu", alwaysOn=1), ("tencent-slurm-partition-queue-scale-to-zero",),
         on="gpu", level="advisory"),
    Case("tc-gang-always-on", "tencent", edit("gpu", gang=True, alwaysOn=2, spot=False, maxNodes=2)),
    Case("tc-gpu-quota", "tencent", edit("gpu", maxNodes=10),
         ("tencent-slurm-partition-gpu-quota", "tencent-slurm-partition-monthly-ceiling"), on="gpu"),
    Case("tc-gpu-quota-sums-partitions", "tencent", tc_second_partition(maxNodes=9, instanceTypes=["GN7.20XLARGE320"],
                                                                         gpusPerNode=4),
         ("tencent-slurm-partition-gpu-quota",), on="gpu"),
    Case("tc-gpu-quota-two-partitions-within", "tencent", tc_second_partition(maxNodes=4, instanceTypes=[
        "GN7.20XLARGE320"], gpusPerNode=4)),
    Case("tc-monthly-ceiling", "tencent", nothing, ("tencent-slurm-partition-monthly-ceiling",), on="gpu",
         level="advisory", policy_config={"tencent-slurm-partition-monthly-ceiling": {"monthlyCeilingCny": 10000}}),
    Case("tc-monthly-ceiling-on-demand-base", "tencent", edit("gpu", onDemandBase=4),
         ("tencent-slurm-partition-monthly-ceiling",), on="gpu", level="advisory"),
    Case("tc-monthly-ceiling-on-demand", "tencent", edit("gpu", spot=False),
         ("tencent-slurm-partition-monthly-ceiling",), on="gpu", level="advisory"),
    Case("tc-cost-tags", "tencent", no_tags("nodes-sg"), ("tencent-any-resource-cost-tags",), on="nodes-sg",
         level="advisory"),
    Case("tc-cost-tags-launch-template", "tencent", no_tags("node"), ("tencent-any-resource-cost-tags",), on="node",
         level="advisory"),
    Case("tc-cost-tags-file-system", "tencent", no_tags("home"), ("tencent-any-resource-cost-tags",), on="home",
         level="advisory"),
]


@pytest.mark.parametrize("stack", sorted(BUILD))
def test_baseline_is_clean(packs, stack):
    verdicts = packs.run(stack, BUILD[stack]().resources)
    assert verdicts["violations"] == [] and verdicts["skipped"] == []
    assert verdicts["resources_analyzed"] >= 5


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_case(packs, case: Case):
    s = (case.build or BUILD[case.stack])()
    case.change(s)
    verdicts = packs.run(case.stack, s.resources, case.policy_config)
    assert names(verdicts) == set(case.fires), [(v["policy"], v["message"]) for v in verdicts["violations"]]
    assert verdicts["skipped"] == []
    if case.fires:
        first = [v for v in verdicts["violations"] if v["policy"] == case.fires[0]]
        assert {v["level"] for v in first} == {case.level}
        assert case.on is None or any(v["urn"].endswith(f"::{case.on}") for v in first), \
            [v["urn"] for v in first]
        assert all(v["message"] and v["remediation"] and v["severity"] for v in first)


def test_every_policy_has_a_failing_case(packs):
    """Passing cases are the clean baselines (every policy runs on them) and the compliant variants."""
    policies = {p["name"] for p in packs.get("prod").policies()}
    assert policies - {name for c in CASES for name in c.fires} == set()
