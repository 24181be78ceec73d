"""Registry: the stack's ECR repository and the pull-through cache rules of `gpufleet:pullThrough`.

Nodes have no route to the internet, so every image they run comes from this account's ECR over the
`ecr.api` and `ecr.dkr` interface endpoints, its layers from ECR's S3 bucket through the S3 gateway:
- the stack's repository `gpufleet-<stack>`: immutable tags, scan on push, encrypted with the stack key,
  untagged images expired after a day and at most `KEEP_IMAGES` images kept;
- a pull-through cache rule per configured upstream: `<registry>/<prefix>/<image>` is pulled from the
  upstream on first use and cached in a repository ECR creates, with the settings of a repository
  creation template for that prefix (the stack key, the same lifecycle; tags stay mutable, as a cache
  needs to follow the upstream's tags). ECR uses the template's role to create those repositories.
The node role may pull from these repositories only (`pull_statements`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Optional

import pulumi
import pulumi_aws as aws

from infra.aws.policies import dns_suffix, partition
from infra.config import PullThrough

KEEP_IMAGES = 50            # images a repository keeps (the newest); older ones expire
UNTAGGED_DAYS = 1           # an untagged image (a failed push, a replaced manifest) expires after a day
PULL_ACTIONS = ("ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:BatchCheckLayerAvailability")
# The first pull of an upstream image through a cache rule imports it, creating its repository if needed.
CACHE_FILL_ACTIONS = ("ecr:BatchImportUpstreamImage", "ecr:CreateRepository")


def repository_name(stack_prefix: str) -> str:
    """The stack's repository: its prefix, lowercase as ECR requires."""
    return stack_prefix.lower()


def registry_host(account_id: str, region: str) -> str:
    return f"{account_id}.dkr.ecr.{region}.{dns_suffix(region)}"


def repository_url(account_id: str, region: str, name: str) -> str:
    """What `docker pull` names: `<account>.dkr.ecr.<region>.amazonaws.com/<name>`."""
    return f"{registry_host(account_id, region)}/{name}"


def repository_arn(region: str, account_id: str, name: str) -> str:
    return f"arn:{partition(region)}:ecr:{region}:{account_id}:repository/{name}"


def cached_repositories_arn(region: str, account_id: str, prefix: str) -> str:
    """Every repository a pull-through cache rule with this prefix creates."""
    return repository_arn(region, account_id, f"{prefix}/*")


def layer_bucket_arn(region: str) -> str:
    """The S3 bucket ECR serves image layers from (through the S3 gateway endpoint): an endpoint policy
    that limits the buckets nodes reach must allow GetObject on `<this>/*`."""
    return f"arn:{partition(region)}:s3:::prod-{region}-starport-layer-bucket"


def lifecycle_policy(keep: int = KEEP_IMAGES, untagged_days: int = UNTAGGED_DAYS) -> dict:
    """Expire untagged images after `untagged_days`, then keep the newest `keep` images."""
    return {"rules": [
        {"rulePriority": 1, "description": f"untagged images expire after {untagged_days} day(s)",
         "selection": {"tagStatus": "untagged", "countType": "sinceImagePushed", "countUnit": "days",
                       "countNumber": untagged_days},
         "action": {"type": "expire"}},
        {"rulePriority": 2, "description": f"keep the newest {keep} images",
         "selection": {"tagStatus": "any", "countType": "imageCountMoreThan", "countNumber": keep},
         "action": {"type": "expire"}},
    ]}


def pull_statements(region: str, account_id: str, stack_prefix: str, prefixes: list[str]) -> list[dict]:
    """What a node needs to pull from the stack's repository and the cached ones, and nothing more.
    GetAuthorizationToken cannot be scoped to a resource (it returns the registry's login token)."""
    cached = [cached_repositories_arn(region, account_id, p) for p in prefixes]
    statements = [
        {"Sid": "RegistryLogin", "Effect": "Allow", "Action": "ecr:GetAuthorizationToken", "Resource": "*"},
        {"Sid": "PullStackImages", "Effect": "Allow", "Action": list(PULL_ACTIONS),
         "Resource": [repository_arn(region, account_id, repository_name(stack_prefix)), *cached]},
    ]
    if cached:
        statements.append({"Sid": "FillPullThroughCache", "Effect": "Allow", "Action": list(CACHE_FILL_ACTIONS),
                           "Resource": cached})
    return statements


def assume_role_ecr(account_id: str) -> dict:
    return {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": {"Service": "ecr.amazonaws.com"}, "Action": "sts:AssumeRole",
         "Condition": {"StringEquals": {"aws:SourceAccount": account_id}}}]}


# A grant on the stack key only for an AWS resource: KMS sets kms:GrantIsForAWSResource when an integrated service
# (here ECR, for the repository it creates) asks on the principal's behalf. KMS evaluates the key for CreateGrant,
# ListGrants and RevokeGrant only (KMS developer guide, "Controlling access to grants"): RetireGrant, which ends a
# grant and gives nothing, goes with DescribeKey, unconditioned.
FOR_AWS_RESOURCE = {"Bool": {"kms:GrantIsForAWSResource": "true"}}


def template_role_policy(region: str, account_id: str, prefixes: list[str], key_arn: str) -> dict:
    """The role ECR uses to create cached repositories from the creation templates: create and tag
    repositories under the rules' prefixes, and hand the stack key to them (grants ECR uses to encrypt, for
    AWS resources only)."""
    cached = [cached_repositories_arn(region, account_id, p) for p in prefixes]
    return {"Version": "2012-10-17", "Statement": [
        {"Sid": "CreateCachedRepositories", "Effect": "Allow", "Action": ["ecr:CreateRepository", "ecr:TagResource"],
         "Resource": cached},
        {"Sid": "GrantStackKeyToRepositories", "Effect": "Allow", "Action": "kms:CreateGrant", "Resource": key_arn,
         "Condition": FOR_AWS_RESOURCE},
        {"Sid": "ReadStackKeyRetireGrants", "Effect": "Allow", "Action": ["kms:DescribeKey", "kms:RetireGrant"],
         "Resource": key_arn},
    ]}


@dataclass(frozen=True)
class RegistryArgs:
    prefix: str                          # the stack prefix, also the repository's name
    region: str
    account_id: pulumi.Input[str]
    key_arn: pulumi.Input[str]
    pull_through: tuple[PullThrough, ...]
    tags: dict[str, str]


class Registry(pulumi.ComponentResource):
    def __init__(self, name: str, args: RegistryArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("gpufleet:aws:Registry", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        p, key = args.prefix, args.key_arn
        self.repository = aws.ecr.Repository(
            f"{p}-images", name=repository_name(p), image_tag_mutability="IMMUTABLE",
            image_scanning_configuration={"scan_on_push": True},
            encryption_configurations=[{"encryption_type": "KMS", "kms_key": key}],
            force_delete=False, tags=args.tags, opts=child)
        lifecycle = json.dumps(lifecycle_policy())
        aws.ecr.LifecyclePolicy(f"{p}-images-lifecycle", repository=self.repository.name, policy=lifecycle,
                                opts=child)
        self.repository_url = self.repository.repository_url
        self.prefixes = [rule.prefix for rule in args.pull_through]
        self.cache_rules = []
        if args.pull_through:
            role = aws.iam.Role(
                f"{p}-ecr-templates", description=f"{p}: ECR creates pull-through cache repositories",
                assume_role_policy=pulumi.Output.from_input(args.account_id).apply(
                    lambda acct: json.dumps(assume_role_ecr(acct))),
                tags=args.tags, opts=child)
            aws.iam.RolePolicy(
                f"{p}-ecr-templates", role=role.name,
                policy=pulumi.Output.all(args.account_id, key).apply(
                    lambda v: json.dumps(template_role_policy(args.region, v[0], self.prefixes, v[1]))),
                opts=child)
        for rule in args.pull_through:
            label = rule.prefix.replace("/", "-")
            aws.ecr.RepositoryCreationTemplate(
                f"{p}-cache-{label}", prefix=rule.prefix, applied_fors=["PULL_THROUGH_CACHE"],
                description=f"{p}: repositories cached from {rule.upstream}",
                image_tag_mutability="MUTABLE", custom_role_arn=role.arn,
                encryption_configurations=[{"encryption_type": "KMS", "kms_key": key}],
                lifecycle_policy=lifecycle, resource_tags=args.tags, opts=child)
            credential = None
            if rule.credential_secret is not None:
                credential = (rule.credential_secret if rule.credential_secret.startswith("arn:")
                              else aws.secretsmanager.get_secret_output(name=rule.credential_secret).arn)
            self.cache_rules.append(aws.ecr.PullThroughCacheRule(
                f"{p}-cache-{label}", ecr_repository_prefix=rule.prefix, upstream_registry_url=rule.upstream,
                credential_arn=credential, opts=child))
        self.register_outputs({"repository_url": self.repository_url})
