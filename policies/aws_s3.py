"""S3 guardrails: KMS encryption, versioning, public access block, TLS-only bucket policy, ACLs, access logs.

Bucket settings live on separate resources (pulumi-aws 7); a setting resource belongs to the bucket
whose URN is among its `bucket` property dependencies. Settings given inline on the bucket count too.
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


def sse_algorithms(stack: Stack, bucket: Resource) -> list:
    rules = sse_rules(bucket.props)
    for cfg in settings(stack, bucket, BUCKET_SSE):
        rules += sse_rules(cfg.props)
    return [get(rule, "applyServerSideEncryptionByDefault", "sseAlgorithm") for rule in rules]


def log_targets(stack: Stack) -> set[str]:
    """URNs of buckets that receive server access logs."""
    return {u for log in stack.of(*BUCKET_LOGGING) for u in log.deps("targetBucket")}


def check_sse_kms(stack: Stack, ctx):
    targets = log_targets(stack)
    for bucket in stack.of(*BUCKET):
        algorithms = sse_algorithms(stack, bucket)
        if UNKNOWN in algorithms:
            continue
        # S3 delivers server access logs only to buckets encrypted with SSE-S3.
        log_bucket = bucket.urn in targets
        wanted = ("AES256",) if log_bucket else KMS_ALGORITHMS
        why = " (S3 access-log delivery needs SSE-S3)" if log_bucket else ""
        used = ", ".join(sorted(set(map(str, algorithms))))
        if not algorithms:
            yield f"bucket '{bucket.name}' has no server-side encryption configuration", bucket.urn
        elif any(a not in wanted for a in algorithms):
            yield f"bucket '{bucket.name}' encrypts with {used}, not {' or '.join(wanted)}{why}", bucket.urn


def check_versioning(stack: Stack, ctx):
    for bucket in stack.of(*BUCKET):
        states = [get(bucket.props, "versioning", "enabled")]
        states += [get(v.props, "versioningConfiguration", "status") for v in settings(stack, bucket, BUCKET_VERSIONING)]
        if UNKNOWN in states:
            continue
        if not any(flag(s) is True or s == "Enabled" for s in states):
            yield f"bucket '{bucket.name}' does not enable versioning", bucket.urn


def check_public_access_block(stack: Stack, ctx):
    for bucket in stack.of(*BUCKET):
        blocks = settings(stack, bucket, BUCKET_PAB)
        if not blocks:
            yield f"bucket '{bucket.name}' has no public access block", bucket.urn
        for block in blocks:
            off = [f for f in PAB_FLAGS if block.props.get(f) is not UNKNOWN and flag(block.props.get(f)) is not True]
            if off:
                yield f"public access block '{block.name}' leaves {', '.join(off)} unset or false", block.urn


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
    for bucket in stack.of(*BUCKET):
        docs = [json_doc(bucket.props.get("policy"))] if bucket.props.get("policy") is not None else []
        docs += [json_doc(p.props.get("policy")) for p in settings(stack, bucket, BUCKET_POLICY)]
        if UNKNOWN in docs:
            continue
        if not docs:
            yield f"bucket '{bucket.name}' has no bucket policy denying insecure transport", bucket.urn
            continue
        merged = {"Statement": [s for d in docs if isinstance(d, dict) for s in _statements(d)]}
        gaps = tls_gaps(merged)
        if gaps:
            yield f"bucket '{bucket.name}' policy lacks {' and '.join(gaps)}", bucket.urn


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
    targets = log_targets(stack)
    for bucket in stack.of(*BUCKET):
        if ctx.classification(bucket.props) not in ctx.config["classifications"] or bucket.urn in targets:
            continue
        inline = get(bucket.props, "logging", "targetBucket")
        if inline is None and not settings(stack, bucket, BUCKET_LOGGING):
            yield (f"bucket '{bucket.name}' holds {ctx.classification(bucket.props)} data without server "
                   f"access logging"), bucket.urn


POLICIES = [
    stack_policy(
        "aws-s3-bucket-sse-kms",
        "S3 buckets encrypt objects at rest with SSE-KMS by default (access-log buckets with SSE-S3).",
        severity="high", frameworks=["CIS", "HIPAA", "GDPR"], check=check_sse_kms,
        remediation="Add an aws.s3.BucketServerSideEncryptionConfiguration for the bucket with "
                    "sseAlgorithm 'aws:kms' and kmsMasterKeyId set to the stack's KMS key; enable bucketKeyEnabled."),
    stack_policy(
        "aws-s3-bucket-versioning",
        "S3 buckets keep object versions so checkpoints survive overwrites and deletes.",
        severity="medium", frameworks=["CIS"], check=check_versioning, mandatory=False,
        remediation="Add an aws.s3.BucketVersioning for the bucket with versioningConfiguration.status 'Enabled' "
                    "and a lifecycle rule expiring noncurrent versions."),
    stack_policy(
        "aws-s3-bucket-public-access-block",
        "Every S3 bucket has a public access block with all four flags on.",
        severity="high", frameworks=["CIS", "GDPR", "HIPAA"], check=check_public_access_block,
        remediation="Add an aws.s3.BucketPublicAccessBlock for the bucket with blockPublicAcls, blockPublicPolicy, "
                    "ignorePublicAcls and restrictPublicBuckets all true."),
    stack_policy(
        "aws-s3-bucket-tls-only",
        "Every S3 bucket policy denies requests without TLS and requests below TLS 1.2.",
        severity="high", frameworks=["CIS", "HIPAA"], check=check_tls_only,
        remediation="Attach an aws.s3.BucketPolicy with Deny s3:* on the bucket and its objects under "
                    "Condition Bool aws:SecureTransport 'false', and another under NumericLessThan s3:TlsVersion 1.2."),
    resource_policy(
        "aws-s3-bucket-no-public-acl",
        "S3 buckets grant no ACL access to all users or all authenticated AWS users.",
        types=BUCKET | BUCKET_ACL, severity="critical", frameworks=["CIS", "GDPR"], check=check_no_public_acl,
        remediation="Remove public canned ACLs and AllUsers/AuthenticatedUsers grants; set object ownership to "
                    "BucketOwnerEnforced to disable ACLs."),
    stack_policy(
        "aws-s3-bucket-access-logging",
        "S3 buckets holding regulated data write server access logs.",
        severity="medium", frameworks=["HIPAA"], check=check_access_logging,
        config={"classifications": {"type": "array", "items": {"type": "string"}, "default": ["phi"],
                                    "description": "Data classifications whose buckets must log access."}},
        remediation="Add an aws.s3.BucketLogging for the bucket targeting a dedicated log bucket "
                    "(itself encrypted and access-blocked) with a per-bucket targetPrefix."),
]
