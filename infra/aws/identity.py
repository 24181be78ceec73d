"""Identity: the node role and instance profile. Shell access is through SSM Session Manager only
(no SSH key, no port 22); the inline policy is `policies.node_policy`, scoped to this stack, plus
the registry's `pull_statements` (pull from the stack's repositories only)."""
from __future__ import annotations

import json
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from infra.aws import policies


@dataclass(frozen=True)
class IdentityArgs:
    prefix: str
    region: str
    bucket_arn: pulumi.Input[str]
    key_arn: pulumi.Input[str]
    queue_arn: pulumi.Input[str]
    dlq_arn: pulumi.Input[str]
    asg_arn: pulumi.Input[str]
    log_group_arn: pulumi.Input[str]
    parameters_arn: pulumi.Input[str]       # the job secrets' SSM path (policies.parameters_arn)
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
        self.role = aws.iam.Role(
            f"{p}-node", description=f"{p} GPU nodes", assume_role_policy=json.dumps(policies.assume_role_ec2()),
            tags=args.tags, opts=child)
        ssm = aws.iam.RolePolicyAttachment(
            f"{p}-node-ssm", role=self.role.name,
            policy_arn=f"arn:{policies.partition(args.region)}:iam::aws:policy/AmazonSSMManagedInstanceCore",
            opts=child)
        inline = aws.iam.RolePolicy(
            f"{p}-node-policy", role=self.role.name,
            policy=pulumi.Output.all(args.bucket_arn, args.key_arn, args.queue_arn, args.dlq_arn, args.asg_arn,
                                     args.log_group_arn, args.parameters_arn, args.pull_statements).apply(
                lambda v: json.dumps(_with(policies.node_policy(*v[:7], metric_namespace=args.metric_namespace),
                                           v[7]))),
            opts=child)
        # Nodes launch only once their permissions are in place.
        self.instance_profile = aws.iam.InstanceProfile(
            f"{p}-node", role=self.role.name, tags=args.tags,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[ssm, inline]))
        self.register_outputs({"role": self.role.arn, "instance_profile": self.instance_profile.arn})
