"""KMS key rotation and SQS queue encryption."""
from __future__ import annotations

from policies.common import UNKNOWN, flag, resource_policy
from policies.tokens import KMS_KEY, SQS_QUEUE


def check_key_rotation(props: dict, ctx):
    spec = props.get("customerMasterKeySpec") or props.get("keySpec") or "SYMMETRIC_DEFAULT"
    if spec != "SYMMETRIC_DEFAULT" or props.get("enableKeyRotation") is UNKNOWN:
        return
    if flag(props.get("enableKeyRotation")) is not True:
        yield "symmetric KMS key without automatic rotation"


def check_queue_encrypted(props: dict, ctx):
    key, managed = props.get("kmsMasterKeyId"), props.get("sqsManagedSseEnabled")
    if key is UNKNOWN or managed is UNKNOWN or key:
        return
    if flag(managed) is False or managed is None:
        # SQS enables managed SSE by default only for queues created by the console; say it explicitly.
        yield "queue sets neither kmsMasterKeyId nor sqsManagedSseEnabled true"


POLICIES = [
    resource_policy(
        "aws-kms-key-rotation",
        "Symmetric customer-managed KMS keys rotate automatically.",
        types=[KMS_KEY], severity="medium", frameworks=["CIS", "HIPAA"], check=check_key_rotation,
        remediation="Set enableKeyRotation true (optionally rotationPeriodInDays) on the key."),
    resource_policy(
        "aws-sqs-queue-encrypted",
        "SQS queues encrypt messages at rest.",
        types=[SQS_QUEUE], severity="medium", frameworks=["HIPAA", "GDPR"], check=check_queue_encrypted,
        remediation="Set kmsMasterKeyId to the stack's KMS key (or sqsManagedSseEnabled true for non-regulated data)."),
]
