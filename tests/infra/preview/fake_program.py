"""A small program shaped like the real stacks (components, policies built from ARNs, invokes),
used to test the preview engine independently of infra/aws."""
from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws

from infra import config


class Storage(pulumi.ComponentResource):
    def __init__(self, name: str, tags: dict, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpufleet:test:Storage", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.key = aws.kms.Key(f"{name}-key", enable_key_rotation=True, tags=tags, opts=child)
        self.bucket = aws.s3.Bucket(f"{name}-bucket", tags=tags, opts=child)
        doc = aws.iam.get_policy_document_output(statements=[{
            "sid": "DenyInsecureTransport", "effect": "Deny", "actions": ["s3:*"],
            "resources": [self.bucket.arn, self.bucket.arn.apply(lambda arn: f"{arn}/*")],
            "principals": [{"type": "*", "identifiers": ["*"]}],
            "conditions": [{"test": "Bool", "variable": "aws:SecureTransport", "values": ["false"]}],
        }])
        aws.s3.BucketPolicy(f"{name}-policy", bucket=self.bucket.id, policy=doc.json, opts=child)
        self.register_outputs({"bucket": self.bucket.bucket})


class Cluster(pulumi.ComponentResource):
    def __init__(self, name: str, cfg: config.StackConfig, storage: Storage,
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpufleet:test:Cluster", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        dlq = aws.sqs.Queue(f"{name}-dlq", kms_master_key_id=storage.key.arn, opts=child)
        self.queue = aws.sqs.Queue(
            f"{name}-jobs", kms_master_key_id=storage.key.arn, opts=child,
            redrive_policy=dlq.arn.apply(lambda arn: json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": 3})))
        role = aws.iam.Role(f"{name}-node", assume_role_policy=json.dumps({
            "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                    "Principal": {"Service": "ec2.amazonaws.com"}}]}), opts=child)
        aws.iam.RolePolicy(f"{name}-node", role=role.name, opts=child, policy=pulumi.Output.all(
            storage.bucket.arn, self.queue.arn).apply(lambda a: json.dumps({"Version": "2012-10-17", "Statement": [
                {"Effect": "Allow", "Action": ["s3:GetObject", "s3:PutObject"], "Resource": f"{a[0]}/teams/*/jobs/*"},
                {"Effect": "Allow", "Action": ["sqs:ReceiveMessage"], "Resource": a[1]}]})))
        profile = aws.iam.InstanceProfile(f"{name}-node", role=role.name, opts=child)
        ami = aws.ec2.get_ami_output(most_recent=True, owners=list(cfg.image.owners),
                                     filters=[{"name": "name", "values": [cfg.image.name or "x"]}])
        template = aws.ec2.LaunchTemplate(
            f"{name}-nodes", image_id=ami.id, instance_type=cfg.instance_types[0],
            iam_instance_profile={"arn": profile.arn},
            metadata_options={"http_tokens": "required", "http_endpoint": "enabled"},
            user_data=cfg.ssh_public_key or "", opts=child)
        self.group = aws.autoscaling.Group(
            f"{name}-nodes", min_size=cfg.nodes.min, max_size=cfg.nodes.max, desired_capacity=cfg.nodes.desired,
            availability_zones=[f"{cfg.region}a"], launch_template={"id": template.id, "version": "$Latest"},
            opts=child)
        self.role_arn = role.arn
        self.register_outputs({})


def build(cfg: config.StackConfig) -> dict:
    storage = Storage("data", cfg.all_tags)
    cluster = Cluster("gpu", cfg, storage)
    return {"bucket": storage.bucket.bucket, "queue_url": cluster.queue.url,
            "asg_name": cluster.group.name, "role_arn": cluster.role_arn, "nodes_max": cfg.nodes.max}


def main() -> None:
    for name, value in build(config.load()).items():
        pulumi.export(name, value)


def failing() -> None:
    """A program with a bug, to test how a failure is reported."""
    config.load()
    raise KeyError("no-such-instance-type")


def leaking() -> None:
    """A program whose error message carries a config value."""
    raise ValueError(f"cannot use key {config.load().ssh_public_key}")


def failing_apply() -> None:
    bucket = aws.s3.Bucket("b")
    pulumi.export("x", bucket.arn.apply(lambda arn: arn.nonexistent))


def unknown_invoke() -> None:
    aws.ec2.get_instance_type_output(instance_type="p5.48xlarge").apply(lambda r: pulumi.export("t", r.id))


def secret_config() -> None:
    """Marks a derived value secret the way a program would with pulumi.Output.secret."""
    main()
    pulumi.export("token", pulumi.Output.secret("s3cr3t-token-value"))
    aws.ssm.Parameter("token", type="SecureString", value=pulumi.Output.secret("s3cr3t-token-value"))
