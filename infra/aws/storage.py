"""Storage: the stack's KMS key and the checkpoint/data bucket (plus its access-log bucket where needed)."""
from __future__ import annotations

import json
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from infra.aws import policies

NONCURRENT_VERSION_DAYS = 30
ACCESS_LOG_DAYS = 400
# Who touched which object: HIPAA's audit controls for phi, GDPR's records of processing for personal data.
ACCESS_LOGGED = ("personal", "phi")


@dataclass(frozen=True)
class StorageArgs:
    prefix: str
    region: str
    account_id: pulumi.Input[str]
    log_group_names: tuple[str, ...]   # the stack's log groups, encrypted with its key
    access_logging: bool
    tags: dict[str, str]


class Storage(pulumi.ComponentResource):
    """KMS key with rotation (the stack's roles use it as their policies say: the controller for the nodes' EBS
    volumes); bucket with versioning, SSE-KMS + bucket key, public access blocked, owner-enforced, TLS >= 1.2
    only, old versions expired; access logs when `access_logging`."""

    def __init__(self, name: str, args: StorageArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpufleet:aws:Storage", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        p = args.prefix

        self.key = aws.kms.Key(
            f"{p}-key", description=f"{p}: bucket, queue, logs, alerts, secrets, file system and node volumes",
            enable_key_rotation=True, deletion_window_in_days=30,
            policy=pulumi.Output.from_input(args.account_id).apply(
                lambda acct: json.dumps(policies.key_policy(acct, args.region, list(args.log_group_names)))),
            tags=args.tags, opts=child)
        aws.kms.Alias(f"{p}-key-alias", name=f"alias/{p}", target_key_id=self.key.key_id, opts=child)

        self.bucket = self._bucket(f"{p}-data", args, sse=("aws:kms", self.key.arn))
        aws.s3.BucketPolicy(
            f"{p}-data-policy", bucket=self.bucket.id,
            policy=self.bucket.arn.apply(lambda arn: json.dumps(policies.bucket_policy(arn))),
            opts=child)
        self.log_bucket = None
        if args.access_logging:
            # S3 server access logs can only be delivered to an SSE-S3 bucket.
            self.log_bucket = self._bucket(f"{p}-access-logs", args, sse=("AES256", None),
                                           expire_days=ACCESS_LOG_DAYS)
            aws.s3.BucketPolicy(
                f"{p}-access-logs-policy", bucket=self.log_bucket.id,
                policy=pulumi.Output.all(self.log_bucket.arn, self.bucket.arn, args.account_id).apply(
                    lambda v: json.dumps(policies.log_bucket_policy(*v))),
                opts=child)
            aws.s3.BucketLogging(
                f"{p}-data-logging", bucket=self.bucket.id, target_bucket=self.log_bucket.id,
                target_prefix="s3-access/",
                target_object_key_format={"partitioned_prefix": {"partition_date_source": "EventTime"}},
                opts=child)
        self.register_outputs({"bucket": self.bucket.bucket, "key": self.key.arn})

    def _bucket(self, name: str, args: StorageArgs, sse: tuple[str, object], expire_days: int | None = None):
        child = pulumi.ResourceOptions(parent=self)
        bucket = aws.s3.Bucket(name, force_destroy=False, tags=args.tags, opts=child)
        aws.s3.BucketPublicAccessBlock(
            f"{name}-public-access-block", bucket=bucket.id, block_public_acls=True, block_public_policy=True,
            ignore_public_acls=True, restrict_public_buckets=True, opts=child)
        aws.s3.BucketOwnershipControls(
            f"{name}-ownership", bucket=bucket.id, rule={"object_ownership": "BucketOwnerEnforced"}, opts=child)
        aws.s3.BucketVersioning(
            f"{name}-versioning", bucket=bucket.id, versioning_configuration={"status": "Enabled"}, opts=child)
        algorithm, key_arn = sse
        aws.s3.BucketServerSideEncryptionConfiguration(
            f"{name}-encryption", bucket=bucket.id,
            rules=[{"apply_server_side_encryption_by_default": {"sse_algorithm": algorithm, "kms_master_key_id": key_arn},
                    "bucket_key_enabled": algorithm == "aws:kms"}],
            opts=child)
        rule = {"id": "expire-old-versions", "status": "Enabled", "filter": {},
                "noncurrent_version_expiration": {"noncurrent_days": NONCURRENT_VERSION_DAYS},
                "abort_incomplete_multipart_upload": {"days_after_initiation": 7}}
        if expire_days:
            rule["expiration"] = {"days": expire_days}
        aws.s3.BucketLifecycleConfiguration(f"{name}-lifecycle", bucket=bucket.id, rules=[rule], opts=child)
        return bucket
