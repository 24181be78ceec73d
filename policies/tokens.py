"""Resource type tokens the policies inspect (pulumi-aws 7, pulumi-azure-native 3).

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
ASG = "aws:autoscaling/group:Group"
LIFECYCLE_HOOK = "aws:autoscaling/lifecycleHook:LifecycleHook"

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
LOG_GROUP = "aws:cloudwatch/logGroup:LogGroup"
SNS_TOPIC = "aws:sns/topic:Topic"
SNS_SUBSCRIPTION = "aws:sns/topicSubscription:TopicSubscription"

AZ_STORAGE = "azure-native:storage:StorageAccount"
AZ_CONTAINER = "azure-native:storage:BlobContainer"
AZ_VMSS = "azure-native:compute:VirtualMachineScaleSet"
AZ_NSG = "azure-native:network:NetworkSecurityGroup"
AZ_SECURITY_RULE = "azure-native:network:SecurityRule"
AZ_AUTOSCALE = "azure-native:monitor:AutoscaleSetting"
AZ_KEY_VAULT = "azure-native:keyvault:Vault"

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
TC_SCALING_CONFIG = "tencentcloud:As/scalingConfig:ScalingConfig"
TC_SCALING_GROUP = "tencentcloud:As/scalingGroup:ScalingGroup"
TC_LIFECYCLE_HOOK = "tencentcloud:As/lifecycleHook:LifecycleHook"
TC_INSTANCE = "tencentcloud:Instance/instance:Instance"
TC_CBS = "tencentcloud:Cbs/storage:Storage"
TC_QUEUE = "tencentcloud:Tcmq/queue:Queue"
TC_CLS_TOPIC = "tencentcloud:Cls/topic:Topic"
