"""Tencent Cloud guardrails: COS buckets, CAM policies, security groups, node disks and addresses, PIPL
residency, and the GPU group (spot terminate hook, scale to zero, GPU quota, monthly ceiling in CNY).

(Named tencent_rules like azure_rules: the policy host puts policies/ on sys.path.) Tencent resources
carry no region: a resource is where its provider is, which is `tencentcloud:region` unless an explicit
provider says otherwise. CAM and COS policy documents are version 2.0 with lower-case elements.
"""
from __future__ import annotations

from infra.catalog import CATALOG
from infra.config import MAINLAND_CHINA_REGIONS
from policies.common import (UNKNOWN, Resource, Stack, as_list, flag, get, items, json_doc, number,
                             resource_policy, stack_policy, stack_value, tags_of)
from policies.tokens import (TC_BUCKET, TC_BUCKET_POLICY, TC_CAM_POLICY, TC_CAM_ROLE, TC_CBS, TC_CLS_TOPIC,
                             TC_INSTANCE, TC_KMS_KEY, TC_LIFECYCLE_HOOK, TC_SCALING_CONFIG, TC_SCALING_GROUP,
                             TC_SECURITY_GROUP, TC_SG_LITE_RULE, TC_SG_RULE, TC_SG_RULE_SET, TC_SUBNET, TC_VPC)

PUBLIC_ACLS = ("public-read", "public-read-write")
ENCRYPTIONS = ("KMS", "AES256", "SM4")
WORLD = ("0.0.0.0/0", "::/0")
ANYONE = "qcs::cam::anyone:anyone"
TERMINATING = "INSTANCE_TERMINATING"
SPOT = "SPOTPAID"
GLOBAL_TYPES = ("tencentcloud:Cam/", "tencentcloud:Billing/")   # account-wide, no region
TAGGABLE = {TC_VPC, TC_SUBNET, TC_SECURITY_GROUP, TC_BUCKET, TC_KMS_KEY, TC_CAM_ROLE, TC_SCALING_CONFIG,
            TC_SCALING_GROUP, TC_INSTANCE, TC_CBS, TC_CLS_TOPIC}


# --- reading the resources -------------------------------------------------------------------------

def region_of(props: dict, provider: dict):
    """Where a resource lives: its own or its provider's region, else the stack's tencentcloud:region."""
    for source in (props, provider):
        if source.get("region") is not None:
            return source["region"]
    return stack_value("tencentcloud:region")


def statements(doc) -> list[dict]:
    return [s for s in as_list(doc.get("statement")) if isinstance(s, dict)] if isinstance(doc, dict) else []


def log_targets(stack: Stack) -> set[str]:
    """URNs of buckets that receive another bucket's access logs."""
    return {u for b in stack.of(TC_BUCKET) for u in b.deps("logTargetBucket")}


def config_of(stack: Stack, group: Resource) -> list[Resource]:
    return stack.targets(group, [TC_SCALING_CONFIG], "configurationId")


def group_types(stack: Stack, group: Resource) -> list[str]:
    return [t for c in config_of(stack, group) for t in items(c.props.get("instanceTypes")) if isinstance(t, str)]


def is_spot(stack: Stack, group: Resource) -> bool:
    return any(c.props.get("instanceChargeType") == SPOT for c in config_of(stack, group))


def monthly_max(instance_types: list[str], max_nodes: float, spot: bool) -> float:
    """Worst-case month of a group at its maximum size, priced by its dearest type (catalog currency)."""
    rows = [CATALOG[t] for t in instance_types if t in CATALOG]
    if not rows:
        return 0.0
    return max(r.spot_price_hour if spot else r.price_hour for r in rows) * max_nodes * 730


# --- checks ----------------------------------------------------------------------------------------

def check_private(props: dict, ctx):
    if props.get("acl") in PUBLIC_ACLS:
        yield f"bucket ACL '{props['acl']}' makes objects readable outside the account"
    body = props.get("aclBody")
    if isinstance(body, str) and "AllUsers" in body:
        yield "aclBody grants access to AllUsers"


def check_sse(props: dict, ctx):
    algorithm = props.get("encryptionAlgorithm")
    if algorithm is not UNKNOWN and algorithm not in ENCRYPTIONS:
        yield f"encryptionAlgorithm is {algorithm or 'unset'}; set KMS (or AES256/SM4)"


def check_personal_kms(stack: Stack, ctx):
    targets = log_targets(stack)
    for bucket in stack.of(TC_BUCKET):
        if ctx.classification(bucket.props) not in ctx.config["classifications"] or bucket.urn in targets:
            continue
        algorithm, key = bucket.props.get("encryptionAlgorithm"), bucket.props.get("kmsId")
        if UNKNOWN in (algorithm, key):
            continue
        if algorithm != "KMS" or not key:
            yield (f"bucket '{bucket.name}' holds {ctx.classification(bucket.props)} data without SSE-KMS under a "
                   f"customer master key"), bucket.urn


def check_versioning(props: dict, ctx):
    if props.get("versioningEnable") is not UNKNOWN and flag(props.get("versioningEnable")) is not True:
        yield "versioningEnable is not true: an overwritten or deleted checkpoint cannot be recovered"


def _denies_insecure(s: dict, bucket: str) -> bool:
    cond = get(s, "condition", "bool_equal", default={})
    return (s.get("effect") == "deny" and ANYONE in as_list(get(s, "principal", "qcs"))
            and any(a in ("*", "name/cos:*") for a in as_list(s.get("action")))
            and isinstance(cond, dict) and str(cond.get("cos:secure-transport")).lower() == "false"
            and any(isinstance(r, str) and r.endswith(f":{bucket}/*") for r in as_list(s.get("resource"))))


def check_tls_only(stack: Stack, ctx):
    for bucket in stack.of(TC_BUCKET):
        name = bucket.props.get("bucket")
        docs = [json_doc(p.props.get("policy")) for p in stack.referrers(bucket, [TC_BUCKET_POLICY], "bucket")]
        if UNKNOWN in docs or name is UNKNOWN:
            continue
        if not docs:
            yield f"bucket '{bucket.name}' has no bucket policy denying plain HTTP", bucket.urn
        elif not any(_denies_insecure(s, name) for d in docs for s in statements(d)):
            yield (f"bucket '{bucket.name}' policy has no deny of name/cos:* for anyone when cos:secure-transport "
                   f"is false"), bucket.urn


def check_access_logging(stack: Stack, ctx):
    targets = log_targets(stack)
    for bucket in stack.of(TC_BUCKET):
        if ctx.classification(bucket.props) not in ctx.config["classifications"] or bucket.urn in targets:
            continue
        if bucket.props.get("logEnable") is UNKNOWN:
            continue
        if flag(bucket.props.get("logEnable")) is not True or not bucket.props.get("logTargetBucket"):
            yield (f"bucket '{bucket.name}' holds {ctx.classification(bucket.props)} data without access "
                   f"logging"), bucket.urn


def check_no_public_ip(props: dict, ctx):
    for key in ("publicIpAssigned", "allocatePublicIp"):
        if flag(props.get(key)) is True:
            yield f"{key} is true: nodes must not have public addresses"
    bandwidth = number(props.get("internetMaxBandwidthOut"))
    if bandwidth:
        yield f"internetMaxBandwidthOut is {bandwidth:g} Mbps: nodes get a public address with internet bandwidth"


def _world_accepts(props: dict, resource_type: str) -> list[str]:
    if resource_type == TC_SG_RULE_SET:
        return [f"ingress rule {i} accepts {r.get('protocol', 'ALL')} port {r.get('port', 'ALL')} from "
                f"{r.get('cidrBlock') or r.get('ipv6CidrBlock')}"
                for i, r in enumerate(items(props.get("ingresses"))) if isinstance(r, dict)
                and r.get("action") == "ACCEPT" and (r.get("cidrBlock") in WORLD or r.get("ipv6CidrBlock") in WORLD)]
    if resource_type == TC_SG_RULE:
        if props.get("type") == "ingress" and props.get("policy") == "ACCEPT" and props.get("cidrIp") in WORLD:
            return [f"rule accepts {props.get('ipProtocol', 'ALL')} port {props.get('portRange', 'ALL')} from "
                    f"{props.get('cidrIp')}"]
        return []
    return [f"lite rule '{r}' accepts from the internet" for r in items(props.get("ingresses"))
            if isinstance(r, str) and r.startswith("ACCEPT#") and r.split("#")[1] in WORLD]


def check_no_world_inbound(props: dict, ctx):
    yield from _world_accepts(props, ctx.resource_type)


def check_cam_wildcards(props: dict, ctx):
    doc = json_doc(props.get("document"))
    for s in statements(doc):
        if s.get("effect") != "allow":
            continue
        for action in as_list(s.get("action")):
            if isinstance(action, str) and (action == "*" or action.rsplit(":", 1)[-1] == "*"
                                            or action.rsplit("/", 1)[-1] == "*:*"):
                yield f"allow of '{action}'"
        operation_level = set(ctx.config["operationLevelActions"])
        if "*" in as_list(s.get("resource")):
            named = [a for a in as_list(s.get("action")) if a not in operation_level]
            if named:
                yield f"{', '.join(map(str, named))} on resource '*': name the stack's resources"


def _disk_gaps(props: dict, resource_type: str) -> list[str]:
    if resource_type == TC_SCALING_CONFIG:
        # A launch configuration's data disks have no encryption setting (AS API and provider).
        return [f"launch configuration attaches {len(items(props.get('dataDisks')))} data disk(s), which Auto "
                "Scaling cannot encrypt"] if items(props.get("dataDisks")) else []
    if resource_type == TC_INSTANCE:
        return [f"data disk {i} is not encrypted" for i, d in enumerate(items(props.get("dataDisks")))
                if isinstance(d, dict) and d.get("encrypt") is not UNKNOWN and flag(d.get("encrypt")) is not True]
    if props.get("encrypt") is not UNKNOWN and flag(props.get("encrypt")) is not True:
        return ["the cloud disk is not encrypted"]
    return []


def check_disks(props: dict, ctx):
    yield from _disk_gaps(props, ctx.resource_type)


def check_key_rotation(props: dict, ctx):
    if props.get("keyUsage", "ENCRYPT_DECRYPT") != "ENCRYPT_DECRYPT":
        return
    if props.get("keyRotationEnabled") is not UNKNOWN and flag(props.get("keyRotationEnabled")) is not True:
        yield "keyRotationEnabled is not true"


def check_pipl_region(props: dict, ctx):
    if ctx.classification(props) not in ctx.config["classifications"] or ctx.resource_type.startswith(GLOBAL_TYPES):
        return
    region = region_of(props, ctx.provider)
    if isinstance(region, str) and region not in ctx.config["allowedRegions"]:
        yield (f"{ctx.classification(props)} data in {region}, outside mainland China; allowed: "
               f"{', '.join(ctx.config['allowedRegions'])}")


def check_spot_terminate_hook(stack: Stack, ctx):
    for group in stack.of(TC_SCALING_GROUP):
        if not is_spot(stack, group):
            continue
        hooks = stack.referrers(group, [TC_LIFECYCLE_HOOK], "scalingGroupId")
        if not any(h.props.get("lifecycleTransition") == TERMINATING for h in hooks):
            yield f"spot GPU group '{group.name}' has no {TERMINATING} lifecycle hook to checkpoint before it goes", group.urn


def check_queue_scale_to_zero(props: dict, ctx):
    if stack_value("gpufleet:mode") != "queue":
        return
    size = number(props.get("minSize"))
    if size:
        yield f"queue-mode group keeps minSize {size:g} nodes running when the queue is empty"


def _sizes(stack: Stack) -> list[tuple[Resource, list[str], float]]:
    out = []
    for group in stack.of(TC_SCALING_GROUP):
        size = number(group.props.get("maxSize"))
        if size is not None:
            out.append((group, group_types(stack, group), size))
    return out


def _detail(groups) -> str:
    return ", ".join(f"{g.name}: {size:g} x {'/'.join(types)}" for g, types, size in groups)


def check_gpu_quota(stack: Stack, ctx):
    groups = [(g, types, size) for g, types, size in _sizes(stack) if any(t in CATALOG for t in types)]
    total = sum(size * max(CATALOG[t].gpus for t in types if t in CATALOG) for _, types, size in groups)
    if total > ctx.config["maxGpus"]:
        yield f"GPU groups can reach {total:g} GPUs, over the quota of {ctx.config['maxGpus']:g} ({_detail(groups)})", \
            groups[0][0].urn


def check_monthly_ceiling(stack: Stack, ctx):
    ceiling = number(ctx.config.get("monthlyCeilingCny") or stack_value("gpufleet:budgetMonthlyCny"))
    if not ceiling:
        return
    groups = _sizes(stack)
    cost = sum(monthly_max(types, size, is_spot(stack, g)) for g, types, size in groups)
    if cost > ceiling:
        yield (f"GPU groups at their maximum size cost about ¥{cost:,.0f}/month, over the ¥{ceiling:,.0f} ceiling "
               f"({_detail(groups)})"), groups[0][0].urn


def check_cost_tags(props: dict, ctx):
    if ctx.resource_type not in TAGGABLE and "tags" not in props:
        return
    tags = props.get("tags")
    if tags is UNKNOWN:
        return
    missing = [t for t in ctx.config["requiredTags"] if not tags_of(props).get(t)]
    if missing:
        yield f"missing tag(s) {', '.join(missing)}"


_CLASSES = {"type": "array", "items": {"type": "string", "enum": ["public", "internal", "personal"]}}
_PERSONAL = {"classifications": {**_CLASSES, "default": ["personal"],
                                 "description": "Data classifications under PIPL controls."}}
_PIPL = {**_PERSONAL, "allowedRegions": {
    "type": "array", "items": {"type": "string"}, "default": list(MAINLAND_CHINA_REGIONS),
    "description": "Tencent regions where personal information may live; default mainland China. A stack's "
                   "own allowedRegions cannot widen it."}}
# Actions CAM can authorize only on '*' (no resource-level permission); none is granted by default.
_OPERATION_LEVEL = {"operationLevelActions": {"type": "array", "items": {"type": "string"}, "default": [],
                                              "description": "Actions allowed on resource '*' (operation-level "
                                                             "actions without resource-level permission)."}}
_GPU = ["gpufleet-gpu"]
_BUCKET = [TC_BUCKET]

POLICIES = [
    resource_policy(
        "tencent-cos-bucket-private", "COS buckets grant no public read or write through ACLs.",
        types=_BUCKET, severity="critical", frameworks=["CIS", "PIPL"], check=check_private,
        remediation="Set acl 'private' and drop aclBody grants to AllUsers; grant access through CAM policies."),
    resource_policy(
        "tencent-cos-bucket-sse", "COS buckets encrypt objects at rest by default.",
        types=_BUCKET, severity="high", frameworks=["CIS", "PIPL"], check=check_sse,
        remediation="Set encryptionAlgorithm 'KMS' with kmsId the stack's key (AES256 or SM4 for log buckets)."),
    stack_policy(
        "tencent-cos-bucket-personal-kms",
        "COS buckets with personal data use SSE-KMS under a customer master key (log buckets exempt).",
        severity="high", frameworks=["PIPL"], check=check_personal_kms, config=_PERSONAL,
        remediation="Create a tencentcloud.kms.Key with rotation and set encryptionAlgorithm 'KMS' and kmsId on "
                    "the bucket (authorize COS to use KMS once per account)."),
    resource_policy(
        "tencent-cos-bucket-versioning", "COS buckets keep object versions so checkpoints survive overwrites.",
        types=_BUCKET, severity="medium", frameworks=["CIS"], check=check_versioning, mandatory=False,
        remediation="Set versioningEnable true and a lifecycle rule with nonCurrentExpiration."),
    stack_policy(
        "tencent-cos-bucket-tls-only", "Every COS bucket policy denies requests over plain HTTP.",
        severity="high", frameworks=["CIS", "PIPL"], check=check_tls_only,
        remediation="Attach a tencentcloud.cos.BucketPolicy denying name/cos:* to qcs::cam::anyone:anyone on the "
                    "bucket's objects under bool_equal cos:secure-transport 'false' (and numeric_less_than "
                    "cos:tls-version 1.2)."),
    stack_policy(
        "tencent-cos-bucket-access-logging", "COS buckets holding personal data write access logs.",
        severity="medium", frameworks=["PIPL"], check=check_access_logging, config=_PERSONAL,
        remediation="Set logEnable true with logTargetBucket a private log bucket of the stack and a logPrefix."),
    resource_policy(
        "tencent-cvm-node-no-public-ip", "Launch configurations and instances get no public IP or internet bandwidth.",
        types=[TC_SCALING_CONFIG, TC_INSTANCE], severity="high", frameworks=["CIS", "PIPL"], check=check_no_public_ip,
        remediation="Set publicIpAssigned (allocatePublicIp) false and internetMaxBandwidthOut 0; reach the nodes "
                    "with TencentCloud Automation Tools."),
    resource_policy(
        "tencent-vpc-securitygroup-no-world-inbound", "Security groups accept nothing inbound from the internet.",
        types=[TC_SG_RULE_SET, TC_SG_RULE, TC_SG_LITE_RULE], severity="critical", frameworks=["CIS"],
        check=check_no_world_inbound,
        remediation="Accept inbound traffic only from the group itself (sourceSecurityId) or the VPC's CIDR, and end "
                    "with DROP ALL from 0.0.0.0/0."),
    resource_policy(
        "tencent-cam-policy-no-wildcards",
        "CAM policies allow no '*' or 'service:*' actions and name their resources instead of '*'.",
        types=[TC_CAM_POLICY], severity="high", frameworks=["CIS"], check=check_cam_wildcards, config=_OPERATION_LEVEL,
        remediation="List the exact actions (name/cos:GetObject, name/tdmq:ReceiveMessage, ...) on the stack's "
                    "six-segment resources (qcs::cos:<region>:uid/<appid>:<bucket>/*); list operation-level "
                    "actions in operationLevelActions."),
    resource_policy(
        "tencent-cvm-disk-encrypted",
        "Cloud disks are encrypted and launch configurations attach no data disk, which Auto Scaling cannot encrypt.",
        types=[TC_SCALING_CONFIG, TC_INSTANCE, TC_CBS], severity="high", frameworks=["CIS", "PIPL"],
        check=check_disks,
        remediation="Remove dataDisks from the launch configuration and keep data in the KMS-encrypted bucket; "
                    "set encrypt true (with kmsKeyId) on instance data disks and CBS disks."),
    resource_policy(
        "tencent-kms-key-rotation", "Symmetric KMS keys rotate their key material.",
        types=[TC_KMS_KEY], severity="medium", frameworks=["CIS"], check=check_key_rotation,
        remediation="Set keyRotationEnabled true."),
    resource_policy(
        "tencent-any-resource-pipl-region",
        "Resources of personal-data stacks stay in mainland China regions (PIPL).",
        types="tencentcloud", severity="critical", frameworks=["PIPL"], check=check_pipl_region, config=_PIPL,
        remediation="Deploy the stack to a mainland China region (tencentcloud:region, e.g. ap-shanghai) and remove "
                    "providers with a region outside it; a cross-border transfer needs its own assessment."),
    stack_policy(
        "tencent-as-group-spot-terminate-hook",
        "Spot GPU scaling groups hold a terminate lifecycle hook for the last checkpoint.",
        severity="medium", frameworks=_GPU, check=check_spot_terminate_hook,
        remediation="Add a tencentcloud.as_.LifecycleHook with lifecycleTransition INSTANCE_TERMINATING and a "
                    "heartbeat long enough to write a checkpoint."),
    resource_policy(
        "tencent-as-group-queue-scale-to-zero", "Queue-mode scaling groups can scale down to zero nodes.",
        types=[TC_SCALING_GROUP], severity="medium", frameworks=_GPU, check=check_queue_scale_to_zero,
        mandatory=False, remediation="Set minSize 0 (nodes.min 0) so an idle queue costs nothing."),
    stack_policy(
        "tencent-as-group-gpu-quota", "The stack's GPU scaling groups together stay within the GPU quota.",
        severity="medium", frameworks=_GPU, check=check_gpu_quota,
        config={"maxGpus": {"type": "integer", "minimum": 0, "default": 64,
                            "description": "Most GPUs all groups of the stack may reach together."}},
        remediation="Lower nodes.max or use a smaller type, or raise maxGpus once the GPU quota of the region "
                    "is raised."),
    stack_policy(
        "tencent-as-group-monthly-ceiling",
        "The stack's GPU scaling groups at their maximum size stay under the monthly ceiling in CNY.",
        severity="low", frameworks=["gpufleet-cost"], check=check_monthly_ceiling, mandatory=False,
        config={"monthlyCeilingCny": {"type": "number", "minimum": 0,
                                      "description": "Monthly ceiling in CNY; defaults to gpufleet:budgetMonthlyCny."}},
        remediation="Lower nodes.max, use spot capacity or a cheaper type, or raise budgetMonthlyCny."),
    resource_policy(
        "tencent-any-resource-cost-tags", "Taggable resources carry the required cost-allocation tags.",
        types="tencentcloud", severity="low", frameworks=["gpufleet-cost"], check=check_cost_tags, mandatory=False,
        config={"requiredTags": {"type": "array", "items": {"type": "string"},
                                 "default": ["team", "cost-center", "data-classification"],
                                 "description": "Tags every taggable resource must carry (non-empty)."}},
        remediation="Add the tags to gpufleet:tags in the stack config; the stack puts them on every taggable "
                    "resource (TDMQ CMQ queues and CAM policies take no tags)."),
]
