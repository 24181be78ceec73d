"""Hand-built resource sets with the shapes the engine sends (camelCase inputs, launch-template
booleans as strings, URNs, parents, dependencies and property dependencies).

`aws_gang()`, `aws_queue()`, `azure_queue()` and `tencent_queue()` build compliant stacks modelled on the gpufleet
stacks: Slurm partitions as `gpufleet:<cloud>:Partition` components with what their nodes need as children (AWS:
launch template and cluster placement group; Azure: an empty Flexible scale set, or for a multi-node gang an
availability set; Tencent: a CVM launch template), the controller under its component, the munge key's secret and
the shared file system; tests mutate one thing and expect exactly the policy that guards it to fire.
"""
from __future__ import annotations

import json
from typing import Any, Optional

PROJECT = "gpufleet"
TAGS = {"team": "ml-platform", "cost-center": "research", "environment": "test"}
KEY_ARN = "arn:aws:kms:eu-north-1:123456789012:key/2ea3ad1a-8e11-469d-84dc-4a1ec3b80a00"
UNKNOWN = "[unknown]"  # how the offline preview writes a value unknown at preview time

# Stack config as the engine passes it to a policy pack (strings; objects as JSON).
STACKS = {
    "prod": {"aws:region": "eu-north-1", "gpufleet:cloud": "aws", "gpufleet:mode": "gang",
             "gpufleet:instanceTypes": '["p5.48xlarge"]', "gpufleet:nodes": '{"min": 4, "desired": 4, "max": 4}',
             "gpufleet:spot": "false", "gpufleet:dataClassification": "personal",
             "gpufleet:budgetMonthlyUsd": "200000"},
    "dev": {"aws:region": "eu-west-1", "gpufleet:cloud": "aws", "gpufleet:mode": "queue",
            "gpufleet:instanceTypes": '["g6.xlarge", "g5.xlarge"]', "gpufleet:nodes": '{"min": 0, "desired": 0, "max": 4}',
            "gpufleet:spot": "true", "gpufleet:dataClassification": "internal", "gpufleet:budgetMonthlyUsd": "3000"},
    "phi": {"aws:region": "eu-central-1", "gpufleet:cloud": "aws", "gpufleet:mode": "gang",
            "gpufleet:instanceTypes": '["p5.48xlarge"]', "gpufleet:nodes": '{"min": 4, "desired": 4, "max": 4}',
            "gpufleet:spot": "false", "gpufleet:dataClassification": "phi", "gpufleet:budgetMonthlyUsd": "200000"},
    "azure-phi": {"azure-native:location": "westeurope", "gpufleet:cloud": "azure", "gpufleet:mode": "queue",
                  "gpufleet:instanceTypes": '["Standard_ND96asr_v4"]',
                  "gpufleet:nodes": '{"min": 0, "desired": 0, "max": 4}', "gpufleet:spot": "true",
                  "gpufleet:dataClassification": "phi", "gpufleet:budgetMonthlyUsd": "100000"},
    "azure": {"azure-native:location": "westeurope", "gpufleet:cloud": "azure", "gpufleet:mode": "queue",
              "gpufleet:instanceTypes": '["Standard_ND96asr_v4"]', "gpufleet:nodes": '{"min": 0, "desired": 0, "max": 4}',
              "gpufleet:spot": "true", "gpufleet:dataClassification": "personal", "gpufleet:budgetMonthlyUsd": "100000"},
    "tencent": {"tencentcloud:region": "ap-shanghai", "gpufleet:cloud": "tencent", "gpufleet:mode": "queue",
                "gpufleet:instanceTypes": '["GN10Xp.20XLARGE320"]',
                "gpufleet:nodes": '{"min": 0, "desired": 0, "max": 4}', "gpufleet:spot": "true",
                "gpufleet:dataClassification": "personal", "gpufleet:budgetMonthlyCny": "300000"},
}


class Stack:
    """Resources of one stack, registered like the engine records them."""

    def __init__(self, stack: str):
        self.stack = stack
        self.resources: list[dict] = []
        self.root = self.add("pulumi:pulumi:Stack", f"{PROJECT}-{stack}", {}, custom=False)

    def add(self, type_: str, name: str, inputs: dict, *, deps: Optional[dict[str, list[dict]]] = None,
            parent: Optional[dict] = None, custom: bool = True, provider: Optional[dict] = None) -> dict:
        parent = parent if parent is not None else (self.root if self.resources else None)
        qualified = type_
        if parent is not None and parent["type"] != "pulumi:pulumi:Stack":
            qualified = f"{parent['urn'].split('::')[2]}${type_}"
        prop_deps = {k: [r["urn"] for r in v] for k, v in (deps or {}).items()}
        resource = {
            "type": type_, "name": name, "urn": f"urn:pulumi:{self.stack}::{PROJECT}::{qualified}::{name}",
            "parent": parent["urn"] if parent else None, "inputs": inputs, "custom": custom,
            "id": f"{name}-id" if custom else None,
            "provider": f"{provider['urn']}::{provider['id']}" if provider else None,
            "dependencies": sorted({u for urns in prop_deps.values() for u in urns}),
            "propertyDependencies": prop_deps,
        }
        self.resources.append(resource)
        return resource

    def get(self, name: str) -> dict:
        return next(r for r in self.resources if r["name"] == name)

    def remove(self, name: str) -> None:
        self.resources = [r for r in self.resources if r["name"] != name]


def tags(classification: str, stack: str) -> dict:
    return {**TAGS, "data-classification": classification, "gpufleet-stack": stack}


def efa_interfaces(cards: int, sg: str) -> list[dict]:
    """The AWS multi-card layout: ENA primary and EFA-only on card 0, EFA-only on every further card."""
    if cards == 0:
        return [{"deviceIndex": 0, "networkCardIndex": 0, "interfaceType": "interface", "securityGroups": [sg],
                 "associatePublicIpAddress": "false", "deleteOnTermination": "true"}]
    nics = [{"deviceIndex": 0, "networkCardIndex": 0, "interfaceType": "interface", "securityGroups": [sg],
             "associatePublicIpAddress": "false", "deleteOnTermination": "true"},
            {"deviceIndex": 1, "networkCardIndex": 0, "interfaceType": "efa-only", "securityGroups": [sg],
             "deleteOnTermination": "true"}]
    nics += [{"deviceIndex": 0, "networkCardIndex": c, "interfaceType": "efa-only", "securityGroups": [sg],
              "deleteOnTermination": "true"} for c in range(1, cards)]
    return nics


def _policy(statements: list[dict]) -> str:
    return json.dumps({"Version": "2012-10-17", "Statement": statements})


def tls_policy(bucket: str) -> str:
    arns = [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"]
    return _policy([
        {"Sid": "DenyInsecureTransport", "Effect": "Deny", "Principal": "*", "Action": "s3:*", "Resource": arns,
         "Condition": {"Bool": {"aws:SecureTransport": "false"}}},
        {"Sid": "DenyTlsBelow12", "Effect": "Deny", "Principal": "*", "Action": "s3:*", "Resource": arns,
         "Condition": {"NumericLessThan": {"s3:TlsVersion": "1.2"}}}])


ACCOUNT = "123456789012"


def account_only_policy(account: str = ACCOUNT) -> str:
    """The interface endpoint policy: this account's principals on this account's resources."""
    return _policy([{"Sid": "ThisAccountOnly", "Effect": "Allow", "Principal": "*", "Action": "*", "Resource": "*",
                     "Condition": {"StringEquals": {"aws:PrincipalAccount": account,
                                                    "aws:ResourceAccount": account}}}])


def node_statements(bucket: str) -> list[dict]:
    return [
        {"Effect": "Allow", "Action": ["s3:GetObject", "s3:PutObject"], "Resource": f"arn:aws:s3:::{bucket}/*"},
        {"Effect": "Allow", "Action": ["ec2:DescribeInstances", "ec2:DescribeTags"], "Resource": "*"},
        {"Effect": "Allow", "Action": "cloudwatch:PutMetricData", "Resource": "*",
         "Condition": {"StringEquals": {"cloudwatch:namespace": "gpufleet/test"}}}]


def on_instance_statements() -> list[dict]:
    """The Denies that keep instance credentials on their instance (infra.aws.policies.stay_on_instance)."""
    rest = {"Null": {"ec2:SourceInstanceARN": "false"}, "BoolIfExists": {"aws:ViaAWSService": "false"}}
    return [{"Sid": "CredentialsOnlyFromOwnVpc", "Effect": "Deny", "Action": "*", "Resource": "*", "Condition": {
                "StringNotEquals": {"aws:ec2InstanceSourceVPC": "${aws:SourceVpc}"}, **rest}},
            {"Sid": "CredentialsOnlyFromOwnAddress", "Effect": "Deny", "Action": "*", "Resource": "*", "Condition": {
                "StringNotEquals": {"aws:ec2InstanceSourcePrivateIPv4": "${aws:VpcSourceIp}"}, **rest}}]


VPC_ID = "vpc-0a1b2c3d4e5f60718"


def job_statements(bucket: str) -> list[dict]:
    """The job role's rights (infra.aws.policies.job_role_policy), short of its VPC Deny."""
    return [
        {"Sid": "OwnJobObjects", "Effect": "Allow", "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"],
         "Resource": f"arn:aws:s3:::{bucket}/teams/*/jobs/*"},
        {"Sid": "ReadCodeAndData", "Effect": "Allow", "Action": "s3:GetObject",
         "Resource": [f"arn:aws:s3:::{bucket}/teams/*/code/*", f"arn:aws:s3:::{bucket}/teams/*/data/*"]}]


def in_vpc_statement(vpc_id: str = VPC_ID) -> dict:
    """The Deny that holds a job role's credentials to the stack's VPC."""
    return {"Sid": "OnlyThroughStackVpc", "Effect": "Deny", "Action": "*", "Resource": "*",
            "Condition": {"StringNotEqualsIfExists": {"aws:SourceVpc": vpc_id},
                          "BoolIfExists": {"aws:ViaAWSService": "false"}}}


def one_sender_policy(stack: str, operator: str = "ArnNotEquals",
                      role: str = "arn:aws:iam::123456789012:role/gpufleet-{stack}-submit-vision") -> dict:
    """A team's job queue: TLS only, and sent to by the team's submit role alone (infra.aws.policies.queue_policy)."""
    arn = f"arn:aws:sqs:eu-north-1:123456789012:gpufleet-{stack}-jobs"
    return {"Version": "2012-10-17", "Statement": [
        {"Sid": "DenyInsecureTransport", "Effect": "Deny", "Principal": "*", "Action": "sqs:*", "Resource": [arn],
         "Condition": {"Bool": {"aws:SecureTransport": "false"}}},
        {"Sid": "OnlyTheTeamSends", "Effect": "Deny", "Principal": "*", "Action": "sqs:SendMessage", "Resource": arn,
         "Condition": {operator: {"aws:PrincipalArn": role.format(stack=stack)}}}]}


def _dns_firewall(s: Stack, vpc: dict, t: dict) -> None:
    """The VPC's DNS firewall: AWS names and the VPC's own allowed, the rest blocked (infra.aws.dns_firewall)."""
    allowed = s.add("aws:route53/resolverFirewallDomainList:ResolverFirewallDomainList", "dns-allowed", {
        "name": "dns-allowed", "domains": ["*.eu-north-1.amazonaws.com", "*.eu-north-1.compute.internal"], "tags": t})
    everything = s.add("aws:route53/resolverFirewallDomainList:ResolverFirewallDomainList", "dns-everything", {
        "name": "dns-everything", "domains": ["*"], "tags": t})
    group = s.add("aws:route53/resolverFirewallRuleGroup:ResolverFirewallRuleGroup", "dns", {"name": "dns", "tags": t})
    for name, action, priority, domains in (("dns-allow-aws", "ALLOW", 100, allowed),
                                            ("dns-block-rest", "BLOCK", 200, everything)):
        s.add("aws:route53/resolverFirewallRule:ResolverFirewallRule", name, {
            "name": name, "action": action, "priority": priority, "firewallDomainListId": "rslvr-fdl-1",
            "firewallRuleGroupId": "rslvr-frg-1", **({"blockResponse": "NXDOMAIN"} if action == "BLOCK" else {})},
            deps={"firewallDomainListId": [domains], "firewallRuleGroupId": [group]})
    s.add("aws:route53/resolverFirewallRuleGroupAssociation:ResolverFirewallRuleGroupAssociation", "dns-association", {
        "name": "dns", "firewallRuleGroupId": "rslvr-frg-1", "vpcId": "vpc-0a1b2c3d4e5f60718", "priority": 101,
        "tags": t}, deps={"firewallRuleGroupId": [group], "vpcId": [vpc]})


def _aws_common(s: Stack, classification: str) -> dict[str, dict]:
    t = tags(classification, s.stack)
    key = s.add("aws:kms/key:Key", "key", {"enableKeyRotation": True, "deletionWindowInDays": 30, "tags": t})
    bucket = s.add("aws:s3/bucket:Bucket", "data", {"forceDestroy": False, "tags": t})
    name = f"gpufleet-{s.stack}-data-1a2b3c4"
    s.add("aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration", "data-sse",
          {"bucket": name, "rules": [{"applyServerSideEncryptionByDefault": {"sseAlgorithm": "aws:kms",
                                                                            "kmsMasterKeyId": KEY_ARN},
                                      "bucketKeyEnabled": True}]},
          deps={"bucket": [bucket], "rules": [key]})
    _bucket_guards(s, bucket, name, "data")
    if classification in ("personal", "phi"):
        _access_logs(s, bucket, name, t)
    jobs = s.add("aws:sqs/queue:Queue", "jobs", {"kmsMasterKeyId": KEY_ARN, "visibilityTimeoutSeconds": 900,
                                                 "tags": t}, deps={"kmsMasterKeyId": [key]})
    s.add("aws:sqs/queuePolicy:QueuePolicy", "jobs-policy", {
        "queueUrl": f"https://sqs.eu-north-1.amazonaws.com/123456789012/gpufleet-{s.stack}-jobs",
        "policy": json.dumps(one_sender_policy(s.stack))}, deps={"queueUrl": [jobs]})
    s.add("aws:cloudwatch/logGroup:LogGroup", "logs", {"name": f"/gpufleet/{s.stack}", "kmsKeyId": KEY_ARN,
                                                       "retentionInDays": 365, "tags": t}, deps={"kmsKeyId": [key]})
    vpc = s.add("aws:ec2/vpc:Vpc", "vpc", {"cidrBlock": "10.42.0.0/16", "enableDnsHostnames": True, "tags": t})
    subnet = s.add("aws:ec2/subnet:Subnet", "private-0", {"vpcId": "vpc-0a1b2c3d4e5f60718", "cidrBlock": "10.42.0.0/19",
                                                         "mapPublicIpOnLaunch": False, "tags": t},
                   deps={"vpcId": [vpc]})
    s.add("aws:ec2/flowLog:FlowLog", "flow", {"vpcId": "vpc-0a1b2c3d4e5f60718", "trafficType": "ALL",
                                              "logDestinationType": "cloud-watch-logs", "tags": t},
          deps={"vpcId": [vpc]})
    _dns_firewall(s, vpc, t)
    s3_endpoint = {"Version": "2012-10-17", "Statement": [
        {"Sid": "StackBuckets", "Effect": "Allow", "Principal": "*", "Action": "s3:*",
         "Resource": [f"arn:aws:s3:::{name}", f"arn:aws:s3:::{name}/*"],
         "Condition": {"StringEquals": {"aws:PrincipalAccount": ACCOUNT, "aws:ResourceAccount": ACCOUNT}}}]}
    s.add("aws:ec2/vpcEndpoint:VpcEndpoint", "s3", {
        "vpcId": "vpc-0a1b2c3d4e5f60718", "serviceName": "com.amazonaws.eu-north-1.s3", "vpcEndpointType": "Gateway",
        "policy": json.dumps(s3_endpoint), "tags": t}, deps={"vpcId": [vpc], "policy": [bucket]})
    s.add("aws:ec2/vpcEndpoint:VpcEndpoint", "sqs", {
        "vpcId": "vpc-0a1b2c3d4e5f60718", "serviceName": "com.amazonaws.eu-north-1.sqs", "vpcEndpointType": "Interface",
        "privateDnsEnabled": True, "policy": account_only_policy(), "tags": t}, deps={"vpcId": [vpc]})
    topic = s.add("aws:sns/topic:Topic", "alerts", {"kmsMasterKeyId": KEY_ARN, "tags": t}, deps={"kmsMasterKeyId": [key]})
    s.add("aws:sns/topicSubscription:TopicSubscription", "alerts-email", {
        "topic": "arn:aws:sns:eu-north-1:123456789012:alerts", "protocol": "email", "endpoint": "ops@example.com"},
        deps={"topic": [topic]})
    sg = s.add("aws:ec2/securityGroup:SecurityGroup", "nodes-sg", {"vpcId": "vpc-0a1b2c3d4e5f60718",
                                                                "description": "GPU nodes", "tags": t},
               deps={"vpcId": [vpc]})
    for direction, kind in (("ingress", "Ingress"), ("egress", "Egress")):
        s.add(f"aws:vpc/securityGroup{kind}Rule:SecurityGroup{kind}Rule", f"nodes-sg-{direction}-self",
              {"ipProtocol": "-1", "securityGroupId": "sg-51b340616cd3da298",
               "referencedSecurityGroupId": "sg-51b340616cd3da298", "tags": t},
              deps={"securityGroupId": [sg], "referencedSecurityGroupId": [sg]})
    s.add("aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule", "nodes-sg-egress-https",
          {"ipProtocol": "tcp", "fromPort": 443, "toPort": 443, "cidrIpv4": "0.0.0.0/0",
           "securityGroupId": "sg-51b340616cd3da298", "tags": t}, deps={"securityGroupId": [sg]})
    role = s.add("aws:iam/role:Role", "node-role", {"assumeRolePolicy": _policy([
        {"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}]), "tags": t})
    s.add("aws:iam/rolePolicy:RolePolicy", "node-policy", {"role": "node-1a2b", "policy": _policy(
        node_statements(name) + on_instance_statements())}, deps={"role": [role], "policy": [bucket]})
    s.add("aws:iam/rolePolicyAttachment:RolePolicyAttachment", "node-extra",  # a customer-managed policy: fine
          {"role": "node-1a2b", "policyArn": "arn:aws:iam::123456789012:policy/gpufleet-prod-extra"},
          deps={"role": [role]})
    # the job role: the node role assumes it for each job; its credentials work only through the stack's VPC
    job_role = s.add("aws:iam/role:Role", "job-role", {"assumeRolePolicy": _policy([
        {"Effect": "Allow", "Principal": {"AWS": NODE_ROLE_ARN}, "Action": "sts:AssumeRole",
         "Condition": {"StringLike": {"sts:RoleSessionName": "gpufleet-*"}}}]), "tags": t},
        deps={"assumeRolePolicy": [role]})
    s.add("aws:iam/rolePolicy:RolePolicy", "job-policy", {"role": "job-1a2b", "policy": _policy(
        job_statements(name) + [in_vpc_statement()])}, deps={"role": [job_role], "policy": [bucket, vpc]})
    _registry(s, key, t)
    return {"key": key, "bucket": bucket, "vpc": vpc, "subnet": subnet, "sg": sg, "role": role}


def _registry(s: Stack, key: dict, t: dict) -> None:
    """The stack's ECR repository and one pull-through cache rule with its creation template."""
    kms = [{"encryptionType": "KMS", "kmsKey": KEY_ARN}]
    repo = s.add("aws:ecr/repository:Repository", "images", {
        "name": f"gpufleet-{s.stack}", "imageTagMutability": "IMMUTABLE", "forceDelete": False,
        "imageScanningConfiguration": {"scanOnPush": True}, "encryptionConfigurations": kms, "tags": t},
        deps={"encryptionConfigurations": [key]})
    s.add("aws:ecr/lifecyclePolicy:LifecyclePolicy", "images-lifecycle", {
        "repository": f"gpufleet-{s.stack}", "policy": json.dumps({"rules": [
            {"rulePriority": 1, "selection": {"tagStatus": "any", "countType": "imageCountMoreThan",
                                              "countNumber": 50}, "action": {"type": "expire"}}]})},
        deps={"repository": [repo]})
    s.add("aws:ecr/repositoryCreationTemplate:RepositoryCreationTemplate", "cache-ecr-public", {
        "prefix": "ecr-public", "appliedFors": ["PULL_THROUGH_CACHE"], "imageTagMutability": "MUTABLE",
        "encryptionConfigurations": kms, "resourceTags": t}, deps={"encryptionConfigurations": [key]})
    s.add("aws:ecr/pullThroughCacheRule:PullThroughCacheRule", "cache-ecr-public", {
        "ecrRepositoryPrefix": "ecr-public", "upstreamRegistryUrl": "public.ecr.aws"})
    role = s.add("aws:iam/role:Role", "ecr-templates", {"assumeRolePolicy": _policy([
        {"Effect": "Allow", "Principal": {"Service": "ecr.amazonaws.com"}, "Action": "sts:AssumeRole"}]), "tags": t})
    s.add("aws:iam/rolePolicy:RolePolicy", "ecr-templates-policy", {"role": "ecr-templates-1a2b", "policy": _policy(
        ecr_template_statements())}, deps={"role": [role], "policy": [key]})


def ecr_template_statements(grant_condition: Optional[dict] = None) -> list[dict]:
    """The ECR creation-template role's grants on the stack key (infra.aws.registry.template_role_policy)."""
    condition = {"Bool": {"kms:GrantIsForAWSResource": "true"}} if grant_condition is None else grant_condition
    grant = {"Sid": "GrantStackKeyToRepositories", "Effect": "Allow", "Action": "kms:CreateGrant", "Resource": KEY_ARN}
    return [{**grant, "Condition": condition} if condition else grant,
            {"Sid": "ReadStackKeyRetireGrants", "Effect": "Allow", "Action": ["kms:DescribeKey", "kms:RetireGrant"],
             "Resource": KEY_ARN}]


def _bucket_guards(s: Stack, bucket: dict, name: str, prefix: str) -> None:
    """Versioning, a full public access block and a TLS-only policy for one bucket."""
    s.add("aws:s3/bucketVersioning:BucketVersioning", f"{prefix}-versioning",
          {"bucket": name, "versioningConfiguration": {"status": "Enabled"}}, deps={"bucket": [bucket]})
    s.add("aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock", f"{prefix}-pab",
          {"bucket": name, "blockPublicAcls": True, "blockPublicPolicy": True, "ignorePublicAcls": True,
           "restrictPublicBuckets": True}, deps={"bucket": [bucket]})
    s.add("aws:s3/bucketPolicy:BucketPolicy", f"{prefix}-policy", {"bucket": name, "policy": tls_policy(name)},
          deps={"bucket": [bucket], "policy": [bucket]})


def _access_logs(s: Stack, bucket: dict, name: str, t: dict) -> None:
    """A log bucket (SSE-S3, as S3 access-log delivery requires) receiving the data bucket's access logs."""
    logs = s.add("aws:s3/bucket:Bucket", "access-logs", {"forceDestroy": False, "tags": t})
    log_name = f"gpufleet-{s.stack}-access-logs-5d6e7f8"
    s.add("aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration", "access-logs-sse",
          {"bucket": log_name, "rules": [{"applyServerSideEncryptionByDefault": {"sseAlgorithm": "AES256"}}]},
          deps={"bucket": [logs]})
    _bucket_guards(s, logs, log_name, "access-logs")
    s.add("aws:s3/bucketLogging:BucketLogging", "data-logging",
          {"bucket": name, "targetBucket": log_name, "targetPrefix": "data/"},
          deps={"bucket": [bucket], "targetBucket": [logs]})


def _template(s: Stack, sg: dict, cards: int, classification: str, parent: dict) -> dict:
    """A partition's launch template: no instance type (the partition's types go to CreateFleet)."""
    inputs: dict[str, Any] = {
        "imageId": "ami-0a1b2c3d4e5f60718",
        "metadataOptions": {"httpEndpoint": "enabled", "httpTokens": "required", "httpPutResponseHopLimit": 1},
        "blockDeviceMappings": [{"deviceName": "/dev/sda1", "ebs": {"volumeSize": 200, "volumeType": "gp3",
                                                                    "encrypted": "true", "kmsKeyId": KEY_ARN,
                                                                    "deleteOnTermination": "true"}}],
        "networkInterfaces": efa_interfaces(cards, "sg-51b340616cd3da298"),
        "tagSpecifications": [{"resourceType": kind, "tags": tags(classification, s.stack)}
                              for kind in ("instance", "volume", "network-interface")],
        "tags": tags(classification, s.stack),
    }
    return s.add("aws:ec2/launchTemplate:LaunchTemplate", "node", inputs, deps={"networkInterfaces": [sg]},
                 parent=parent)


PARTITION = "gpufleet:aws:Partition"
CONTROLLER = "gpufleet:aws:Controller"
TEMPLATE_ARN = "arn:aws:ec2:eu-north-1:123456789012:launch-template/lt-9afbf080c7dd4dd7f"
NODE_ROLE_ARN = "arn:aws:iam::123456789012:role/gpufleet-node-4932714"
FS_ARN = "arn:aws:elasticfilesystem:eu-north-1:123456789012:file-system/fs-0a1b2c3d4e5f60718"


def partition(s: Stack, subnets: list[dict], **props) -> dict:
    """A Slurm partition component with the properties infra.aws.partition gives it."""
    subnet_ids = props.pop("subnetIds")
    return s.add(PARTITION, "gpu", {"partition": "gpu", **props, "subnetIds": subnet_ids},
                 deps={"subnetIds": subnets}, custom=False)


def launch_statements(stack: str, template_arns: list[str] = (TEMPLATE_ARN,)) -> list[dict]:
    """The controller's launch rights as infra.aws.policies.controller_policy writes them."""
    ec2 = "arn:aws:ec2:eu-north-1:123456789012"
    from_templates = {"ArnEquals": {"ec2:LaunchTemplate": list(template_arns)}}
    return [
        {"Sid": "LaunchNodesTagged", "Effect": "Allow", "Action": ["ec2:RunInstances", "ec2:CreateFleet"],
         "Resource": f"{ec2}:instance/*",
         "Condition": {**from_templates, "StringEquals": {"aws:RequestTag/gpufleet-stack": stack}}},
        {"Sid": "LaunchNodeParts", "Effect": "Allow", "Action": ["ec2:RunInstances", "ec2:CreateFleet"],
         "Resource": [f"{ec2}:volume/*", f"{ec2}:network-interface/*"], "Condition": from_templates},
        {"Sid": "LaunchFromStackResources", "Effect": "Allow", "Action": ["ec2:RunInstances", "ec2:CreateFleet"],
         "Resource": [*template_arns, f"{ec2}:subnet/subnet-9ed9e5720457e2e00",
                      f"{ec2}:security-group/sg-51b340616cd3da298",
                      "arn:aws:ec2:eu-north-1::image/ami-0a1b2c3d4e5f60718"]},
        {"Sid": "CreateFleetRequests", "Effect": "Allow", "Action": "ec2:CreateFleet", "Resource": f"{ec2}:fleet/*"},
        {"Sid": "TerminateStackNodes", "Effect": "Allow", "Action": "ec2:TerminateInstances",
         "Resource": f"{ec2}:instance/*",
         "Condition": {"StringEquals": {"ec2:ResourceTag/gpufleet-stack": stack}}},
        {"Sid": "PassNodeRole", "Effect": "Allow", "Action": "iam:PassRole", "Resource": NODE_ROLE_ARN,
         "Condition": {"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}}},
        {"Sid": "DescribeNodes", "Effect": "Allow", "Action": ["ec2:DescribeInstances", "ec2:DescribeTags"],
         "Resource": "*"},
    ]


def efs_policy(fs_arn: str = FS_ARN) -> str:
    """The shared file system's policy: TLS only, nodes mount through the access point."""
    return _policy([
        {"Sid": "DenyInsecureTransport", "Effect": "Deny", "Principal": {"AWS": "*"}, "Action": "*",
         "Resource": fs_arn, "Condition": {"Bool": {"aws:SecureTransport": "false"}}},
        {"Sid": "NodesMountHome", "Effect": "Allow", "Principal": {"AWS": NODE_ROLE_ARN},
         "Action": ["elasticfilesystem:ClientMount", "elasticfilesystem:ClientWrite"], "Resource": fs_arn}])


def _slurm(s: Stack, c: dict[str, dict], classification: str, template: dict, controller_type: str) -> None:
    """What every Slurm stack has beside its partitions: the controller (its instance on a network interface of
    its own, its role's launch rights), the munge key's empty secret and the shared file system."""
    t = tags(classification, s.stack)
    eni = s.add("aws:ec2/networkInterface:NetworkInterface", "controller-eni", {
        "subnetId": "subnet-9ed9e5720457e2e00", "securityGroups": ["sg-70c69a8013a0c5e32"],
        "description": "Slurm controller", "tags": t}, deps={"subnetId": [c["subnet"]]})
    role = s.add("aws:iam/role:Role", "controller-role", {"assumeRolePolicy": _policy([
        {"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}]), "tags": t})
    controller = s.add(CONTROLLER, "controller", {}, custom=False)
    s.add("aws:iam/rolePolicy:RolePolicy", "controller-policy", {
        "role": "controller-1a2b", "policy": _policy(launch_statements(s.stack) + on_instance_statements())},
        deps={"role": [role], "policy": [template, c["role"]]}, parent=controller)
    s.add("aws:ec2/instance:Instance", "controller-instance", {
        "ami": "ami-0a1b2c3d4e5f60718", "instanceType": controller_type, "iamInstanceProfile": "controller-1a2b",
        "networkInterfaces": [{"networkInterfaceId": "eni-b85d18a3ef8ebcb32", "deviceIndex": 0}],
        "metadataOptions": {"httpEndpoint": "enabled", "httpTokens": "required", "httpPutResponseHopLimit": 1},
        "rootBlockDevice": {"volumeSize": 50, "volumeType": "gp3", "encrypted": True, "kmsKeyId": KEY_ARN,
                            "deleteOnTermination": True},
        "tags": t}, deps={"networkInterfaces": [eni], "rootBlockDevice": [c["key"]]}, parent=controller)
    s.add("aws:secretsmanager/secret:Secret", "munge", {
        "namePrefix": f"gpufleet-{s.stack}-munge-", "kmsKeyId": KEY_ARN, "recoveryWindowInDays": 7, "tags": t},
        deps={"kmsKeyId": [c["key"]]})
    fs = s.add("aws:efs/fileSystem:FileSystem", "shared", {
        "encrypted": True, "kmsKeyId": KEY_ARN, "performanceMode": "generalPurpose", "throughputMode": "elastic",
        "tags": t}, deps={"kmsKeyId": [c["key"]]})
    s.add("aws:efs/fileSystemPolicy:FileSystemPolicy", "shared-policy", {
        "fileSystemId": "fs-0a1b2c3d4e5f60718", "policy": efs_policy()}, deps={"fileSystemId": [fs], "policy": [fs]})


def aws_gang(stack: str = "prod", classification: str = "personal", instance_type: str = "p5.48xlarge",
             nodes: int = 4, efa_cards: int = 32, controller_type: str = "m6i.large") -> Stack:
    """A multi-node EFA gang partition: all nodes always on, one cluster placement group, one subnet, on-demand."""
    s = Stack(stack)
    c = _aws_common(s, classification)
    part = partition(s, [c["subnet"]], instanceTypes=[instance_type], maxNodes=nodes, alwaysOn=nodes, spot=False,
                     onDemandBase=0, gang=True, gpusPerNode=8, efaInterfaces=efa_cards,
                     subnetIds=["subnet-9ed9e5720457e2e00"])
    lt = _template(s, c["sg"], efa_cards, classification, part)
    if nodes > 1:
        s.add("aws:ec2/placementGroup:PlacementGroup", "cluster", {"strategy": "cluster",
                                                                   "tags": tags(classification, stack)}, parent=part)
    _slurm(s, c, classification, lt, controller_type)
    return s


def aws_queue(stack: str = "dev", classification: str = "internal") -> Stack:
    """A queue partition of spot single-GPU types without EFA across three subnets that powers down to zero."""
    s = Stack(stack)
    c = _aws_common(s, classification)
    part = partition(s, [c["subnet"]], instanceTypes=["g6.xlarge", "g5.xlarge"], maxNodes=4, alwaysOn=0, spot=True,
                     onDemandBase=0, gang=False, gpusPerNode=1, efaInterfaces=0,
                     subnetIds=["subnet-1", "subnet-2", "subnet-3"])
    lt = _template(s, c["sg"], 0, classification, part)
    _slurm(s, c, classification, lt, "m6i.large")
    return s


def vault_properties(**overrides) -> dict:
    """A Key Vault as the stack makes it: RBAC, soft delete, purge protection, no public network access."""
    values = {"tenantId": "00000000-0000-4000-8000-000000000001", "sku": {"family": "A", "name": "standard"},
              "enableRbacAuthorization": True, "enableSoftDelete": True, "softDeleteRetentionInDays": 90,
              "enablePurgeProtection": True, "publicNetworkAccess": "Disabled",
              "networkAcls": {"defaultAction": "Deny", "bypass": "None"}}
    return {k: v for k, v in {**values, **overrides}.items() if v is not None}


AZ_PARTITION = "gpufleet:azure:Partition"
AZ_CONTROLLER = "gpufleet:azure:Controller"
SUBSCRIPTION = "/subscriptions/00000000-0000-4000-8000-000000000001/resourceGroups/gpufleet-azure"
SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGdw gpufleet@example"
AZ_KEY_ENCRYPTION = {"keySource": "Microsoft.Keyvault", "keyVaultProperties": {
    "keyName": "gpufleet", "keyVaultUri": "https://gpufleet-kv.vault.azure.net/"}}


def linux_os_profile(computer_name: str = "controller") -> dict:
    """An osProfile with SSH keys only (infra.azure.controller)."""
    return {"computerName": computer_name, "adminUsername": "azureuser",
            "linuxConfiguration": {"disablePasswordAuthentication": True, "ssh": {"publicKeys": [
                {"path": "/home/azureuser/.ssh/authorized_keys", "keyData": SSH_KEY}]}}}


def azure_vm(size: str = "Standard_D2s_v5", nic: str = f"{SUBSCRIPTION}/providers/Microsoft.Network/"
             "networkInterfaces/gpufleet-azure-controller", **overrides) -> dict:
    """A VM's inputs as the controller's: on its own NIC, encryption at host, SSH keys only."""
    values = {"resourceGroupName": "gpufleet-azure", "location": "westeurope", "hardwareProfile": {"vmSize": size},
              "osProfile": linux_os_profile(), "securityProfile": {"encryptionAtHost": True},
              "networkProfile": {"networkInterfaces": [{"id": nic, "primary": True, "deleteOption": "Detach"}]},
              "storageProfile": {"osDisk": {"createOption": "FromImage", "diskSizeGB": 64,
                                            "managedDisk": {"storageAccountType": "Premium_LRS"}}},
              "priority": "Regular"}
    return {**values, **overrides}


def azure_partition(name: str = "gpu", size: str = "Standard_ND96asr_v4", gang: bool = False, nodes: int = 4,
                    **overrides) -> dict:
    """A Slurm partition component's properties (infra.azure.partition.props)."""
    multi = gang and nodes > 1
    values = {"partition": name, "vmSize": size, "instanceTypes": [size], "maxNodes": nodes, "alwaysOn": 0,
              "spot": not multi, "onDemandBase": 0, "gang": gang, "gpusPerNode": 8, "infiniband": True,
              "placement": "availability_set" if multi else "scale_set"}
    return {**values, **overrides}


def azure_partition_group(s: Stack, part: dict, t: dict) -> dict:
    """The partition's child: an empty Flexible scale set, or for a multi-node gang an availability set."""
    name = part["inputs"]["partition"]
    if part["inputs"]["placement"] == "availability_set":
        return s.add("azure-native:compute:AvailabilitySet", f"{name}-avset", {
            "resourceGroupName": "gpufleet-azure-nodes", "location": "westeurope", "availabilitySetName":
            f"gpufleet-azure-{name}", "platformFaultDomainCount": 1, "platformUpdateDomainCount": 1,
            "sku": {"name": "Aligned"}, "tags": t}, parent=part)
    return s.add("azure-native:compute:VirtualMachineScaleSet", f"{name}-vmss", {
        "resourceGroupName": "gpufleet-azure-nodes", "location": "westeurope", "vmScaleSetName": f"gpufleet-azure-{name}",
        "orchestrationMode": "Flexible", "platformFaultDomainCount": 1, "singlePlacementGroup": False, "tags": t},
        parent=part)


def _azure_dns_policy(s: Stack, t: dict) -> None:
    """The VNet and its DNS security policy: Azure's names allowed, the rest blocked (infra.azure.dns_firewall)."""
    vnet = s.add("azure-native:network:VirtualNetwork", "vnet", {
        "resourceGroupName": "gpufleet-azure-rg", "virtualNetworkName": "gpufleet-azure", "location": "westeurope",
        "addressSpace": {"addressPrefixes": ["10.64.0.0/16"]}, "tags": t})
    policy = s.add("azure-native:dnsresolver:DnsResolverPolicy", "dns-policy", {
        "resourceGroupName": "gpufleet-azure-rg", "dnsResolverPolicyName": "gpufleet-azure-dns",
        "location": "westeurope", "tags": t})
    for name, domains, action, priority in (
            ("allowed", ["core.windows.net.", "vault.azure.net.", "azurecr.io."], {"actionType": "Allow"}, 100),
            ("everything", ["."], {"actionType": "Block", "blockResponseCode": "SERVFAIL"}, 200)):
        domain_list = s.add("azure-native:dnsresolver:DnsResolverDomainList", f"dns-{name}", {
            "resourceGroupName": "gpufleet-azure-rg", "dnsResolverDomainListName": f"gpufleet-azure-dns-{name}",
            "location": "westeurope", "domains": domains, "tags": t})
        s.add("azure-native:dnsresolver:DnsSecurityRule", f"dns-rule-{name}", {
            "resourceGroupName": "gpufleet-azure-rg", "dnsResolverPolicyName": "gpufleet-azure-dns",
            "dnsSecurityRuleName": name, "location": "westeurope", "priority": priority, "action": action,
            "dnsResolverDomainLists": [{"id": f"{SUBSCRIPTION}/providers/Microsoft.Network/dnsResolverDomainLists/"
                                               f"gpufleet-azure-dns-{name}"}],
            "dnsSecurityRuleState": "Enabled", "tags": t},
            deps={"dnsResolverPolicyName": [policy], "dnsResolverDomainLists": [domain_list]})
    s.add("azure-native:dnsresolver:DnsResolverPolicyVirtualNetworkLink", "dns-link", {
        "resourceGroupName": "gpufleet-azure-rg", "dnsResolverPolicyName": "gpufleet-azure-dns",
        "dnsResolverPolicyVirtualNetworkLinkName": "vnet", "location": "westeurope",
        "virtualNetwork": {"id": f"{SUBSCRIPTION}/providers/Microsoft.Network/virtualNetworks/gpufleet-azure"},
        "tags": t}, deps={"dnsResolverPolicyName": [policy], "virtualNetwork": [vnet]})


def azure_queue(stack: str = "azure", classification: str = "personal", gang_nodes: int = 0) -> Stack:
    """The Azure stack's shapes: locked-down storage, a queue partition whose VMs join an empty Flexible scale set
    (with `gang_nodes`, a second partition "big", a gang whose VMs share an availability set), the controller VM on
    its own NIC in a subnet whose only way out is a NAT gateway with the stack's one public IP, the munge key's
    placeholder secret, the NFS shares' FileStorage account behind a private endpoint, the VNet's DNS security
    policy."""
    s = Stack(stack)
    t = tags(classification, stack)
    cmk = {"encryption": AZ_KEY_ENCRYPTION} if classification == "phi" else {}
    rg = s.add("azure-native:resources:ResourceGroup", "rg", {"location": "westeurope", "tags": t})
    _azure_dns_policy(s, t)
    s.add("azure-native:storage:StorageAccount", "data", {
        "resourceGroupName": "gpufleet-azure-rg", "kind": "StorageV2", "sku": {"name": "Standard_LRS"},
        "enableHttpsTrafficOnly": True, "minimumTlsVersion": "TLS1_2", "allowBlobPublicAccess": False,
        "allowSharedKeyAccess": False, "publicNetworkAccess": "Enabled",
        "networkRuleSet": {"defaultAction": "Deny", "bypass": "AzureServices",
                           "virtualNetworkRules": [{"virtualNetworkResourceId": "/subscriptions/x/subnets/nodes"}]},
        **cmk, "tags": t}, deps={"resourceGroupName": [rg]})
    s.add("azure-native:storage:BlobContainer", "checkpoints", {"accountName": "gpufleetazuredata",
                                                                 "resourceGroupName": "gpufleet-azure-rg",
                                                                 "publicAccess": "None"})
    deny_internet = {"name": "deny-internet", "direction": "Inbound", "access": "Deny", "priority": 4000,
                     "protocol": "*", "sourceAddressPrefix": "Internet", "sourcePortRange": "*",
                     "destinationAddressPrefix": "*", "destinationPortRange": "*"}
    s.add("azure-native:network:NetworkSecurityGroup", "nodes-nsg", {
        "resourceGroupName": "gpufleet-azure-rg", "tags": t,
        "securityRules": [{"name": "vnet-in", "direction": "Inbound", "access": "Allow", "priority": 100,
                           "protocol": "*", "sourceAddressPrefix": "VirtualNetwork", "sourcePortRange": "*",
                           "destinationAddressPrefix": "VirtualNetwork", "destinationPortRange": "*"},
                          deny_internet]})
    controller_nsg = s.add("azure-native:network:NetworkSecurityGroup", "controller-nsg", {
        "resourceGroupName": "gpufleet-azure-rg", "tags": t,
        "securityRules": [{"name": "slurmctld-from-nodes", "direction": "Inbound", "access": "Allow", "priority": 100,
                           "protocol": "Tcp", "sourceAddressPrefix": "10.64.0.0/20", "sourcePortRange": "*",
                           "destinationAddressPrefix": "10.64.16.0/24", "destinationPortRange": "6817"},
                          deny_internet,
                          {"name": "resource-manager", "direction": "Outbound", "access": "Allow", "priority": 100,
                           "protocol": "Tcp", "sourceAddressPrefix": "10.64.16.0/24", "sourcePortRange": "*",
                           "destinationAddressPrefix": "AzureResourceManager", "destinationPortRange": "443"},
                          {"name": "deny-internet-out", "direction": "Outbound", "access": "Deny", "priority": 4000,
                           "protocol": "*", "sourceAddressPrefix": "*", "sourcePortRange": "*",
                           "destinationAddressPrefix": "Internet", "destinationPortRange": "*"}]})
    egress = s.add("azure-native:network:PublicIPAddress", "controller-egress", {
        "resourceGroupName": "gpufleet-azure-rg", "location": "westeurope", "sku": {"name": "Standard"},
        "publicIPAllocationMethod": "Static", "publicIPAddressVersion": "IPv4", "tags": t})
    nat = s.add("azure-native:network:NatGateway", "controller-nat", {
        "resourceGroupName": "gpufleet-azure-rg", "location": "westeurope", "sku": {"name": "Standard"},
        "publicIpAddresses": [{"id": f"{SUBSCRIPTION}/providers/Microsoft.Network/publicIPAddresses/egress"}],
        "tags": t}, deps={"publicIpAddresses": [egress]})
    subnet = s.add("azure-native:network:Subnet", "controller-subnet", {
        "resourceGroupName": "gpufleet-azure-rg", "virtualNetworkName": "gpufleet-azure", "subnetName": "controller",
        "addressPrefix": "10.64.16.0/24", "defaultOutboundAccess": False,
        "natGateway": {"id": f"{SUBSCRIPTION}/providers/Microsoft.Network/natGateways/controller"},
        "networkSecurityGroup": {"id": f"{SUBSCRIPTION}/providers/Microsoft.Network/networkSecurityGroups/c"}},
        deps={"natGateway": [nat], "networkSecurityGroup": [controller_nsg]})
    nic = s.add("azure-native:network:NetworkInterface", "controller-nic", {
        "resourceGroupName": "gpufleet-azure-rg", "location": "westeurope", "enableAcceleratedNetworking": True,
        "ipConfigurations": [{"name": "ipconfig1", "primary": True, "privateIPAllocationMethod": "Static",
                              "privateIPAddress": "10.64.16.4",
                              "subnet": {"id": f"{SUBSCRIPTION}/providers/Microsoft.Network/virtualNetworks/"
                                               "gpufleet-azure/subnets/controller"}}],
        "tags": t}, deps={"ipConfigurations": [subnet]})
    controller = s.add(AZ_CONTROLLER, "controller", {}, custom=False)
    s.add("azure-native:compute:VirtualMachine", "controller-vm", {**azure_vm(), "tags": t},
          deps={"networkProfile": [nic]}, parent=controller)
    part = s.add(AZ_PARTITION, "gpu", azure_partition(), custom=False)
    azure_partition_group(s, part, t)
    if gang_nodes:
        big = s.add(AZ_PARTITION, "big", azure_partition("big", gang=True, nodes=gang_nodes), custom=False)
        azure_partition_group(s, big, t)
    s.add("azure-native:containerregistry:Registry", "registry", {
        "resourceGroupName": "gpufleet-azure-rg", "registryName": "gpufleetazure0a1b2c3d", "sku": {"name": "Premium"},
        "adminUserEnabled": False, "anonymousPullEnabled": False, "publicNetworkAccess": "Disabled",
        "networkRuleBypassOptions": "None", "tags": t}, deps={"resourceGroupName": [rg]})
    vault = s.add("azure-native:keyvault:Vault", "vault", {
        "resourceGroupName": "gpufleet-azure-rg", "vaultName": "gfazure-0a1b2c3d", "tags": t,
        "properties": vault_properties()}, deps={"resourceGroupName": [rg]})
    s.add("azure-native:keyvault:Secret", "munge", {
        "resourceGroupName": "gpufleet-azure-rg", "vaultName": "gfazure-0a1b2c3d", "secretName": "slurm-munge-key",
        "properties": {"value": "unset", "contentType": "text/plain"}, "tags": t}, deps={"vaultName": [vault]})
    files = s.add("azure-native:storage:StorageAccount", "shared-fs-account", {
        "resourceGroupName": "gpufleet-azure-rg", "kind": "FileStorage", "sku": {"name": "Premium_LRS"},
        "enableHttpsTrafficOnly": True, "minimumTlsVersion": "TLS1_2", "allowBlobPublicAccess": False,
        "allowSharedKeyAccess": False, "publicNetworkAccess": "Disabled",
        "networkRuleSet": {"defaultAction": "Deny", "bypass": "None"},
        "encryption": AZ_KEY_ENCRYPTION if classification == "phi" else {
            "keySource": "Microsoft.Storage", "services": {"file": {"enabled": True, "keyType": "Account"}}},
        "tags": t}, deps={"resourceGroupName": [rg]})
    for share in ("home", "slurm-state"):
        s.add("azure-native:storage:FileShare", f"shared-fs-{share}", {
            "resourceGroupName": "gpufleet-azure-rg", "accountName": "gpufazure7472ec00", "shareName": share,
            "enabledProtocols": "NFS", "shareQuota": 100, "rootSquash": "NoRootSquash"},
            deps={"accountName": [files]})
    s.add("azure-native:network:PrivateEndpoint", "shared-fs-endpoint", {
        "resourceGroupName": "gpufleet-azure-rg", "location": "westeurope",
        "privateLinkServiceConnections": [{"name": "file", "groupIds": ["file"], "privateLinkServiceId":
                                           f"{SUBSCRIPTION}/providers/Microsoft.Storage/storageAccounts/files"}],
        "subnet": {"id": f"{SUBSCRIPTION}/providers/Microsoft.Network/virtualNetworks/gpufleet-azure/subnets/nodes"},
        "tags": t}, deps={"privateLinkServiceConnections": [files]})
    return s


def _cam(statements: list[dict]) -> str:
    return json.dumps({"version": "2.0", "statement": statements})


def tencent_tls_policy(bucket: str) -> str:
    resources = [f"qcs::cos:ap-shanghai:uid/1250000000:{bucket}/", f"qcs::cos:ap-shanghai:uid/1250000000:{bucket}/*"]
    anyone = {"qcs": ["qcs::cam::anyone:anyone"]}
    return _cam([{"principal": anyone, "effect": "deny", "action": ["name/cos:*"], "resource": resources,
                  "condition": {"bool_equal": {"cos:secure-transport": "false"}}},
                 {"principal": anyone, "effect": "deny", "action": ["name/cos:*"], "resource": resources,
                  "condition": {"numeric_less_than": {"cos:tls-version": 1.2}}}])


TC_PARTITION = "gpufleet:tencent:Partition"
TC_CONTROLLER = "gpufleet:tencent:Controller"
TC_UIN = "100000000001"
TC_CONTROLLER_IP = "10.72.240.10"


def tencent_launch_statements(stack: str) -> list[dict]:
    """The controller's launch rights as infra/tencent/controller.py writes them."""
    cvm = f"qcs::cvm:ap-shanghai:uin/{TC_UIN}"
    return [
        {"effect": "allow", "action": ["name/cvm:RunInstances"],
         "resource": [f"{cvm}:instance/*", f"qcs::vpc:ap-shanghai:uin/{TC_UIN}:subnet/subnet-sucsrxbo",
                      f"{cvm}:sg/sg-zr5s9g2e", f"{cvm}:image/img-78622eme"],
         "condition": {"for_any_value:string_equal": {"qcs:request_tag": [f"gpufleet-stack&{stack}"]}}},
        {"effect": "allow", "action": ["name/cam:PassRole"],
         "resource": [f"qcs::cam::uin/{TC_UIN}:roleName/gpufleet-{stack}-nodes"]},
        {"effect": "allow", "action": ["name/cvm:TerminateInstances"], "resource": [f"{cvm}:instance/*"],
         "condition": {"for_any_value:string_equal": {"qcs:resource_tag": [f"gpufleet-stack&{stack}"]}}},
        {"effect": "allow", "action": ["name/cvm:DescribeInstances"], "resource": [f"{cvm}:instance/*"]},
        {"effect": "allow", "action": ["name/ssm:GetSecretValue", "name/ssm:PutSecretValue"],
         "resource": [f"qcs::ssm:ap-shanghai:uin/{TC_UIN}:secret/creatorUin/{TC_UIN}/gpufleet-{stack}-munge"]},
    ]


def tencent_partition(name: str = "gpu", **overrides) -> dict:
    """A Slurm partition component's properties (infra.tencent.partition.props)."""
    values = {"partition": name, "instanceTypes": ["GN10Xp.20XLARGE320"], "maxNodes": 4, "alwaysOn": 0,
              "spot": True, "onDemandBase": 0, "gang": False, "gpusPerNode": 8,
              "subnetIds": ["subnet-sucsrxbo", "subnet-4hls89m0"]}
    return {**values, **overrides}


def tencent_launch_template(t: dict, **overrides) -> dict:
    """A partition's launch template as infra/tencent/partition.py makes it: no public IP, no bandwidth, the
    image's login, the system disk only."""
    values = {"launchTemplateName": "gpufleet-tencent-gpu-node", "imageId": "img-78622eme",
              "instanceType": "GN10Xp.20XLARGE320", "instanceChargeType": "POSTPAID_BY_HOUR",
              "placement": {"zone": "ap-shanghai-2", "projectId": 0},
              "virtualPrivateCloud": {"vpcId": "vpc-ohdqtqwt", "subnetId": "subnet-sucsrxbo"},
              "systemDisk": {"diskType": "CLOUD_PREMIUM", "diskSize": 200},
              "internetAccessible": {"publicIpAssigned": False, "internetMaxBandwidthOut": 0},
              "loginSettings": {"keepImageLogin": "TRUE"}, "camRoleName": "gpufleet-tencent-nodes",
              "securityGroupIds": ["sg-zr5s9g2e"], "tags": t}
    return {**values, **overrides}


def tencent_controller(t: dict, **overrides) -> dict:
    values = {"instanceName": "gpufleet-tencent-controller", "instanceType": "S5.LARGE8", "imageId": "img-78622eme",
              "availabilityZone": "ap-shanghai-2", "vpcId": "vpc-ohdqtqwt", "subnetId": "subnet-di5e2kva",
              "privateIp": TC_CONTROLLER_IP, "allocatePublicIp": False, "internetMaxBandwidthOut": 0,
              "instanceChargeType": "POSTPAID_BY_HOUR", "systemDiskType": "CLOUD_PREMIUM", "systemDiskSize": 50,
              "keepImageLogin": True, "camRoleName": "gpufleet-tencent-controller",
              "orderlySecurityGroups": ["sg-5hagdd40"], "tags": t}
    return {**values, **overrides}


def tencent_queue(stack: str = "tencent", classification: str = "personal") -> Stack:
    """The Tencent stack's shapes: a private KMS-encrypted logged bucket with TLS-only policies, a security
    group admitting only itself, CAM policies naming their resources (the controller's launch rights bounded by the
    stack tag), a spot queue partition whose launch template has no public IP, password or data disk, the
    controller instance, the shared /home on CFS with a permission group of its own, the munge key's SSM secret
    (stack key, placeholder version)."""
    s = Stack(stack)
    t = tags(classification, stack)
    key = s.add("tencentcloud:Kms/key:Key", "key", {"alias": "gpufleet", "keyUsage": "ENCRYPT_DECRYPT",
                                                     "isEnabled": True, "keyRotationEnabled": True, "tags": t})
    logs = s.add("tencentcloud:Cos/bucket:Bucket", "access-logs", {
        "bucket": "gpufleet-tencent-logs-1250000000", "acl": "private", "encryptionAlgorithm": "AES256",
        "versioningEnable": True, "tags": t})
    data = s.add("tencentcloud:Cos/bucket:Bucket", "data", {
        "bucket": "gpufleet-tencent-data-1250000000", "acl": "private", "encryptionAlgorithm": "KMS",
        "kmsId": "6b42dc33-a065-4ef2-854b-20cd8c4aa87f", "versioningEnable": True, "logEnable": True,
        "logTargetBucket": "gpufleet-tencent-logs-1250000000", "logPrefix": "data/", "tags": t},
        deps={"kmsId": [key], "logTargetBucket": [logs]})
    for name, bucket in (("data-policy", data), ("access-logs-policy", logs)):
        s.add("tencentcloud:Cos/bucketPolicy:BucketPolicy", name, {
            "bucket": bucket["inputs"]["bucket"], "policy": tencent_tls_policy(bucket["inputs"]["bucket"])},
            deps={"bucket": [bucket], "policy": [bucket]})
    s.add("tencentcloud:Vpc/instance:Instance", "vpc", {"cidrBlock": "10.72.0.0/16", "tags": t})
    sg = s.add("tencentcloud:Security/group:Group", "nodes-sg", {"description": "GPU nodes", "tags": t})
    s.add("tencentcloud:Security/groupRuleSet:GroupRuleSet", "nodes-rules", {
        "securityGroupId": "sg-zr5s9g2e",
        "ingresses": [{"action": "ACCEPT", "protocol": "ALL", "port": "ALL", "sourceSecurityId": "sg-zr5s9g2e"},
                      {"action": "DROP", "protocol": "ALL", "port": "ALL", "cidrBlock": "0.0.0.0/0"}],
        "egresses": [{"action": "ACCEPT", "protocol": "TCP", "port": "80,443", "cidrBlock": "0.0.0.0/0"}]},
        deps={"securityGroupId": [sg], "ingresses": [sg]})
    role = s.add("tencentcloud:Cam/role:Role", "node-role", {"name": "gpufleet-tencent-nodes", "document": _cam([
        {"action": ["name/sts:AssumeRole"], "effect": "allow", "principal": {"service": ["cvm.qcloud.com"]}}]),
        "tags": t})
    s.add("tencentcloud:Cam/policy:Policy", "node-policy", {"name": "gpufleet-tencent-nodes", "document": _cam([
        {"effect": "allow", "action": ["name/cos:GetObject", "name/cos:PutObject"],
         "resource": ["qcs::cos:ap-shanghai:uid/1250000000:gpufleet-tencent-data-1250000000/*"],
         "condition": {"string_equal": {"vpc:requester_vpc": ["vpc-ohdqtqwt"]}}},
        {"effect": "allow", "action": ["name/tdmq:ReceiveMessage"],
         "resource": ["qcs::tdmq:ap-shanghai:uin/100000000001:queue/gpufleet-tencent-jobs"]}])},
        deps={"document": [data]})
    # a team's submitters (people, from their own machines): COS rights from anywhere, through their CAM group
    submit = s.add("tencentcloud:Cam/policy:Policy", "submit-policy", {
        "name": "gpufleet-tencent-submit-default", "document": _cam([
            {"effect": "allow", "action": ["name/cos:GetObject"],
             "resource": ["qcs::cos:ap-shanghai:uid/1250000000:gpufleet-tencent-data-1250000000/teams/default/*"]}])},
        deps={"document": [data]})
    submitters = s.add("tencentcloud:Cam/group:Group", "submit-group", {"name": "gpufleet-tencent-submit-default"})
    s.add("tencentcloud:Cam/groupPolicyAttachment:GroupPolicyAttachment", "submit-attachment", {
        "groupId": "100000000002", "policyId": "200000000002"}, deps={"groupId": [submitters], "policyId": [submit]})
    part = s.add(TC_PARTITION, "gpu", tencent_partition(), custom=False)
    template = s.add("tencentcloud:Cvm/launchTemplate:LaunchTemplate", "node", tencent_launch_template(t),
                     deps={"securityGroupIds": [sg], "camRoleName": [role]}, parent=part)
    secret = s.add("tencentcloud:Ssm/secret:Secret", "munge", {
        "secretName": f"gpufleet-{stack}-munge", "kmsKeyId": "6b42dc33-a065-4ef2-854b-20cd8c4aa87f",
        "recoveryWindowInDays": 7, "isEnabled": True, "tags": t}, deps={"kmsKeyId": [key]})
    s.add("tencentcloud:Ssm/secretVersion:SecretVersion", "munge-init", {
        "secretName": f"gpufleet-{stack}-munge", "versionId": "init", "secretString": "unset"},
        deps={"secretName": [secret]})
    controller = s.add(TC_CONTROLLER, "controller", {}, custom=False)
    s.add("tencentcloud:Cam/policy:Policy", "controller-policy", {
        "name": f"gpufleet-{stack}-controller", "document": _cam(tencent_launch_statements(stack))},
        deps={"document": [role, secret, sg]}, parent=controller)
    s.add("tencentcloud:Instance/instance:Instance", "controller-instance", tencent_controller(t),
          deps={"userData": [template, secret]}, parent=controller)
    group = s.add("tencentcloud:Cfs/accessGroup:AccessGroup", "home-group", {
        "name": f"gpufleet-{stack}-home", "description": "/home: node subnets root-squashed, the controller as root"})
    for i, (address, root) in enumerate(((TC_CONTROLLER_IP, "no_root_squash"), ("10.72.0.0/20", "root_squash"))):
        s.add("tencentcloud:Cfs/accessRule:AccessRule", f"home-rule-{i}", {
            "accessGroupId": "pgroup-pnrrir4t", "authClientIp": address, "priority": i + 1, "rwPermission": "RW",
            "userPermission": root}, deps={"accessGroupId": [group]})
    s.add("tencentcloud:Cfs/fileSystem:FileSystem", "home", {
        "name": f"gpufleet-{stack}-home", "availabilityZone": "ap-shanghai-2", "accessGroupId": "pgroup-pnrrir4t",
        "protocol": "NFS", "storageType": "SD", "netInterface": "VPC", "vpcId": "vpc-ohdqtqwt",
        "subnetId": "subnet-di5e2kva", "mountIp": "10.72.240.11", "tags": t}, deps={"accessGroupId": [group]})
    s.add("tencentcloud:Tcmq/queue:Queue", "jobs", {"queueName": "gpufleet-tencent-jobs", "visibilityTimeout": 10800})
    return s
