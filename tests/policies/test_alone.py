"""Every policy against its resource alone, with no siblings: no bucket beside a bucket setting, no launch
template or placement group in a partition, no VPC beside a queue, no file system policy beside a file system.
A check that only follows links from a parent would pass these; each must give exactly the verdicts listed (the
resource's own faults, and what its missing siblings mean, nothing else: an Azure partition alone has no scale set
for its VMs). A subject that is what it is by its component (a controller's instance or VM) is created under that
component, which holds nothing else.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Optional

import pytest

from tests.policies import fixtures as f
from tests.policies.conftest import names

KEY = f.KEY_ARN


def tags(stack: str) -> dict:
    classification = {"prod": "personal", "dev": "internal", "phi": "phi", "azure": "personal",
                      "azure-phi": "phi", "tencent": "personal"}[stack]
    return f.tags(classification, stack)


@dataclass
class Alone:
    policy: str                       # the policy this fixture is for
    stack: str
    type: str
    inputs: dict
    verdicts: frozenset[str]          # exactly the policies that report
    policy_config: Optional[dict] = field(default=None)
    provider: Optional[dict] = field(default=None)   # inputs of an explicit provider the subject is created with
    parent: Optional[str] = field(default=None)      # the type of a component the subject is created under


def _doc(*statements: dict) -> str:
    return json.dumps({"Version": "2012-10-17", "Statement": list(statements)})


def template(stack: str, **overrides) -> dict:
    values = {"imageId": "ami-0a1b2c3d4e5f60718",
              "metadataOptions": {"httpEndpoint": "enabled", "httpTokens": "required"},
              "blockDeviceMappings": [{"deviceName": "/dev/sda1", "ebs": {"encrypted": "true", "kmsKeyId": KEY}}],
              "networkInterfaces": f.efa_interfaces(0, "sg-1"), "tags": tags(stack)}
    return {**values, **overrides}


def instance(**overrides) -> dict:
    values = {"instanceType": "g6.xlarge", "ami": "ami-0a1b2c3d4e5f60718", "subnetId": "subnet-1",
              "metadataOptions": {"httpTokens": "required"}, "associatePublicIpAddress": False,
              "rootBlockDevice": {"encrypted": True, "kmsKeyId": KEY}, "tags": tags("prod")}
    return {**values, **overrides}


def partition(stack: str, types: list[str], gang: bool = False, **overrides) -> dict:
    """A Slurm partition component's properties (infra.aws.partition.props)."""
    row = {"p5.48xlarge": (8, 32), "g6.xlarge": (1, 0)}[types[0]]
    values = {"partition": "gpu", "instanceTypes": types, "maxNodes": 2, "alwaysOn": 0, "spot": not gang,
              "onDemandBase": 0, "gang": gang, "gpusPerNode": row[0], "efaInterfaces": row[1] if gang else 0,
              "subnetIds": ["subnet-1"]}
    return {**values, **overrides}


def controller_instance(**overrides) -> dict:
    values = {"instanceType": "m6i.large", "ami": "ami-0a1b2c3d4e5f60718",
              "networkInterfaces": [{"networkInterfaceId": "eni-0a1b2c3d", "deviceIndex": 0}],
              "metadataOptions": {"httpEndpoint": "enabled", "httpTokens": "required", "httpPutResponseHopLimit": 1},
              "rootBlockDevice": {"encrypted": True, "kmsKeyId": KEY}, "tags": tags("prod")}
    return {**values, **overrides}


def account(**overrides) -> dict:
    values = {"resourceGroupName": "rg", "kind": "StorageV2", "sku": {"name": "Standard_LRS"},
              "enableHttpsTrafficOnly": True, "minimumTlsVersion": "TLS1_2", "allowBlobPublicAccess": False,
              "allowSharedKeyAccess": False, "publicNetworkAccess": "Disabled", "tags": tags("azure")}
    return {**values, **overrides}


def ecr(**overrides) -> dict:
    values = {"imageTagMutability": "IMMUTABLE", "imageScanningConfiguration": {"scanOnPush": True},
              "encryptionConfigurations": [{"encryptionType": "KMS", "kmsKey": KEY}], "tags": tags("prod")}
    return {**values, **overrides}


def acr(**overrides) -> dict:
    values = {"resourceGroupName": "rg", "sku": {"name": "Premium"}, "adminUserEnabled": False,
              "publicNetworkAccess": "Disabled", "anonymousPullEnabled": False, "tags": tags("azure")}
    return {**values, **overrides}


def vault(**properties) -> dict:
    return {"resourceGroupName": "rg", "properties": f.vault_properties(**properties), "tags": tags("azure")}


def cos(**overrides) -> dict:
    values = {"bucket": "gpufleet-tencent-data-1250000000", "acl": "private", "encryptionAlgorithm": "KMS",
              "kmsId": "6b42dc33-a065-4ef2-854b-20cd8c4aa87f", "versioningEnable": True, "logEnable": True,
              "logTargetBucket": "gpufleet-tencent-logs-1250000000", "logPrefix": "data/", "tags": tags("tencent")}
    return {k: v for k, v in {**values, **overrides}.items() if v is not None}


def tc_key(**overrides) -> dict:
    values = {"alias": "gpufleet", "keyUsage": "ENCRYPT_DECRYPT", "isEnabled": True, "keyRotationEnabled": True,
              "tags": tags("tencent")}
    return {**values, **overrides}


def _cam(*statements: dict) -> str:
    return json.dumps({"version": "2.0", "statement": list(statements)})


BUCKET = "aws:s3/bucket:Bucket"
ECR = "aws:ecr/repository:Repository"
ACR = "azure-native:containerregistry:Registry"
VAULT = "azure-native:keyvault:Vault"
BUCKET_MISSING_ALL = frozenset({"aws-s3-bucket-sse-kms", "aws-s3-bucket-versioning", "aws-s3-bucket-public-access-block",
                                "aws-s3-bucket-tls-only", "aws-s3-bucket-access-logging"})
LT = "aws:ec2/launchTemplate:LaunchTemplate"
INSTANCE = "aws:ec2/instance:Instance"
PARTITION = "gpufleet:aws:Partition"
CONTROLLER = "gpufleet:aws:Controller"
SECRET = "aws:secretsmanager/secret:Secret"
EFS = "aws:efs/fileSystem:FileSystem"
QUEUE = "aws:sqs/queue:Queue"
LOGS = "aws:cloudwatch/logGroup:LogGroup"
ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
SA = "azure-native:storage:StorageAccount"
VM = "azure-native:compute:VirtualMachine"
AZ_PARTITION = "gpufleet:azure:Partition"
AZ_CONTROLLER = "gpufleet:azure:Controller"
NSG = "azure-native:network:NetworkSecurityGroup"
AZ_ROLE_ASSIGNMENT = "azure-native:authorization:RoleAssignment"
COS = "tencentcloud:Cos/bucket:Bucket"
TC_LAUNCH_TEMPLATE = "tencentcloud:Cvm/launchTemplate:LaunchTemplate"
TC_PARTITION = "gpufleet:tencent:Partition"
TC_KMS_KEY = "tencentcloud:Kms/key:Key"
NO_TLS_POLICY = "tencent-cos-bucket-tls-only"   # a bucket alone has no bucket policy denying plain HTTP
PHI_WITHOUT_VPC = "aws-ec2-vpc-flow-logs"   # a phi stack with AWS resources and no VPC declares no flow log


def one(*policies: str) -> frozenset[str]:
    return frozenset(policies)


ALONE = [
    # --- S3: settings resources whose bucket is elsewhere, and a bucket without settings -----------
    Alone("aws-s3-bucket-sse-kms", "prod", "aws:s3/bucketServerSideEncryptionConfiguration:"
          "BucketServerSideEncryptionConfiguration",
          {"bucket": "legacy", "rules": [{"applyServerSideEncryptionByDefault": {"sseAlgorithm": "AES256"}}]},
          one("aws-s3-bucket-sse-kms")),
    Alone("aws-s3-bucket-versioning", "prod", BUCKET, {"tags": tags("prod")}, BUCKET_MISSING_ALL),
    Alone("aws-s3-bucketversioning-enabled", "prod", "aws:s3/bucketVersioning:BucketVersioning",
          {"bucket": "legacy", "versioningConfiguration": {"status": "Suspended"}},
          one("aws-s3-bucketversioning-enabled")),
    Alone("aws-s3-bucket-public-access-block", "prod", BUCKET, {"tags": tags("prod")}, BUCKET_MISSING_ALL),
    Alone("aws-s3-publicaccessblock-all-flags", "prod", "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock",
          {"bucket": "legacy", "blockPublicAcls": True, "blockPublicPolicy": True, "ignorePublicAcls": False,
           "restrictPublicBuckets": True}, one("aws-s3-publicaccessblock-all-flags")),
    Alone("aws-s3-bucket-tls-only", "prod", BUCKET, {"tags": tags("prod")}, BUCKET_MISSING_ALL),
    Alone("aws-s3-bucketpolicy-tls-only", "prod", "aws:s3/bucketPolicy:BucketPolicy",
          {"bucket": "legacy", "policy": _doc({"Effect": "Allow", "Principal": {"AWS": "arn:aws:iam::1:root"},
                                              "Action": "s3:GetObject", "Resource": "arn:aws:s3:::legacy/*"})},
          one("aws-s3-bucketpolicy-tls-only")),
    Alone("aws-s3-bucket-no-public-acl", "prod", "aws:s3/bucketAcl:BucketAcl",
          {"bucket": "legacy", "acl": "public-read"}, one("aws-s3-bucket-no-public-acl")),
    Alone("aws-s3-bucket-access-logging", "prod", BUCKET, {"tags": tags("prod")}, BUCKET_MISSING_ALL),
    # --- EC2 --------------------------------------------------------------------------------------
    Alone("aws-ec2-launchtemplate-imdsv2", "prod", LT, template("prod", metadataOptions={"httpTokens": "optional"}),
          one("aws-ec2-launchtemplate-imdsv2")),
    Alone("aws-ec2-instance-imdsv2", "prod", INSTANCE, instance(metadataOptions=None), one("aws-ec2-instance-imdsv2")),
    Alone("aws-ec2-launchtemplate-ebs-encrypted", "prod", LT,
          template("prod", blockDeviceMappings=[{"deviceName": "/dev/sda1", "ebs": {"encrypted": "false"}}]),
          one("aws-ec2-launchtemplate-ebs-encrypted")),
    Alone("aws-ec2-instance-ebs-encrypted", "prod", INSTANCE, instance(rootBlockDevice={"encrypted": False}),
          one("aws-ec2-instance-ebs-encrypted")),
    Alone("aws-ebs-volume-encrypted", "prod", "aws:ebs/volume:Volume",
          {"availabilityZone": "eu-north-1a", "size": 100, "encrypted": False, "tags": tags("prod")},
          one("aws-ebs-volume-encrypted")),
    Alone("aws-ec2-launchtemplate-no-public-ip", "prod", LT,
          template("prod", networkInterfaces=[{"deviceIndex": 0, "associatePublicIpAddress": "true"}]),
          one("aws-ec2-launchtemplate-no-public-ip")),
    Alone("aws-ec2-instance-no-public-ip", "prod", INSTANCE, instance(associatePublicIpAddress=True),
          one("aws-ec2-instance-no-public-ip")),
    Alone("aws-ec2-subnet-no-public-ip-on-launch", "prod", "aws:ec2/subnet:Subnet",
          {"vpcId": "vpc-1", "cidrBlock": "10.0.0.0/24", "mapPublicIpOnLaunch": True, "tags": tags("prod")},
          one("aws-ec2-subnet-no-public-ip-on-launch")),
    Alone("aws-ec2-securitygroup-no-internet-ingress", "prod",
          "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule",
          {"securityGroupId": "sg-1", "ipProtocol": "tcp", "fromPort": 22, "toPort": 22, "cidrIpv4": "0.0.0.0/0"},
          one("aws-ec2-securitygroup-no-internet-ingress")),
    Alone("aws-ec2-vpcendpoint-restricted-policy", "prod", "aws:ec2/vpcEndpoint:VpcEndpoint",
          {"vpcId": "vpc-1", "serviceName": "com.amazonaws.eu-north-1.sqs", "vpcEndpointType": "Interface",
           "tags": tags("prod")}, one("aws-ec2-vpcendpoint-restricted-policy")),
    # --- IAM --------------------------------------------------------------------------------------
    Alone("aws-iam-policy-no-wildcard-actions", "prod", ROLE_POLICY,
          {"role": "r", "policy": _doc({"Effect": "Allow", "Action": "s3:*", "Resource": "arn:aws:s3:::b/*"})},
          one("aws-iam-policy-no-wildcard-actions")),
    Alone("aws-iam-policy-no-unconditioned-wildcard-write", "prod", ROLE_POLICY,
          {"role": "r", "policy": _doc({"Effect": "Allow", "Action": "cloudwatch:PutMetricData", "Resource": "*"})},
          one("aws-iam-policy-no-unconditioned-wildcard-write")),
    Alone("aws-iam-attachment-no-admin-managed-policy", "prod", "aws:iam/rolePolicyAttachment:RolePolicyAttachment",
          {"role": "r", "policyArn": "arn:aws:iam::aws:policy/AdministratorAccess"},
          one("aws-iam-attachment-no-admin-managed-policy")),
    Alone("aws-iam-policy-kms-grant-for-aws-resource", "prod", ROLE_POLICY,
          {"role": "r", "policy": _doc({"Effect": "Allow", "Action": "kms:CreateGrant", "Resource": KEY})},
          one("aws-iam-policy-kms-grant-for-aws-resource")),
    Alone("aws-iam-instance-role-credentials-stay-on-instance", "prod", "aws:iam/role:Role",   # no policy: no Deny
          {"assumeRolePolicy": _doc({"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"},
                                     "Action": "sts:AssumeRole"}), "tags": tags("prod")},
          one("aws-iam-instance-role-credentials-stay-on-instance")),
    Alone("aws-iam-job-role-stays-in-vpc", "prod", "aws:iam/role:Role",   # no policy: no Deny
          {"assumeRolePolicy": _doc({"Effect": "Allow", "Principal": {"AWS": f.NODE_ROLE_ARN},
                                     "Action": "sts:AssumeRole"}), "tags": tags("prod")},
          one("aws-iam-job-role-stays-in-vpc")),
    # --- KMS, SQS, logs, alerts -------------------------------------------------------------------
    Alone("aws-kms-key-rotation", "prod", "aws:kms/key:Key", {"enableKeyRotation": False, "tags": tags("prod")},
          one("aws-kms-key-rotation")),
    Alone("aws-sqs-queue-encrypted", "prod", QUEUE, {"tags": tags("prod")},
          one("aws-sqs-queue-encrypted", "aws-sqs-job-queue-one-sender")),
    # a queue with no policy beside it: any principal the account lets send may
    Alone("aws-sqs-job-queue-one-sender", "prod", QUEUE, {"kmsMasterKeyId": KEY, "tags": tags("prod")},
          one("aws-sqs-job-queue-one-sender")),
    Alone("aws-cloudwatch-loggroup-encrypted", "prod", LOGS, {"retentionInDays": 365, "tags": tags("prod")},
          one("aws-cloudwatch-loggroup-encrypted")),
    Alone("aws-cloudwatch-loggroup-retention", "prod", LOGS, {"kmsKeyId": KEY, "tags": tags("prod")},
          one("aws-cloudwatch-loggroup-retention")),
    Alone("aws-ec2-vpc-flow-logs", "phi", "aws:ec2/vpc:Vpc", {"cidrBlock": "10.42.0.0/16", "tags": tags("phi")},
          one("aws-ec2-vpc-flow-logs", "aws-ec2-vpc-dns-firewall")),
    Alone("aws-ec2-vpc-dns-firewall", "prod", "aws:ec2/vpc:Vpc", {"cidrBlock": "10.42.0.0/16", "tags": tags("prod")},
          one("aws-ec2-vpc-dns-firewall")),
    Alone("aws-sns-topic-alert-subscribers", "prod", "aws:sns/topic:Topic", {"kmsMasterKeyId": KEY, "tags": tags("prod")},
          one("aws-sns-topic-alert-subscribers")),
    # --- GPU --------------------------------------------------------------------------------------
    Alone("aws-ec2-launchtemplate-efa-layout", "prod", LT,
          template("prod", instanceType="p5.48xlarge", networkInterfaces=f.efa_interfaces(16, "sg-1")),
          one("aws-ec2-launchtemplate-efa-layout", "aws-ec2-securitygroup-efa-self-traffic")),
    Alone("aws-ec2-securitygroup-efa-self-traffic", "prod", LT,
          template("prod", instanceType="p5.48xlarge", networkInterfaces=f.efa_interfaces(32, "sg-1")),
          one("aws-ec2-securitygroup-efa-self-traffic")),
    Alone("aws-slurm-partition-efa-cluster", "prod", PARTITION,
          partition("prod", ["p5.48xlarge"], gang=True, maxNodes=4, alwaysOn=4),
          one("aws-slurm-partition-efa-cluster")),
    Alone("aws-slurm-partition-gpu-quota", "prod", PARTITION, partition("prod", ["p5.48xlarge"], maxNodes=16),
          one("aws-slurm-partition-gpu-quota", "aws-slurm-partition-monthly-ceiling")),
    Alone("aws-slurm-partition-queue-scale-to-zero", "dev", PARTITION, partition("dev", ["g6.xlarge"], alwaysOn=1),
          one("aws-slurm-partition-queue-scale-to-zero")),
    Alone("aws-slurm-partition-monthly-ceiling", "dev", PARTITION, partition("dev", ["g6.xlarge"], maxNodes=20),
          one("aws-slurm-partition-monthly-ceiling")),
    # --- the Slurm controller, the munge key, the shared file system, launch rights -----------------
    Alone("aws-slurm-controller-hardened", "prod", INSTANCE,
          controller_instance(metadataOptions={"httpTokens": "required", "httpPutResponseHopLimit": 2}),
          one("aws-slurm-controller-hardened"), parent=CONTROLLER),
    Alone("aws-secretsmanager-secret-cmk", "prod", SECRET,
          {"namePrefix": "gpufleet-prod-munge-", "recoveryWindowInDays": 7, "tags": tags("prod")},
          one("aws-secretsmanager-secret-cmk")),
    Alone("aws-efs-filesystem-cmk-tls-only", "prod", EFS,   # a file system alone has no TLS-only policy
          {"encrypted": True, "kmsKeyId": KEY, "tags": tags("prod")}, one("aws-efs-filesystem-cmk-tls-only")),
    Alone("aws-iam-policy-bounded-launch", "prod", ROLE_POLICY,
          {"role": "r", "policy": _doc({"Effect": "Allow", "Action": ["ec2:RunInstances", "ec2:CreateFleet"],
                                        "Resource": "arn:aws:ec2:eu-north-1:123456789012:instance/*"})},
          one("aws-iam-policy-bounded-launch")),
    # --- Azure ------------------------------------------------------------------------------------
    Alone("azure-network-vnet-dns-security-policy", "azure", "azure-native:network:VirtualNetwork",
          {"resourceGroupName": "rg", "addressSpace": {"addressPrefixes": ["10.64.0.0/16"]}, "tags": tags("azure")},
          one("azure-network-vnet-dns-security-policy")),
    Alone("azure-storage-account-https-only", "azure", SA, account(enableHttpsTrafficOnly=False),
          one("azure-storage-account-https-only")),
    Alone("azure-storage-account-min-tls", "azure", SA, account(minimumTlsVersion="TLS1_0"),
          one("azure-storage-account-min-tls")),
    Alone("azure-storage-account-no-public-blob", "azure", SA, account(allowBlobPublicAccess=True),
          one("azure-storage-account-no-public-blob")),
    Alone("azure-storage-account-no-shared-key", "azure", SA, account(allowSharedKeyAccess=True),
          one("azure-storage-account-no-shared-key")),
    Alone("azure-storage-account-restricted-network", "azure", SA, account(publicNetworkAccess="Enabled"),
          one("azure-storage-account-restricted-network")),
    Alone("azure-slurm-partition-placement", "azure", AZ_PARTITION, f.azure_partition(),   # no scale set beside it
          one("azure-slurm-partition-placement")),
    Alone("azure-compute-vm-ssh-keys-only", "azure", VM, f.azure_vm(osProfile={
        "adminUsername": "azureuser", "adminPassword": "[secret]",
        "linuxConfiguration": {"disablePasswordAuthentication": False}}, tags=tags("azure")),
        one("azure-compute-vm-ssh-keys-only")),
    Alone("azure-compute-vm-encryption-at-host", "azure", VM, f.azure_vm(securityProfile={}, tags=tags("azure")),
          one("azure-compute-vm-encryption-at-host")),
    Alone("azure-slurm-controller-hardened", "azure", VM,
          f.azure_vm(securityProfile={"encryptionAtHost": False}, tags=tags("azure")),
          one("azure-slurm-controller-hardened", "azure-compute-vm-encryption-at-host"), parent=AZ_CONTROLLER),
    Alone("azure-network-publicip-nat-only", "azure", "azure-native:network:PublicIPAddress",
          {"resourceGroupName": "rg", "sku": {"name": "Standard"}, "publicIPAllocationMethod": "Static",
           "tags": tags("azure")}, one("azure-network-publicip-nat-only")),
    Alone("azure-slurm-partition-gpu-quota", "azure", AZ_PARTITION, f.azure_partition(maxNodes=9),
          one("azure-slurm-partition-gpu-quota", "azure-slurm-partition-placement")),
    Alone("azure-slurm-partition-queue-scale-to-zero", "azure", AZ_PARTITION, f.azure_partition(alwaysOn=1),
          one("azure-slurm-partition-queue-scale-to-zero", "azure-slurm-partition-placement")),
    Alone("azure-slurm-partition-monthly-ceiling", "azure", AZ_PARTITION, f.azure_partition(),
          one("azure-slurm-partition-monthly-ceiling", "azure-slurm-partition-placement"),
          policy_config={"azure-slurm-partition-monthly-ceiling": {"monthlyCeilingUsd": 1}}),
    Alone("azure-network-nsg-no-internet-inbound", "azure", NSG, {"resourceGroupName": "rg", "tags": tags("azure"),
          "securityRules": [{"name": "ssh", "direction": "Inbound", "access": "Allow", "priority": 200,
                             "protocol": "Tcp", "sourceAddressPrefix": "Internet", "destinationPortRange": "22"}]},
          one("azure-network-nsg-no-internet-inbound")),
    # --- compliance -------------------------------------------------------------------------------
    Alone("aws-any-resource-gdpr-region", "prod", QUEUE, {"kmsMasterKeyId": KEY, "region": "us-east-1",
                                                          "tags": tags("prod")},
          one("aws-any-resource-gdpr-region", "aws-sqs-job-queue-one-sender")),
    Alone("azure-any-resource-gdpr-region", "azure", SA, account(location="eastus"),
          one("azure-any-resource-gdpr-region")),
    Alone("aws-ec2-instancetype-hipaa-eligible", "phi", PARTITION, partition("phi", ["g6.xlarge"]),
          one("aws-ec2-instancetype-hipaa-eligible")),
    Alone("azure-compute-vmsize-hipaa-eligible", "azure-phi", VM, f.azure_vm(tags=tags("azure-phi")),
          one("azure-compute-vmsize-hipaa-eligible")),   # a controller's size, but not under the controller
    Alone("aws-kms-phi-cmk-encryption", "phi", QUEUE, {"kmsMasterKeyId": "alias/aws/sqs", "tags": tags("phi")},
          one("aws-kms-phi-cmk-encryption", "aws-sqs-job-queue-one-sender", PHI_WITHOUT_VPC)),
    Alone("azure-storage-account-phi-cmk", "azure-phi", SA, account(tags=tags("azure-phi")),
          one("azure-storage-account-phi-cmk")),
    # --- registries: a repository or registry of its own, every other setting right ----------------------
    Alone("aws-ecr-repository-kms-encrypted", "prod", ECR, ecr(encryptionConfigurations=[{"encryptionType": "AES256"}]),
          one("aws-ecr-repository-kms-encrypted")),
    Alone("aws-ecr-repository-scan-on-push", "prod", ECR, ecr(imageScanningConfiguration={"scanOnPush": False}),
          one("aws-ecr-repository-scan-on-push")),
    Alone("aws-ecr-repository-immutable-tags", "prod", ECR, ecr(imageTagMutability="MUTABLE"),
          one("aws-ecr-repository-immutable-tags")),
    Alone("aws-ecr-repository-no-public-policy", "prod", "aws:ecr/repositoryPolicy:RepositoryPolicy",
          {"repository": "imported", "policy": _doc({"Effect": "Allow", "Principal": "*",
                                                     "Action": ["ecr:BatchGetImage"]})},
          one("aws-ecr-repository-no-public-policy")),
    Alone("azure-containerregistry-registry-admin-disabled", "azure", ACR, acr(adminUserEnabled=True),
          one("azure-containerregistry-registry-admin-disabled")),
    Alone("azure-containerregistry-registry-no-public-access", "azure", ACR, acr(publicNetworkAccess="Enabled"),
          one("azure-containerregistry-registry-no-public-access")),
    Alone("azure-keyvault-vault-rbac-purge-protected", "azure", VAULT,
          vault(enableRbacAuthorization=False), one("azure-keyvault-vault-rbac-purge-protected")),
    Alone("azure-keyvault-vault-no-public-access", "azure", VAULT, vault(publicNetworkAccess=None, networkAcls=None),
          one("azure-keyvault-vault-no-public-access")),
    Alone("aws-any-resource-cost-tags", "prod", QUEUE, {"kmsMasterKeyId": KEY},
          one("aws-any-resource-cost-tags", "aws-sqs-job-queue-one-sender")),
    Alone("azure-authorization-team-container-role-conditioned", "azure", AZ_ROLE_ASSIGNMENT, {
        "principalId": "0b5e9a52-7c1d-4f7e-9a3b-2f6d8c4e1a90", "principalType": "Group",
        "roleDefinitionId": "/subscriptions/s/providers/Microsoft.Authorization/roleDefinitions/r",
        "scope": "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Storage/storageAccounts/a/blobServices/"
                 "default/containers/checkpoints"},
          one("azure-authorization-team-container-role-conditioned")),
    Alone("azure-any-resource-cost-tags", "azure", NSG, {"resourceGroupName": "rg", "securityRules": []},
          one("azure-any-resource-cost-tags")),
    # --- Tencent: a bucket alone also lacks its TLS-only bucket policy -----------------------------------
    Alone("tencent-cos-bucket-private", "tencent", COS, cos(acl="public-read"),
          one("tencent-cos-bucket-private", NO_TLS_POLICY)),
    Alone("tencent-cos-bucket-sse", "tencent", COS,   # internal data: no customer-key requirement on top
          cos(encryptionAlgorithm=None, kmsId=None, tags=f.tags("internal", "tencent")),
          one("tencent-cos-bucket-sse", NO_TLS_POLICY)),
    Alone("tencent-cos-bucket-personal-kms", "tencent", COS, cos(encryptionAlgorithm="AES256", kmsId=None),
          one("tencent-cos-bucket-personal-kms", NO_TLS_POLICY)),
    Alone("tencent-cos-bucket-versioning", "tencent", COS, cos(versioningEnable=False),
          one("tencent-cos-bucket-versioning", NO_TLS_POLICY)),
    Alone("tencent-cos-bucket-tls-only", "tencent", COS, cos(), one(NO_TLS_POLICY)),
    Alone("tencent-cos-bucket-access-logging", "tencent", COS, cos(logEnable=False, logTargetBucket=None,
                                                                   logPrefix=None),
          one("tencent-cos-bucket-access-logging", NO_TLS_POLICY)),
    Alone("tencent-cvm-node-no-public-ip", "tencent", TC_LAUNCH_TEMPLATE, f.tencent_launch_template(
        tags("tencent"), internetAccessible={"publicIpAssigned": True, "internetMaxBandwidthOut": 10}),
        one("tencent-cvm-node-no-public-ip")),
    Alone("tencent-cvm-node-no-password-login", "tencent", TC_LAUNCH_TEMPLATE, f.tencent_launch_template(
        tags("tencent"), loginSettings={"password": "[secret]"}), one("tencent-cvm-node-no-password-login")),
    Alone("tencent-vpc-securitygroup-no-world-inbound", "tencent", "tencentcloud:Security/groupRuleSet:GroupRuleSet",
          {"securityGroupId": "sg-zr5s9g2e",
           "ingresses": [{"action": "ACCEPT", "protocol": "TCP", "port": "22", "cidrBlock": "0.0.0.0/0"}]},
          one("tencent-vpc-securitygroup-no-world-inbound")),
    Alone("tencent-cam-policy-no-wildcards", "tencent", "tencentcloud:Cam/policy:Policy",
          {"name": "gpufleet-tencent-nodes", "document": _cam({
              "effect": "allow", "action": ["name/cos:*"],
              "resource": ["qcs::cos:ap-shanghai:uid/1250000000:gpufleet-tencent-data-1250000000/*"],
              "condition": {"string_equal": {"vpc:requester_vpc": ["vpc-ohdqtqwt"]}}})},
          one("tencent-cam-policy-no-wildcards")),
    Alone("tencent-cam-policy-cos-in-vpc", "tencent", "tencentcloud:Cam/policy:Policy",
          {"name": "gpufleet-tencent-jobs", "document": _cam({
              "effect": "allow", "action": ["name/cos:GetObject", "name/cos:PutObject"],
              "resource": ["qcs::cos:ap-shanghai:uid/1250000000:gpufleet-tencent-data-1250000000/teams/*/jobs/*"]})},
          one("tencent-cam-policy-cos-in-vpc")),
    Alone("tencent-cvm-disk-encrypted", "tencent", "tencentcloud:Cbs/storage:Storage",
          {"storageType": "CLOUD_SSD", "storageSize": 500, "availabilityZone": "ap-shanghai-2",
           "tags": tags("tencent")}, one("tencent-cvm-disk-encrypted")),
    Alone("tencent-kms-key-rotation", "tencent", TC_KMS_KEY, tc_key(keyRotationEnabled=False),
          one("tencent-kms-key-rotation")),
    Alone("tencent-any-resource-pipl-region", "tencent", TC_KMS_KEY, tc_key(), one("tencent-any-resource-pipl-region"),
          provider={"region": "ap-singapore"}),
    Alone("tencent-cfs-filesystem-private-access", "tencent", "tencentcloud:Cfs/fileSystem:FileSystem",
          {"name": "gpufleet-tencent-home", "availabilityZone": "ap-shanghai-2", "accessGroupId": "pgroup-imported",
           "protocol": "NFS", "vpcId": "vpc-ohdqtqwt", "subnetId": "subnet-di5e2kva", "tags": tags("tencent")},
          one("tencent-cfs-filesystem-private-access")),   # its permission group is not in the stack
    Alone("tencent-ssm-secret-kms-no-value", "tencent", "tencentcloud:Ssm/secret:Secret",
          {"secretName": "gpufleet-tencent-munge", "recoveryWindowInDays": 7, "tags": tags("tencent")},
          one("tencent-ssm-secret-kms-no-value")),
    Alone("tencent-cam-policy-bounded-launch", "tencent", "tencentcloud:Cam/policy:Policy",
          {"name": "gpufleet-tencent-controller", "document": _cam({
              "effect": "allow", "action": ["name/cvm:RunInstances", "name/cvm:TerminateInstances"],
              "resource": ["qcs::cvm:ap-shanghai:uin/100000000001:instance/*"]})},
          one("tencent-cam-policy-bounded-launch")),
    Alone("tencent-slurm-partition-queue-scale-to-zero", "tencent", TC_PARTITION, f.tencent_partition(alwaysOn=1),
          one("tencent-slurm-partition-queue-scale-to-zero")),
    Alone("tencent-slurm-partition-gpu-quota", "tencent", TC_PARTITION,   # 68 GPUs, about ¥146,000 a month
          f.tencent_partition(instanceTypes=["GN7.20XLARGE320"], gpusPerNode=4, maxNodes=17),
          one("tencent-slurm-partition-gpu-quota")),
    Alone("tencent-slurm-partition-monthly-ceiling", "tencent", TC_PARTITION, f.tencent_partition(),
          one("tencent-slurm-partition-monthly-ceiling"),
          policy_config={"tencent-slurm-partition-monthly-ceiling": {"monthlyCeilingCny": 1}}),
    Alone("tencent-any-resource-cost-tags", "tencent", "tencentcloud:Security/group:Group",
          {"description": "GPU nodes"}, one("tencent-any-resource-cost-tags")),
]


@pytest.mark.parametrize("case", ALONE, ids=[c.policy for c in ALONE])
def test_resource_alone(packs, case: Alone):
    s = f.Stack(case.stack)
    package = case.type.split(":")[0]
    provider = s.add(f"pulumi:providers:{package}", "explicit", case.provider) if case.provider else None
    parent = s.add(case.parent, "component", {}, custom=False) if case.parent else None
    custom = not case.type.startswith("gpufleet:")
    subject = s.add(case.type, "subject", case.inputs, provider=provider, parent=parent, custom=custom)
    verdicts = packs.run(case.stack, s.resources, case.policy_config)
    assert names(verdicts) == case.verdicts, [(v["policy"], v["message"]) for v in verdicts["violations"]]
    assert verdicts["skipped"] == []
    own = [v for v in verdicts["violations"] if v["policy"] == case.policy]
    assert own and all(v["urn"] == subject["urn"] for v in own), [v["urn"] for v in own]
    # every other verdict is about the subject too, or about the stack as a whole
    assert all(v["urn"] in (subject["urn"], None) for v in verdicts["violations"])


def test_every_policy_has_a_resource_alone(packs):
    assert {p["name"] for p in packs.get("prod").policies()} == {c.policy for c in ALONE}
