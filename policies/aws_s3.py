"""S3 guardrails: KMS encryption, versioning, public access block, TLS-only bucket policy, ACLs, access logs.

Bucket settings live on separate resources (pulumi-aws 7); a setting resource belongs to the bucket
whose URN is among its `bucket` property dependencies. Settings given inline on the bucket count too.
A settings resource is judged on its own, so a bad one passes nowhere, even when its bucket is not in
this stack (imported, or another stack's named by its id); the stack policies keep the case of a
bucket in this stack that lacks the setting altogether.
"""
from __future__ import annotations

from policies.common import (UNKNOWN, Resource, Stack, as_list, flag, get, items, json_doc,
                             resource_policy, stack_policy)
from policies.tokens import BUCKET, BUCKET_ACL, BUCKET_LOGGING, BUCKET_PAB, BUCKET_POLICY, BUCKET_SSE, BUCKET_VERSIONING

KMS_ALGORITHMS = ("aws:kms", "aws:kms:dsse")
PAB_FLAGS = ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets")
PUBLIC_ACLS = ("public-read", "public-read-write", "authenticated-read")
PUBLIC_GRANTEES = ("http://acs.amazonaws.com/groups/global/AllUsers",
                   "http://acs.amazonaws.com/groups/global/AuthenticatedUsers")


def settings(stack: Stack, bucket: Resource, types) -> list[Resource]:
    return stack.referrers(bucket, types, "bucket")


def sse_rules(props: dict) -> list:
    """The SSE default rules of a bucket (inline) or of a BucketServerSideEncryptionConfiguration."""
    inline = get(props, "serverSideEncryptionConfiguration", "rule")
    if inline is not None:
        return [inline]
    return [UNKNOWN] if props.get("rules") is UNKNOWN else items(props.get("rules"))


def log_targets(stack: Stack) -> tuple[set[str], set[str]]:
    """Buckets that receive server access logs: their URNs, and the names BucketLogging gives."""
    logging = stack.of(*BUCKET_LOGGING)
    return ({u for log in logging for u in log.deps("targetBucket")},
            {log.props["targetBucket"] for log in logging if isinstance(log.props.get("targetBucket"), str)})


def _sse_problem(algorithms: list, log_bucket: bool) -> str | None:
    """Why these default-encryption algorithms are wrong for the bucket, or None."""
    if UNKNOWN in algorithms or not algorithms:
        return None
    # S3 delivers server access logs only to buckets encrypted with SSE-S3.
    wanted = ("AES256",) if log_bucket else KMS_ALGORITHMS
    if all(a in wanted for a in algorithms):
        return None
    why = " (S3 access-log delivery needs SSE-S3)" if log_bucket else ""
    return f"encrypts with {', '.join(sorted(set(map(str, algorithms))))}, not {' or '.join(wanted)}{why}"


def _algorithms(props: dict) -> list:
    return [get(rule, "applyServerSideEncryptionByDefault", "sseAlgorithm") for rule in sse_rules(props)]


def check_sse_kms(stack: Stack, ctx):
    """Every bucket has default encryption; every encryption setting, whether or not its bucket is in
    this stack, is SSE-KMS (SSE-S3 for a bucket that receives access logs: that needs the BucketLogging
    sibling, hence a stack policy)."""
    target_urns, target_names = log_targets(stack)
    for bucket in stack.of(*BUCKET):
        inline = _algorithms(bucket.props)
        if not inline and not settings(stack, bucket, BUCKET_SSE):
            yield f"bucket '{bucket.name}' has no server-side encryption configuration", bucket.urn
        problem = _sse_problem(inline, bucket.urn in target_urns)
        if problem:
            yield f"bucket '{bucket.name}' {problem}", bucket.urn
    for config in stack.of(*BUCKET_SSE):
        log_bucket = bool(target_urns & set(config.deps("bucket"))) or config.props.get("bucket") in target_names
        problem = _sse_problem(_algorithms(config.props), log_bucket)
        if problem:
            yield f"encryption configuration '{config.name}' of bucket {_bucket_of(config)} {problem}", config.urn


def _bucket_of(setting: Resource | dict) -> str:
    props = setting.props if isinstance(setting, Resource) else setting
    bucket = props.get("bucket")
    return f"'{bucket}'" if isinstance(bucket, str) else "(unknown yet)"


def check_versioning(stack: Stack, ctx):
    """Buckets with no versioning setting at all (a BucketVersioning is judged on its own)."""
    for bucket in stack.of(*BUCKET):
        if settings(stack, bucket, BUCKET_VERSIONING):
            continue
        inline = get(bucket.props, "versioning", "enabled")
        if inline is not UNKNOWN and flag(inline) is not True:
            yield f"bucket '{bucket.name}' does not enable versioning", bucket.urn


def check_versioning_enabled(props: dict, ctx):
    status = get(props, "versioningConfiguration", "status")
    if status is not UNKNOWN and status != "Enabled":
        yield f"versioning of bucket {_bucket_of(props)} is {status or 'unset'}, not Enabled"


def check_public_access_block(stack: Stack, ctx):
    """Buckets without a public access block (a block's flags are judged on its own)."""
    for bucket in stack.of(*BUCKET):
        if not settings(stack, bucket, BUCKET_PAB):
            yield f"bucket '{bucket.name}' has no public access block", bucket.urn


def check_block_flags(props: dict, ctx):
    off = [f for f in PAB_FLAGS if props.get(f) is not UNKNOWN and flag(props.get(f)) is not True]
    if off:
        yield f"public access block of bucket {_bucket_of(props)} leaves {', '.join(off)} unset or false"


def _statements(doc) -> list:
    return [s for s in as_list(doc.get("Statement")) if isinstance(s, dict)]


def _denies(statement: dict, operator: str, key: str, value) -> bool:
    if statement.get("Effect") != "Deny":
        return False
    actions = as_list(statement.get("Action"))
    if not any(a in ("*", "s3:*") for a in actions):
        return False
    cond = get(statement, "Condition", operator, default={})
    return {str(v).lower() for v in as_list(cond.get(key) if isinstance(cond, dict) else None)} == {value}


def tls_gaps(doc) -> list[str]:
    """What a bucket policy document lacks: a deny on insecure transport and a deny below TLS 1.2."""
    statements = _statements(doc) if isinstance(doc, dict) else []
    gaps = []
    if not any(_denies(s, "Bool", "aws:SecureTransport", "false") for s in statements):
        gaps.append("a Deny of s3:* when aws:SecureTransport is false")
    if not any(_denies(s, "NumericLessThan", "s3:TlsVersion", "1.2") for s in statements):
        gaps.append("a Deny of s3:* when s3:TlsVersion is less than 1.2")
    return gaps


def check_tls_only(stack: Stack, ctx):
    """Buckets with no bucket policy at all (a policy's statements are judged on their own)."""
    for bucket in stack.of(*BUCKET):
        if bucket.props.get("policy") is None and not settings(stack, bucket, BUCKET_POLICY):
            yield f"bucket '{bucket.name}' has no bucket policy denying insecure transport", bucket.urn


def check_policy_tls(props: dict, ctx):
    if props.get("policy") is None:  # a bucket without an inline policy: the stack policy's case
        return
    doc = json_doc(props.get("policy"))
    if doc is UNKNOWN:
        return
    gaps = tls_gaps(doc)
    if gaps:
        yield f"policy of bucket {_bucket_of(props)} lacks {' and '.join(gaps)}"


def check_no_public_acl(props: dict, ctx):
    acl = props.get("acl")
    if acl in PUBLIC_ACLS:
        yield f"canned ACL '{acl}' makes objects readable outside the account"
    grants = items(props.get("grants")) + items(get(props, "accessControlPolicy", "grants", default=[]))
    for grant in grants:
        uri = get(grant, "uri") or get(grant, "grantee", "uri")
        if uri in PUBLIC_GRANTEES:
            yield f"ACL grants {get(grant, 'permission') or get(grant, 'permissions')} to {uri.rsplit('/', 1)[-1]}"


def check_access_logging(stack: Stack, ctx):
    target_urns, _ = log_targets(stack)
    for bucket in stack.of(*BUCKET):
        if ctx.classification(bucket.props) not in ctx.config["classifications"] or bucket.urn in target_urns:
            continue
        inline = get(bucket.props, "logging", "targetBucket")
        if inline is None and not settings(stack, bucket, BUCKET_LOGGING):
            yield (f"bucket '{bucket.name}' holds {ctx.classification(bucket.props)} data without server "
                   f"access logging"), bucket.urn


POLICIES = [
    stack_policy(
        "aws-s3-bucket-sse-kms",
        "S3 buckets and their encryption settings encrypt at rest with SSE-KMS (access-log buckets with SSE-S3).",
        severity="high", frameworks=["CIS", "HIPAA", "GDPR"], check=check_sse_kms,
        remediation="Add an aws.s3.BucketServerSideEncryptionConfiguration for the bucket with "
                    "sseAlgorithm 'aws:kms' and kmsMasterKeyId set to the stack's KMS key; enable bucketKeyEnabled."),
    stack_policy(
        "aws-s3-bucket-versioning",
        "S3 buckets have a versioning setting, so checkpoints survive overwrites and deletes.",
        severity="medium", frameworks=["CIS"], check=check_versioning, mandatory=False,
        remediation="Add an aws.s3.BucketVersioning for the bucket with versioningConfiguration.status 'Enabled' "
                    "and a lifecycle rule expiring noncurrent versions."),
    resource_policy(
        "aws-s3-bucketversioning-enabled",
        "S3 versioning settings enable versioning.",
        types=BUCKET_VERSIONING, severity="medium", frameworks=["CIS"], check=check_versioning_enabled,
        mandatory=False,
        remediation="Set versioningConfiguration.status 'Enabled' on the aws.s3.BucketVersioning."),
    stack_policy(
        "aws-s3-bucket-public-access-block",
        "Every S3 bucket has a public access block.",
        severity="high", frameworks=["CIS", "GDPR", "HIPAA"], check=check_public_access_block,
        remediation="Add an aws.s3.BucketPublicAccessBlock for the bucket with blockPublicAcls, blockPublicPolicy, "
                    "ignorePublicAcls and restrictPublicBuckets all true."),
    resource_policy(
        "aws-s3-publicaccessblock-all-flags",
        "S3 public access blocks turn all four flags on.",
        types=BUCKET_PAB, severity="high", frameworks=["CIS", "GDPR", "HIPAA"], check=check_block_flags,
        remediation="Set blockPublicAcls, blockPublicPolicy, ignorePublicAcls and restrictPublicBuckets true on the "
                    "aws.s3.BucketPublicAccessBlock."),
    stack_policy(
        "aws-s3-bucket-tls-only",
        "Every S3 bucket has a bucket policy.",
        severity="high", frameworks=["CIS", "HIPAA"], check=check_tls_only,
        remediation="Attach an aws.s3.BucketPolicy with Deny s3:* on the bucket and its objects under "
                    "Condition Bool aws:SecureTransport 'false', and another under NumericLessThan s3:TlsVersion 1.2."),
    resource_policy(
        "aws-s3-bucketpolicy-tls-only",
        "S3 bucket policies deny requests without TLS and requests below TLS 1.2.",
        types=BUCKET | BUCKET_POLICY, severity="high", frameworks=["CIS", "HIPAA"], check=check_policy_tls,
        remediation="Add to the policy a Deny of s3:* on the bucket and its objects under Condition Bool "
                    "aws:SecureTransport 'false', and another under NumericLessThan s3:TlsVersion 1.2."),
    resource_policy(
        "aws-s3-bucket-no-public-acl",
        "S3 buckets grant no ACL access to all users or all authenticated AWS users.",
        types=BUCKET | BUCKET_ACL, severity="critical", frameworks=["CIS", "GDPR"], check=check_no_public_acl,
        remediation="Remove public canned ACLs and AllUsers/AuthenticatedUsers grants; set object ownership to "
                    "BucketOwnerEnforced to disable ACLs."),
    stack_policy(
        "aws-s3-bucket-access-logging",
        "S3 buckets holding regulated data write server access logs.",
        severity="medium", frameworks=["HIPAA", "GDPR"], check=check_access_logging,
        config={"classifications": {"type": "array", "items": {"type": "string"}, "default": ["personal", "phi"],
                                    "description": "Data classifications whose buckets must log access "
                                                   "(HIPAA audit controls; GDPR records of processing)."}},
        remediation="Add an aws.s3.BucketLogging for the bucket targeting a dedicated log bucket "
                    "(itself encrypted and access-blocked) with a per-bucket targetPrefix."),
]
