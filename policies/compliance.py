"""Compliance policies: GDPR data residency, HIPAA controls for phi stacks, cost tags.

A resource's data classification is its `data-classification` tag, else the stack's
gpufleet:dataClassification (the pack reads stack config as the Pulumi CLI passes it).
"""
from __future__ import annotations

from infra.catalog import CATALOG
from policies.common import UNKNOWN, Stack, eu_regions, get, items, resource_policy, stack_policy, tags_of
from policies.tokens import (ASG, AZ_NSG, AZ_STORAGE, AZ_VMSS, BUCKET, BUCKET_LOGGING, BUCKET_SSE, EBS_VOLUME,
                             FLOW_LOG, INSTANCE, KMS_KEY, LAUNCH_TEMPLATE, LOG_GROUP, PLACEMENT_GROUP,
                             SECURITY_GROUP, SQS_QUEUE, SUBNET, VPC)

GLOBAL_LOCATIONS = ("global",)
GLOBAL_AWS = ("aws:iam/", "aws:budgets/", "aws:organizations/", "aws:route53/", "aws:cloudfront/")  # no region
REGIONS = {"aws": eu_regions("aws"), "azure-native": eu_regions("azure-native")}
ALL_REGIONS = {r for regions in REGIONS.values() for r in regions}
# Default PHI-approved types: the datacenter training GPUs (A100, H100, H200) the compliance review covered.
HIPAA_ELIGIBLE = sorted(n for n, t in CATALOG.items() if t.gpu_model in ("A100", "H100", "H200"))
AWS_MANAGED_KEYS = ("alias/aws/",)
CMK_TYPES = {"aws": [*BUCKET, *BUCKET_SSE, SQS_QUEUE, LOG_GROUP, LAUNCH_TEMPLATE, EBS_VOLUME], "azure": [AZ_STORAGE]}
TAGGABLE = {
    "aws": {*BUCKET, LAUNCH_TEMPLATE, ASG, INSTANCE, EBS_VOLUME, SUBNET, VPC, FLOW_LOG, SECURITY_GROUP,
            PLACEMENT_GROUP, KMS_KEY, SQS_QUEUE, LOG_GROUP, "aws:iam/role:Role", "aws:iam/policy:Policy"},
    "azure-native": {AZ_STORAGE, AZ_VMSS, AZ_NSG, "azure-native:resources:ResourceGroup",
                     "azure-native:network:VirtualNetwork", "azure-native:managedidentity:UserAssignedIdentity"},
}


def _norm(location: str) -> str:
    return location.replace(" ", "").lower()


def gdpr_residency(cloud: str):
    def check(props: dict, ctx):
        if ctx.classification(props) not in ctx.config["classifications"] or ctx.resource_type.startswith(GLOBAL_AWS):
            return
        region = ctx.region(props, cloud)
        if not isinstance(region, str) or _norm(region) in GLOBAL_LOCATIONS:
            return
        allowed = ctx.config["allowedRegions"]
        if _norm(region) not in {_norm(r) for r in allowed}:
            other = ALL_REGIONS - set(REGIONS[cloud])  # the other cloud's names: left out of the message
            shown = ", ".join(r for r in allowed if r not in other)
            yield f"{ctx.classification(props)} data in {region}; allowed: {shown}"
    return check


def instance_types(props: dict, resource_type: str) -> list:
    if resource_type == AZ_VMSS:
        return [get(props, "sku", "name")]
    overrides = items(get(props, "mixedInstancesPolicy", "launchTemplate", "overrides", default=[]))
    return [props.get("instanceType")] + [get(o, "instanceType") for o in overrides]


def check_hipaa_types(props: dict, ctx):
    if ctx.classification(props) not in ctx.config["classifications"]:
        return
    for name in instance_types(props, ctx.resource_type):
        if isinstance(name, str) and name not in ctx.config["eligibleTypes"]:
            yield f"{name} is not on the list of types approved for {ctx.classification(props)} data"


def _cmk_gaps(props: dict, resource_type: str) -> list[str]:
    """Encryption settings of a resource that do not name a customer-managed key."""
    if resource_type in BUCKET | BUCKET_SSE:
        rules = items(props.get("rules")) or [get(props, "serverSideEncryptionConfiguration", "rule")]
        keys = [("server-side encryption", get(r, "applyServerSideEncryptionByDefault", "kmsMasterKeyId"))
                for r in rules if r is not None]
    elif resource_type == SQS_QUEUE:
        keys = [("queue encryption", props.get("kmsMasterKeyId"))]
    elif resource_type == LOG_GROUP:
        keys = [("log group encryption", props.get("kmsKeyId"))]
    elif resource_type == LAUNCH_TEMPLATE:
        keys = [(f"block device {get(m, 'deviceName')}", get(m, "ebs", "kmsKeyId"))
                for m in items(props.get("blockDeviceMappings")) if get(m, "ebs") is not None]
    elif resource_type == EBS_VOLUME:
        keys = [("volume encryption", props.get("kmsKeyId"))]
    elif resource_type == AZ_STORAGE:
        source = get(props, "encryption", "keySource")
        if source in ("Microsoft.Keyvault", UNKNOWN):
            return []
        return [f"encryption keySource is {source or 'Microsoft.Storage'}"]
    else:
        return []
    return [f"{what} uses {'an AWS managed key' if key else 'no customer-managed key'}"
            for what, key in keys
            if key is not UNKNOWN and (not key or (isinstance(key, str) and key.startswith(AWS_MANAGED_KEYS)))]


def cmk_encryption(cloud: str):
    def check(stack: Stack, ctx):
        # S3 delivers server access logs only to SSE-S3 buckets: log target buckets are exempt.
        log_targets = {u for log in stack.of(*BUCKET_LOGGING) for u in log.deps("targetBucket")}
        for r in stack.of(*CMK_TYPES[cloud]):
            if ctx.classification(r.props) not in ctx.config["classifications"]:
                continue
            if log_targets & ({r.urn} | set(r.deps("bucket"))):
                continue
            for gap in _cmk_gaps(r.props, r.type):
                yield f"'{r.name}': {gap}", r.urn
    return check


def cost_tags(cloud: str):
    def check(props: dict, ctx):
        if ctx.resource_type not in TAGGABLE[cloud] and "tags" not in props:
            return
        if props.get("tags") is UNKNOWN:
            return
        tags = {**(get(ctx.provider, "defaultTags", "tags", default={}) or {}), **tags_of(props)}
        missing = [t for t in ctx.config["requiredTags"] if not tags.get(t)]
        if missing:
            yield f"missing tag(s) {', '.join(missing)}"
    return check


_REGULATED = {"type": "array", "items": {"type": "string", "enum": ["public", "internal", "personal", "phi"]}}
_GDPR_CONFIG = {
    "classifications": {**_REGULATED, "default": ["personal", "phi"],
                        "description": "Data classifications that must stay in the allowed regions."},
    "allowedRegions": {"type": "array", "items": {"type": "string"}, "default": sorted(ALL_REGIONS),
                       "description": "Regions (AWS and Azure names) where regulated data may live; "
                                      "default the EU regions. A stack's own allowedRegions cannot widen it."},
}
_HIPAA = {"classifications": {**_REGULATED, "default": ["phi"],
                              "description": "Data classifications under HIPAA controls."}}


_TAGS = {"requiredTags": {"type": "array", "items": {"type": "string"},
                          "default": ["team", "cost-center", "data-classification"],
                          "description": "Tags every taggable resource must carry (non-empty)."}}
_TYPES = {**_HIPAA, "eligibleTypes": {"type": "array", "items": {"type": "string"}, "default": HIPAA_ELIGIBLE,
                                      "description": "Instance types / VM sizes approved for PHI."}}

POLICIES = [
    *[resource_policy(
        f"{prefix}-any-resource-gdpr-region",
        "Resources of personal or phi stacks stay in the allowed (by default EU) regions.",
        types=cloud, severity="critical", frameworks=["GDPR"], check=gdpr_residency(cloud), config=_GDPR_CONFIG,
        remediation="Deploy the stack to an allowed region (aws:region / azure-native:location) and remove "
                    "per-resource region or provider overrides outside it.")
      for prefix, cloud in (("aws", "aws"), ("azure", "azure-native"))],
    resource_policy(
        "aws-ec2-instancetype-hipaa-eligible",
        "phi stacks run only instance types on the HIPAA-approved list.",
        types=[LAUNCH_TEMPLATE, INSTANCE, ASG], severity="high", frameworks=["HIPAA"], check=check_hipaa_types,
        config=_TYPES,
        remediation="Use an approved type (default: A100/H100/H200 types) or have compliance add the type to "
                    "eligibleTypes in the policy config."),
    resource_policy(
        "azure-compute-vmsize-hipaa-eligible",
        "phi stacks run only VM sizes on the HIPAA-approved list.",
        types=[AZ_VMSS], severity="high", frameworks=["HIPAA"], check=check_hipaa_types, config=_TYPES,
        remediation="Use an approved ND size or have compliance add the size to eligibleTypes."),
    stack_policy(
        "aws-kms-phi-cmk-encryption",
        "phi data at rest (S3, SQS, logs, EBS) is encrypted with a customer-managed KMS key.",
        severity="high", frameworks=["HIPAA"], check=cmk_encryption("aws"), config=_HIPAA,
        remediation="Create an aws.kms.Key with rotation and pass its ARN as kmsMasterKeyId / kmsKeyId; "
                    "never alias/aws/* managed keys. (S3 access-log buckets keep SSE-S3: S3 requires it.)"),
    stack_policy(
        "azure-storage-account-phi-cmk",
        "phi storage accounts encrypt with a customer-managed Key Vault key.",
        severity="high", frameworks=["HIPAA"], check=cmk_encryption("azure"), config=_HIPAA,
        remediation="Set encryption.keySource 'Microsoft.Keyvault' with keyVaultProperties and a user-assigned identity."),
    *[resource_policy(
        f"{prefix}-any-resource-cost-tags",
        "Taggable resources carry the required cost-allocation tags.",
        types=cloud, severity="low", frameworks=["gpufleet-cost"], check=cost_tags(cloud), mandatory=False,
        config=_TAGS,
        remediation="Add the tags to gpufleet:tags in the stack config; the stack puts them on every resource.")
      for prefix, cloud in (("aws", "aws"), ("azure", "azure-native"))],
]
