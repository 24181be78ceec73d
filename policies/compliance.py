"""Compliance policies: GDPR data residency, HIPAA controls for phi stacks, cost tags.

A resource's data classification is its `data-classification` tag, else the stack's
gpufleet:dataClassification (the pack reads stack config as the Pulumi CLI passes it).
"""
from __future__ import annotations

from infra.catalog import CATALOG, controller_types
from policies.common import (UNKNOWN, Stack, aws_managed_key, eu_regions, get, items, resource_policy, stack_policy,
                             tags_of)
from policies.tokens import (AZ_AVSET, AZ_CONTROLLER, AZ_KEY_VAULT, AZ_NAT_GATEWAY, AZ_NIC, AZ_NSG, AZ_PARTITION,
                             AZ_PRIVATE_ENDPOINT, AZ_PRIVATE_ZONE, AZ_PUBLIC_IP, AZ_REGISTRY, AZ_SECRET, AZ_STORAGE,
                             AZ_VM, AZ_VMSS, BUCKET, BUCKET_LOGGING, BUCKET_SSE, CONTROLLER, EBS_VOLUME,
                             EFS_FILE_SYSTEM, FLOW_LOG, INSTANCE, KMS_KEY, LAUNCH_TEMPLATE, LOG_GROUP,
                             NETWORK_INTERFACE, PARTITION, PLACEMENT_GROUP, SECRET, SECURITY_GROUP, SQS_QUEUE, SUBNET,
                             VPC)

GLOBAL_LOCATIONS = ("global",)
GLOBAL_AWS = ("aws:iam/", "aws:budgets/", "aws:organizations/", "aws:route53/", "aws:cloudfront/")  # no region
REGIONS = {"aws": eu_regions("aws"), "azure-native": eu_regions("azure-native")}
ALL_REGIONS = {r for regions in REGIONS.values() for r in regions}
# Default PHI-approved types: the datacenter training GPUs (A100, H100, H200) the compliance review covered.
HIPAA_ELIGIBLE = sorted(n for n, t in CATALOG.items() if t.gpu_model in ("A100", "H100", "H200"))
# Default sizes for the Slurm controller of a phi stack: the catalog's controller sizes (general purpose, on demand),
# the only ones the stack config accepts. Compliance narrows the list in the policy config.
HIPAA_CONTROLLER_ELIGIBLE = controller_types("aws")
HIPAA_AZURE_CONTROLLER_ELIGIBLE = controller_types("azure")
# A controller instance or VM: its type and the component it is created under.
CONTROLLERS = {INSTANCE: CONTROLLER, AZ_VM: AZ_CONTROLLER}
CMK_TYPES = {"aws": [*BUCKET, *BUCKET_SSE, SQS_QUEUE, LOG_GROUP, LAUNCH_TEMPLATE, EBS_VOLUME], "azure": [AZ_STORAGE]}
TAGGABLE = {
    "aws": {*BUCKET, LAUNCH_TEMPLATE, INSTANCE, EBS_VOLUME, SUBNET, VPC, FLOW_LOG, SECURITY_GROUP, NETWORK_INTERFACE,
            PLACEMENT_GROUP, KMS_KEY, SQS_QUEUE, LOG_GROUP, SECRET, EFS_FILE_SYSTEM, "aws:iam/role:Role",
            "aws:iam/policy:Policy"},
    "azure-native": {AZ_STORAGE, AZ_VM, AZ_VMSS, AZ_AVSET, AZ_NSG, AZ_NIC, AZ_NAT_GATEWAY, AZ_PUBLIC_IP,
                     AZ_PRIVATE_ENDPOINT, AZ_PRIVATE_ZONE, AZ_KEY_VAULT, AZ_SECRET, AZ_REGISTRY,
                     "azure-native:resources:ResourceGroup", "azure-native:network:VirtualNetwork",
                     "azure-native:managedidentity:UserAssignedIdentity"},
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
    """The instance types / VM sizes a resource runs: a Slurm partition's instanceTypes (and an Azure one's
    vmSize), a scale set's SKU (none for an empty Flexible set), a VM's hardwareProfile.vmSize, a launch template's
    or an instance's instanceType."""
    if resource_type == AZ_VMSS:
        return [get(props, "sku", "name")]
    if resource_type == AZ_VM:
        return [get(props, "hardwareProfile", "vmSize")]
    if resource_type in (PARTITION, AZ_PARTITION):
        return items(props.get("instanceTypes")) + [props.get("vmSize")]
    return [props.get("instanceType")]


def check_hipaa_types(props: dict, ctx):
    if ctx.classification(props) not in ctx.config["classifications"]:
        return
    controller = ctx.resource_type in CONTROLLERS and ctx.within(CONTROLLERS[ctx.resource_type])
    allowed = set(ctx.config["eligibleTypes"]) | (set(ctx.config.get("eligibleControllerTypes", ())) if controller
                                                  else set())
    what = "the Slurm controller's type " if controller else ""
    for name in dict.fromkeys(instance_types(props, ctx.resource_type)):
        if isinstance(name, str) and name not in allowed:
            yield f"{what}{name} is not on the list of types approved for {ctx.classification(props)} data"


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
            for what, key in keys if key is not UNKNOWN and (not key or aws_managed_key(key))]


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
_AWS_TYPES = {**_TYPES, "eligibleControllerTypes": {
    "type": "array", "items": {"type": "string"}, "default": HIPAA_CONTROLLER_ELIGIBLE,
    "description": "Instance types approved for the Slurm controller of a PHI stack (besides eligibleTypes)."}}
_AZURE_TYPES = {**_TYPES, "eligibleControllerTypes": {
    "type": "array", "items": {"type": "string"}, "default": HIPAA_AZURE_CONTROLLER_ELIGIBLE,
    "description": "VM sizes approved for the Slurm controller of a PHI stack (besides eligibleTypes)."}}

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
        "phi stacks run only instance types on the HIPAA-approved list (Slurm partitions, launch templates, "
        "instances).",
        types=[PARTITION, LAUNCH_TEMPLATE, INSTANCE], severity="high", frameworks=["HIPAA"], check=check_hipaa_types,
        config=_AWS_TYPES,
        remediation="Use an approved type in every partition (default: A100/H100/H200 types) and an approved "
                    "controller type (default: the catalog's controller sizes), or have compliance add the type to "
                    "eligibleTypes (eligibleControllerTypes for the controller) in the policy config."),
    resource_policy(
        "azure-compute-vmsize-hipaa-eligible",
        "phi stacks run only VM sizes on the HIPAA-approved list (Slurm partitions, VMs, scale sets).",
        types=[AZ_PARTITION, AZ_VM, AZ_VMSS], severity="high", frameworks=["HIPAA"], check=check_hipaa_types,
        config=_AZURE_TYPES,
        remediation="Use an approved ND size in every partition (default: A100/H100/H200 sizes) and an approved "
                    "controller size (default: the catalog's controller sizes), or have compliance add the size to "
                    "eligibleTypes (eligibleControllerTypes for the controller) in the policy config."),
    stack_policy(
        "aws-kms-phi-cmk-encryption",
        "phi data at rest (S3, SQS, logs, EBS) is encrypted with a customer-managed KMS key.",
        severity="high", frameworks=["HIPAA"], check=cmk_encryption("aws"), config=_HIPAA,
        remediation="Create an aws.kms.Key with rotation and pass its ARN as kmsMasterKeyId / kmsKeyId; "
                    "never alias/aws/* managed keys. (S3 access-log buckets keep SSE-S3: S3 requires it.)"),
    stack_policy(
        "azure-storage-account-phi-cmk",
        "phi storage accounts (blob and queue data, the FileStorage account of the NFS shares) encrypt with a "
        "customer-managed Key Vault key.",
        severity="high", frameworks=["HIPAA"], check=cmk_encryption("azure"), config=_HIPAA,
        remediation="Set encryption.keySource 'Microsoft.Keyvault' with keyVaultProperties and a user-assigned "
                    "identity on every storage account, the FileStorage account of /home and slurmctld's state "
                    "included (Azure Files takes a customer-managed key the same way)."),
    *[resource_policy(
        f"{prefix}-any-resource-cost-tags",
        "Taggable resources carry the required cost-allocation tags.",
        types=cloud, severity="low", frameworks=["gpufleet-cost"], check=cost_tags(cloud), mandatory=False,
        config=_TAGS,
        remediation="Add the tags to gpufleet:tags in the stack config; the stack puts them on every resource.")
      for prefix, cloud in (("aws", "aws"), ("azure", "azure-native"))],
]
