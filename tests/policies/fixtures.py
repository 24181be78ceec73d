"""Hand-built resource sets with the shapes the engine sends (camelCase inputs, launch-template
booleans as strings, URNs, parents, dependencies and property dependencies).

`aws_gang()`, `aws_queue()` and `azure_queue()` build compliant stacks modelled on the gpufleet
stacks; tests mutate one thing and expect exactly the policy that guards it to fire.
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


def node_policy(bucket: str) -> str:
    return _policy([
        {"Effect": "Allow", "Action": ["s3:GetObject", "s3:PutObject"], "Resource": f"arn:aws:s3:::{bucket}/*"},
        {"Effect": "Allow", "Action": ["ec2:DescribeInstances", "ec2:DescribeTags"], "Resource": "*"},
        {"Effect": "Allow", "Action": "cloudwatch:PutMetricData", "Resource": "*",
         "Condition": {"StringEquals": {"cloudwatch:namespace": "gpufleet/test"}}}])


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
    s.add("aws:sqs/queue:Queue", "jobs", {"kmsMasterKeyId": KEY_ARN, "visibilityTimeoutSeconds": 900, "tags": t},
          deps={"kmsMasterKeyId": [key]})
    s.add("aws:cloudwatch/logGroup:LogGroup", "logs", {"name": f"/gpufleet/{s.stack}", "kmsKeyId": KEY_ARN,
                                                       "retentionInDays": 365, "tags": t}, deps={"kmsKeyId": [key]})
    vpc = s.add("aws:ec2/vpc:Vpc", "vpc", {"cidrBlock": "10.42.0.0/16", "enableDnsHostnames": True, "tags": t})
    subnet = s.add("aws:ec2/subnet:Subnet", "private-0", {"vpcId": "vpc-0a1b2c3d4e5f60718", "cidrBlock": "10.42.0.0/19",
                                                         "mapPublicIpOnLaunch": False, "tags": t},
                   deps={"vpcId": [vpc]})
    s.add("aws:ec2/flowLog:FlowLog", "flow", {"vpcId": "vpc-0a1b2c3d4e5f60718", "trafficType": "ALL",
                                              "logDestinationType": "cloud-watch-logs", "tags": t},
          deps={"vpcId": [vpc]})
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
    s.add("aws:iam/rolePolicy:RolePolicy", "node-policy", {"role": "node-1a2b", "policy": node_policy(name)},
          deps={"role": [role], "policy": [bucket]})
    s.add("aws:iam/rolePolicyAttachment:RolePolicyAttachment", "node-ssm",
          {"role": "node-1a2b", "policyArn": "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore"},
          deps={"role": [role]})
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


def _template(s: Stack, sg: dict, cards: int, instance_type: Optional[str], classification: str, spot: bool) -> dict:
    inputs: dict[str, Any] = {
        "imageId": "ami-0a1b2c3d4e5f60718",
        "metadataOptions": {"httpEndpoint": "enabled", "httpTokens": "required", "httpPutResponseHopLimit": 1},
        "blockDeviceMappings": [{"deviceName": "/dev/sda1", "ebs": {"volumeSize": 200, "volumeType": "gp3",
                                                                    "encrypted": "true", "kmsKeyId": KEY_ARN,
                                                                    "deleteOnTermination": "true"}}],
        "networkInterfaces": efa_interfaces(cards, "sg-51b340616cd3da298"),
        "tagSpecifications": [{"resourceType": "instance", "tags": tags(classification, s.stack)}],
        "tags": tags(classification, s.stack),
    }
    if instance_type:
        inputs["instanceType"] = instance_type
    if spot:
        inputs["instanceMarketOptions"] = {"marketType": "spot"}
    return s.add("aws:ec2/launchTemplate:LaunchTemplate", "node", inputs, deps={"networkInterfaces": [sg]})


def _asg_tags(classification: str, stack: str) -> list[dict]:
    return [{"key": k, "value": v, "propagateAtLaunch": True} for k, v in tags(classification, stack).items()]


def aws_gang(stack: str = "prod", classification: str = "personal", instance_type: str = "p5.48xlarge",
             nodes: int = 4, efa_cards: int = 32) -> Stack:
    """A multi-node EFA gang stack: one cluster placement group, one subnet, on-demand."""
    s = Stack(stack)
    c = _aws_common(s, classification)
    lt = _template(s, c["sg"], efa_cards, None, classification, spot=False)
    pg = s.add("aws:ec2/placementGroup:PlacementGroup", "cluster", {"strategy": "cluster",
                                                                    "tags": tags(classification, stack)})
    s.add("aws:autoscaling/group:Group", "nodes", {
        "minSize": nodes, "maxSize": nodes, "desiredCapacity": nodes, "capacityRebalance": False,
        "placementGroup": "gpufleet-cluster-48b1b03", "vpcZoneIdentifiers": ["subnet-9ed9e5720457e2e00"],
        "mixedInstancesPolicy": {
            "instancesDistribution": {"onDemandBaseCapacity": 0, "onDemandPercentageAboveBaseCapacity": 100},
            "launchTemplate": {"launchTemplateSpecification": {"launchTemplateId": "lt-9afbf080c7dd4dd7f",
                                                               "version": "1"},
                               "overrides": [{"instanceType": instance_type}]}},
        "initialLifecycleHooks": [{"name": "checkpoint", "lifecycleTransition": "autoscaling:EC2_INSTANCE_TERMINATING",
                                   "heartbeatTimeout": 600, "defaultResult": "CONTINUE"}],
        "tags": _asg_tags(classification, stack),
    }, deps={"mixedInstancesPolicy": [lt], "placementGroup": [pg], "vpcZoneIdentifiers": [c["subnet"]]})
    return s


def aws_queue(stack: str = "dev", classification: str = "internal") -> Stack:
    """A queue-mode spot stack on single-GPU types without EFA that scales to zero."""
    s = Stack(stack)
    c = _aws_common(s, classification)
    lt = _template(s, c["sg"], 0, "g6.xlarge", classification, spot=False)
    s.add("aws:autoscaling/group:Group", "nodes", {
        "minSize": 0, "maxSize": 4, "desiredCapacity": 0, "capacityRebalance": True,
        "vpcZoneIdentifiers": ["subnet-1", "subnet-2", "subnet-3"],
        "mixedInstancesPolicy": {
            "instancesDistribution": {"onDemandBaseCapacity": 0, "onDemandPercentageAboveBaseCapacity": 0,
                                      "spotAllocationStrategy": "price-capacity-optimized"},
            "launchTemplate": {"launchTemplateSpecification": {"launchTemplateId": "lt-1", "version": "1"},
                               "overrides": [{"instanceType": "g6.xlarge"}, {"instanceType": "g5.xlarge"}]}},
        "tags": _asg_tags(classification, stack),
    }, deps={"mixedInstancesPolicy": [lt], "vpcZoneIdentifiers": [c["subnet"]]})
    s.add("aws:autoscaling/lifecycleHook:LifecycleHook", "checkpoint", {
        "autoscalingGroupName": "gpufleet-dev-nodes", "lifecycleTransition": "autoscaling:EC2_INSTANCE_TERMINATING",
        "heartbeatTimeout": 600, "defaultResult": "CONTINUE"}, deps={"autoscalingGroupName": [s.get("nodes")]})
    return s


def vault_properties(**overrides) -> dict:
    """A Key Vault as the stack makes it: RBAC, soft delete, purge protection, no public network access."""
    values = {"tenantId": "00000000-0000-4000-8000-000000000001", "sku": {"family": "A", "name": "standard"},
              "enableRbacAuthorization": True, "enableSoftDelete": True, "softDeleteRetentionInDays": 90,
              "enablePurgeProtection": True, "publicNetworkAccess": "Disabled",
              "networkAcls": {"defaultAction": "Deny", "bypass": "None"}}
    return {k: v for k, v in {**values, **overrides}.items() if v is not None}


def azure_queue(stack: str = "azure", classification: str = "personal") -> Stack:
    """An InfiniBand scale set behind an autoscale setting that reaches zero, with locked-down storage."""
    s = Stack(stack)
    t = tags(classification, stack)
    rg = s.add("azure-native:resources:ResourceGroup", "rg", {"location": "westeurope", "tags": t})
    s.add("azure-native:storage:StorageAccount", "data", {
        "resourceGroupName": "gpufleet-azure-rg", "kind": "StorageV2", "sku": {"name": "Standard_LRS"},
        "enableHttpsTrafficOnly": True, "minimumTlsVersion": "TLS1_2", "allowBlobPublicAccess": False,
        "allowSharedKeyAccess": False, "publicNetworkAccess": "Enabled",
        "networkRuleSet": {"defaultAction": "Deny", "bypass": "AzureServices",
                           "virtualNetworkRules": [{"virtualNetworkResourceId": "/subscriptions/x/subnets/nodes"}]},
        **({"encryption": {"keySource": "Microsoft.Keyvault", "keyVaultProperties": {
            "keyName": "gpufleet", "keyVaultUri": "https://gpufleet-kv.vault.azure.net/"}}}
           if classification == "phi" else {}),
        "tags": t}, deps={"resourceGroupName": [rg]})
    s.add("azure-native:storage:BlobContainer", "checkpoints", {"accountName": "gpufleetazuredata",
                                                                 "resourceGroupName": "gpufleet-azure-rg",
                                                                 "publicAccess": "None"})
    s.add("azure-native:network:NetworkSecurityGroup", "nodes-nsg", {
        "resourceGroupName": "gpufleet-azure-rg", "tags": t,
        "securityRules": [{"name": "vnet-in", "direction": "Inbound", "access": "Allow", "priority": 100,
                           "protocol": "*", "sourceAddressPrefix": "VirtualNetwork", "sourcePortRange": "*",
                           "destinationAddressPrefix": "VirtualNetwork", "destinationPortRange": "*"},
                          {"name": "deny-internet", "direction": "Inbound", "access": "Deny", "priority": 4000,
                           "protocol": "*", "sourceAddressPrefix": "Internet", "sourcePortRange": "*",
                           "destinationAddressPrefix": "*", "destinationPortRange": "*"}]})
    vmss = s.add("azure-native:compute:VirtualMachineScaleSet", "nodes", {
        "resourceGroupName": "gpufleet-azure-rg", "location": "westeurope", "tags": t,
        "sku": {"name": "Standard_ND96asr_v4", "tier": "Standard", "capacity": 0},
        "orchestrationMode": "Uniform", "singlePlacementGroup": True, "platformFaultDomainCount": 1,
        "overprovision": False, "upgradePolicy": {"mode": "Manual"},
        "virtualMachineProfile": {
            "priority": "Spot", "evictionPolicy": "Delete",
            "osProfile": {"computerNamePrefix": "gpu", "adminUsername": "azureuser",
                          "linuxConfiguration": {"disablePasswordAuthentication": True, "ssh": {"publicKeys": [
                              {"path": "/home/azureuser/.ssh/authorized_keys",
                               "keyData": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGdw gpufleet@example"}]}}},
            "securityProfile": {"encryptionAtHost": True},
        }}, deps={"resourceGroupName": [rg]})
    s.add("azure-native:containerregistry:Registry", "registry", {
        "resourceGroupName": "gpufleet-azure-rg", "registryName": "gpufleetazure0a1b2c3d", "sku": {"name": "Premium"},
        "adminUserEnabled": False, "anonymousPullEnabled": False, "publicNetworkAccess": "Disabled",
        "networkRuleBypassOptions": "None", "tags": t}, deps={"resourceGroupName": [rg]})
    s.add("azure-native:keyvault:Vault", "vault", {
        "resourceGroupName": "gpufleet-azure-rg", "vaultName": "gfazure-0a1b2c3d", "tags": t,
        "properties": vault_properties()}, deps={"resourceGroupName": [rg]})
    s.add("azure-native:monitor:AutoscaleSetting", "nodes-autoscale", {
        "resourceGroupName": "gpufleet-azure-rg", "enabled": True, "targetResourceUri": "/subscriptions/x/vmss/nodes",
        "profiles": [{"name": "queue", "capacity": {"minimum": "0", "maximum": "4", "default": "0"}, "rules": []}],
        "tags": t}, deps={"targetResourceUri": [vmss]})
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


def tencent_queue(stack: str = "tencent", classification: str = "personal") -> Stack:
    """The Tencent stack's shapes: a private KMS-encrypted logged bucket with TLS-only policies, a security
    group admitting only itself, a CAM policy naming its resources, a spot launch configuration without a public
    IP or data disks, and a group from zero with a terminate hook."""
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
    s.add("tencentcloud:Cam/role:Role", "node-role", {"name": "gpufleet-tencent-nodes", "document": _cam([
        {"action": ["name/sts:AssumeRole"], "effect": "allow", "principal": {"service": ["cvm.qcloud.com"]}}]),
        "tags": t})
    s.add("tencentcloud:Cam/policy:Policy", "node-policy", {"name": "gpufleet-tencent-nodes", "document": _cam([
        {"effect": "allow", "action": ["name/cos:GetObject", "name/cos:PutObject"],
         "resource": ["qcs::cos:ap-shanghai:uid/1250000000:gpufleet-tencent-data-1250000000/*"]},
        {"effect": "allow", "action": ["name/tdmq:ReceiveMessage"],
         "resource": ["qcs::tdmq:ap-shanghai:uin/100000000001:queue/gpufleet-tencent-jobs"]}])},
        deps={"document": [data]})
    config = s.add("tencentcloud:As/scalingConfig:ScalingConfig", "node", {
        "configurationName": "gpufleet-tencent-node", "instanceTypes": ["GN10Xp.20XLARGE320"],
        "imageId": "img-1a2b3c4d", "systemDiskType": "CLOUD_PREMIUM", "systemDiskSize": 200,
        "publicIpAssigned": False, "internetMaxBandwidthOut": 0, "camRoleName": "gpufleet-tencent-nodes",
        "instanceChargeType": "SPOTPAID", "spotInstanceType": "one-time", "spotMaxPrice": "162.80",
        "securityGroupIds": ["sg-zr5s9g2e"], "instanceTags": t, "tags": t},
        deps={"securityGroupIds": [sg]})
    group = s.add("tencentcloud:As/scalingGroup:ScalingGroup", "nodes", {
        "scalingGroupName": "gpufleet-tencent-nodes", "configurationId": "asc-ps9pcdv4", "minSize": 0,
        "maxSize": 4, "desiredCapacity": 0, "vpcId": "vpc-ohdqtqwt", "subnetIds": ["subnet-1", "subnet-2"],
        "tags": t}, deps={"configurationId": [config]})
    s.add("tencentcloud:As/lifecycleHook:LifecycleHook", "checkpoint", {
        "scalingGroupId": "asg-93u1srs4", "lifecycleHookName": "checkpoint", "lifecycleTransition": "INSTANCE_TERMINATING",
        "defaultResult": "CONTINUE", "heartbeatTimeout": 600}, deps={"scalingGroupId": [group]})
    s.add("tencentcloud:Tcmq/queue:Queue", "jobs", {"queueName": "gpufleet-tencent-jobs", "visibilityTimeout": 10800})
    return s
