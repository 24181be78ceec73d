"""IAM, KMS, S3, SQS and SNS policy documents of the AWS stack: pure functions of ARNs and names.

The node policy is least privilege: every action is named (no `*`, no `service:*`), scoped to this
stack's bucket, key, queue, autoscaling group and log group; `Resource: "*"` is used only for
Describe calls that IAM cannot scope and for PutMetricData, which is held to the stack's metric
namespace by a `cloudwatch:namespace` condition. The flow log role can only write into the flow
log group, and only VPC Flow Logs of this account can assume it. The VPC endpoints pass only this
account's principals acting on this account's resources, and the S3 gateway endpoint only the
buckets the nodes use.
"""
from __future__ import annotations

MIN_TLS_VERSION = "1.2"


def partition(region: str) -> str:
    if region.startswith("cn-"):
        return "aws-cn"
    if region.startswith("us-gov-"):
        return "aws-us-gov"
    return "aws"


def _doc(*statements: dict) -> dict:
    return {"Version": "2012-10-17", "Statement": list(statements)}


def _deny_insecure_transport(action: str, resources: list[str]) -> dict:
    return {"Sid": "DenyInsecureTransport", "Effect": "Deny", "Principal": "*", "Action": action,
            "Resource": resources, "Condition": {"Bool": {"aws:SecureTransport": "false"}}}


def assume_role_ec2() -> dict:
    return _doc({"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"})


def assume_role_lambda() -> dict:
    return _doc({"Effect": "Allow", "Principal": {"Service": "lambda.amazonaws.com"}, "Action": "sts:AssumeRole"})


def chat_forwarder_policy(log_group_arn: str) -> dict:
    """The chat forwarder writes its own log group and nothing else (it calls no AWS API)."""
    return _doc({"Sid": "WriteOwnLogs", "Effect": "Allow", "Action": ["logs:CreateLogStream", "logs:PutLogEvents"],
                 "Resource": [log_group_arn, f"{log_group_arn}:*"]})


def log_group_arn(region: str, account_id: str, name: str) -> str:
    return f"arn:{partition(region)}:logs:{region}:{account_id}:log-group:{name}"


# What the EC2 Auto Scaling user guide asks a customer managed key to grant the group's service-linked
# role for EBS encryption ("Required AWS KMS key policy for use with encrypted volumes"), with its
# `kms:ReEncrypt*` and `kms:GenerateDataKey*` spelled out as the symmetric-key actions they stand for.
AUTOSCALING_EBS_KEY_ACTIONS = ("kms:Encrypt", "kms:Decrypt", "kms:ReEncryptFrom", "kms:ReEncryptTo",
                               "kms:GenerateDataKey", "kms:GenerateDataKeyWithoutPlaintext", "kms:DescribeKey")


def key_policy(account_id: str, region: str, log_group_names: list[str], autoscaling_role_arn: str) -> dict:
    """The stack's KMS key: account administration, CloudWatch Logs for the stack's log groups only,
    CloudWatch alarms and AWS Budgets publishing to the encrypted alert topic, and the node group's
    Auto Scaling service-linked role launching nodes with EBS volumes encrypted by this key (grants
    only for AWS resources, as EBS attaches them)."""
    part = partition(region)
    log_group_arns = [log_group_arn(region, account_id, name) for name in log_group_names]
    return _doc(
        {"Sid": "AccountAdministration", "Effect": "Allow",
         "Principal": {"AWS": f"arn:{part}:iam::{account_id}:root"}, "Action": "kms:*", "Resource": "*"},
        {"Sid": "CloudWatchLogsForStackLogGroups", "Effect": "Allow",
         "Principal": {"Service": f"logs.{region}.amazonaws.com"},
         "Action": ["kms:Encrypt", "kms:Decrypt", "kms:ReEncryptFrom", "kms:ReEncryptTo",
                    "kms:GenerateDataKey", "kms:GenerateDataKeyWithoutPlaintext", "kms:DescribeKey"],
         "Resource": "*",
         "Condition": {"ArnEquals": {"kms:EncryptionContext:aws:logs:arn": log_group_arns}}},
        {"Sid": "AlertTopicPublishers", "Effect": "Allow",
         "Principal": {"Service": ["cloudwatch.amazonaws.com", "budgets.amazonaws.com"]},
         "Action": ["kms:Decrypt", "kms:GenerateDataKey"], "Resource": "*",
         "Condition": {"StringEquals": {"aws:SourceAccount": account_id}}},
        {"Sid": "AutoScalingEbsVolumes", "Effect": "Allow", "Principal": {"AWS": autoscaling_role_arn},
         "Action": list(AUTOSCALING_EBS_KEY_ACTIONS), "Resource": "*"},
        {"Sid": "AutoScalingEbsGrants", "Effect": "Allow", "Principal": {"AWS": autoscaling_role_arn},
         "Action": "kms:CreateGrant", "Resource": "*",
         "Condition": {"Bool": {"kms:GrantIsForAWSResource": True}}},
    )


def bucket_policy(bucket_arn: str) -> dict:
    """Deny any request without TLS, and any over TLS below 1.2."""
    resources = [bucket_arn, f"{bucket_arn}/*"]
    return _doc(
        _deny_insecure_transport("s3:*", resources),
        {"Sid": "DenyTlsBelow12", "Effect": "Deny", "Principal": "*", "Action": "s3:*", "Resource": resources,
         "Condition": {"NumericLessThan": {"s3:TlsVersion": MIN_TLS_VERSION}}},
    )


def log_bucket_policy(log_bucket_arn: str, source_bucket_arn: str, account_id: str) -> dict:
    """The access-log bucket: S3 log delivery for the data bucket only, plus the TLS denies."""
    doc = bucket_policy(log_bucket_arn)
    doc["Statement"].append(
        {"Sid": "S3ServerAccessLogDelivery", "Effect": "Allow", "Principal": {"Service": "logging.s3.amazonaws.com"},
         "Action": "s3:PutObject", "Resource": f"{log_bucket_arn}/*",
         "Condition": {"ArnLike": {"aws:SourceArn": source_bucket_arn},
                       "StringEquals": {"aws:SourceAccount": account_id}}})
    return doc


def queue_policy(queue_arn: str) -> dict:
    return _doc(_deny_insecure_transport("sqs:*", [queue_arn]))


def topic_policy(topic_arn: str, account_id: str) -> dict:
    """The alert topic: CloudWatch alarms and AWS Budgets of this account publish; TLS only."""
    return _doc(
        {"Sid": "AlarmAndBudgetPublish", "Effect": "Allow",
         "Principal": {"Service": ["cloudwatch.amazonaws.com", "budgets.amazonaws.com"]},
         "Action": "sns:Publish", "Resource": topic_arn,
         "Condition": {"StringEquals": {"aws:SourceAccount": account_id}}},
        _deny_insecure_transport("sns:Publish", [topic_arn]),
    )


def assume_role_flow_logs(region: str, account_id: str) -> dict:
    """Only VPC Flow Logs, acting for flow logs of this account, may assume the delivery role."""
    return _doc(
        {"Effect": "Allow", "Principal": {"Service": "vpc-flow-logs.amazonaws.com"}, "Action": "sts:AssumeRole",
         "Condition": {"StringEquals": {"aws:SourceAccount": account_id},
                       "ArnLike": {"aws:SourceArn": f"arn:{partition(region)}:ec2:{region}:{account_id}:vpc-flow-log/*"}}})


def flow_log_delivery_policy(log_group_arn: str) -> dict:
    """Write flow log records into one log group (its streams are `<log group ARN>:log-stream:<eni>`)."""
    return _doc(
        {"Sid": "DeliverFlowLogs", "Effect": "Allow",
         "Action": ["logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"],
         "Resource": [log_group_arn, f"{log_group_arn}:*"]})


def node_policy(bucket_arn: str, key_arn: str, queue_arn: str, dlq_arn: str, asg_arn: str, log_group_arn: str,
                parameters_arn: str, metric_namespace: str) -> dict:
    """What a node (trainer agent, preflight, log shipping) may do, and nothing more."""
    return _doc(
        {"Sid": "ListCheckpointBucket", "Effect": "Allow",
         "Action": ["s3:ListBucket", "s3:GetBucketLocation"], "Resource": bucket_arn},
        {"Sid": "ReadWriteCheckpoints", "Effect": "Allow",
         "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload",
                    "s3:ListMultipartUploadParts"],
         "Resource": f"{bucket_arn}/*"},
        {"Sid": "UseStackKey", "Effect": "Allow", "Action": ["kms:Decrypt", "kms:GenerateDataKey"],
         "Resource": key_arn},
        # SendMessage: a hand-back or a retried failure goes back as a fresh message with its attempts
        {"Sid": "ConsumeJobQueue", "Effect": "Allow",
         "Action": ["sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility",
                    "sqs:GetQueueAttributes", "sqs:GetQueueUrl", "sqs:SendMessage"],
         "Resource": queue_arn},
        # a job out of retries, or invalid, is moved to the redrive policy's queue at once
        {"Sid": "DeadLetterJobs", "Effect": "Allow", "Action": ["sqs:GetQueueUrl", "sqs:SendMessage"],
         "Resource": dlq_arn},
        # the secrets a job's env names ({"ssm": NAME}), under the stack's path only
        {"Sid": "ReadJobSecrets", "Effect": "Allow", "Action": "ssm:GetParameter", "Resource": parameters_arn},
        {"Sid": "LifecycleAndProtection", "Effect": "Allow",
         "Action": ["autoscaling:CompleteLifecycleAction", "autoscaling:RecordLifecycleActionHeartbeat",
                    "autoscaling:SetInstanceProtection", "autoscaling:SetInstanceHealth"],
         "Resource": asg_arn},
        {"Sid": "ShipLogs", "Effect": "Allow",
         "Action": ["logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"],
         "Resource": [log_group_arn, f"{log_group_arn}:*"]},
        {"Sid": "PublishStackMetrics", "Effect": "Allow", "Action": "cloudwatch:PutMetricData", "Resource": "*",
         "Condition": {"StringEquals": {"cloudwatch:namespace": metric_namespace}}},
        {"Sid": "DiscoverPeers", "Effect": "Allow",
         "Action": ["ec2:DescribeInstances", "autoscaling:DescribeAutoScalingInstances",
                    "autoscaling:DescribeAutoScalingGroups"],
         "Resource": "*"},
        # The CloudWatch agent resolves ${aws:AutoScalingGroupName} from the instance's tags (as AWS's
        # CloudWatchAgentServerPolicy allows); DescribeTags has no resource-level permissions.
        {"Sid": "ResolveAgentDimensions", "Effect": "Allow", "Action": "ec2:DescribeTags", "Resource": "*"},
    )


def _this_account(account_id: str) -> dict:
    return {"StringEquals": {"aws:PrincipalAccount": account_id, "aws:ResourceAccount": account_id}}


def interface_endpoint_policy(account_id: str) -> dict:
    """An interface endpoint (SQS, SSM, Logs, CloudWatch, ...) carries only requests signed by this
    account's principals for this account's resources: no foreign credentials in, no data out to a
    foreign account's queue or log group (the pattern of AWS's data-perimeter examples)."""
    return _doc({"Sid": "ThisAccountOnly", "Effect": "Allow", "Principal": "*", "Action": "*", "Resource": "*",
                 "Condition": _this_account(account_id)})


def s3_endpoint_policy(account_id: str, bucket_arns: list[str], aws_owned_reads: list[str] = ()) -> dict:
    """The S3 gateway endpoint reaches only the named buckets of this account, for this account's principals,
    and reads (GetObject only) from the AWS-owned buckets named one by one in ``aws_owned_reads``.

    The one AWS-owned bucket the nodes need is ECR's layer bucket `prod-<region>-starport-layer-bucket`
    (image layers; infra.aws.registry.layer_bucket_arn). They boot from a baked image, and Session Manager
    uses none (SSM Agent's buckets serve patching, Distributor and agent self-updates, which the stack does
    not use)."""
    resources = [r for arn in bucket_arns for r in (arn, f"{arn}/*")]
    statements = [{"Sid": "StackBuckets", "Effect": "Allow", "Principal": "*", "Action": "s3:*",
                   "Resource": resources, "Condition": _this_account(account_id)}]
    if aws_owned_reads:
        statements.append({"Sid": "AwsOwnedReads", "Effect": "Allow", "Principal": "*", "Action": "s3:GetObject",
                           "Resource": [f"{arn}/*" for arn in aws_owned_reads],
                           "Condition": {"StringEquals": {"aws:PrincipalAccount": account_id}}})
    return _doc(*statements)


def parameters_arn(region: str, account_id: str, path: str) -> str:
    """ARN pattern of the SSM parameters below ``path`` (``/gpufleet/<stack>/``)."""
    return f"arn:{partition(region)}:ssm:{region}:{account_id}:parameter/{path.strip('/')}/*"


def asg_arn(region: str, account_id: str, asg_name: str) -> str:
    """ARN pattern of the named group (its ARN holds a UUID that exists only after creation)."""
    return (f"arn:{partition(region)}:autoscaling:{region}:{account_id}:autoScalingGroup:*:"
            f"autoScalingGroupName/{asg_name}")
