"""What the demo creates in moto, read from a stack's preview document: pure functions, no I/O.

``stack_resources`` picks the stack's KMS key, bucket (and its settings resources), job queue,
dead-letter queue (and their policies) and the instance types of its first Slurm partition out of the preview's
``resources`` and
``outputs``. The ``*_requests`` functions turn them into boto3 calls (``(operation, params)``) with the
provider's inputs as the preview recorded them; ids and ARNs only known once moto has created a
resource (the KMS key's) replace the preview's mock ones through ``substitute``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

KEY = "aws:kms/key:Key"
ALIAS = "aws:kms/alias:Alias"
BUCKET = "aws:s3/bucket:Bucket"
QUEUE = "aws:sqs/queue:Queue"
QUEUE_POLICY = "aws:sqs/queuePolicy:QueuePolicy"
REDRIVE_ALLOW = "aws:sqs/redriveAllowPolicy:RedriveAllowPolicy"
PARTITION = "gpufleet:aws:Partition"
BUCKET_SETTINGS = {  # resource type -> the boto3 S3 operation that applies it
    "aws:s3/bucketVersioning:BucketVersioning": "put_bucket_versioning",
    "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration": "put_bucket_encryption",
    "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock": "put_public_access_block",
    "aws:s3/bucketOwnershipControls:BucketOwnershipControls": "put_bucket_ownership_controls",
    "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration": "put_bucket_lifecycle_configuration",
    "aws:s3/bucketPolicy:BucketPolicy": "put_bucket_policy",
}
# Pulumi AWS queue inputs -> SQS attribute names (SQS's names are not a case change of Pulumi's).
QUEUE_ATTRIBUTES = {
    "visibilityTimeoutSeconds": "VisibilityTimeout",
    "receiveWaitTimeSeconds": "ReceiveMessageWaitTimeSeconds",
    "messageRetentionSeconds": "MessageRetentionPeriod",
    "delaySeconds": "DelaySeconds",
    "maxMessageSize": "MaximumMessageSize",
    "kmsMasterKeyId": "KmsMasterKeyId",
    "kmsDataKeyReusePeriodSeconds": "KmsDataKeyReusePeriodSeconds",
    "sqsManagedSseEnabled": "SqsManagedSseEnabled",
    "redrivePolicy": "RedrivePolicy",
}
MOTO_CONDITIONS = {"StringEquals"}  # the condition operators moto evaluates in bucket policies
# camelCase input names whose S3 API name is not their PascalCase.
S3_NAMES = {"kmsMasterKeyId": "KMSMasterKeyID", "sseAlgorithm": "SSEAlgorithm", "id": "ID"}


class PreviewMismatch(Exception):
    """The preview document lacks a resource the demo needs (not an AWS queue-mode stack?)."""


@dataclass(frozen=True)
class Queue:
    name: str
    mock_url: str
    mock_arn: str
    inputs: dict
    policy: str | None = None
    redrive_allow: str | None = None

    @property
    def redrive(self) -> dict | None:
        text = self.inputs.get("redrivePolicy")
        return json.loads(text) if text else None


@dataclass(frozen=True)
class StackResources:
    stack: str
    region: str
    key: dict                      # the KMS key resource (id: the mock key id)
    key_arn: str                   # its mock ARN (the preview's kmsKey output)
    alias: str | None
    bucket: dict                   # the bucket resource (id: its name)
    bucket_settings: list[dict]    # resources whose input `bucket` is the bucket, in BUCKET_SETTINGS order
    jobs: Queue
    dlq: Queue
    instance_types: list[str] = field(default_factory=list)   # the first partition's (what the box's nodes are)
    teams: dict[str, tuple[Queue, Queue]] = field(default_factory=dict)  # each team's queue and dead letters

    @property
    def bucket_name(self) -> str:
        return self.bucket["id"]


def _one(resources: list[dict], rtype: str, **match: Any) -> dict:
    found = [r for r in resources if r["type"] == rtype
             and all(r.get(k) == v or r.get("inputs", {}).get(k) == v for k, v in match.items())]
    if len(found) != 1:
        what = rtype + "".join(f" {k}={v}" for k, v in match.items())
        raise PreviewMismatch(f"the preview has {len(found)} {what}; the demo needs exactly one "
                              "(an AWS queue-mode stack)")
    return found[0]


def queue_arn(url: str, region: str) -> str:
    """arn:aws:sqs:<region>:<account>:<name> of a queue URL https://sqs.<region>.amazonaws.com/<account>/<name>."""
    account, name = urlparse(url).path.strip("/").split("/")[-2:]
    return f"arn:aws:sqs:{region}:{account}:{name}"


def queue_name(url: str) -> str:
    return urlparse(url).path.rstrip("/").rsplit("/", 1)[-1]


def stack_resources(doc: dict) -> StackResources:
    """The resources of a preview document (``python -m infra.preview --format json``) the demo creates."""
    if doc.get("cloud") != "aws":
        raise PreviewMismatch(f"stack {doc.get('stack')!r} is on {doc.get('cloud')!r}; the demo runs an AWS stack")
    if doc.get("config", {}).get("mode") != "queue":
        raise PreviewMismatch(f"stack {doc.get('stack')!r} is in {doc.get('config', {}).get('mode')!r} mode; "
                              "the demo runs a queue-mode stack")
    res, out = doc["resources"], doc["outputs"]
    region = out["region"]
    key = _one(res, KEY)
    aliases = [r for r in res if r["type"] == ALIAS and r["inputs"].get("targetKeyId") == key["id"]]
    bucket = _one(res, BUCKET, id=out["bucket"])
    settings = [r for rtype in BUCKET_SETTINGS for r in res
                if r["type"] == rtype and r["inputs"].get("bucket") == bucket["id"]]

    def queue(url: str) -> Queue:
        q = _one(res, QUEUE, id=url)
        policy = [r["inputs"]["policy"] for r in res if r["type"] == QUEUE_POLICY and r["inputs"]["queueUrl"] == url]
        allow = [r["inputs"]["redriveAllowPolicy"] for r in res
                 if r["type"] == REDRIVE_ALLOW and r["inputs"]["queueUrl"] == url]
        return Queue(queue_name(url), url, queue_arn(url, region), q["inputs"],
                     policy[0] if policy else None, allow[0] if allow else None)

    partitions = [r for r in res if r["type"] == PARTITION]
    if not partitions:
        raise PreviewMismatch(f"the preview has no {PARTITION}; the demo needs a Slurm partition")
    types = list(partitions[0]["inputs"]["instanceTypes"])
    teams = {team: (queue(url), queue(out["teamDeadLetterQueues"][team]))
             for team, url in (out.get("teamQueues") or {}).items()}
    return StackResources(doc["stack"], region, key, out["kmsKey"], aliases[0]["inputs"]["name"] if aliases else None,
                          bucket, settings, queue(out["queueUrl"]), queue(out["dlqUrl"]), types, teams)


def substitute(value: Any, mapping: dict[str, str]) -> Any:
    """``value`` with every occurrence of each mapping key replaced by its value, inside JSON strings too
    (longest keys first, so an ARN is replaced whole before the id inside it)."""
    if isinstance(value, str):
        for old in sorted(mapping, key=len, reverse=True):
            value = value.replace(old, mapping[old])
        return value
    if isinstance(value, dict):
        return {k: substitute(v, mapping) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, mapping) for v in value]
    return value


def pascal(value: Any, names: dict[str, str] = S3_NAMES) -> Any:
    """Pulumi's camelCase input keys as the AWS API's PascalCase, recursively."""
    if isinstance(value, dict):
        return {names.get(k, k[:1].upper() + k[1:]): pascal(v, names) for k, v in value.items()}
    if isinstance(value, list):
        return [pascal(v, names) for v in value]
    return value


def _tags(tags: dict[str, str], key: str = "Key", value: str = "Value") -> list[dict]:
    return [{key: k, value: v} for k, v in sorted(tags.items())]


def key_requests(r: StackResources) -> list[tuple[str, dict]]:
    """KMS: create the key (its policy and description as previewed), then rotation and the alias.

    The alias and rotation calls name the key by the preview's mock id: ``substitute`` it with moto's."""
    inputs = r.key["inputs"]
    calls = [("create_key", {"Description": inputs.get("description", ""), "Policy": inputs["policy"],
                             "Tags": _tags(inputs.get("tags", {}), "TagKey", "TagValue")})]
    if inputs.get("enableKeyRotation"):
        calls.append(("enable_key_rotation", {"KeyId": r.key["id"]}))
    if r.alias:
        calls.append(("create_alias", {"AliasName": r.alias, "TargetKeyId": r.key["id"]}))
    return calls


def bucket_requests(r: StackResources) -> list[tuple[str, dict]]:
    """S3: create the bucket in the stack's region, tag it, then each settings resource as its API call."""
    name = r.bucket_name
    create: dict = {"Bucket": name}
    if r.region != "us-east-1":
        create["CreateBucketConfiguration"] = {"LocationConstraint": r.region}
    calls = [("create_bucket", create)]
    if r.bucket["inputs"].get("tags"):
        calls.append(("put_bucket_tagging", {"Bucket": name, "Tagging": {"TagSet": _tags(r.bucket["inputs"]["tags"])}}))
    for res in r.bucket_settings:
        op, inputs = BUCKET_SETTINGS[res["type"]], {k: v for k, v in res["inputs"].items() if k != "bucket"}
        params = {
            "put_bucket_versioning": lambda: {"VersioningConfiguration": pascal(inputs["versioningConfiguration"])},
            "put_bucket_encryption": lambda: {"ServerSideEncryptionConfiguration": {"Rules": pascal(inputs["rules"])}},
            "put_public_access_block": lambda: {"PublicAccessBlockConfiguration": pascal(inputs)},
            "put_bucket_ownership_controls": lambda: {"OwnershipControls": {"Rules": [pascal(inputs["rule"])]}},
            "put_bucket_lifecycle_configuration": lambda: {"LifecycleConfiguration": {"Rules": pascal(inputs["rules"])}},
            "put_bucket_policy": lambda: {"Policy": inputs["policy"]},
        }[op]()
        calls.append((op, {"Bucket": name, **params}))
    return calls


def queue_attributes(q: Queue) -> dict[str, str]:
    """The queue's SQS attributes (strings, as the API takes them) from its inputs."""
    attrs = {}
    for name, attr in QUEUE_ATTRIBUTES.items():
        if name in q.inputs:
            value = q.inputs[name]
            attrs[attr] = str(value).lower() if isinstance(value, bool) else str(value)
    return attrs


def queue_requests(q: Queue) -> list[tuple[str, dict]]:
    """SQS: create the queue (attributes and tags), then its access policy and redrive-allow policy.

    ``set_queue_attributes`` names the queue by its mock URL: ``substitute`` it with moto's."""
    calls = [("create_queue", {"QueueName": q.name, "Attributes": queue_attributes(q),
                               "tags": dict(q.inputs.get("tags", {}))})]
    extra = {k: v for k, v in (("Policy", q.policy), ("RedriveAllowPolicy", q.redrive_allow)) if v}
    if extra:
        calls.append(("set_queue_attributes", {"QueueUrl": q.mock_url, "Attributes": extra}))
    return calls


def policy_resources(policy: str) -> set[str]:
    """The Resource ARNs a policy document names."""
    found: set[str] = set()
    for st in json.loads(policy).get("Statement", []):
        res = st.get("Resource", [])
        found.update([res] if isinstance(res, str) else res)
    return found


def unevaluable_denies(policy: str) -> list[str]:
    """Sids of Deny statements whose conditions moto cannot evaluate.

    moto 5 evaluates only StringEquals in bucket policies and takes any other condition (Bool,
    NumericLessThan, ...) as matched: such a Deny, e.g. "deny plain HTTP", denies every request there.
    """
    return [st.get("Sid", "?") for st in json.loads(policy).get("Statement", [])
            if st.get("Effect") == "Deny" and set(st.get("Condition", {})) - MOTO_CONDITIONS]
