"""Storage: the stack's KMS key (rotation on) and the COS bucket for checkpoints and data: private ACL,
SSE-KMS with the stack key, versioning, old versions and stale multipart uploads expired, and a bucket
policy denying plain HTTP and TLS below 1.2 (COS's cos:secure-transport and cos:tls-version condition
keys). Personal data adds access logs to a private log bucket (SSE-COS, the same TLS-only policy).

COS needs two one-time account grants the provider cannot make: COS's service role for KMS (SSE-KMS)
and the log-delivery authorization (access logs)."""
from __future__ import annotations

import json
from dataclasses import dataclass

import pulumi
from tencentcloud_iac_pulumi import cos, kms

from infra.tencent import derive

OLD_VERSION_DAYS = 30
MULTIPART_DAYS = 7
KEY_DELETION_DAYS = 30


@dataclass(frozen=True)
class StorageArgs:
    prefix: str
    stack: str
    region: str
    app_id: pulumi.Input[str]
    access_logging: bool
    tags: dict


class Storage(pulumi.ComponentResource):
    bucket_name: pulumi.Output[str]
    key_id: pulumi.Output[str]

    def __init__(self, name: str, args: StorageArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpufleet:tencent:Storage", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        p = args.prefix
        app_id = pulumi.Output.from_input(args.app_id)
        self.key = kms.Key(f"{p}-key", alias=p, description=f"{p}: checkpoints and data", key_usage="ENCRYPT_DECRYPT",
                           is_enabled=True, key_rotation_enabled=True,
                           pending_delete_window_in_days=KEY_DELETION_DAYS, tags=args.tags, opts=child)
        self.log_bucket = None
        logging = {}
        if args.access_logging:
            self.log_bucket = cos.Bucket(
                f"{p}-access-logs", bucket=app_id.apply(lambda a: derive.bucket_name(args.stack, a, "logs")),
                acl="private", encryption_algorithm="AES256", versioning_enable=True,
                lifecycle_rules=[_lifecycle()], force_clean=False, tags=args.tags, opts=child)
            logging = {"log_enable": True, "log_target_bucket": self.log_bucket.bucket,
                       "log_prefix": "data-bucket/"}
        self.bucket = cos.Bucket(
            f"{p}-data", bucket=app_id.apply(lambda a: derive.bucket_name(args.stack, a)), acl="private",
            encryption_algorithm="KMS", kms_id=self.key.id, versioning_enable=True,
            lifecycle_rules=[_lifecycle()], force_clean=False, tags=args.tags, opts=child, **logging)
        self.policies = [self._tls_only(f"{p}-{kind}-policy", bucket, app_id, args.region)
                         for kind, bucket in (("data", self.bucket), ("access-logs", self.log_bucket)) if bucket]
        self.bucket_name = self.bucket.bucket
        self.key_id = self.key.id
        self.register_outputs({"bucket": self.bucket.bucket, "keyId": self.key.id})


    def _tls_only(self, name: str, bucket: cos.Bucket, app_id: pulumi.Output, region: str) -> cos.BucketPolicy:
        return cos.BucketPolicy(
            name, bucket=bucket.bucket,
            policy=pulumi.Output.all(app_id, bucket.bucket).apply(
                lambda v: json.dumps(derive.bucket_policy(region, v[0], v[1]))),
            opts=pulumi.ResourceOptions(parent=self))


def _lifecycle() -> dict:
    return {"id": "old-versions-and-uploads", "filter_prefix": "",
            "non_current_expiration": {"non_current_days": OLD_VERSION_DAYS},
            "abort_incomplete_multipart_upload": {"days_after_initiation": MULTIPART_DAYS}}
