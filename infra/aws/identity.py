"""Identity: the roles of the GPU nodes, of their jobs and of the controller, the instance profiles, and the
cluster's munge key secret. Shell access is through SSM Session Manager only (no SSH key, no port 22). The node's
inline policy is `policies.node_policy`, scoped to this stack, plus the registry's `pull_statements` (pull from the
stack's repositories only); the controller's policy names the launch templates, so it is attached where they exist
(infra.aws.controller).

Jobs do not hold the node role. The job role (`policies.job_role_policy`, plus the same pull statements, so an
image job's `docker login` works with its own credentials) is assumed only by the node role, whose root
credentials daemon narrows each session to one job's prefix (trainer.clouds.aws_credentials). Its trust names the
node role's ARN, so it is made after the node role; the node's policy names the job role, so it is made after
both, and the instance profile (what nodes launch with) after that.

The munge key authenticates every Slurm message of the cluster. The secret is made empty here, encrypted with the
stack key; the controller generates the key at its first boot and stores it (so it is never in the Pulumi state,
user-data, a preview or an output), the nodes read it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from infra.aws import policies

MUNGE_RECOVERY_DAYS = 7


@dataclass(frozen=True)
class IdentityArgs:
    prefix: str
    region: str
    bucket_arn: pulumi.Input[str]
    key_arn: pulumi.Input[str]
    log_group_arn: pulumi.Input[str]
    parameters_arn: pulumi.Input[str]       # the job secrets' SSM path (policies.parameters_arn)
    vpc_id: pulumi.Input[str]               # Session Manager from the stack's VPC only
    metric_namespace: str
    pull_statements: pulumi.Input[list]     # infra.aws.registry.pull_statements
    tags: dict[str, str]


def _with(doc: dict, statements: list) -> dict:
    return {**doc, "Statement": [*doc["Statement"], *statements]}


class Identity(pulumi.ComponentResource):
    def __init__(self, name: str, args: IdentityArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpufleet:aws:Identity", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        p = args.prefix
        self.munge_secret = aws.secretsmanager.Secret(
            f"{p}-munge", name_prefix=f"{p}-munge-", description=f"{p}: the Slurm cluster's munge key (made by the "
            "controller)", kms_key_id=args.key_arn, recovery_window_in_days=MUNGE_RECOVERY_DAYS, tags=args.tags,
            opts=child)
        self.role = aws.iam.Role(
            f"{p}-node", description=f"{p} GPU nodes", assume_role_policy=json.dumps(policies.assume_role_ec2()),
            tags=args.tags, opts=child)
        # IAM refuses a trust policy naming a role that does not exist yet: the ARN (an output) orders the two.
        self.job_role = aws.iam.Role(
            f"{p}-job", description=f"{p} jobs: assumed by the nodes' credentials daemon, narrowed to one job",
            assume_role_policy=self.role.arn.apply(lambda arn: json.dumps(policies.assume_role_job(arn))),
            tags=args.tags, opts=child)
        job_inline = aws.iam.RolePolicy(
            f"{p}-job-policy", role=self.job_role.name,
            policy=pulumi.Output.all(args.bucket_arn, args.key_arn, args.parameters_arn, args.vpc_id,
                                     args.pull_statements).apply(
                lambda v: json.dumps(_with(policies.job_role_policy(*v[:4], region=args.region), v[4]))),
            opts=child)
        inline = aws.iam.RolePolicy(
            f"{p}-node-policy", role=self.role.name,
            policy=pulumi.Output.all(args.bucket_arn, args.key_arn, args.log_group_arn, args.parameters_arn,
                                     self.munge_secret.arn, args.vpc_id, self.job_role.arn,
                                     args.pull_statements).apply(
                lambda v: json.dumps(_with(policies.node_policy(*v[:6], metric_namespace=args.metric_namespace,
                                                                job_role_arn=v[6]), v[7]))),
            opts=child)
        # Nodes launch only once their permissions, and their jobs', are in place.
        self.instance_profile = aws.iam.InstanceProfile(
            f"{p}-node", role=self.role.name, tags=args.tags,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[inline, job_inline]))

        self.controller_role = aws.iam.Role(
            f"{p}-controller", description=f"{p} Slurm controller",
            assume_role_policy=json.dumps(policies.assume_role_ec2()), tags=args.tags, opts=child)
        self.controller_profile = aws.iam.InstanceProfile(
            f"{p}-controller", role=self.controller_role.name, tags=args.tags, opts=child)
        self.register_outputs({"role": self.role.arn, "job_role": self.job_role.arn,
                               "instance_profile": self.instance_profile.arn,
                               "controller_role": self.controller_role.arn, "munge_secret": self.munge_secret.arn})
