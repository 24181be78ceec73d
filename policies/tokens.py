"""Resource type tokens the policies inspect (pulumi-aws 7, pulumi-azure-native 3, tencentcloud-iac-pulumi 0.2),
and the gpufleet components whose properties say what a part of the stack is.

pulumi-aws 7 keeps the deprecated `...V2` S3 tokens as aliases of the plain ones; both are covered.
"""

def _s3(name: str) -> frozenset[str]:
    return frozenset({f"aws:s3/{name[0].lower()}{name[1:]}:{name}",
                      f"aws:s3/{name[0].lower()}{name[1:]}V2:{name}V2"})


BUCKET = _s3("Bucket")
BUCKET_SSE = _s3("BucketServerSideEncryptionConfiguration")
BUCKET_VERSIONING = _s3("BucketVersioning")
BUCKET_LOGGING = _s3("BucketLogging")
BUCKET_ACL = _s3("BucketAcl")
BUCKET_PAB = frozenset({"aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock"})
BUCKET_POLICY = frozenset({"aws:s3/bucketPolicy:BucketPolicy"})

LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
INSTANCE = "aws:ec2/instance:Instance"
EBS_VOLUME = "aws:ebs/volume:Volume"
SUBNET = "aws:ec2/subnet:Subnet"
VPC = "aws:ec2/vpc:Vpc"
FLOW_LOG = "aws:ec2/flowLog:FlowLog"
VPC_ENDPOINT = "aws:ec2/vpcEndpoint:VpcEndpoint"
VPC_ENDPOINT_POLICY = "aws:ec2/vpcEndpointPolicy:VpcEndpointPolicy"
SECURITY_GROUP = "aws:ec2/securityGroup:SecurityGroup"
DEFAULT_SECURITY_GROUP = "aws:ec2/defaultSecurityGroup:DefaultSecurityGroup"
SG_RULE = "aws:ec2/securityGroupRule:SecurityGroupRule"
SG_INGRESS_RULE = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
SG_EGRESS_RULE = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
PLACEMENT_GROUP = "aws:ec2/placementGroup:PlacementGroup"
NETWORK_INTERFACE = "aws:ec2/networkInterface:NetworkInterface"
EIP = "aws:ec2/eip:Eip"
EIP_ASSOCIATION = "aws:ec2/eipAssociation:EipAssociation"
SECRET = "aws:secretsmanager/secret:Secret"
EFS_FILE_SYSTEM = "aws:efs/fileSystem:FileSystem"
EFS_POLICY = "aws:efs/fileSystemPolicy:FileSystemPolicy"
DNS_FIREWALL_ASSOCIATION = "aws:route53/resolverFirewallRuleGroupAssociation:ResolverFirewallRuleGroupAssociation"

# gpufleet's AWS components (infra/aws): a Slurm partition, whose properties are {partition, instanceTypes, maxNodes,
# alwaysOn, spot, onDemandBase, gang, gpusPerNode, efaInterfaces, subnetIds} and whose children are its launch
# template and (a multi-node gang) its cluster placement group; and the controller, whose child is its instance.
PARTITION = "gpufleet:aws:Partition"
CONTROLLER = "gpufleet:aws:Controller"

IAM_POLICY_DOCS = {  # type -> input properties holding policy documents
    "aws:iam/policy:Policy": ("policy",),
    "aws:iam/rolePolicy:RolePolicy": ("policy",),
    "aws:iam/userPolicy:UserPolicy": ("policy",),
    "aws:iam/groupPolicy:GroupPolicy": ("policy",),
}
IAM_ROLE = "aws:iam/role:Role"
IAM_ATTACHMENTS = frozenset({
    "aws:iam/rolePolicyAttachment:RolePolicyAttachment",
    "aws:iam/userPolicyAttachment:UserPolicyAttachment",
    "aws:iam/groupPolicyAttachment:GroupPolicyAttachment",
    "aws:iam/policyAttachment:PolicyAttachment",
})

KMS_KEY = "aws:kms/key:Key"
SQS_QUEUE = "aws:sqs/queue:Queue"
SQS_QUEUE_POLICY = "aws:sqs/queuePolicy:QueuePolicy"
LOG_GROUP = "aws:cloudwatch/logGroup:LogGroup"
SNS_TOPIC = "aws:sns/topic:Topic"
SNS_SUBSCRIPTION = "aws:sns/topicSubscription:TopicSubscription"

AZ_STORAGE = "azure-native:storage:StorageAccount"
AZ_CONTAINER = "azure-native:storage:BlobContainer"
AZ_FILE_SHARE = "azure-native:storage:FileShare"
AZ_VM = "azure-native:compute:VirtualMachine"
AZ_VMSS = "azure-native:compute:VirtualMachineScaleSet"
AZ_AVSET = "azure-native:compute:AvailabilitySet"
AZ_NSG = "azure-native:network:NetworkSecurityGroup"
AZ_SECURITY_RULE = "azure-native:network:SecurityRule"
AZ_NIC = "azure-native:network:NetworkInterface"
AZ_NAT_GATEWAY = "azure-native:network:NatGateway"
AZ_PUBLIC_IP = "azure-native:network:PublicIPAddress"
AZ_PRIVATE_ENDPOINT = "azure-native:network:PrivateEndpoint"
AZ_PRIVATE_ZONE = "azure-native:privatedns:PrivateZone"
AZ_VNET = "azure-native:network:VirtualNetwork"
AZ_DNS_POLICY_LINK = "azure-native:dnsresolver:DnsResolverPolicyVirtualNetworkLink"
AZ_KEY_VAULT = "azure-native:keyvault:Vault"
AZ_SECRET = "azure-native:keyvault:Secret"
AZ_REGISTRY = "azure-native:containerregistry:Registry"
AZ_ROLE_ASSIGNMENT = "azure-native:authorization:RoleAssignment"

# gpufleet's Azure components (infra/azure): a Slurm partition, whose properties are {partition, vmSize,
# instanceTypes, maxNodes, alwaysOn, spot, onDemandBase, gang, gpusPerNode, infiniband, placement} and whose child
# is the group its nodes' VMs join (an empty Flexible scale set, or for a multi-node gang an availability set);
# and the controller, whose child is its VM.
AZ_PARTITION = "gpufleet:azure:Partition"
AZ_CONTROLLER = "gpufleet:azure:Controller"

# tencentcloud-iac-pulumi 0.2
TC_VPC = "tencentcloud:Vpc/instance:Instance"
TC_SUBNET = "tencentcloud:Subnet/instance:Instance"
TC_SECURITY_GROUP = "tencentcloud:Security/group:Group"
TC_SG_RULE_SET = "tencentcloud:Security/groupRuleSet:GroupRuleSet"
TC_SG_RULE = "tencentcloud:Security/groupRule:GroupRule"
TC_SG_LITE_RULE = "tencentcloud:Security/groupLiteRule:GroupLiteRule"
TC_BUCKET = "tencentcloud:Cos/bucket:Bucket"
TC_BUCKET_POLICY = "tencentcloud:Cos/bucketPolicy:BucketPolicy"
TC_KMS_KEY = "tencentcloud:Kms/key:Key"
TC_CAM_POLICY = "tencentcloud:Cam/policy:Policy"
TC_CAM_ROLE = "tencentcloud:Cam/role:Role"
TC_CAM_GROUP_ATTACHMENT = "tencentcloud:Cam/groupPolicyAttachment:GroupPolicyAttachment"
TC_INSTANCE = "tencentcloud:Instance/instance:Instance"
TC_LAUNCH_TEMPLATE = "tencentcloud:Cvm/launchTemplate:LaunchTemplate"
TC_CBS = "tencentcloud:Cbs/storage:Storage"
TC_CFS_FILE_SYSTEM = "tencentcloud:Cfs/fileSystem:FileSystem"
TC_CFS_ACCESS_GROUP = "tencentcloud:Cfs/accessGroup:AccessGroup"
TC_CFS_ACCESS_RULE = "tencentcloud:Cfs/accessRule:AccessRule"
TC_SSM_SECRET = "tencentcloud:Ssm/secret:Secret"
TC_SSM_SECRET_VERSION = "tencentcloud:Ssm/secretVersion:SecretVersion"
TC_CLS_TOPIC = "tencentcloud:Cls/topic:Topic"

# gpufleet's Tencent components (infra/tencent): a Slurm partition, whose properties are {partition, instanceTypes,
# maxNodes, alwaysOn, spot, onDemandBase, gang, gpusPerNode, subnetIds} and whose child is its CVM launch template;
# and the controller, whose children are its instance and its CAM policy.
TC_PARTITION = "gpufleet:tencent:Partition"
TC_CONTROLLER = "gpufleet:tencent:Controller"
