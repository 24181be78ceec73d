"""A job's own Tencent Cloud key (trainer.node.jobcreds serves it): the stack's job role, assumed with the node's
CAM role through STS AssumeRole, with a policy that narrows it to the one job (Tencent's STS grants the
intersection of the role's policies and this one, as AWS's does).

The job role (infra.tencent.derive.job_role_policy) is the ceiling of every job's rights; the policy here gives a
job's key only:
- ``teams/<team>/jobs/<job_id>/`` read-write (its record, checkpoints and log chunks; trainer.jobs.layout); no
  write to the records' index (the bridge keeps it);
- its team's ``teams/<team>/code/`` and ``teams/<team>/data/`` read-only, listing only under those three prefixes
  (COS's ``cos:prefix`` condition on GET Bucket); nothing of another team's;
- the stack key through COS (SSE-KMS objects), as far as the job role allows.

The key is served in AWS's container-credentials document (AccessKeyId = TmpSecretId, SecretAccessKey =
TmpSecretKey, Token), which COS's S3-compatible API accepts from boto3 and which the trainer's Tencent provider
reads (trainer.clouds.tencent_api.EndpointCredentials).
"""
from __future__ import annotations

import json
import time
import urllib.parse

from trainer.jobs.layout import team_prefix
from trainer.jobs.records import record_key

DURATION_S = 3600            # each AssumeRole's key (Tencent allows up to 43200; renewed well before it ends)
VERSION = "2018-08-13"       # STS API 3.0 version
READ_PREFIXES = ("code/", "data/")  # under the team's prefix
SESSION_PREFIX = "gpufleet-"
OBJECT_ACTIONS = ("name/cos:GetObject", "name/cos:HeadObject", "name/cos:PutObject", "name/cos:DeleteObject",
                  "name/cos:InitiateMultipartUpload", "name/cos:UploadPart", "name/cos:CompleteMultipartUpload",
                  "name/cos:AbortMultipartUpload", "name/cos:ListParts")
READ_ACTIONS = ("name/cos:GetObject", "name/cos:HeadObject")
KEY_ACTIONS = ("name/kms:Encrypt", "name/kms:Decrypt", "name/kms:GenerateDataKey")


def bucket_of(uri: str) -> str:
    """``<bucket>-<appid>`` of ``cos://<bucket>-<appid>[/...]`` (or the name itself)."""
    return urllib.parse.urlparse(uri).netloc if "://" in uri else uri.strip("/")


def session_policy(region: str, app_id: str, bucket: str, team: str, job_id: str) -> dict:
    """The CAM policy of one job's key (pure); resources as COS writes them,
    ``qcs::cos:<region>:uid/<appid>:<bucket>-<appid>/<key>``."""
    base = f"qcs::cos:{region}:uid/{app_id}:{bucket}"
    team_base = team_prefix(team)
    own = team_base + record_key(job_id).rsplit("/", 1)[0] + "/"
    reads = [team_base + p for p in READ_PREFIXES]
    return {"version": "2.0", "statement": [
        {"effect": "allow", "action": list(OBJECT_ACTIONS), "resource": [f"{base}/{own}*"]},
        {"effect": "allow", "action": list(READ_ACTIONS), "resource": [f"{base}/{p}*" for p in reads]},
        {"effect": "allow", "action": ["name/cos:GetBucket"], "resource": [f"{base}/"],
         "condition": {"string_like": {"cos:prefix": [f"{p}*" for p in (own, *reads)]}}},
        {"effect": "allow", "action": ["name/cos:HeadBucket", *KEY_ACTIONS], "resource": ["*"]},
    ]}


def packed(policy: dict) -> str:
    """AssumeRole's Policy parameter: the compact JSON, URL-encoded (STS decodes it once)."""
    return urllib.parse.quote(json.dumps(policy, separators=(",", ":")), safe="")


class JobRoleIssuer:
    """Keys of the job role for one job, from STS with the node's own key (root's: the metadata service answers
    only root). ``api``: a trainer.clouds.tencent_api.Api."""

    def __init__(self, role_arn: str, bucket: str, region: str, app_id: str, api):
        self.role_arn, self.bucket, self.region, self.app_id, self.api = role_arn, bucket, region, app_id, api

    def __call__(self, team: str, job_id: str, session: str) -> tuple[dict, float]:
        """(the container-credentials document, when the key expires as a Unix time)."""
        out = self.api.call("sts", VERSION, "AssumeRole", {
            "RoleArn": self.role_arn, "RoleSessionName": f"{SESSION_PREFIX}{session}"[:128],
            "DurationSeconds": DURATION_S,
            "Policy": packed(session_policy(self.region, self.app_id, self.bucket, team, job_id))})
        key, expires = out["Credentials"], float(out["ExpiredTime"])
        return ({"AccessKeyId": key["TmpSecretId"], "SecretAccessKey": key["TmpSecretKey"], "Token": key["Token"],
                 "Expiration": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(expires))}, expires)
