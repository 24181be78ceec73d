"""A job's own AWS credentials (trainer.node.jobcreds serves them): the stack's job role, assumed with the node's
credentials through STS, with a session policy that narrows it to the one job.

The job role (infra.aws.policies.job_role_policy) is the ceiling of every job's rights; the session policy here
is the intersection STS applies on top, so a job's credentials reach only:
- ``teams/<team>/jobs/<job_id>/`` read-write (its record, checkpoints and log chunks; trainer.jobs.layout); no
  write to the records' index, whose shards hold other jobs' entries (the bridge keeps it, trainer.jobs.records);
- its team's ``teams/<team>/code/`` (content-addressed bundles) and ``teams/<team>/data/`` read-only; nothing of
  another team's;
- the stack key through S3 and SSM, the stack's job secrets and image pulls, as far as the job role allows.
"""
from __future__ import annotations

import json
from datetime import datetime, timezone

from trainer.jobs.layout import team_prefix
from trainer.jobs.records import record_key

DURATION_S = 3600            # what each AssumeRole asks for (the role's default maximum)
MAX_POLICY_CHARS = 2048      # STS's limit on a session policy's plain text
READ_PREFIXES = ("code/", "data/")  # under the team's prefix
SESSION_PREFIX = "gpufleet-"  # the job role's trust admits only session names like this (infra.aws.policies)


def partition(region: str) -> str:
    return "aws-cn" if region.startswith("cn-") else "aws"


def session_policy(bucket: str, team: str, job_id: str, region: str) -> dict:
    """The session policy of one job's credentials (pure). Compact enough for STS with any valid team, job id
    and bucket name (test_aws_credentials checks the longest)."""
    arn = f"arn:{partition(region)}:s3:::{bucket}"
    base = team_prefix(team)
    own = base + record_key(job_id).rsplit("/", 1)[0] + "/"
    reads = [base + p for p in READ_PREFIXES]
    return {"Version": "2012-10-17", "Statement": [
        {"Sid": "OwnPrefix", "Effect": "Allow",
         "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload",
                    "s3:ListMultipartUploadParts"],
         "Resource": f"{arn}/{own}*"},
        {"Sid": "ReadTeams", "Effect": "Allow", "Action": "s3:GetObject",
         "Resource": [f"{arn}/{p}*" for p in reads]},
        {"Sid": "List", "Effect": "Allow", "Action": "s3:ListBucket", "Resource": arn,
         "Condition": {"StringLike": {"s3:prefix": [f"{own}*", *(f"{p}*" for p in reads)]}}},
        {"Sid": "KeySecretsImages", "Effect": "Allow",
         "Action": ["s3:GetBucketLocation", "kms:Decrypt", "kms:GenerateDataKey", "ssm:GetParameter",
                    "ecr:GetAuthorizationToken", "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer",
                    "ecr:BatchCheckLayerAvailability"],
         "Resource": "*"},
    ]}


def packed(policy: dict) -> str:
    text = json.dumps(policy, separators=(",", ":"))
    if len(text) > MAX_POLICY_CHARS:
        raise ValueError(f"session policy of {len(text)} characters; STS takes at most {MAX_POLICY_CHARS}")
    return text


class JobRoleIssuer:
    """Credentials of the job role for one job, from STS with the node's own credentials (root's: the metadata
    service answers only root)."""

    def __init__(self, role_arn: str, bucket: str, region: str, client=None):
        self.role_arn, self.bucket, self.region = role_arn, bucket, region
        self._client = client

    @property
    def client(self):
        if self._client is None:
            import boto3  # lazy: AWS SDK (~0.2 s) only when used

            self._client = boto3.client("sts", region_name=self.region)
        return self._client

    def __call__(self, team: str, job_id: str, session: str) -> tuple[dict, float]:
        """(the container-credentials document botocore reads, when the credentials expire as a Unix time)."""
        out = self.client.assume_role(RoleArn=self.role_arn, RoleSessionName=f"{SESSION_PREFIX}{session}"[:64],
                                      Policy=packed(session_policy(self.bucket, team, job_id, self.region)),
                                      DurationSeconds=DURATION_S)["Credentials"]
        expires = out["Expiration"]
        if isinstance(expires, str):
            expires = datetime.fromisoformat(expires.replace("Z", "+00:00"))
        if expires.tzinfo is None:
            expires = expires.replace(tzinfo=timezone.utc)
        return ({"AccessKeyId": out["AccessKeyId"], "SecretAccessKey": out["SecretAccessKey"],
                 "Token": out["SessionToken"],
                 "Expiration": expires.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")},
                expires.timestamp())


def job_issuer(settings: dict) -> JobRoleIssuer:
    """The issuer of a node whose node.json has ``aws.job_role_arn`` and ``aws.bucket`` (infra.aws.stack)."""
    aws = settings.get("aws") or {}
    return JobRoleIssuer(aws["job_role_arn"], aws["bucket"], settings["region"])
