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


def add(type_: str, name: str, values: dict, deps: Optional[dict[str, list[str]]] = None):
    def change(s: f.Stack) -> None:
        s.add(type_, name, values, deps={k: [s.get(n) for n in v] for k, v in (deps or {}).items()})
    return change


def role_policy(statements: list[dict]) -> Callable[[f.Stack], None]:
    return edit("node-policy", policy=json.dumps({"Version": "2012-10-17", "Statement": statements}))


def instance(**overrides) -> Callable[[f.Stack], None]:
    values = {"instanceType": "p5.48xlarge", "ami": "ami-0a1b2c3d4e5f60718", "subnetId": "subnet-1",
              "metadataOptions": {"httpTokens": "required"}, "associatePublicIpAddress": False,
              "rootBlockDevice": {"encrypted": True, "volumeSize": 200}, "tags": f.tags("personal", "prod")}
    return add("aws:ec2/instance:Instance", "debug-node", {**values, **overrides})


def template_nics(nics) -> Callable[[f.Stack], None]:
    return edit("node", networkInterfaces=nics)


SSE = "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration"
PAB = "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock"
KMS_RULE = {"rule": {"applyServerSideEncryptionByDefault": {"sseAlgorithm": "aws:kms", "kmsMasterKeyId": f.KEY_ARN}}}
WORLD_SSH = {"ipProtocol": "tcp", "fromPort": 22, "toPort": 22, "cidrIpv4": "0.0.0.0/0",
             "securityGroupId": "sg-51b340616cd3da298"}
SELF_ALL = {"protocol": "-1", "fromPort": 0, "toPort": 0, "self": True}
US_PROVIDER = "urn:pulumi:prod::gpufleet::pulumi:providers:aws::us"


def us_provider(s: f.Stack) -> None:
    provider = s.add("pulumi:providers:aws", "us", {"region": "us-east-1"})
    queue = s.add("aws:sqs/queue:Queue", "replica", {"kmsMasterKeyId": f.KEY_ARN, "tags": f.tags("personal", "prod")},
                  provider=provider)
    assert queue["provider"].startswith(US_PROVIDER)


def tag_free_with_default_tags(s: f.Stack) -> None:
    provider = s.add("pulumi:providers:aws", "tagged", {"region": "eu-west-1", "defaultTags": {"tags": {
        **f.TAGS, "data-classification": "internal"}}})
    s.add("aws:sqs/queue:Queue", "scratch", {"sqsManagedSseEnabled": True}, provider=provider)


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


AZ_SA, AZ_VMSS = "data", "nodes"
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
        ("aws-iam-policy-no-wildcard-actions", "aws-iam-policy-no-unconditioned-wildcard-write"), on="admin"),
    Case("iam-read-wildcard-ok", "prod", role_policy([{"Effect": "Allow", "Action": ["ec2:Describe*"],
                                                       "Resource": "*"}])),
    Case("iam-write-star-no-condition", "prod", role_policy([{"Effect": "Allow", "Action": "cloudwatch:PutMetricData",
                                                              "Resource": "*"}]),
         ("aws-iam-policy-no-unconditioned-wildcard-write",), on="node-policy"),
    Case("iam-admin-attachment", "prod", edit("node-ssm", policyArn="arn:aws:iam::aws:policy/AdministratorAccess"),
         ("aws-iam-attachment-no-admin-managed-policy",), on="node-ssm"),
    Case("iam-fullaccess-attachment", "prod", edit("node-ssm", policyArn="arn:aws:iam::aws:policy/AmazonS3FullAccess"),
         ("aws-iam-attachment-no-admin-managed-policy",), on="node-ssm"),
    # --- KMS, SQS, logs ---------------------------------------------------------------------------
    Case("kms-no-rotation", "prod", edit("key", enableKeyRotation=False), ("aws-kms-key-rotation",), on="key"),
    Case("kms-asymmetric-no-rotation", "prod", edit("key", enableKeyRotation=False, customerMasterKeySpec="RSA_2048")),
    Case("sqs-unencrypted", "prod", pop("jobs", "kmsMasterKeyId"), ("aws-sqs-queue-encrypted",), on="jobs"),
    Case("sqs-managed-sse", "dev", both(pop("jobs", "kmsMasterKeyId"), edit("jobs", sqsManagedSseEnabled=True))),
    Case("logs-no-kms", "prod", pop("logs", "kmsKeyId"), ("aws-cloudwatch-loggroup-encrypted",), on="logs"),
    Case("logs-forever", "prod", pop("logs", "retentionInDays"), ("aws-cloudwatch-loggroup-retention",), on="logs",
         level="advisory"),
    Case("logs-retention-under-config", "prod", nothing, ("aws-cloudwatch-loggroup-retention",), on="logs",
         level="advisory", policy_config={"aws-cloudwatch-loggroup-retention": {"minDays": 400}}),
    Case("flow-logs-missing", "phi", drop("flow"), ("aws-ec2-vpc-flow-logs",), on="vpc"),
    Case("flow-logs-reject-only", "phi", edit("flow", trafficType="REJECT"), ("aws-ec2-vpc-flow-logs",), on="flow"),
    Case("flow-logs-not-needed-internal", "dev", drop("flow")),
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
    Case("efa-spread-placement", "prod", edit("cluster", strategy="spread"), ("aws-autoscaling-group-efa-cluster",),
         on="nodes"),
    Case("efa-three-subnets", "prod", edit("nodes", vpcZoneIdentifiers=["subnet-1", "subnet-2", "subnet-3"]),
         ("aws-autoscaling-group-efa-cluster",), on="nodes"),
    Case("efa-no-placement-group", "prod", both(pop("nodes", "placementGroup"), drop("cluster")),
         ("aws-autoscaling-group-efa-cluster",), on="nodes"),
    Case("efa-single-node", "prod", both(pop("nodes", "placementGroup"), drop("cluster")),
         build=lambda: f.aws_gang(nodes=1)),
    Case("spot-no-rebalance", "dev", edit("nodes", capacityRebalance=False), ("aws-autoscaling-group-spot-lifecycle",),
         on="nodes"),
    Case("spot-no-terminate-hook", "dev", drop("checkpoint"), ("aws-autoscaling-group-spot-lifecycle",), on="nodes"),
    Case("on-demand-needs-no-hook", "prod", edit("nodes", initialLifecycleHooks=[])),
    Case("gpu-quota-exceeded", "prod", nothing, ("aws-autoscaling-group-gpu-quota",
                                                 "aws-autoscaling-group-monthly-ceiling"), on="nodes",
         build=lambda: f.aws_gang(nodes=16)),
    Case("gpu-quota-raised", "prod", nothing, build=lambda: f.aws_gang(nodes=16),
         policy_config={"aws-autoscaling-group-gpu-quota": {"maxGpus": 256},
                        "aws-autoscaling-group-monthly-ceiling": {"monthlyCeilingUsd": 1_000_000}}),
    Case("queue-min-size", "dev", edit("nodes", minSize=1), ("aws-autoscaling-group-queue-scale-to-zero",),
         on="nodes", level="advisory"),
    Case("monthly-ceiling", "dev", edit("nodes", maxSize=20), ("aws-autoscaling-group-monthly-ceiling",),
         on="nodes", level="advisory"),
    Case("monthly-ceiling-configured", "dev", edit("nodes", maxSize=20),
         policy_config={"aws-autoscaling-group-monthly-ceiling": {"monthlyCeilingUsd": 10000}}),
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
    Case("az-ib-fault-domains", "azure", edit(AZ_VMSS, platformFaultDomainCount=5),
         ("azure-compute-vmss-infiniband-layout",), on=AZ_VMSS),
    Case("az-ib-multi-placement", "azure", edit(AZ_VMSS, singlePlacementGroup=False),
         ("azure-compute-vmss-infiniband-layout",), on=AZ_VMSS),
    Case("az-ib-flexible", "azure", edit(AZ_VMSS, orchestrationMode="Flexible"),
         ("azure-compute-vmss-infiniband-layout",), on=AZ_VMSS),
    Case("az-ib-over-100", "azure", set_path("nodes-autoscale", ("profiles", 0, "capacity", "maximum"), "120"),
         ("azure-compute-vmss-infiniband-layout", "azure-compute-vmss-gpu-quota",
          "azure-compute-vmss-monthly-ceiling"), on=AZ_VMSS),
    Case("az-password-login", "azure", set_path(AZ_VMSS, ("virtualMachineProfile", "osProfile"), {
        "adminUsername": "azureuser", "adminPassword": "[secret]",
        "linuxConfiguration": {"disablePasswordAuthentication": False}}),
        ("azure-compute-vmss-ssh-keys-only",), on=AZ_VMSS),
    Case("az-no-host-encryption", "azure", set_path(AZ_VMSS, ("virtualMachineProfile", "securityProfile"), {}),
         ("azure-compute-vmss-encryption-at-host",), on=AZ_VMSS),
    Case("az-nsg-internet-ssh", "azure", set_path("nodes-nsg", ("securityRules", 1), {
        "name": "ssh", "direction": "Inbound", "access": "Allow", "priority": 200, "protocol": "Tcp",
        "sourceAddressPrefix": "Internet", "destinationPortRange": "22"}),
        ("azure-network-nsg-no-internet-inbound",), on="nodes-nsg"),
    Case("az-security-rule-any", "azure", add("azure-native:network:SecurityRule", "jupyter", {
        "networkSecurityGroupName": "nsg", "direction": "Inbound", "access": "Allow", "priority": 300,
        "protocol": "Tcp", "sourceAddressPrefixes": ["10.0.0.0/8", "*"], "destinationPortRange": "8888"}),
        ("azure-network-nsg-no-internet-inbound",), on="jupyter"),
    Case("az-queue-floor", "azure", set_path("nodes-autoscale", ("profiles", 0, "capacity", "minimum"), "1"),
         ("azure-compute-vmss-queue-scale-to-zero",), on=AZ_VMSS, level="advisory"),
    Case("az-gpu-quota", "azure", set_path("nodes-autoscale", ("profiles", 0, "capacity", "maximum"), "10"),
         ("azure-compute-vmss-gpu-quota",), on=AZ_VMSS),
    Case("az-monthly-ceiling", "azure", nothing, ("azure-compute-vmss-monthly-ceiling",), on=AZ_VMSS, level="advisory",
         policy_config={"azure-compute-vmss-monthly-ceiling": {"monthlyCeilingUsd": 10000}}),
    # --- compliance -------------------------------------------------------------------------------
    Case("gdpr-resource-region", "prod", edit("jobs", region="us-east-1"), ("aws-any-resource-gdpr-region",),
         on="jobs"),
    Case("gdpr-provider-region", "prod", us_provider, ("aws-any-resource-gdpr-region",), on="replica"),
    Case("gdpr-internal-anywhere", "dev", edit("jobs", region="us-east-1")),
    Case("gdpr-configured-region", "prod", edit("jobs", region="us-east-1"),
         policy_config={"aws-any-resource-gdpr-region": {"allowedRegions": ["eu-north-1", "us-east-1"]}}),
    Case("gdpr-azure-location", "azure", edit(AZ_SA, location="East US"), ("azure-any-resource-gdpr-region",),
         on=AZ_SA),
    Case("hipaa-type", "phi", nothing, ("aws-ec2-instancetype-hipaa-eligible",), on="nodes",
         build=lambda: f.aws_gang("phi", "phi", instance_type="g6e.48xlarge", efa_cards=4)),
    Case("hipaa-type-approved", "phi", nothing, build=lambda: f.aws_gang("phi", "phi", instance_type="g6e.48xlarge",
                                                                          efa_cards=4),
         policy_config={"aws-ec2-instancetype-hipaa-eligible": {"eligibleTypes": ["g6e.48xlarge"]}}),
    Case("hipaa-vm-size", "azure-phi", nothing,
         ("azure-compute-vmsize-hipaa-eligible",), on=AZ_VMSS,
         policy_config={"azure-compute-vmsize-hipaa-eligible": {"eligibleTypes": ["Standard_ND96isr_H100_v5"]}}),
    Case("cmk-aws-managed-sqs", "phi", edit("jobs", kmsMasterKeyId="alias/aws/sqs"), ("aws-kms-phi-cmk-encryption",),
         on="jobs"),
    Case("cmk-ebs-default-key", "phi", set_path("node", ("blockDeviceMappings", 0, "ebs", "kmsKeyId"), None),
         ("aws-kms-phi-cmk-encryption",), on="node"),
    Case("cmk-not-needed-personal", "prod", edit("jobs", kmsMasterKeyId="alias/aws/sqs")),
    Case("cmk-azure-storage", "azure-phi", pop(AZ_SA, "encryption"), ("azure-storage-account-phi-cmk",), on=AZ_SA),
    Case("cost-tags-missing", "prod", set_path("jobs", ("tags",), {"team": "ml-platform"}),
         ("aws-any-resource-cost-tags",), on="jobs", level="advisory"),
    Case("cost-tags-from-provider", "dev", tag_free_with_default_tags),
    Case("cost-tags-azure", "azure", no_tags("nodes-nsg"), ("azure-any-resource-cost-tags",), on="nodes-nsg",
         level="advisory"),
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
    Case("tc-public-ip", "tencent", edit("node", publicIpAssigned=True), ("tencent-cvm-node-no-public-ip",), on="node"),
    Case("tc-internet-bandwidth", "tencent", edit("node", internetMaxBandwidthOut=10),
         ("tencent-cvm-node-no-public-ip",), on="node"),
    Case("tc-world-ssh", "tencent", set_path("nodes-rules", ("ingresses", 0),
                                             {"action": "ACCEPT", "protocol": "TCP", "port": "22",
                                              "cidrBlock": "0.0.0.0/0"}),
         ("tencent-vpc-securitygroup-no-world-inbound",), on="nodes-rules"),
    Case("tc-world-lite-rule", "tencent", add("tencentcloud:Security/groupLiteRule:GroupLiteRule", "jupyter", {
        "securityGroupId": "sg-zr5s9g2e", "ingresses": ["ACCEPT#0.0.0.0/0#8888#TCP"]}),
         ("tencent-vpc-securitygroup-no-world-inbound",), on="jupyter"),
    Case("tc-cam-service-wildcard", "tencent", edit("node-policy", document=json.dumps({"version": "2.0", "statement": [
        {"effect": "allow", "action": ["name/cos:*"],
         "resource": ["qcs::cos:ap-shanghai:uid/1250000000:gpufleet-tencent-data-1250000000/*"]}]})),
         ("tencent-cam-policy-no-wildcards",), on="node-policy"),
    Case("tc-cam-any-resource", "tencent", edit("node-policy", document=json.dumps({"version": "2.0", "statement": [
        {"effect": "allow", "action": ["name/cvm:DescribeInstances"], "resource": ["*"]}]})),
         ("tencent-cam-policy-no-wildcards",), on="node-policy"),
    Case("tc-cam-operation-level-listed", "tencent", edit("node-policy", document=json.dumps({
        "version": "2.0", "statement": [{"effect": "allow", "action": ["name/cvm:DescribeInstances"],
                                         "resource": ["*"]}]})),
         policy_config={"tencent-cam-policy-no-wildcards": {"operationLevelActions": ["name/cvm:DescribeInstances"]}}),
    Case("tc-data-disk", "tencent", edit("node", dataDisks=[{"diskType": "CLOUD_SSD", "diskSize": 500}]),
         ("tencent-cvm-disk-encrypted",), on="node"),
    Case("tc-cbs-plain", "tencent", add("tencentcloud:Cbs/storage:Storage", "scratch", {
        "storageType": "CLOUD_SSD", "storageSize": 500, "availabilityZone": "ap-shanghai-2",
        "tags": f.tags("personal", "tencent")}), ("tencent-cvm-disk-encrypted",), on="scratch"),
    Case("tc-key-not-rotated", "tencent", edit("key", keyRotationEnabled=False), ("tencent-kms-key-rotation",),
         on="key"),
    Case("tc-personal-abroad", "tencent", tencent_abroad, ("tencent-any-resource-pipl-region",), on="replica"),
    Case("tc-spot-no-terminate-hook", "tencent", drop("checkpoint"), ("tencent-as-group-spot-terminate-hook",),
         on="nodes"),
    Case("tc-on-demand-no-hook", "tencent", both(drop("checkpoint"), edit("node", instanceChargeType="POSTPAID_BY_HOUR"),
                                                 edit("nodes", maxSize=2))),
    Case("tc-queue-floor", "tencent", edit("nodes", minSize=1), ("tencent-as-group-queue-scale-to-zero",), on="nodes",
         level="advisory"),
    Case("tc-gpu-quota", "tencent", edit("nodes", maxSize=10),
         ("tencent-as-group-gpu-quota", "tencent-as-group-monthly-ceiling"), on="nodes"),
    Case("tc-monthly-ceiling", "tencent", nothing, ("tencent-as-group-monthly-ceiling",), on="nodes", level="advisory",
         policy_config={"tencent-as-group-monthly-ceiling": {"monthlyCeilingCny": 10000}}),
    Case("tc-cost-tags", "tencent", no_tags("nodes-sg"), ("tencent-any-resource-cost-tags",), on="nodes-sg",
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
