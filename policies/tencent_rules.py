"""Tencent Cloud guardrails: COS buckets, CAM policies (no wildcards; bounded launch rights for the Slurm
controller; machines' and jobs' COS rights held to a VPC), security groups, node disks, addresses and logins, CFS
file systems, SSM secrets (the munge key), PIPL residency, and the Slurm partitions (scale to zero, GPU quota,
monthly ceiling in CNY).

(Named tencent_rules like azure_rules: the policy host puts policies/ on sys.path.) Tencent resources
carry no region: a resource is where its provider is, which is `tencentcloud:region` unless an explicit
provider says otherwise. CAM and COS policy documents are version 2.0 with lower-case elements.

On Tencent the GPU nodes are Slurm CLOUD nodes the controller launches with RunInstances from a partition's launch
template: each Slurm partition is a `gpufleet:tencent:Partition` component whose properties say what it is
(instance types, maxNodes, alwaysOn, spot, onDemandBase, gang, subnetIds) and whose child is its launch template;
the controller is an instance under a `gpufleet:tencent:Controller` component.
"""
from __future__ import annotations

import ipaddress
from fnmatch import fnmatchcase

from infra.config import MAINLAND_CHINA_REGIONS
from policies.common import (UNKNOWN, Stack, as_list, flag, get, items, json_doc, number, resource_policy,
                             stack_policy, stack_value, tags_of)
from policies.gpu import check_partition_scale_to_zero, gpu_quota, monthly_ceiling
from policies.tokens import (TC_BUCKET, TC_BUCKET_POLICY, TC_CAM_GROUP_ATTACHMENT, TC_CAM_POLICY, TC_CAM_ROLE,
                             TC_CBS, TC_CFS_ACCESS_GROUP,
                             TC_CFS_ACCESS_RULE, TC_CFS_FILE_SYSTEM, TC_CLS_TOPIC, TC_INSTANCE, TC_KMS_KEY,
                             TC_LAUNCH_TEMPLATE, TC_PARTITION, TC_SECURITY_GROUP, TC_SG_LITE_RULE, TC_SG_RULE,
                             TC_SG_RULE_SET, TC_SSM_SECRET, TC_SSM_SECRET_VERSION, TC_SUBNET, TC_VPC)

PUBLIC_ACLS = ("public-read", "public-read-write")
ENCRYPTIONS = ("KMS", "AES256", "SM4")
WORLD = ("0.0.0.0/0", "::/0")
ANYONE = "qcs::cam::anyone:anyone"
GLOBAL_TYPES = ("tencentcloud:Cam/", "tencentcloud:Billing/")   # account-wide, no region
TAGGABLE = {TC_VPC, TC_SUBNET, TC_SECURITY_GROUP, TC_BUCKET, TC_KMS_KEY, TC_CAM_ROLE, TC_LAUNCH_TEMPLATE, TC_INSTANCE,
            TC_CBS, TC_CLS_TOPIC, TC_CFS_FILE_SYSTEM, TC_SSM_SECRET}
DEFAULT_PERMISSION_GROUP = "pgroupbasic"   # CFS's account-wide default permission group
PLACEHOLDER = "unset"                      # what the stack writes into the munge key's first secret version
STACK_TAG = "gpufleet-stack"


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
    """A launch template's internetAccessible, an instance's own settings: no public IP, no internet bandwidth."""
    if ctx.resource_type == TC_LAUNCH_TEMPLATE:
        settings, keys = props.get("internetAccessible"), ("publicIpAssigned",)
        where = "internetAccessible."
    else:
        settings, keys, where = props, ("allocatePublicIp", "publicIpAssigned"), ""
    if settings is UNKNOWN or not isinstance(settings, dict):
        return
    for key in keys:
        if flag(settings.get(key)) is True:
            yield f"{where}{key} is true: nodes must not have public addresses"
    bandwidth = number(settings.get("internetMaxBandwidthOut"))
    if bandwidth:
        yield (f"{where}internetMaxBandwidthOut is {bandwidth:g} Mbps: the machine gets a public address with "
               f"internet bandwidth")


def check_no_password(props: dict, ctx):
    """A launch template's loginSettings, an instance's own: no login password."""
    settings = props.get("loginSettings") if ctx.resource_type == TC_LAUNCH_TEMPLATE else props
    where = "loginSettings." if ctx.resource_type == TC_LAUNCH_TEMPLATE else ""
    if not isinstance(settings, dict):
        return
    if settings.get("password") not in (None, ""):
        yield f"{where}password is set: machines log in with the image's login or SSH keys only"


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
    """Data disks of a launch template or an instance, and CBS disks, that are not encrypted. System disks are not
    judged: neither the pinned provider's cvm.LaunchTemplate (systemDisk: type and size) nor its Instance can ask
    for an encrypted system disk."""
    if resource_type in (TC_LAUNCH_TEMPLATE, TC_INSTANCE):
        disks = props.get("dataDisks")
        if disks is UNKNOWN:
            return []
        return [f"data disk {i} is not encrypted" for i, d in enumerate(items(disks))
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


# --- CFS: the shared /home and slurmctld's state --------------------------------------------------------

def _network(address):
    try:
        return ipaddress.ip_network(address, strict=False)
    except ValueError:
        return None


def world_client(address) -> bool:
    """An access rule's client address that admits everyone: '*' or a /0 range."""
    if not isinstance(address, str):
        return False
    net = _network(address)
    return address.strip() == "*" or (net is not None and net.prefixlen == 0)


def single_client(address) -> bool:
    """One client address (10.0.0.5, 10.0.0.5/32), not a range."""
    net = _network(address) if isinstance(address, str) else None
    return net is not None and net.num_addresses == 1


def check_cfs(stack: Stack, ctx):
    """Every file system uses a permission group of this stack; every access rule, whether or not its group is in
    this stack, admits no one-for-all address and keeps root (no_root_squash) for a single address only."""
    for fs in stack.of(TC_CFS_FILE_SYSTEM):
        group = fs.props.get("accessGroupId")
        if group is UNKNOWN:
            continue
        if group == DEFAULT_PERMISSION_GROUP:
            yield (f"file system '{fs.name}' uses the account's default permission group {DEFAULT_PERMISSION_GROUP}, "
                   f"which this stack does not control"), fs.urn
        elif not stack.targets(fs, [TC_CFS_ACCESS_GROUP], "accessGroupId"):
            yield f"file system '{fs.name}' uses permission group {group or 'unset'}, not one of this stack", fs.urn
    for rule in stack.of(TC_CFS_ACCESS_RULE):
        address, root = rule.props.get("authClientIp"), rule.props.get("userPermission")
        if address is UNKNOWN:
            continue
        if world_client(address):
            yield f"access rule '{rule.name}' admits every client address ({address})", rule.urn
        elif root == "no_root_squash" and not single_client(address):
            yield (f"access rule '{rule.name}' keeps root (no_root_squash) for the range {address}; only a single "
                   f"address (the controller's) may"), rule.urn


# --- SSM: the munge key's secret ----------------------------------------------------------------------

def check_secret(props: dict, ctx):
    if ctx.resource_type == TC_SSM_SECRET:
        key = props.get("kmsKeyId")
        if key is not UNKNOWN and not key:
            yield "kmsKeyId is unset: SSM encrypts the secret with its own default key, not the stack's KMS key"
        return
    for field in ("secretString", "secretBinary"):
        value = props.get(field)
        if value not in (None, UNKNOWN, PLACEHOLDER):
            # never the value itself: it is the secret
            yield (f"{field} holds a value other than the placeholder '{PLACEHOLDER}': it would be in the stack's "
                   f"state and previews")


# --- CAM: the controller's launch rights --------------------------------------------------------------

RUN = "cvm:RunInstances"
TERMINATE = "cvm:TerminateInstances"
PASS_ROLE = "cam:PassRole"
_EXACT_OPERATORS = ("string_equal", "for_any_value:string_equal")


def _action(value: str) -> str:
    return value[5:] if value.lower().startswith("name/") else value


def cam_allows(statement: dict, action: str) -> bool:
    """The allow statement grants `action` (an action pattern such as name/cvm:* or * covers it)."""
    return statement.get("effect") == "allow" and any(
        isinstance(a, str) and fnmatchcase(action.lower(), _action(a).lower()) for a in as_list(statement.get("action")))


def exact_values(statement: dict, key: str) -> list[str]:
    """The values an exact operator (string_equal) requires of condition `key`; [] if none, or if any is a
    pattern."""
    condition = statement.get("condition")
    for op, pairs in condition.items() if isinstance(condition, dict) else ():
        if not isinstance(pairs, dict) or not isinstance(op, str) or op.lower() not in _EXACT_OPERATORS:
            continue
        for k, values in pairs.items():
            values = as_list(values)
            if isinstance(k, str) and k.lower() == key and values and all(
                    isinstance(v, str) and v and "*" not in v and "?" not in v for v in values):
                return values
    return []


def tag_condition(statement: dict, key: str) -> list[str]:
    """The stack-tag values (gpufleet-stack&<stack>) an exact operator requires of condition `key`; [] if none, or
    if any value is a pattern."""
    values = exact_values(statement, key)
    return values if all(v.startswith(f"{STACK_TAG}&") and len(v) > len(STACK_TAG) + 1 for v in values) else []


def cam_launch_gaps(statement: dict) -> list[str]:
    gaps = []
    if cam_allows(statement, RUN) and not tag_condition(statement, "qcs:request_tag"):
        gaps.append(f"{RUN} without a string_equal qcs:request_tag condition on {STACK_TAG}&<stack>")
    if cam_allows(statement, TERMINATE) and not tag_condition(statement, "qcs:resource_tag"):
        gaps.append(f"{TERMINATE} without a string_equal qcs:resource_tag condition on {STACK_TAG}&<stack>")
    if cam_allows(statement, PASS_ROLE):
        roles = as_list(statement.get("resource"))
        if not roles or any(not isinstance(r, str) or "*" in r for r in roles):
            gaps.append(f"{PASS_ROLE} on {', '.join(map(str, roles)) or 'no resource'}, not named roles")
    return gaps


def check_cam_launch(props: dict, ctx):
    doc = json_doc(props.get("document"))
    for i, s in enumerate(statements(doc)):
        for gap in cam_launch_gaps(s):
            yield f"statement {i}: {gap}"


def check_cos_in_vpc(stack: Stack, ctx):
    """Machines' and jobs' COS rights hold to a VPC: every CAM policy of the stack but those its groups alone hold
    (people, who submit from their own machines) allows COS actions only under a string_equal vpc:requester_vpc
    condition, so a role's key copied off a node (or handed to a job) is refused by COS from anywhere else."""
    people = {u for a in stack.of(TC_CAM_GROUP_ATTACHMENT) for u in a.deps("policyId")}
    for policy in stack.of(TC_CAM_POLICY):
        if policy.urn in people:
            continue
        doc = json_doc(policy.props.get("document"))
        for i, s in enumerate(statements(doc)):
            cos = [a for a in as_list(s.get("action")) if isinstance(a, str) and _action(a).lower().startswith("cos:")]
            if s.get("effect") == "allow" and cos and not exact_values(s, "vpc:requester_vpc"):
                yield (f"CAM policy '{policy.name}': statement {i} allows {', '.join(cos)} from anywhere (no "
                       f"string_equal vpc:requester_vpc condition): a key of a role that holds it works off the "
                       f"stack's VPC"), policy.urn


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
        "tencent-cvm-node-no-public-ip",
        "Launch templates and instances (the controller among them) get no public IP or internet bandwidth.",
        types=[TC_LAUNCH_TEMPLATE, TC_INSTANCE], severity="high", frameworks=["CIS", "PIPL"],
        check=check_no_public_ip,
        remediation="Set internetAccessible {publicIpAssigned: false, internetMaxBandwidthOut: 0} on launch templates "
                    "and allocatePublicIp false, internetMaxBandwidthOut 0 on instances; reach the machines with "
                    "TencentCloud Automation Tools."),
    resource_policy(
        "tencent-cvm-node-no-password-login",
        "Launch templates and instances set no login password.",
        types=[TC_LAUNCH_TEMPLATE, TC_INSTANCE], severity="high", frameworks=["CIS", "PIPL"],
        check=check_no_password,
        remediation="Remove loginSettings.password (password on an instance); keep the image's login "
                    "(keepImageLogin) or name SSH keys (keyIds), and reach the machines with TencentCloud Automation "
                    "Tools."),
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
        "Data disks of launch templates and instances, and CBS disks, are encrypted (system disks are not judged: "
        "the pinned provider cannot ask for an encrypted one).",
        types=[TC_LAUNCH_TEMPLATE, TC_INSTANCE, TC_CBS], severity="high", frameworks=["CIS", "PIPL"],
        check=check_disks,
        remediation="Set encrypt true (with kmsKeyId the stack's key) on every data disk of a launch template or "
                    "instance and on CBS disks, or keep data in the KMS-encrypted bucket instead. The provider's "
                    "launch template and instance have no system disk encryption; RunInstances' "
                    "SystemDisk.Encrypt is the node provider's to set."),
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
        "tencent-cfs-filesystem-private-access",
        "CFS file systems use a permission group of the stack, whose rules admit no one-for-all address and keep "
        "root only for a single address.",
        severity="high", frameworks=["CIS", "PIPL"], check=check_cfs,
        remediation="Give each file system its own tencentcloud.cfs.AccessGroup (never pgroupbasic) with access "
                    "rules naming the node subnets' CIDRs with root_squash and the controller's address alone with "
                    "no_root_squash; never '*' or 0.0.0.0/0."),
    resource_policy(
        "tencent-ssm-secret-kms-no-value",
        "SSM secrets are encrypted with the stack's KMS key and their versions in the stack hold only the "
        "placeholder 'unset'.",
        types=[TC_SSM_SECRET, TC_SSM_SECRET_VERSION], severity="high", frameworks=["CIS", "PIPL"],
        check=check_secret,
        remediation="Set kmsKeyId to the stack's key on the secret; create its first version with secretString "
                    "'unset' and let the controller store the munge key (PutSecretValue), so the key is never in "
                    "the stack's state, a preview or an output."),
    resource_policy(
        "tencent-cam-policy-bounded-launch",
        "CAM policies launch instances only with the stack tag, terminate only tagged instances and pass only "
        "named roles.",
        types=[TC_CAM_POLICY], severity="critical", frameworks=["CIS"], check=check_cam_launch,
        remediation="Condition name/cvm:RunInstances on for_any_value:string_equal qcs:request_tag "
                    "['gpufleet-stack&<stack>'] and name/cvm:TerminateInstances on qcs:resource_tag "
                    "['gpufleet-stack&<stack>']; allow name/cam:PassRole only on the node role's "
                    "qcs::cam::uin/<uin>:roleName/<name> (infra/tencent/controller.py)."),
    stack_policy(
        "tencent-cam-policy-cos-in-vpc",
        "CAM policies other than the teams' groups' allow COS actions only from a VPC (vpc:requester_vpc).",
        severity="high", frameworks=["CIS", "PIPL"], check=check_cos_in_vpc,
        remediation="Add the condition {string_equal: {vpc:requester_vpc: ['<the stack's VPC id>']}} to every "
                    "statement that allows name/cos:* actions in the node, controller and job roles' policies "
                    "(infra.tencent.derive.in_vpc); a policy for people attaches to their CAM group "
                    "(GroupPolicyAttachment)."),
    resource_policy(
        "tencent-slurm-partition-queue-scale-to-zero",
        "Queue (non-gang) Slurm partitions power every node down when no job needs it.",
        types=[TC_PARTITION], severity="medium", frameworks=_GPU, check=check_partition_scale_to_zero,
        mandatory=False,
        remediation="Set the partition's nodes.min 0 (alwaysOn 0) so an idle queue partition holds no GPU node."),
    stack_policy(
        "tencent-slurm-partition-gpu-quota",
        "The stack's Slurm partitions at their maximum size together stay within the configured GPU quota.",
        severity="medium", frameworks=_GPU, check=gpu_quota(TC_PARTITION),
        config={"maxGpus": {"type": "integer", "minimum": 0, "default": 64,
                            "description": "Most GPUs all partitions of the stack may reach together."}},
        remediation="Lower the partitions' nodes.max or use a smaller type, or raise maxGpus once the GPU quota of "
                    "the region is raised."),
    stack_policy(
        "tencent-slurm-partition-monthly-ceiling",
        "The stack's Slurm partitions at their maximum size stay under the monthly ceiling in CNY.",
        severity="low", frameworks=["gpufleet-cost"], check=monthly_ceiling(TC_PARTITION, "CNY"), mandatory=False,
        config={"monthlyCeilingCny": {"type": "number", "minimum": 0,
                                      "description": "Monthly ceiling in CNY; defaults to gpufleet:budgetMonthlyCny."}},
        remediation="Lower the partitions' nodes.max, use spot capacity (a smaller onDemandBase) or a cheaper type, "
                    "or raise budgetMonthlyCny."),
    resource_policy(
        "tencent-any-resource-cost-tags", "Taggable resources carry the required cost-allocation tags.",
        types="tencentcloud", severity="low", frameworks=["gpufleet-cost"], check=check_cost_tags, mandatory=False,
        config={"requiredTags": {"type": "array", "items": {"type": "string"},
                                 "default": ["team", "cost-center", "data-classification"],
                                 "description": "Tags every taggable resource must carry (non-empty)."}},
        remediation="Add the tags to gpufleet:tags in the stack config; the stack puts them on every taggable "
                    "resource (TDMQ CMQ queues, CAM policies, CFS permission groups and rules and SSM secret versions "
                    "take no tags)."),
]
